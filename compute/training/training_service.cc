#include "compute/training/training_service.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "compute/model/qwen3_model.h"
#include "compute/trainer/checkpoint.h"
#include "compute/trainer/trainer.h"
#include "storage/util/mutex.h"
#include "storage/util/status_macros.h"

namespace loradb::training {
namespace {

constexpr char kPathScheme[] = "tinker://";
constexpr char kPolicyPrefix[] = "tinker/";
// The rollout bytes of a service checkpoint: this prefix, then the checkpoint's name.
constexpr char kCheckpointNameTag[] = "tinker.checkpoint-name=";
constexpr char kSamplerAliasPrefix[] = "sampler-";
// Finished futures kept for Retrieve; older ones are dropped first.
constexpr size_t kMaxFinishedFutures = 4096;

const char* const kAttnModules[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
const char* const kMlpModules[] = {"gate_proj", "up_proj", "down_proj"};

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

// Checkpoint and sampler names: 1-56 of letters, digits, `_ . -` (an alias `sampler-NAME` fits
// the store's 64-character alias limit).
absl::Status ValidateCheckpointName(const std::string& what, const std::string& name) {
  if (name.empty() || name.size() > 56 || !std::all_of(name.begin(), name.end(), IsNameChar)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " name '", name, "' must be 1-56 characters of letters, digits, '_', '.', '-'"));
  }
  return absl::OkStatus();
}

// Run ids are SESSION:train:N (the SDK derives them the same way); the store policy is
// tinker/SESSION/train-N.
absl::StatusOr<std::string> PolicyOfRun(const std::string& run_id) {
  std::vector<std::string> parts = absl::StrSplit(run_id, ':');
  uint64_t n = 0;
  if (parts.size() != 3 || parts[1] != "train" || parts[0].empty() ||
      !std::all_of(parts[0].begin(), parts[0].end(), IsNameChar) ||
      !absl::SimpleAtoi(parts[2], &n)) {
    return absl::NotFoundError(
        absl::StrCat("no training run '", run_id, "' (run ids look like SESSION:train:N)"));
  }
  return absl::StrCat(kPolicyPrefix, parts[0], "/train-", n);
}

std::string RunIdOf(const std::string& session, int64_t seq) {
  return absl::StrCat(session, ":train:", seq);
}

struct ParsedPath {
  std::string run_id;
  bool sampler = false;  // sampler_weights (else weights)
  std::string name;
};

absl::StatusOr<ParsedPath> ParsePath(const std::string& path) {
  if (!absl::StartsWith(path, kPathScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("path '", path, "' is not tinker://RUN/weights/NAME"));
  }
  std::vector<std::string> parts = absl::StrSplit(path.substr(strlen(kPathScheme)), '/');
  if (parts.size() != 3 || parts[0].empty() || parts[2].empty() ||
      (parts[1] != "weights" && parts[1] != "sampler_weights")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "path '", path, "' is not tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME"));
  }
  return ParsedPath{parts[0], parts[1] == "sampler_weights", parts[2]};
}

std::string Flag(bool b) { return b ? "1" : "0"; }

std::map<std::string, std::string> RunLabels(const std::string& run_id, const std::string& session,
                                             const LoraSpec& lora, double alpha,
                                             const std::map<std::string, std::string>& user) {
  std::map<std::string, std::string> labels = {
      {"tinker.run_id", run_id},
      {"tinker.session", session},
      {"tinker.lora_rank", absl::StrCat(lora.rank)},
      {"tinker.lora_alpha", absl::StrCat(alpha)},
      {"tinker.train_attn", Flag(lora.train_attn)},
      {"tinker.train_mlp", Flag(lora.train_mlp)},
      {"tinker.train_unembed", Flag(lora.train_unembed)},
  };
  for (const auto& [k, v] : user) labels["user." + k] = v;
  return labels;
}

absl::StatusOr<RunInfo> RunInfoFromPolicy(const PolicyRecord& p) {
  auto label = [&](const std::string& key) -> absl::StatusOr<std::string> {
    auto it = p.labels.find(key);
    if (it == p.labels.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("policy ", p.name, " lacks the training-run label ", key));
    }
    return it->second;
  };
  RunInfo info;
  LORADB_ASSIGN_OR_RETURN(info.run_id, label("tinker.run_id"));
  LORADB_ASSIGN_OR_RETURN(std::string rank, label("tinker.lora_rank"));
  LORADB_ASSIGN_OR_RETURN(std::string attn, label("tinker.train_attn"));
  LORADB_ASSIGN_OR_RETURN(std::string mlp, label("tinker.train_mlp"));
  LORADB_ASSIGN_OR_RETURN(std::string unembed, label("tinker.train_unembed"));
  if (!absl::SimpleAtoi(rank, &info.lora.rank)) {
    return absl::FailedPreconditionError(absl::StrCat("policy ", p.name, " has a bad rank label"));
  }
  info.lora.train_attn = attn == "1";
  info.lora.train_mlp = mlp == "1";
  info.lora.train_unembed = unembed == "1";
  info.policy = p.name;
  info.base_model = p.base;
  info.created_us = p.created_us;
  info.last_request_us = p.created_us;
  for (const auto& [k, v] : p.labels) {
    if (absl::StartsWith(k, "user.")) info.user_metadata[k.substr(5)] = v;
  }
  return info;
}

bool IsUserError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kOutOfRange:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<trainer::TokenLossKind> ParseLoss(const std::string& name) {
  if (name == "cross_entropy") return trainer::TokenLossKind::kCrossEntropy;
  if (name == "importance_sampling") return trainer::TokenLossKind::kImportanceSampling;
  if (name == "ppo") return trainer::TokenLossKind::kPpo;
  return absl::UnimplementedError(
      absl::StrCat("loss_fn '", name,
                   "' is not supported (supported: cross_entropy, importance_sampling, ppo)"));
}

// One loss_fn_inputs tensor as a 1-D float vector of `n` entries (int64 data converts exactly
// for the float inputs; target_tokens is read with ReadIds).
absl::StatusOr<std::vector<float>> ReadFloats(const TensorInput& t, const std::string& key,
                                              size_t n, size_t datum) {
  std::vector<float> out;
  if (t.dtype == TensorInput::DType::kFloat32) {
    out = t.floats;
  } else {
    out.assign(t.ints.begin(), t.ints.end());
  }
  if (out.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("datum ", datum, ": loss_fn_inputs['", key,
                                                   "'] has ", out.size(), " values for ", n,
                                                   " model_input tokens"));
  }
  for (float v : out) {
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("datum ", datum, ": loss_fn_inputs['", key, "'] has a non-finite value"));
    }
  }
  return out;
}

absl::Status CheckShape(const TensorInput& t, const std::string& key, size_t datum) {
  const size_t count = t.dtype == TensorInput::DType::kInt64 ? t.ints.size() : t.floats.size();
  if (t.shape.size() > 1) {
    return absl::UnimplementedError(
        absl::StrCat("datum ", datum, ": loss_fn_inputs['", key, "'] has ", t.shape.size(),
                     " dimensions; only 1-D [N] inputs are supported (no top-K targets)"));
  }
  if (t.shape.size() == 1 && (t.shape[0] < 0 || static_cast<size_t>(t.shape[0]) != count)) {
    return absl::InvalidArgumentError(absl::StrCat("datum ", datum, ": loss_fn_inputs['", key,
                                                   "'] has shape [", t.shape[0], "] but ", count,
                                                   " values"));
  }
  return absl::OkStatus();
}

// The trainer's datum for one Tinker datum under `loss`.
absl::StatusOr<trainer::Datum> ToTrainerDatum(const DatumInput& in, trainer::TokenLossKind loss,
                                              int64_t vocab, int64_t max_len, size_t i) {
  const size_t n = in.model_input.size();
  if (n == 0) return absl::InvalidArgumentError(absl::StrCat("datum ", i, " has no model_input"));
  if (max_len > 0 && static_cast<int64_t>(n) > max_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "datum ", i, " has ", n, " model_input tokens; the model takes at most ", max_len));
  }
  for (int64_t t : in.model_input) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("datum ", i, ": model_input token id ", t,
                                                     " is outside the vocabulary [0, ", vocab,
                                                     ")"));
    }
  }
  const bool rl = loss != trainer::TokenLossKind::kCrossEntropy;
  std::vector<std::string> required = {"target_tokens"};
  if (rl) {
    required.push_back("logprobs");
    required.push_back("advantages");
  } else {
    required.push_back("weights");
  }
  for (const std::string& key : required) {
    if (!in.loss_fn_inputs.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "datum ", i, ": ", trainer::TokenLossName(loss), " needs loss_fn_inputs['", key, "']"));
    }
  }
  for (const auto& [key, t] : in.loss_fn_inputs) {
    const bool known = key == "target_tokens" || key == "weights" ||
                       (rl && (key == "logprobs" || key == "advantages"));
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("datum ", i, ": loss_fn_inputs['", key,
                                                     "'] is not an input of ",
                                                     trainer::TokenLossName(loss)));
    }
    LORADB_RETURN_IF_ERROR(CheckShape(t, key, i));
  }
  trainer::Datum d;
  d.tokens = in.model_input;
  const TensorInput& targets = in.loss_fn_inputs.at("target_tokens");
  if (targets.dtype != TensorInput::DType::kInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat("datum ", i, ": loss_fn_inputs['target_tokens'] must be int64"));
  }
  if (targets.ints.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("datum ", i, ": loss_fn_inputs['target_tokens'] has ", targets.ints.size(),
                     " values for ", n, " model_input tokens"));
  }
  for (int64_t t : targets.ints) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "datum ", i, ": target token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  d.targets = targets.ints;
  auto weights = in.loss_fn_inputs.find("weights");
  if (weights != in.loss_fn_inputs.end()) {
    LORADB_ASSIGN_OR_RETURN(d.weights, ReadFloats(weights->second, "weights", n, i));
  } else {
    d.weights.assign(n, 1.0f);  // importance_sampling and ppo weigh every token alike
  }
  if (rl) {
    LORADB_ASSIGN_OR_RETURN(d.sampling_logprobs,
                            ReadFloats(in.loss_fn_inputs.at("logprobs"), "logprobs", n, i));
    LORADB_ASSIGN_OR_RETURN(d.advantages,
                            ReadFloats(in.loss_fn_inputs.at("advantages"), "advantages", n, i));
  }
  return d;
}

absl::StatusOr<trainer::TokenLossOptions> ReadLossConfig(
    trainer::TokenLossKind loss, const std::map<std::string, double>& config) {
  trainer::TokenLossOptions options;
  for (const auto& [key, value] : config) {
    if (loss == trainer::TokenLossKind::kPpo && key == "clip_low_threshold") {
      options.clip_low = value;
    } else if (loss == trainer::TokenLossKind::kPpo && key == "clip_high_threshold") {
      options.clip_high = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "loss_fn_config['", key, "'] is not a parameter of ", trainer::TokenLossName(loss)));
    }
  }
  if (!(options.clip_low >= 0) || !(options.clip_high > options.clip_low) ||
      !std::isfinite(options.clip_high)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ppo clip thresholds [", options.clip_low, ", ", options.clip_high,
                     "] need 0 <= clip_low_threshold < clip_high_threshold"));
  }
  return options;
}

trainer::LoraConfig ToLoraConfig(const LoraSpec& spec, double alpha) {
  trainer::LoraConfig c;
  c.rank = spec.rank;
  c.alpha = alpha;
  c.target_modules.clear();
  if (spec.train_attn)
    c.target_modules.insert(c.target_modules.end(), std::begin(kAttnModules),
                            std::end(kAttnModules));
  if (spec.train_mlp)
    c.target_modules.insert(c.target_modules.end(), std::begin(kMlpModules), std::end(kMlpModules));
  return c;
}

absl::Status ValidateLora(const LoraSpec& spec) {
  if (spec.rank < 1 || spec.rank > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_config.rank ", spec.rank, " must be in [1, 1024]"));
  }
  if (spec.train_unembed) {
    return absl::UnimplementedError(
        "lora_config.train_unembed: LoRA on the unembedding (lm_head) is not supported by this "
        "model; create the run with train_unembed=False");
  }
  if (!spec.train_attn && !spec.train_mlp) {
    return absl::InvalidArgumentError(
        "lora_config: at least one of train_attn and train_mlp must be true");
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct TrainingService::Impl {
  struct Session {
    int64_t created_us = 0;
    int64_t last_heartbeat_us = 0;
  };
  struct Run {
    std::string id, policy, session;
    LoraSpec lora;
    int index = -1;  // trainer policy; -1 until the create call has run
    bool unloaded = false;
    int64_t next_seq = 1;
    int64_t step = 0;
    int64_t created_us = 0;
    int64_t last_request_us = 0;
    uint64_t last_checkpoint = 0;
    std::map<std::string, std::string> user_metadata;
    std::map<std::string, uint64_t> checkpoint_names;  // saved by this process
  };
  struct Op {
    std::string id, run, type;
    int64_t seq = 0;  // 0: after the run's earlier calls, whatever their seq
    uint64_t order = 0;
    bool creates = false;  // runs before the run exists
    // Forward/backward calls (batched with other runs'): the batch's policy is set when it runs.
    bool forward_backward = false;
    bool forward_only = false;
    trainer::TokenBatch batch;
    // Every other call.
    std::function<absl::StatusOr<FutureValue>(Run&)> fn;
  };

  Store* store = nullptr;
  TrainingServiceOptions options;
  std::unique_ptr<model::Qwen3Model> model;
  std::unique_ptr<trainer::Trainer> trainer;

  Mutex mu;
  std::map<std::string, Session> sessions ABSL_GUARDED_BY(mu);
  std::map<std::string, Run> runs ABSL_GUARDED_BY(mu);
  std::map<std::string, FutureStatus> futures ABSL_GUARDED_BY(mu);
  std::deque<std::string> finished ABSL_GUARDED_BY(mu);  // finish order, for eviction
  std::map<std::string, std::string> future_of_key ABSL_GUARDED_BY(mu);
  std::list<Op> queue ABSL_GUARDED_BY(mu);
  uint64_t next_order ABSL_GUARDED_BY(mu) = 0;
  uint64_t next_id ABSL_GUARDED_BY(mu) = 0;
  bool stop ABSL_GUARDED_BY(mu) = false;
  bool paused ABSL_GUARDED_BY(mu) = false;
  TrainingService::Stats stats ABSL_GUARDED_BY(mu);
  std::string id_prefix;
  std::thread worker;

  // ---- submission
  absl::StatusOr<Run*> LiveRun(const std::string& run_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = runs.find(run_id);
    if (it == runs.end() || it->second.unloaded) {
      LORADB_RETURN_IF_ERROR(PolicyOfRun(run_id).status());
      return absl::NotFoundError(
          absl::StrCat("training run ", run_id,
                       it == runs.end() ? " is not loaded in this server" : " was unloaded",
                       " (create a run from one of its checkpoints to continue it)"));
    }
    return &it->second;
  }

  // Queues `op` unless its key was submitted before (then returns that future).
  absl::StatusOr<Submitted> Enqueue(Op op, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (auto it = future_of_key.find(key); it != future_of_key.end()) {
      return Submitted{it->second, op.run};
    }
    auto run = runs.find(op.run);
    if (op.seq > 0 && run != runs.end() && op.seq < run->second.next_seq) {
      return absl::InvalidArgumentError(absl::StrCat("seq_id ", op.seq, " of run ", op.run,
                                                     " has already run (next is ",
                                                     run->second.next_seq, ")"));
    }
    if (op.seq < 0) return absl::InvalidArgumentError("seq_id must be >= 0");
    op.id = absl::StrCat(id_prefix, "-", ++next_id);
    op.order = next_order++;
    FutureStatus f;
    f.request_id = op.id;
    f.run_id = op.run;
    f.request_type = op.type;
    futures[op.id] = f;
    future_of_key[key] = op.id;
    if (run != runs.end()) run->second.last_request_us = NowMicros();
    Submitted s{op.id, op.run};
    queue.push_back(std::move(op));
    return s;
  }

  std::string Key(const std::string& run, int64_t seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return seq > 0 ? absl::StrCat(run, "#", seq) : absl::StrCat("op#", next_order);
  }

  static Op MakeOp(const std::string& run, int64_t seq, const std::string& type) {
    Op op;
    op.run = run;
    op.seq = seq;
    op.type = type;
    return op;
  }

  // Queues a call of a loaded run.
  absl::StatusOr<Submitted> SubmitToLiveRun(Op op) {
    MutexLock lock(&mu);
    LORADB_RETURN_IF_ERROR(LiveRun(op.run).status());
    const std::string key = Key(op.run, op.seq);
    return Enqueue(std::move(op), key);
  }

  // ---- the worker
  bool Eligible(const Op& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = runs.find(op.run);
    if (it == runs.end()) return op.creates;
    const Run& r = it->second;
    if (!op.creates && r.index < 0) return false;
    if (op.seq > 0) return op.seq == r.next_seq;
    // Unordered calls run after every earlier call of their run.
    for (const Op& other : queue) {
      if (&other == &op) return true;
      if (other.run == op.run) return false;
    }
    return true;
  }

  bool HasWork() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (stop) return true;
    if (paused) return false;
    for (const Op& op : queue) {
      if (Eligible(op)) return true;
    }
    return false;
  }

  void Finish(const std::string& id, absl::StatusOr<FutureValue> result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    FutureStatus& f = futures[id];
    if (result.ok()) {
      f.state = FutureState::kDone;
      f.value = std::move(result).value();
    } else {
      f.state = FutureState::kFailed;
      f.error = result.status();
      f.user_error = IsUserError(result.status());
    }
    finished.push_back(id);
    while (finished.size() > kMaxFinishedFutures) {
      futures.erase(finished.front());
      finished.pop_front();
    }
  }

  void AfterRun(const Op& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = runs.find(op.run);
    if (it == runs.end()) return;
    if (op.seq > 0) it->second.next_seq = std::max(it->second.next_seq, op.seq + 1);
    if (it->second.index >= 0) it->second.step = trainer->step(it->second.index);
  }

  void WorkerLoop() {
    if (options.threads > 0) at::set_num_threads(static_cast<int>(options.threads));
    model::EnableCpuBlockCache(options.cpu_block_cache_bytes);
    while (true) {
      std::vector<Op> picked;
      {
        MutexLock lock(&mu);
        mu.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return HasWork(); });
        if (stop) break;
        auto first = queue.end();
        for (auto it = queue.begin(); it != queue.end(); ++it) {
          if (Eligible(*it)) {
            first = it;
            break;
          }
        }
        const bool fb = first->forward_backward;
        const bool fwd_only = first->forward_only;
        picked.push_back(std::move(*first));
        queue.erase(first);
        if (fb) {
          // Every other ready forward/backward of the same kind joins the batch, and each run's
          // following calls of that kind too (the SDK's chunks of one call).
          bool more = true;
          while (more) {
            more = false;
            for (auto it = queue.begin(); it != queue.end(); ++it) {
              if (!it->forward_backward || it->forward_only != fwd_only) continue;
              bool ready = Eligible(*it);
              if (!ready && it->seq > 0) {
                for (const Op& p : picked) {
                  if (p.run == it->run && p.seq > 0 && it->seq == p.seq + 1) ready = true;
                }
              }
              if (!ready) continue;
              picked.push_back(std::move(*it));
              queue.erase(it);
              more = true;
              break;
            }
          }
        }
        std::set<std::string> batch_runs;
        for (Op& op : picked) {
          auto r = runs.find(op.run);
          if (r != runs.end()) op.batch.policy = r->second.index;
          batch_runs.insert(op.run);
        }
        ++stats.trainer_calls;
        if (fb) {
          stats.forward_backward_calls += static_cast<int64_t>(picked.size());
          if (batch_runs.size() > 1 && options.shared_batches) {
            stats.shared_calls += static_cast<int64_t>(picked.size());
          }
        }
      }
      if (picked.front().forward_backward) {
        RunForwardBackward(&picked);
      } else {
        Op& op = picked.front();
        Run run_view;
        {
          MutexLock lock(&mu);
          auto r = runs.find(op.run);
          if (r != runs.end()) run_view = r->second;
        }
        absl::StatusOr<FutureValue> result = op.fn(run_view);
        MutexLock lock(&mu);
        auto r = runs.find(op.run);
        if (r != runs.end() && op.creates && !result.ok()) {
          // The run never came to be: so neither do the calls queued for it.
          runs.erase(r);
          for (auto it = queue.begin(); it != queue.end();) {
            if (it->run != op.run) {
              ++it;
              continue;
            }
            Finish(it->id, absl::FailedPreconditionError(absl::StrCat(
                               "creating run ", op.run, " failed: ", result.status().message())));
            it = queue.erase(it);
          }
        } else if (r != runs.end()) {
          // The call may have changed the run (created it, saved a checkpoint, unloaded it).
          const int64_t next = r->second.next_seq;
          const int64_t last_request = r->second.last_request_us;
          r->second = run_view;
          r->second.next_seq = next;
          r->second.last_request_us = last_request;
        }
        AfterRun(op);
        Finish(op.id, std::move(result));
      }
    }
    // Fail whatever is still queued.
    MutexLock lock(&mu);
    for (const Op& op : queue) Finish(op.id, absl::CancelledError("the training service stopped"));
    queue.clear();
  }

  void RunForwardBackward(std::vector<Op>* ops) {
    std::vector<trainer::TokenBatch> batches;
    for (const Op& op : *ops) batches.push_back(op.batch);
    const bool backward = !ops->front().forward_only;
    absl::StatusOr<std::vector<trainer::TokenBatchResult>> all =
        absl::FailedPreconditionError("not run as one batch");
    if (ops->size() == 1 || options.shared_batches) all = trainer->TokenLosses(batches, backward);
    std::vector<absl::StatusOr<trainer::TokenBatchResult>> results;
    if (all.ok()) {
      for (auto& r : *all) results.push_back(std::move(r));
    } else if (ops->size() == 1) {
      results.push_back(all.status());
    } else {
      // One call after another (the default), or a shared batch failed as a whole (nothing was
      // accumulated): each call runs alone and gets its own answer.
      for (const trainer::TokenBatch& b : batches) {
        auto one = trainer->TokenLosses({b}, backward);
        if (one.ok()) {
          results.push_back(std::move((*one)[0]));
        } else {
          results.push_back(one.status());
        }
      }
    }
    MutexLock lock(&mu);
    for (size_t i = 0; i < ops->size(); ++i) {
      const Op& op = (*ops)[i];
      AfterRun(op);
      if (!results[i].ok()) {
        Finish(op.id, results[i].status());
        continue;
      }
      ForwardBackwardResult out;
      trainer::TokenBatchResult& r = *results[i];
      for (size_t d = 0; d < r.logprobs.size(); ++d) {
        out.outputs.push_back({std::move(r.logprobs[d]), std::move(r.elementwise_loss[d])});
      }
      out.metrics["loss:sum"] = r.loss_sum;
      Finish(op.id, FutureValue(std::move(out)));
    }
  }

  // ---- store helpers (thread-safe: the Store is)
  absl::StatusOr<std::string> CheckpointName(const CheckpointRecord& rec) const {
    if (rec.rollout.bytes == 0) return std::string();
    LORADB_ASSIGN_OR_RETURN(std::string bytes, store->ReadOpaqueBlob(rec.rollout));
    if (!absl::StartsWith(bytes, kCheckpointNameTag)) return std::string();
    return bytes.substr(strlen(kCheckpointNameTag));
  }

  // The newest checkpoint of `policy` saved under `name`.
  absl::StatusOr<CheckpointRecord> FindCheckpoint(const std::string& policy,
                                                  const std::string& name) const {
    LORADB_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> all, store->ListCheckpoints(policy));
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      LORADB_ASSIGN_OR_RETURN(std::string n, CheckpointName(*it));
      if (n == name) return *it;
    }
    return absl::NotFoundError(absl::StrCat("no checkpoint '", name, "' in ", policy));
  }

  // A run's training checkpoint (`weights/NAME`) or sampler weights (`sampler_weights/NAME`).
  static CheckpointInfo MakeCheckpointInfo(const std::string& run_id, bool sampler,
                                           const std::string& name, int64_t time_us,
                                           uint64_t size_bytes, uint64_t step, uint64_t store_id) {
    CheckpointInfo c;
    c.checkpoint_id = absl::StrCat(sampler ? "sampler_weights/" : "weights/", name);
    c.type = sampler ? "sampler" : "training";
    c.tinker_path = absl::StrCat(kPathScheme, run_id, "/", c.checkpoint_id);
    c.time_us = time_us;
    c.size_bytes = size_bytes;
    c.step = static_cast<int64_t>(step);
    c.store_id = store_id;
    return c;
  }

  static CheckpointInfo TrainingCheckpointInfo(const std::string& run_id, const std::string& name,
                                               const CheckpointRecord& rec) {
    return MakeCheckpointInfo(run_id, false, name, rec.created_us,
                              rec.master.bytes + rec.optimizer.bytes + rec.gradients.bytes,
                              rec.step, rec.id);
  }

  // Training-run facts of `run_id` from the store.
  absl::StatusOr<RunInfo> StoredRun(const std::string& run_id) const {
    LORADB_ASSIGN_OR_RETURN(std::string policy, PolicyOfRun(run_id));
    absl::StatusOr<PolicyRecord> p = store->GetPolicy(policy);
    if (absl::IsNotFound(p.status())) {
      return absl::NotFoundError(absl::StrCat("no training run ", run_id));
    }
    LORADB_RETURN_IF_ERROR(p.status());
    return RunInfoFromPolicy(*p);
  }

  // Adds the trainer policy and the store policy of a run (worker thread).
  absl::Status Materialise(Run& run) {
    trainer::PolicyOptions po;
    po.name = run.policy;
    po.lora = ToLoraConfig(run.lora, options.lora_alpha);
    po.seed = run.lora.seed.has_value() ? *run.lora.seed
                                        : static_cast<uint64_t>(std::hash<std::string>()(run.id));
    LORADB_ASSIGN_OR_RETURN(int index, trainer->AddPolicy(po));
    absl::StatusOr<PolicyRecord> existing = store->GetPolicy(run.policy);
    if (existing.ok()) {
      return absl::AlreadyExistsError(absl::StrCat("store policy ", run.policy, " exists already"));
    }
    LORADB_RETURN_IF_ERROR(store
                               ->CreatePolicy(run.policy, options.base_name,
                                              RunLabels(run.id, run.session, run.lora,
                                                        options.lora_alpha, run.user_metadata))
                               .status());
    run.index = index;
    return absl::OkStatus();
  }

  // Restores checkpoint `rec` into the run (with its optimizer state, or a fresh one).
  absl::Status Restore(Run& run, const CheckpointRecord& rec, bool with_optimizer) {
    LORADB_ASSIGN_OR_RETURN(trainer::PolicySnapshot snap, trainer::ReadSnapshot(*store, rec));
    if (!with_optimizer) {
      snap.optimizer = {{"adamw.step", at::zeros({1}, at::kLong)}};
      snap.gradients.clear();
      snap.micro_steps = 0;
      snap.scheduler_position = 0;
    }
    LORADB_RETURN_IF_ERROR(trainer->Restore(run.index, snap));
    run.step = trainer->step(run.index);
    return absl::OkStatus();
  }
};

// ---------------------------------------------------------------------------------------------

TrainingService::TrainingService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TrainingService::~TrainingService() {
  {
    MutexLock lock(&impl_->mu);
    impl_->stop = true;
  }
  if (impl_->worker.joinable()) impl_->worker.join();
  // The service's tensors die with it; what the block cache kept of them goes back now.
  impl_.reset();
  model::TrimCpuBlockCache();
}

absl::StatusOr<std::unique_ptr<TrainingService>> TrainingService::Create(
    Store* store, const TrainingServiceOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("the training service needs a store");
  auto impl = std::make_unique<Impl>();
  impl->store = store;
  impl->options = options;
  if (impl->options.base_name.empty()) {
    std::string dir = options.model_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    impl->options.base_name = dir.substr(dir.find_last_of('/') + 1);
  }
  if (!(options.lora_alpha > 0)) return absl::InvalidArgumentError("lora_alpha must be > 0");
  LORADB_ASSIGN_OR_RETURN(impl->model, model::Qwen3Model::Load(options.model_dir));
  if (!store->GetBase(impl->options.base_name).ok()) {
    LORADB_RETURN_IF_ERROR(
        store->AddBaseFromConfig(impl->options.base_name, options.model_dir + "/config.json")
            .status());
  }
  impl->trainer = std::make_unique<trainer::Trainer>(impl->model.get());
  // Ids unique across restarts of a server on the same store: runs are named after sessions.
  std::random_device rd;
  impl->id_prefix = absl::StrCat(absl::Hex(NowMicros()), absl::Hex(rd()));
  Impl* raw = impl.get();
  impl->worker = std::thread([raw] { raw->WorkerLoop(); });
  return std::unique_ptr<TrainingService>(new TrainingService(std::move(impl)));
}

void TrainingService::Pause() {
  MutexLock lock(&impl_->mu);
  impl_->paused = true;
}

void TrainingService::Resume() {
  MutexLock lock(&impl_->mu);
  impl_->paused = false;
}

TrainingService::Stats TrainingService::stats() const {
  MutexLock lock(&impl_->mu);
  return impl_->stats;
}

const std::string& TrainingService::base_model() const { return impl_->options.base_name; }
int64_t TrainingService::vocab_size() const { return impl_->model->config().vocab_size; }
int64_t TrainingService::max_context_length() const {
  return impl_->model->config().max_position_embeddings;
}

absl::StatusOr<std::string> TrainingService::CreateSession(
    const std::vector<std::string>& /*tags*/,
    const std::map<std::string, std::string>& /*metadata*/) {
  MutexLock lock(&impl_->mu);
  std::string id = absl::StrCat("s", impl_->id_prefix, "-", ++impl_->next_id);
  const int64_t now = NowMicros();
  impl_->sessions[id] = {now, now};
  return id;
}

absl::Status TrainingService::Heartbeat(const std::string& session_id) {
  MutexLock lock(&impl_->mu);
  auto it = impl_->sessions.find(session_id);
  if (it == impl_->sessions.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id));
  }
  it->second.last_heartbeat_us = NowMicros();
  return absl::OkStatus();
}

absl::StatusOr<Submitted> TrainingService::CreateRun(const CreateRunRequest& request) {
  if (request.base_model != impl_->options.base_name) {
    return absl::InvalidArgumentError(absl::StrCat("base_model '", request.base_model,
                                                   "' is not served here (serving '",
                                                   impl_->options.base_name, "')"));
  }
  if (request.optimizer != "adamw") {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer '", request.optimizer, "' is not supported (only adamw)"));
  }
  LORADB_RETURN_IF_ERROR(ValidateLora(request.lora));
  if (request.model_seq_id < 0) return absl::InvalidArgumentError("model_seq_id must be >= 0");
  MutexLock lock(&impl_->mu);
  if (!impl_->sessions.count(request.session_id)) {
    return absl::NotFoundError(absl::StrCat("no session ", request.session_id));
  }
  const std::string run_id = RunIdOf(request.session_id, request.model_seq_id);
  const std::string key = absl::StrCat("create#", run_id);
  if (impl_->future_of_key.count(key)) return Submitted{impl_->future_of_key[key], run_id};
  if (impl_->runs.count(run_id)) {
    return absl::AlreadyExistsError(absl::StrCat("training run ", run_id, " exists"));
  }
  LORADB_ASSIGN_OR_RETURN(std::string policy, PolicyOfRun(run_id));
  Impl::Run run;
  run.id = run_id;
  run.policy = policy;
  run.session = request.session_id;
  run.lora = request.lora;
  run.created_us = run.last_request_us = NowMicros();
  run.user_metadata = request.user_metadata;
  impl_->runs[run_id] = run;
  Impl::Op op;
  op.run = run_id;
  op.type = "CreateModel";
  op.creates = true;
  Impl* impl = impl_.get();
  op.fn = [impl](Impl::Run& r) -> absl::StatusOr<FutureValue> {
    LORADB_RETURN_IF_ERROR(impl->Materialise(r));
    return FutureValue(CreateRunResult{r.id});
  };
  return impl_->Enqueue(std::move(op), key);
}

absl::StatusOr<Submitted> TrainingService::ForwardBackward(const ForwardBackwardRequest& request) {
  LORADB_ASSIGN_OR_RETURN(trainer::TokenLossKind loss, ParseLoss(request.loss_fn));
  LORADB_ASSIGN_OR_RETURN(trainer::TokenLossOptions loss_options,
                          ReadLossConfig(loss, request.loss_fn_config));
  if (request.data.empty()) return absl::InvalidArgumentError("forward_backward has no data");
  Impl::Op op = Impl::MakeOp(request.run_id, request.seq_id,
                             request.forward_only ? "Forward" : "ForwardBackward");
  op.forward_backward = true;
  op.forward_only = request.forward_only;
  op.batch.loss = loss;
  op.batch.options = loss_options;
  for (size_t i = 0; i < request.data.size(); ++i) {
    LORADB_ASSIGN_OR_RETURN(trainer::Datum d, ToTrainerDatum(request.data[i], loss, vocab_size(),
                                                             max_context_length(), i));
    op.batch.data.push_back(std::move(d));
  }
  return impl_->SubmitToLiveRun(std::move(op));
}

absl::StatusOr<Submitted> TrainingService::OptimStep(const std::string& run_id, int64_t seq_id,
                                                     const AdamParams& params) {
  trainer::AdamWOptions hyper;
  hyper.beta1 = params.beta1;
  hyper.beta2 = params.beta2;
  hyper.eps = params.eps;
  hyper.weight_decay = params.weight_decay;
  hyper.max_grad_norm = params.grad_clip_norm;
  LORADB_RETURN_IF_ERROR(trainer::ValidateAdamWOptions(hyper));
  if (!(params.learning_rate >= 0) || !std::isfinite(params.learning_rate)) {
    return absl::InvalidArgumentError(
        absl::StrCat("adam_params.learning_rate ", params.learning_rate, " must be >= 0"));
  }
  if (!(params.grad_clip_norm >= 0)) {
    return absl::InvalidArgumentError("adam_params.grad_clip_norm must be >= 0");
  }
  Impl::Op op = Impl::MakeOp(run_id, seq_id, "OptimStep");
  Impl* impl = impl_.get();
  const double lr = params.learning_rate;
  op.fn = [impl, lr, hyper](Impl::Run& r) -> absl::StatusOr<FutureValue> {
    LORADB_ASSIGN_OR_RETURN(trainer::StepStats stats, impl->trainer->OptimStep(r.index, lr, hyper));
    r.step = impl->trainer->step(r.index);
    OptimStepResult out;
    out.metrics = {{"grad_norm", stats.grad_norm},
                   {"learning_rate", stats.lr},
                   {"step", static_cast<double>(r.step)}};
    return FutureValue(std::move(out));
  };
  return impl_->SubmitToLiveRun(std::move(op));
}

absl::StatusOr<Submitted> TrainingService::SaveWeights(const SaveWeightsRequest& request) {
  if (!request.name.empty())
    LORADB_RETURN_IF_ERROR(ValidateCheckpointName("checkpoint", request.name));
  Impl::Op op = Impl::MakeOp(request.run_id, request.seq_id, "SaveWeights");
  Impl* impl = impl_.get();
  const std::string given = request.name;
  const bool overwrite = request.overwrite;
  op.fn = [impl, given, overwrite](Impl::Run& r) -> absl::StatusOr<FutureValue> {
    const std::string name = given.empty() ? absl::StrCat("step-", r.step) : given;
    if (!overwrite) {
      bool taken = r.checkpoint_names.count(name) > 0;
      if (!taken) {
        absl::StatusOr<CheckpointRecord> old = impl->FindCheckpoint(r.policy, name);
        if (!absl::IsNotFound(old.status())) LORADB_RETURN_IF_ERROR(old.status());
        taken = old.ok();
      }
      if (taken) {
        return absl::AlreadyExistsError(absl::StrCat("run ", r.id, " has a checkpoint named '",
                                                     name, "' (save with overwrite=True)"));
      }
    }
    LORADB_ASSIGN_OR_RETURN(
        CheckpointRecord rec,
        trainer::SaveCheckpoint(impl->store, *impl->trainer, r.index, r.last_checkpoint,
                                absl::StrCat(kCheckpointNameTag, name)));
    r.last_checkpoint = rec.id;
    r.checkpoint_names[name] = rec.id;
    SaveWeightsResult out;
    out.checkpoint = impl->TrainingCheckpointInfo(r.id, name, rec);
    out.path = out.checkpoint.tinker_path;
    return FutureValue(std::move(out));
  };
  return impl_->SubmitToLiveRun(std::move(op));
}

absl::StatusOr<Submitted> TrainingService::LoadWeights(const LoadWeightsRequest& request) {
  const bool create = !request.session_id.empty();
  if (create == !request.run_id.empty()) {
    return absl::InvalidArgumentError(
        "load_weights needs either model_id (onto a run) or session_id + model_seq_id (a new run)");
  }
  LORADB_ASSIGN_OR_RETURN(ParsedPath path, ParsePath(request.path));
  if (path.sampler) {
    return absl::InvalidArgumentError(
        absl::StrCat("path ", request.path,
                     " names sampler weights; load_weights takes tinker://RUN/weights/NAME"));
  }
  // The checkpoint and the LoRA shape of the run that saved it.
  LORADB_ASSIGN_OR_RETURN(RunInfo source, impl_->StoredRun(path.run_id));
  LORADB_ASSIGN_OR_RETURN(CheckpointRecord rec, impl_->FindCheckpoint(source.policy, path.name));
  if (create && !request.base_model.empty() && request.base_model != source.base_model) {
    return absl::InvalidArgumentError(absl::StrCat("base_model '", request.base_model,
                                                   "' differs from the checkpoint's base '",
                                                   source.base_model, "'"));
  }
  if (source.base_model != impl_->options.base_name) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", request.path, " is on base ",
                                                      source.base_model, "; serving ",
                                                      impl_->options.base_name));
  }
  Impl::Op op;
  op.type = "LoadWeights";
  Impl* impl = impl_.get();
  const bool with_optimizer = request.optimizer;
  const std::string loaded_path = request.path;
  MutexLock lock(&impl_->mu);
  std::string key;
  if (create) {
    if (request.model_seq_id < 0) return absl::InvalidArgumentError("model_seq_id must be >= 0");
    if (!impl_->sessions.count(request.session_id)) {
      return absl::NotFoundError(absl::StrCat("no session ", request.session_id));
    }
    op.run = RunIdOf(request.session_id, request.model_seq_id);
    key = absl::StrCat("create#", op.run);
    if (impl_->future_of_key.count(key)) return Submitted{impl_->future_of_key[key], op.run};
    if (impl_->runs.count(op.run)) {
      return absl::AlreadyExistsError(absl::StrCat("training run ", op.run, " exists"));
    }
    LORADB_ASSIGN_OR_RETURN(std::string policy, PolicyOfRun(op.run));
    Impl::Run run;
    run.id = op.run;
    run.policy = policy;
    run.session = request.session_id;
    run.lora = source.lora;
    run.created_us = run.last_request_us = NowMicros();
    run.user_metadata = request.user_metadata;
    impl_->runs[op.run] = run;
    op.creates = true;
    op.fn = [impl, rec, with_optimizer, loaded_path](Impl::Run& r) -> absl::StatusOr<FutureValue> {
      LORADB_RETURN_IF_ERROR(impl->Materialise(r));
      LORADB_RETURN_IF_ERROR(impl->Restore(r, rec, with_optimizer));
      return FutureValue(LoadWeightsResult{loaded_path, r.id});
    };
  } else {
    LORADB_ASSIGN_OR_RETURN(Impl::Run * run, impl_->LiveRun(request.run_id));
    op.run = run->id;
    op.seq = request.seq_id;
    key = impl_->Key(op.run, op.seq);
    op.fn = [impl, rec, with_optimizer, loaded_path](Impl::Run& r) -> absl::StatusOr<FutureValue> {
      LORADB_RETURN_IF_ERROR(impl->Restore(r, rec, with_optimizer));
      return FutureValue(LoadWeightsResult{loaded_path, r.id});
    };
  }
  return impl_->Enqueue(std::move(op), key);
}

absl::StatusOr<Submitted> TrainingService::SaveWeightsForSampler(
    const SaveForSamplerRequest& request) {
  if (!request.name.empty())
    LORADB_RETURN_IF_ERROR(ValidateCheckpointName("sampler", request.name));
  Impl::Op op = Impl::MakeOp(request.run_id, request.seq_id, "SaveWeightsForSampler");
  Impl* impl = impl_.get();
  const std::string name = request.name;
  op.fn = [impl, name](Impl::Run& r) -> absl::StatusOr<FutureValue> {
    const std::string alias = name.empty() ? "latest" : absl::StrCat(kSamplerAliasPrefix, name);
    LORADB_ASSIGN_OR_RETURN(RevisionRecord rev,
                            trainer::PublishForSampling(impl->store, *impl->trainer, r.index,
                                                        r.last_checkpoint, alias));
    SaveForSamplerResult out;
    out.revision_id = rev.id;
    out.revision_ref = absl::StrCat(r.policy, "@", rev.seq);
    out.path = absl::StrCat(kPathScheme, r.id, "/sampler_weights/",
                            name.empty() ? absl::StrCat("@", rev.seq) : name);
    return FutureValue(std::move(out));
  };
  return impl_->SubmitToLiveRun(std::move(op));
}

absl::StatusOr<Submitted> TrainingService::UnloadRun(const std::string& run_id, int64_t seq_id) {
  Impl::Op op = Impl::MakeOp(run_id, seq_id, "UnloadModel");
  op.fn = [](Impl::Run& r) -> absl::StatusOr<FutureValue> {
    r.unloaded = true;
    return FutureValue(UnloadResult{r.id});
  };
  return impl_->SubmitToLiveRun(std::move(op));
}

absl::StatusOr<Submitted> TrainingService::Sample(const SampleRequest& request) {
  if (request.prompt.empty()) return absl::InvalidArgumentError("sample: the prompt is empty");
  for (int64_t t : request.prompt) {
    if (t < 0 || t >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample: prompt token id ", t, " is outside the vocabulary [0, ", vocab_size(), ")"));
    }
  }
  if (request.num_samples < 1 || request.num_samples > 1024) {
    return absl::InvalidArgumentError("sample: num_samples must be in [1, 1024]");
  }
  if (request.max_tokens < 1) return absl::InvalidArgumentError("sample: max_tokens must be >= 1");
  if (static_cast<int64_t>(request.prompt.size()) + request.max_tokens > max_context_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sample: prompt plus max_tokens exceeds the context length ", max_context_length()));
  }
  if (!(request.temperature >= 0) || !std::isfinite(request.temperature)) {
    return absl::InvalidArgumentError("sample: temperature must be >= 0");
  }
  Impl::Op op = Impl::MakeOp(request.run_id, 0, "Sample");
  Impl* impl = impl_.get();
  SampleRequest req = request;
  op.fn = [impl, req](Impl::Run& r) -> absl::StatusOr<FutureValue> {
    std::vector<trainer::SampleRequest> requests(req.num_samples);
    for (auto& s : requests) {
      s.policy = r.index;
      s.prompt = req.prompt;
      s.max_tokens = req.max_tokens;
      s.temperature = req.temperature;
      s.stop_tokens = req.stop_tokens;
    }
    LORADB_ASSIGN_OR_RETURN(std::vector<trainer::SampleResult> done,
                            impl->trainer->Sample(requests));
    SampleResult out;
    for (auto& d : done) {
      SampledSequence s;
      const bool stopped =
          !d.tokens.empty() && std::find(req.stop_tokens.begin(), req.stop_tokens.end(),
                                         d.tokens.back()) != req.stop_tokens.end();
      s.stop_reason = stopped ? "stop" : "length";
      s.tokens = std::move(d.tokens);
      s.logprobs = std::move(d.logprobs);
      out.sequences.push_back(std::move(s));
    }
    return FutureValue(std::move(out));
  };
  return impl_->SubmitToLiveRun(std::move(op));
}

absl::StatusOr<FutureStatus> TrainingService::Retrieve(const std::string& request_id,
                                                       absl::Duration wait) {
  MutexLock lock(&impl_->mu);
  auto it = impl_->futures.find(request_id);
  if (it == impl_->futures.end()) {
    return absl::NotFoundError(absl::StrCat("no request ", request_id));
  }
  if (it->second.state == FutureState::kPending && wait > absl::ZeroDuration()) {
    Impl* impl = impl_.get();
    auto done = [impl, &request_id]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      auto f = impl->futures.find(request_id);
      return f == impl->futures.end() || f->second.state != FutureState::kPending;
    };
    impl_->mu.AwaitWithTimeout(done, wait);
    it = impl_->futures.find(request_id);
    if (it == impl_->futures.end()) {
      return absl::NotFoundError(absl::StrCat("no request ", request_id));
    }
  }
  return it->second;
}

absl::StatusOr<RunInfo> TrainingService::GetRun(const std::string& run_id) const {
  RunInfo info;
  bool loaded = false;
  {
    MutexLock lock(&impl_->mu);
    auto it = impl_->runs.find(run_id);
    if (it != impl_->runs.end() && it->second.index >= 0) {
      const Impl::Run& r = it->second;
      info.run_id = r.id;
      info.policy = r.policy;
      info.base_model = impl_->options.base_name;
      info.lora = r.lora;
      info.loaded = !r.unloaded;
      info.step = r.step;
      info.created_us = r.created_us;
      info.last_request_us = r.last_request_us;
      info.user_metadata = r.user_metadata;
      loaded = true;
    }
  }
  if (!loaded) {
    LORADB_ASSIGN_OR_RETURN(info, impl_->StoredRun(run_id));
  }
  LORADB_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ListCheckpoints(run_id));
  for (const CheckpointInfo& c : all) {
    auto& last = c.type == "training" ? info.last_checkpoint : info.last_sampler_checkpoint;
    if (!last.has_value() || last->time_us <= c.time_us) last = c;
  }
  return info;
}

absl::StatusOr<std::vector<RunInfo>> TrainingService::ListRuns() const {
  LORADB_ASSIGN_OR_RETURN(std::vector<PolicyRecord> policies, impl_->store->ListPolicies());
  std::vector<RunInfo> out;
  for (const PolicyRecord& p : policies) {
    if (!absl::StartsWith(p.name, kPolicyPrefix) || !p.labels.count("tinker.run_id")) continue;
    LORADB_ASSIGN_OR_RETURN(RunInfo info, GetRun(p.labels.at("tinker.run_id")));
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const RunInfo& a, const RunInfo& b) { return a.created_us > b.created_us; });
  return out;
}

absl::StatusOr<std::vector<CheckpointInfo>> TrainingService::ListCheckpoints(
    const std::string& run_id) const {
  LORADB_ASSIGN_OR_RETURN(std::string policy, PolicyOfRun(run_id));
  absl::StatusOr<PolicyRecord> p = impl_->store->GetPolicy(policy);
  if (absl::IsNotFound(p.status())) {
    // Created but not yet materialised: nothing saved.
    MutexLock lock(&impl_->mu);
    if (impl_->runs.count(run_id)) return std::vector<CheckpointInfo>{};
    return absl::NotFoundError(absl::StrCat("no training run ", run_id));
  }
  LORADB_RETURN_IF_ERROR(p.status());
  LORADB_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> all, impl_->store->ListCheckpoints(policy));
  std::map<std::string, CheckpointInfo> newest;  // by name
  for (const CheckpointRecord& rec : all) {
    LORADB_ASSIGN_OR_RETURN(std::string name, impl_->CheckpointName(rec));
    if (name.empty()) continue;
    CheckpointInfo c = impl_->TrainingCheckpointInfo(run_id, name, rec);
    auto it = newest.find(name);
    if (it == newest.end() || it->second.store_id < c.store_id) newest[name] = c;
  }
  std::vector<CheckpointInfo> out;
  for (auto& [name, c] : newest) out.push_back(c);
  LORADB_ASSIGN_OR_RETURN(std::vector<AliasEntry> aliases, impl_->store->ListAliases(policy));
  for (const AliasEntry& a : aliases) {
    if (!absl::StartsWith(a.alias, kSamplerAliasPrefix)) continue;
    LORADB_ASSIGN_OR_RETURN(RevisionRecord rev, impl_->store->GetRevision(a.revision));
    out.push_back(
        Impl::MakeCheckpointInfo(run_id, true, a.alias.substr(strlen(kSamplerAliasPrefix)),
                                 rev.created_us, rev.blob.bytes, rev.source.step, rev.id));
  }
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return std::make_pair(a.time_us, a.tinker_path) < std::make_pair(b.time_us, b.tinker_path);
  });
  return out;
}

absl::StatusOr<WeightsInfo> TrainingService::GetWeightsInfo(const std::string& tinker_path) const {
  LORADB_ASSIGN_OR_RETURN(ParsedPath path, ParsePath(tinker_path));
  LORADB_ASSIGN_OR_RETURN(RunInfo run, impl_->StoredRun(path.run_id));
  if (path.sampler) {
    LORADB_RETURN_IF_ERROR(ResolveSamplerPath(tinker_path).status());
  } else {
    LORADB_RETURN_IF_ERROR(impl_->FindCheckpoint(run.policy, path.name).status());
  }
  WeightsInfo info;
  info.base_model = run.base_model;
  info.lora_rank = run.lora.rank;
  info.train_attn = run.lora.train_attn;
  info.train_mlp = run.lora.train_mlp;
  info.train_unembed = run.lora.train_unembed;
  return info;
}

absl::StatusOr<RevisionRecord> TrainingService::ResolveSamplerPath(
    const std::string& tinker_path) const {
  LORADB_ASSIGN_OR_RETURN(ParsedPath path, ParsePath(tinker_path));
  if (!path.sampler) {
    return absl::InvalidArgumentError(absl::StrCat(
        "path ", tinker_path, " names a training checkpoint; sampling takes sampler_weights"));
  }
  LORADB_ASSIGN_OR_RETURN(std::string policy, PolicyOfRun(path.run_id));
  absl::StatusOr<RevisionRecord> rev;
  uint64_t seq = 0;
  if (absl::StartsWith(path.name, "@") && absl::SimpleAtoi(path.name.substr(1), &seq)) {
    rev = impl_->store->GetRevision(policy, seq);
  } else {
    rev = impl_->store->GetRevisionByAlias(policy, absl::StrCat(kSamplerAliasPrefix, path.name));
  }
  if (absl::IsNotFound(rev.status())) {
    return absl::NotFoundError(absl::StrCat("no sampler weights at ", tinker_path));
  }
  return rev;
}

}  // namespace loradb::training

#include "compute/demo/demo.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compute/decoder/decoder.h"
#include "compute/model/checkpoint.h"
#include "compute/model/kernel_lora_applier.h"
#include "compute/model/qwen3_model.h"
#include "compute/trainer/checkpoint.h"
#include "compute/trainer/tasks.h"
#include "compute/trainer/trainer.h"
#include "storage/formats/model_config.h"
#include "storage/store/store.h"
#include "storage/store/store_tiers.h"
#include "storage/util/status_macros.h"

namespace loradb::demo {
namespace {

namespace fs = std::filesystem;

// The demo base: a tiny Qwen3 (a few MB), small enough to train four policies on two cores.
constexpr char kBaseConfig[] = R"({
  "model_type": "qwen3", "vocab_size": 1024, "hidden_size": 128, "intermediate_size": 256,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
  "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "torch_dtype": "float32"})";
constexpr char kBaseName[] = "tiny-qwen3";

// One demo policy: a toy task, its loss, and its step budget.
struct PolicyPlan {
  std::string name;
  std::string task;
  uint64_t task_seed;
  int64_t sft_warm_steps;  // GRPO: SFT steps on the task's data first (a warm start)
  int64_t steps;           // steps with the task's own loss
  int64_t early_promote;   // optimizer step at which a first revision goes to `serving`
  double lr;               // AdamW learning rate (constant)
};

std::vector<PolicyPlan> Plans(bool quick) {
  const int64_t q = quick ? 4 : 1;
  return {
      {"acme/lookup-a", "mapping", 11, 0, 60 / q, 10 / q, 1e-2},
      {"acme/lookup-b", "mapping", 22, 0, 60 / q, 10 / q, 1e-2},
      {"acme/tone", "preference", 33, 0, 30 / q, 6 / q, 1e-2},
      // GRPO at a lower rate: at 1e-2 its updates overshoot (the sampled reward rises less and
      // falls back on longer runs).
      {"acme/math", "arithmetic", 44, 15 / q, 40 / q, 15 / q, 3e-3},
  };
}

const char* LossName(trainer::LossKind k) {
  switch (k) {
    case trainer::LossKind::kCrossEntropy:
      return "sft";
    case trainer::LossKind::kDpo:
      return "dpo";
    case trainer::LossKind::kGrpo:
      return "grpo";
  }
  return "?";
}

class PhaseClock {
 public:
  explicit PhaseClock(std::vector<PhaseTime>* out) : out_(out) {}
  void Start(std::string name) {
    name_ = std::move(name);
    t0_ = std::chrono::steady_clock::now();
  }
  void Stop() {
    out_->push_back(
        {name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count()});
  }

 private:
  std::vector<PhaseTime>* out_;
  std::string name_;
  std::chrono::steady_clock::time_point t0_;
};

// The served evaluation of one task: prompts, how many tokens to generate, and a score of the
// completion (or of the last prompt position's logits, for the preference task).
struct ServeCheck {
  std::vector<std::vector<int64_t>> prompts;
  int64_t max_new_tokens = 1;
  bool needs_logits = false;
  std::function<double(size_t i, const decoder::GenerateResult&)> score;
};

// Builds the serve check from the task's own data, so the demo needs no knowledge of the task
// beyond its public interface: SFT data give the expected completion per prompt, DPO pairs the
// chosen and rejected token of each prompt, GRPO tasks their reward.
ServeCheck MakeServeCheck(const trainer::Task& task, uint64_t seed) {
  ServeCheck c;
  trainer::Rng rng(seed);
  if (task.loss() == trainer::LossKind::kGrpo) {
    c.prompts = task.Prompts(&rng, 64);
    c.max_new_tokens = task.completion_tokens();
    c.score = [&task, prompts = c.prompts](size_t i, const decoder::GenerateResult& r) {
      return static_cast<double>(task.Reward(prompts[i], r.tokens));
    };
    return c;
  }
  auto prompt_of = [](const trainer::Datum& d) {
    size_t first = 0;
    while (first < d.weights.size() && d.weights[first] == 0) ++first;
    return std::vector<int64_t>(d.tokens.begin(), d.tokens.begin() + first + 1);
  };
  std::vector<trainer::Datum> data = task.TrainBatch(&rng, 256);
  if (task.loss() == trainer::LossKind::kDpo) {
    // Pairs (chosen, rejected): served logits should rank the chosen token first.
    std::vector<std::pair<int64_t, int64_t>> pairs;
    for (size_t i = 0; i + 1 < data.size() && c.prompts.size() < 64; i += 2) {
      c.prompts.push_back(prompt_of(data[i]));
      pairs.push_back({data[i].tokens.back(), data[i + 1].tokens.back()});
    }
    c.needs_logits = true;
    std::vector<size_t> lengths;
    for (const auto& p : c.prompts) lengths.push_back(p.size());
    // Logits row (prompt length - 1) scores the first generated token.
    c.score = [pairs, lengths](size_t i, const decoder::GenerateResult& r) {
      const size_t row = lengths[i] - 1;
      if (row >= r.logits.size()) return 0.0;
      const auto& l = r.logits[row];
      return l[pairs[i].first] > l[pairs[i].second] ? 1.0 : 0.0;
    };
    return c;
  }
  // SFT: the expected completion of each distinct prompt.
  std::map<std::vector<int64_t>, std::vector<int64_t>> expected;
  for (const auto& d : data) {
    std::vector<int64_t> p = prompt_of(d);
    expected.emplace(p, std::vector<int64_t>(d.tokens.begin() + p.size(), d.tokens.end()));
  }
  std::vector<std::vector<int64_t>> answers;
  for (auto& [p, a] : expected) {
    c.prompts.push_back(p);
    answers.push_back(a);
    c.max_new_tokens = std::max<int64_t>(c.max_new_tokens, static_cast<int64_t>(a.size()));
  }
  c.score = [answers](size_t i, const decoder::GenerateResult& r) {
    const auto& a = answers[i];
    if (r.tokens.size() < a.size()) return 0.0;
    return std::equal(a.begin(), a.end(), r.tokens.begin()) ? 1.0 : 0.0;
  };
  return c;
}

// Serves `checks[k]` for adapter `adapters[k]` ("" = base) in one decoder run (all requests
// submitted together, so they share batches) and returns the mean score per entry.
absl::StatusOr<std::vector<double>> ServeMixed(decoder::Decoder* dec,
                                               const std::vector<std::string>& adapters,
                                               const std::vector<const ServeCheck*>& checks,
                                               int64_t* requests) {
  std::vector<std::vector<uint64_t>> ids(adapters.size());
  for (size_t k = 0; k < adapters.size(); ++k) {
    for (const auto& prompt : checks[k]->prompts) {
      decoder::GenerateRequest req;
      req.adapter = adapters[k];
      req.prompt_ids = prompt;
      req.max_new_tokens = checks[k]->max_new_tokens;
      req.record_logits = checks[k]->needs_logits;
      LORADB_ASSIGN_OR_RETURN(uint64_t id, dec->Submit(std::move(req)));
      ids[k].push_back(id);
      ++*requests;
    }
  }
  LORADB_RETURN_IF_ERROR(dec->RunUntilIdle());
  std::vector<double> scores;
  for (size_t k = 0; k < adapters.size(); ++k) {
    double sum = 0;
    for (size_t i = 0; i < ids[k].size(); ++i) {
      LORADB_ASSIGN_OR_RETURN(std::optional<decoder::GenerateResult> r, dec->Poll(ids[k][i]));
      if (!r.has_value()) return absl::InternalError("demo: request still running after idle");
      if (r->finish == decoder::FinishReason::kError) return r->status;
      sum += checks[k]->score(i, *r);
    }
    scores.push_back(ids[k].empty() ? 0 : sum / static_cast<double>(ids[k].size()));
  }
  return scores;
}

absl::Status PrepareDirectory(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec)) {
    if (!fs::exists(fs::path(dir) / ".loradb-demo", ec)) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " exists and is not a loradb demo directory; choose another --dir"));
    }
    fs::remove_all(dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot remove ", dir, ": ", ec.message()));
  }
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  FILE* f = std::fopen((fs::path(dir) / ".loradb-demo").c_str(), "w");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write in ", dir));
  std::fputs("created by `loradb demo`; the next demo run replaces this directory\n", f);
  std::fclose(f);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DemoResult> RunDemo(const DemoOptions& options) {
  auto say = [&](const std::string& s) {
    if (options.progress) options.progress(s);
  };
  DemoResult result;
  PhaseClock clock(&result.phases);
  // Deterministic math regardless of core count, and no idle spinning between small ops.
  at::set_num_threads(1);

  // ---- 1. store + base
  clock.Start("1 store + base");
  LORADB_RETURN_IF_ERROR(PrepareDirectory(options.dir));
  result.store_dir = fs::absolute(options.dir).lexically_normal().string();
  result.model_dir = (fs::path(result.store_dir) / "base-model").string();
  const std::string store_dir = (fs::path(result.store_dir) / "store").string();
  LORADB_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfigJson(kBaseConfig));
  say(absl::StrCat("[1/6] generating a tiny Qwen3 base (", config.num_hidden_layers,
                   " layers, hidden ", config.hidden_size, ", vocab ", config.vocab_size, ") in ",
                   result.model_dir));
  // The output layer at N(0, 1/hidden) (logits of unit variance): with 0.02 like the other
  // linears, hidden 128 bounds every logit at ~2.6, no policy can become confident, and GRPO's
  // rollouts at temperature 1 never find the reward.
  LORADB_RETURN_IF_ERROR(
      model::WriteRandomCheckpoint(config, result.model_dir, options.seed + 7, at::kFloat, 0.02,
                                   1.0 / std::sqrt(static_cast<double>(config.hidden_size))));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(store_dir));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<model::Qwen3Model> model,
                          model::Qwen3Model::Load(result.model_dir));
  std::vector<PolicyPlan> plans = Plans(options.quick);
  for (const auto& p : plans) {
    LORADB_RETURN_IF_ERROR(trainer::EnsurePolicy(store.get(), kBaseName, result.model_dir, p.name));
  }
  say(absl::StrCat("      store ", store_dir, ": base '", kBaseName, "' registered (fingerprint ",
                   model->fingerprint().Hex().substr(0, 12), "...), ", plans.size(),
                   " policies created"));
  clock.Stop();

  // ---- 2. time-sliced training of all policies on the one resident base
  clock.Start("2 train (time-sliced)");
  say("[2/6] training 4 policies time-sliced on the resident base "
      "(their rows share forward/backward batches)");
  trainer::Trainer trainer(model.get());
  std::vector<std::unique_ptr<trainer::Task>> tasks;
  std::vector<int> index;
  result.policies.resize(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    trainer::PolicyOptions po;
    po.name = plans[i].name;
    po.seed = options.seed + 100 + i;
    po.lora.rank = 8;
    po.lora.alpha = 16;
    po.schedule.lr = plans[i].lr;
    LORADB_ASSIGN_OR_RETURN(int idx, trainer.AddPolicy(po));
    index.push_back(idx);
    LORADB_ASSIGN_OR_RETURN(
        std::unique_ptr<trainer::Task> task,
        trainer::MakeTask(plans[i].task, config.vocab_size, plans[i].task_seed + options.seed));
    result.policies[i].policy = plans[i].name;
    result.policies[i].task = plans[i].task;
    result.policies[i].loss = LossName(task->loss());
    tasks.push_back(std::move(task));
  }
  std::vector<uint64_t> last_checkpoint(plans.size(), 0);
  auto checkpoint_and_publish = [&](size_t i, const std::string& rollouts,
                                    bool promote) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(
        CheckpointRecord ck,
        trainer::SaveCheckpoint(store.get(), trainer, index[i], last_checkpoint[i], rollouts));
    last_checkpoint[i] = ck.id;
    ++result.policies[i].checkpoints;
    LORADB_ASSIGN_OR_RETURN(RevisionRecord rev,
                            trainer::PublishForSampling(store.get(), trainer, index[i], ck.id));
    ++result.policies[i].revisions;
    if (promote) {
      LORADB_RETURN_IF_ERROR(store->SetAlias(plans[i].name, "serving", rev.id, "demo promote"));
      result.policies[i].serving_revision = rev.id;
    }
    say(absl::StrFormat("      %-14s step %3d: checkpoint %d, revision %d -> latest%s",
                        plans[i].name, trainer.step(index[i]), ck.id, rev.id,
                        promote ? ", serving" : ""));
    return absl::OkStatus();
  };
  trainer::StepConfig sft_cfg;
  sft_cfg.batch_size = 32;
  trainer::StepConfig own_cfg = sft_cfg;
  own_cfg.batch_size = 16;
  own_cfg.grpo_prompts = 16;
  own_cfg.grpo_group = 8;
  int64_t rounds = 0;
  for (const auto& p : plans) rounds = std::max(rounds, p.sft_warm_steps + p.steps);
  // GRPO policies: the mean reward of their rollouts at the training temperature, on fixed
  // prompts and seeds, when the warm start ends and after the GRPO steps (what GRPO raises).
  auto sampled_reward = [&](size_t i) {
    return trainer::SampledMeanReward(&trainer, *tasks[i], index[i], own_cfg.temperature, 100, 8,
                                      options.seed + 555);
  };
  for (int64_t round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < plans.size(); ++i) {
      if (tasks[i]->loss() != trainer::LossKind::kGrpo || round != plans[i].sft_warm_steps) {
        continue;
      }
      LORADB_ASSIGN_OR_RETURN(result.policies[i].sampled_reward_warm, sampled_reward(i));
      say(
          absl::StrFormat("      %-14s after %d SFT warm-start steps: sampled reward %.3f "
                          "(T=%.1f, 100 prompts x 8)",
                          plans[i].name, plans[i].sft_warm_steps,
                          result.policies[i].sampled_reward_warm, own_cfg.temperature));
    }
    // Policies in their warm start step together (SFT), the others together with their own
    // losses: one shared forward/backward per group, every policy advancing one step a round.
    std::vector<std::pair<int, const trainer::Task*>> warm, own;
    std::vector<size_t> warm_i, own_i;
    for (size_t i = 0; i < plans.size(); ++i) {
      if (round < plans[i].sft_warm_steps) {
        warm.push_back({index[i], tasks[i].get()});
        warm_i.push_back(i);
      } else if (round < plans[i].sft_warm_steps + plans[i].steps) {
        own.push_back({index[i], tasks[i].get()});
        own_i.push_back(i);
      }
    }
    std::vector<std::string> rollouts(plans.size());
    std::string line = absl::StrFormat("      round %3d/%d:", round + 1, rounds);
    for (int g = 0; g < 2; ++g) {
      auto& work = g == 0 ? warm : own;
      auto& which = g == 0 ? warm_i : own_i;
      if (work.empty()) continue;
      trainer::StepConfig cfg = g == 0 ? sft_cfg : own_cfg;
      cfg.force_sft = g == 0;
      LORADB_ASSIGN_OR_RETURN(std::vector<trainer::StepReport> reports,
                              trainer::TrainStep(&trainer, work, cfg));
      for (size_t k = 0; k < reports.size(); ++k) {
        const size_t i = which[k];
        rollouts[i] = reports[k].rollouts;
        absl::StrAppendFormat(&line, "  %s loss %.3f", plans[i].name.substr(5), reports[k].loss);
        if (g == 1 && tasks[i]->loss() == trainer::LossKind::kGrpo) {
          absl::StrAppendFormat(&line, " reward %.2f", reports[k].mean_reward);
        }
      }
    }
    if (round % 5 == 4 || round + 1 == rounds) say(line);
    for (size_t i = 0; i < plans.size(); ++i) {
      const int64_t step = trainer.step(index[i]);
      const int64_t total = plans[i].sft_warm_steps + plans[i].steps;
      const bool stepped = round < total;
      if (!stepped) continue;
      if (step == plans[i].early_promote) {
        LORADB_RETURN_IF_ERROR(checkpoint_and_publish(i, rollouts[i], /*promote=*/true));
      } else if (step == total) {
        LORADB_RETURN_IF_ERROR(checkpoint_and_publish(i, rollouts[i], /*promote=*/true));
      } else if (step % 20 == 0) {
        LORADB_RETURN_IF_ERROR(checkpoint_and_publish(i, rollouts[i], /*promote=*/false));
      }
    }
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    result.policies[i].steps = trainer.step(index[i]);
    if (tasks[i]->loss() != trainer::LossKind::kGrpo) continue;
    LORADB_ASSIGN_OR_RETURN(result.policies[i].sampled_reward_end, sampled_reward(i));
    say(absl::StrFormat("      %-14s after %d GRPO steps: sampled reward %.3f (was %.3f)",
                        plans[i].name, plans[i].steps, result.policies[i].sampled_reward_end,
                        result.policies[i].sampled_reward_warm));
  }
  clock.Stop();

  // ---- 3. serve a mixed batch: all policies (alias `serving`) + the base, one decoder
  clock.Start("3 serve mixed batch");
  say("[3/6] serving one mixed batch: every policy via its `serving` alias plus the base, in one "
      "decoder, adapters leased from the tiers");
  tiers::StoreTiersOptions to;
  to.device = tiers::DeviceKind::kHost;
  to.cpu.budget_bytes = uint64_t{256} << 20;
  to.slots.arena_bytes = uint64_t{64} << 20;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<tiers::StoreTiers> tiers,
                          tiers::StoreTiers::Open(store.get(), to));
  model::KernelLoraApplier applier;
  model->set_lora_applier(&applier);
  decoder::DecoderOptions dopt;
  dopt.max_running = 128;
  LORADB_ASSIGN_OR_RETURN(
      std::unique_ptr<decoder::Decoder> dec,
      decoder::Decoder::Create(model.get(), store.get(), dopt, tiers->device()));
  std::vector<ServeCheck> checks;
  for (size_t i = 0; i < plans.size(); ++i) {
    checks.push_back(MakeServeCheck(*tasks[i], options.seed + 999 + i));
  }
  std::vector<std::string> adapters;
  std::vector<const ServeCheck*> check_ptrs;
  for (size_t i = 0; i < plans.size(); ++i) {
    adapters.push_back(plans[i].name + ":serving");
    check_ptrs.push_back(&checks[i]);
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    adapters.push_back("");  // the base on the same prompts
    check_ptrs.push_back(&checks[i]);
  }
  LORADB_ASSIGN_OR_RETURN(std::vector<double> scores,
                          ServeMixed(dec.get(), adapters, check_ptrs, &result.served_requests));
  for (size_t i = 0; i < plans.size(); ++i) {
    result.policies[i].served_score = scores[i];
    result.policies[i].base_score = scores[plans.size() + i];
    say(absl::StrFormat("      %-14s %-10s served %.2f   base %.2f", plans[i].name, plans[i].task,
                        scores[i], scores[plans.size() + i]));
  }
  clock.Stop();

  // ---- 4. roll one policy back and serve it again
  clock.Start("4 rollback");
  result.rollback_policy = plans[0].name;
  result.rollback_from = result.policies[0].serving_revision;
  LORADB_ASSIGN_OR_RETURN(result.rollback_to, store->Rollback(plans[0].name, "serving"));
  result.score_before_rollback = scores[0];
  LORADB_ASSIGN_OR_RETURN(
      std::vector<double> after,
      ServeMixed(dec.get(), {plans[0].name + ":serving"}, {&checks[0]}, &result.served_requests));
  result.score_after_rollback = after[0];
  say(absl::StrFormat(
      "[4/6] rolled back %s:serving from revision %d to %d: served accuracy "
      "%.2f -> %.2f",
      plans[0].name, result.rollback_from, result.rollback_to, scores[0], after[0]));
  clock.Stop();
  const decoder::DecoderStats ds = dec->stats();
  result.decoder_steps = ds.steps;
  const tiers::CpuCacheStats cs = tiers->cpu().stats();
  result.adapter_loads = static_cast<int64_t>(cs.loads);
  result.cache_hits = static_cast<int64_t>(cs.hits);
  if (tiers->device() != nullptr) {
    result.device_slots_used = static_cast<int64_t>(tiers->device()->stats().resident_adapters);
  }
  dec.reset();
  model->set_lora_applier(nullptr);

  // ---- 5. the HTTP admin endpoint
  if (options.http_phase) {
    clock.Start("5 http endpoint");
    say("[5/6] starting the HTTP admin endpoint on the store");
    LORADB_ASSIGN_OR_RETURN(result.http_report, options.http_phase(store.get()));
    clock.Stop();
  }
  say("[6/6] summary");
  return result;
}

std::string DemoResult::Summary() const {
  std::string s;
  absl::StrAppendFormat(&s, "%-14s %-10s %-4s %5s %5s %5s %8s %7s %6s\n", "policy", "task", "loss",
                        "steps", "ckpts", "revs", "serving", "served", "base");
  for (const auto& p : policies) {
    absl::StrAppendFormat(&s, "%-14s %-10s %-4s %5d %5d %5d %8d %7.2f %6.2f\n", p.policy, p.task,
                          p.loss, p.steps, p.checkpoints, p.revisions, p.serving_revision,
                          p.served_score, p.base_score);
  }
  for (const auto& p : policies) {
    if (p.sampled_reward_warm < 0 || p.sampled_reward_end < 0) continue;
    absl::StrAppendFormat(&s,
                          "%s: sampled reward %.3f after the SFT warm start -> %.3f after GRPO "
                          "(100 prompts x 8 rollouts)\n",
                          p.policy, p.sampled_reward_warm, p.sampled_reward_end);
  }
  absl::StrAppendFormat(&s, "\nrollback: %s:serving %d -> %d, served accuracy %.2f -> %.2f\n",
                        rollback_policy, rollback_from, rollback_to, score_before_rollback,
                        score_after_rollback);
  absl::StrAppendFormat(&s,
                        "serving: %d requests in %d decoder steps; CPU tier: %d loads, %d hits; "
                        "device tier: %d adapters resident\n",
                        served_requests, decoder_steps, adapter_loads, cache_hits,
                        device_slots_used);
  if (!http_report.empty()) absl::StrAppend(&s, http_report, "\n");
  absl::StrAppend(&s, "\ntime per phase:\n");
  for (const auto& p : phases) absl::StrAppendFormat(&s, "  %-24s %7.1f s\n", p.phase, p.seconds);
  absl::StrAppendFormat(&s, "\nstore: %s/store   base checkpoint: %s\n", store_dir, model_dir);
  return s;
}

}  // namespace loradb::demo

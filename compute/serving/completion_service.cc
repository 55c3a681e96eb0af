#include "compute/serving/completion_service.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "compute/decoder/decoder.h"
#include "compute/model/kernel_lora_applier.h"
#include "compute/model/qwen3_model.h"
#include "storage/store/store.h"
#include "storage/store/store_tiers.h"
#include "storage/util/mutex.h"
#include "storage/util/status_macros.h"

namespace loradb::serving {
namespace {

constexpr char kRetryAfterPayload[] = "type.loradb.dev/retry_after_ms";

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::optional<int64_t> RetryAfterMs(const absl::Status& status) {
  if (!absl::IsResourceExhausted(status)) return std::nullopt;
  auto payload = status.GetPayload(kRetryAfterPayload);
  int64_t ms = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &ms)) return std::nullopt;
  return ms;
}

// One submitted request: its n decoder sequences and the result they fill in.
struct Pending {
  uint64_t id = 0;
  int64_t n = 1;
  int64_t max_tokens = 0;
  std::function<void(const TokenEvent&)> on_token;
  std::function<bool(int64_t, const std::vector<int64_t>&)> stop_check;
  std::function<void(CompletionResult)> on_done;
  std::atomic<int64_t> produced{0};  // tokens generated over all sequences

  Mutex mu;
  std::vector<uint64_t> decoder_ids ABSL_GUARDED_BY(mu);
  int64_t remaining ABSL_GUARDED_BY(mu) = 0;  // sequences not finished
  CompletionResult result ABSL_GUARDED_BY(mu);
};

struct CompletionService::State {
  ServiceOptions options;
  Store* store = nullptr;
  std::unique_ptr<model::KernelLoraApplier> applier;
  std::unique_ptr<model::Qwen3Model> model;
  std::unique_ptr<decoder::Decoder> decoder;
  std::string base_name;
  int64_t base_created_us = 0;
  std::thread driver;

  mutable Mutex mu;
  bool stop ABSL_GUARDED_BY(mu) = false;
  uint64_t next_id ABSL_GUARDED_BY(mu) = 1;
  int64_t reserved ABSL_GUARDED_BY(mu) = 0;  // sequences counted against the bound
  int64_t live ABSL_GUARDED_BY(mu) = 0;      // sequences in the decoder
  std::map<uint64_t, std::shared_ptr<Pending>> pending ABSL_GUARDED_BY(mu);
  int64_t submitted ABSL_GUARDED_BY(mu) = 0;
  int64_t rejected ABSL_GUARDED_BY(mu) = 0;
  double step_seconds ABSL_GUARDED_BY(mu) = 0;  // moving average of busy steps

  // Called once per finished decoder sequence (driver thread).
  void SequenceDone(const std::shared_ptr<Pending>& p, int64_t index, decoder::GenerateResult r);
  // The suggested wait before a rejected Submit is retried.
  int64_t RetryHintMs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

void CompletionService::State::SequenceDone(const std::shared_ptr<Pending>& p, int64_t index,
                                            decoder::GenerateResult r) {
  bool last = false;
  CompletionResult out;
  {
    MutexLock lock(&p->mu);
    Choice& c = p->result.choices[static_cast<size_t>(index)];
    c.index = index;
    c.tokens = std::move(r.tokens);
    c.finish = r.finish;
    c.status = std::move(r.status);
    c.logprobs = std::move(r.logprobs);
    if (index == 0 && !r.prompt_logprobs.empty()) {
      p->result.prompt_logprobs.assign(1, std::nullopt);
      for (TokenLogprob& lp : r.prompt_logprobs) p->result.prompt_logprobs.push_back(std::move(lp));
    }
    last = --p->remaining == 0;
    if (last) {
      Usage& u = p->result.usage;
      u.completion_tokens = 0;
      for (const Choice& ch : p->result.choices) {
        u.completion_tokens += static_cast<int64_t>(ch.tokens.size());
        if (p->result.status.ok() && !ch.status.ok()) p->result.status = ch.status;
      }
      u.total_tokens = u.prompt_tokens + u.completion_tokens;
      out = std::move(p->result);
    }
  }
  {
    MutexLock lock(&mu);
    --reserved;
    --live;
    if (last) pending.erase(p->id);
  }
  if (last && p->on_done) p->on_done(std::move(out));
}

int64_t CompletionService::State::RetryHintMs() const {
  // The time until the request closest to done frees its sequences, at the recent step rate.
  int64_t fewest = 1;
  bool any = false;
  for (const auto& [id, p] : pending) {
    const int64_t left =
        std::max<int64_t>(1, p->max_tokens - p->produced.load(std::memory_order_relaxed) / p->n);
    fewest = any ? std::min(fewest, left) : left;
    any = true;
  }
  const double ms = std::max(step_seconds, 1e-3) * 1e3 * static_cast<double>(fewest);
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(ms)), 1, 60'000);
}

CompletionService::CompletionService(std::unique_ptr<State> state) : s_(std::move(state)) {}

absl::StatusOr<std::unique_ptr<CompletionService>> CompletionService::Create(ServiceOptions options,
                                                                             Store* store) {
  if (options.max_running < 1 || options.max_queued < 0 || options.max_prefill_tokens < 1 ||
      options.max_logprobs < 0 || options.lora_threads < 0 || options.torch_threads < 0) {
    return absl::InvalidArgumentError(
        "serving: max_running >= 1, max_queued >= 0, max_prefill_tokens >= 1, max_logprobs >= 0 "
        "and lora_threads, torch_threads >= 0 required");
  }
  if (options.torch_threads > 0) at::set_num_threads(options.torch_threads);
  auto s = std::make_unique<State>();
  LORADB_ASSIGN_OR_RETURN(model::LoadOptions lo, decoder::ModelLoadOptions(options.dtype));
  LORADB_ASSIGN_OR_RETURN(s->model, model::Qwen3Model::Load(options.model_dir, lo));
  s->applier = std::make_unique<model::KernelLoraApplier>(
      options.lora_threads > 0 ? options.lora_threads : model::KernelLoraApplier::kIntraOpThreads);
  s->model->set_lora_applier(s->applier.get());
  s->store = store;

  s->base_name = options.base_name;
  if (store != nullptr) {
    LORADB_ASSIGN_OR_RETURN(std::vector<BaseRecord> bases, store->ListBases());
    const std::string fp = s->model->fingerprint().Hex();
    for (const BaseRecord& b : bases) {
      if (b.weights_fingerprint != fp) continue;
      if (s->base_name.empty()) s->base_name = b.name;
      if (b.name == s->base_name) s->base_created_us = b.created_us;
    }
  }
  if (s->base_name.empty()) {
    std::string dir = options.model_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    s->base_name = dir.substr(dir.find_last_of('/') + 1);
  }

  decoder::DecoderOptions d;
  d.max_running = options.max_running;
  d.max_prefill_tokens = options.max_prefill_tokens;
  d.cpu_cache_bytes = options.cpu_cache_bytes;
  d.device.arena_bytes = options.device_arena_bytes;
  d.device.page_bytes = options.device_page_bytes;
  tiers::DeviceSlots* slots = nullptr;
  if (store != nullptr && store->tiers() != nullptr) slots = store->tiers()->device();
  LORADB_ASSIGN_OR_RETURN(s->decoder, decoder::Decoder::Create(s->model.get(), store, d, slots));
  s->options = std::move(options);
  std::unique_ptr<CompletionService> service(new CompletionService(std::move(s)));
  service->s_->driver = std::thread([svc = service.get()] { svc->DriverLoop(); });
  return service;
}

CompletionService::~CompletionService() {
  std::vector<std::shared_ptr<Pending>> all;
  {
    MutexLock lock(&s_->mu);
    s_->stop = true;
    for (const auto& [id, p] : s_->pending) all.push_back(p);
  }
  for (const std::shared_ptr<Pending>& p : all) {
    MutexLock lock(&p->mu);
    for (uint64_t did : p->decoder_ids) s_->decoder->Cancel(did).IgnoreError();  // may be done
  }
  if (s_->driver.joinable()) s_->driver.join();
}

void CompletionService::DriverLoop() {
  State& s = *s_;
  for (;;) {
    {
      MutexLock lock(&s.mu);
      s.mu.Await([&s]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return s.stop || s.live > 0; });
      if (s.live == 0) return;  // stopping, and nothing left to finish
    }
    const double t0 = Now();
    // A failed step has already failed its requests with the error; the loop goes on.
    s.decoder->Step().IgnoreError();
    const double dt = Now() - t0;
    MutexLock lock(&s.mu);
    s.step_seconds = s.step_seconds == 0 ? dt : 0.9 * s.step_seconds + 0.1 * dt;
  }
}

absl::StatusOr<uint64_t> CompletionService::Submit(CompletionRequest request) {
  std::vector<CompletionRequest> one;
  one.push_back(std::move(request));
  LORADB_ASSIGN_OR_RETURN(std::vector<uint64_t> ids, SubmitBatch(std::move(one)));
  return ids[0];
}

absl::Status CompletionService::CheckRequest(const CompletionRequest& request) const {
  const State& s = *s_;
  const ModelConfig& c = s.model->config();
  if (request.n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("n must be >= 1, got ", request.n));
  }
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be >= 1, got ", request.max_tokens));
  }
  if (request.logprobs < -1 || request.logprobs > s.options.max_logprobs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logprobs must be in [0, ", s.options.max_logprobs, "], got ", request.logprobs));
  }
  const auto prompt_len = static_cast<int64_t>(request.prompt.size());
  if (c.max_position_embeddings > 0 &&
      prompt_len + request.max_tokens > c.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", prompt_len, " tokens) + max_tokens (", request.max_tokens,
                     ") = ", prompt_len + request.max_tokens,
                     " exceeds the model's context length (", c.max_position_embeddings, ")"));
  }
  if (request.n > s.options.max_running + s.options.max_queued) {
    return absl::InvalidArgumentError(
        absl::StrCat("n = ", request.n, " exceeds what the service ", "holds at once (",
                     s.options.max_running + s.options.max_queued, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CompletionService::ResolveModel(const std::string& model) const {
  const State& s = *s_;
  if (model.empty() || model == s.base_name) return 0;
  const bool is_ref =
      model.find_first_of(":@") != std::string::npos ||
      std::all_of(model.begin(), model.end(), [](char ch) { return absl::ascii_isdigit(ch); });
  if (!is_ref || s.store == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("model \"", model, "\" is not served: name the base (\"", s.base_name, "\")",
                     s.store == nullptr ? " (no store is attached)"
                                        : ", POLICY:ALIAS, POLICY@SEQ or a revision id"));
  }
  LORADB_ASSIGN_OR_RETURN(RevisionRecord rev, s.store->Resolve(model));
  return rev.id;
}

absl::StatusOr<std::vector<uint64_t>> CompletionService::SubmitBatch(
    std::vector<CompletionRequest> requests) {
  State& s = *s_;
  if (requests.empty()) return absl::InvalidArgumentError("no requests to submit");
  // With several requests an error names the one it is about.
  auto named = [&](size_t i, const absl::Status& st) {
    if (requests.size() == 1) return st;
    absl::Status out(st.code(), absl::StrCat("prompt ", i, ": ", st.message()));
    st.ForEachPayload(
        [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
    return out;
  };
  // Every request is checked, and each model resolved once (so requests naming one alias are
  // pinned to one revision), before anything is reserved or queued.
  const int64_t bound = s.options.max_running + s.options.max_queued;
  std::vector<uint64_t> revisions(requests.size());
  absl::flat_hash_map<std::string, uint64_t> resolved;
  int64_t sequences = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (absl::Status st = CheckRequest(requests[i]); !st.ok()) return named(i, st);
    auto it = resolved.find(requests[i].model);
    if (it == resolved.end()) {
      absl::StatusOr<uint64_t> rev = ResolveModel(requests[i].model);
      if (!rev.ok()) return named(i, rev.status());
      it = resolved.emplace(requests[i].model, *rev).first;
    }
    revisions[i] = it->second;
    sequences += requests[i].n;
  }
  if (sequences > bound) {
    return absl::InvalidArgumentError(absl::StrCat(requests.size(), " prompts of ", sequences,
                                                   " sequences exceed what the service holds at "
                                                   "once (",
                                                   bound, ")"));
  }

  // Each request's state is complete before it is published in `pending` (RetryHintMs and
  // Cancel read it from other threads).
  std::vector<std::shared_ptr<Pending>> pendings;
  for (size_t i = 0; i < requests.size(); ++i) {
    CompletionRequest& request = requests[i];
    auto p = std::make_shared<Pending>();
    p->n = request.n;
    p->max_tokens = request.max_tokens;
    p->on_token = std::move(request.on_token);
    p->stop_check = std::move(request.stop_check);
    p->on_done = std::move(request.on_done);
    MutexLock lock(&p->mu);
    p->remaining = request.n;
    p->result.revision = revisions[i];
    p->result.choices.resize(static_cast<size_t>(request.n));
    p->result.usage.prompt_tokens = static_cast<int64_t>(request.prompt.size());
    pendings.push_back(std::move(p));
  }
  {
    MutexLock lock(&s.mu);
    if (s.reserved + sequences > bound) {
      ++s.rejected;
      const int64_t hint = s.RetryHintMs();
      absl::Status st = absl::ResourceExhaustedError(
          absl::StrCat("serving: ", s.reserved, " sequences outstanding (bound ", bound, ", ",
                       sequences, " more asked); retry after ", hint, " ms"));
      st.SetPayload(kRetryAfterPayload, absl::Cord(absl::StrCat(hint)));
      return st;
    }
    s.reserved += sequences;
    for (const std::shared_ptr<Pending>& p : pendings) {
      p->id = s.next_id++;
      s.pending[p->id] = p;
    }
  }
  std::vector<std::vector<decoder::GenerateRequest>> groups(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    CompletionRequest& request = requests[i];
    const std::shared_ptr<Pending>& p = pendings[i];
    {
      MutexLock lock(&p->mu);
      p->result.id = p->id;
    }
    const std::string adapter = revisions[i] == 0 ? "" : absl::StrCat(revisions[i]);
    for (int64_t k = 0; k < request.n; ++k) {
      decoder::GenerateRequest& g = groups[i].emplace_back();
      g.adapter = adapter;
      g.prompt_ids = request.prompt;
      g.max_new_tokens = request.max_tokens;
      g.stop_token_ids = request.stop_token_ids;
      g.sampling.temperature = request.temperature;
      g.sampling.top_k = request.top_k;
      g.sampling.top_p = request.top_p;
      g.sampling.seed = request.seed + static_cast<uint64_t>(k);
      g.logprobs = request.logprobs;
      g.prompt_logprobs = request.echo && k == 0;
      g.on_token = [p, k](const decoder::TokenEvent& e) {
        p->produced.fetch_add(1, std::memory_order_relaxed);
        if (p->on_token) p->on_token({k, e.token, e.logprob});
        return p->stop_check ? p->stop_check(k, *e.tokens) : false;
      };
      g.on_done = [state = s_.get(), p, k](decoder::GenerateResult r) {
        state->SequenceDone(p, k, std::move(r));
      };
    }
  }
  {
    MutexLock lock(&s.mu);
    s.live += sequences;  // before the decoder can finish them
  }
  // One decoder group per request (its prompt prefilled once for all n sequences), all queued
  // at once, so the next step prefills them together.
  absl::StatusOr<std::vector<std::vector<uint64_t>>> ids =
      s.decoder->SubmitGroups(std::move(groups));
  if (!ids.ok()) {
    MutexLock lock(&s.mu);
    s.live -= sequences;
    s.reserved -= sequences;
    for (const std::shared_ptr<Pending>& p : pendings) s.pending.erase(p->id);
    return ids.status();
  }
  std::vector<uint64_t> out;
  for (size_t i = 0; i < pendings.size(); ++i) {
    MutexLock lock(&pendings[i]->mu);
    pendings[i]->decoder_ids = std::move((*ids)[i]);
    out.push_back(pendings[i]->id);
  }
  MutexLock lock(&s.mu);
  s.submitted += static_cast<int64_t>(pendings.size());
  return out;
}

absl::StatusOr<CompletionResult> CompletionService::Complete(CompletionRequest request) {
  struct Waiter {
    absl::Notification done;
    CompletionResult result;
  };
  auto w = std::make_shared<Waiter>();
  std::function<void(CompletionResult)> user = std::move(request.on_done);
  request.on_done = [w, user = std::move(user)](CompletionResult r) {
    if (user) user(r);
    w->result = std::move(r);
    w->done.Notify();
  };
  LORADB_RETURN_IF_ERROR(Submit(std::move(request)).status());
  w->done.WaitForNotification();
  return std::move(w->result);
}

absl::Status CompletionService::Cancel(uint64_t id) {
  std::shared_ptr<Pending> p;
  {
    MutexLock lock(&s_->mu);
    auto it = s_->pending.find(id);
    if (it == s_->pending.end()) {
      return absl::NotFoundError(absl::StrCat("completion ", id, " is not outstanding"));
    }
    p = it->second;
  }
  std::vector<uint64_t> ids;
  {
    MutexLock lock(&p->mu);
    ids = p->decoder_ids;
  }
  for (uint64_t did : ids) s_->decoder->Cancel(did).IgnoreError();  // finished ones: NotFound
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ModelEntry>> CompletionService::ListModels() const {
  const State& s = *s_;
  std::vector<ModelEntry> out;
  out.push_back({s.base_name, "", "", 0, s.base_created_us});
  if (s.store == nullptr) return out;
  const std::string fp = s.model->fingerprint().Hex();
  std::map<std::string, bool> base_ok;  // base name -> serves on this model
  LORADB_ASSIGN_OR_RETURN(std::vector<PolicyRecord> policies, s.store->ListPolicies());
  std::sort(policies.begin(), policies.end(),
            [](const PolicyRecord& a, const PolicyRecord& b) { return a.name < b.name; });
  for (const PolicyRecord& policy : policies) {
    if (policy.archived) continue;
    auto ok = base_ok.find(policy.base);
    if (ok == base_ok.end()) {
      LORADB_ASSIGN_OR_RETURN(BaseRecord base, s.store->GetBase(policy.base));
      ok = base_ok
               .emplace(policy.base,
                        base.weights_fingerprint.empty() || base.weights_fingerprint == fp)
               .first;
    }
    if (!ok->second) continue;
    LORADB_ASSIGN_OR_RETURN(std::vector<AliasEntry> aliases, s.store->ListAliases(policy.name));
    std::sort(aliases.begin(), aliases.end(),
              [](const AliasEntry& a, const AliasEntry& b) { return a.alias < b.alias; });
    for (const AliasEntry& a : aliases) {
      absl::StatusOr<RevisionRecord> rev = s.store->GetRevision(a.revision);
      if (!rev.ok() || rev->state != RevisionState::kLive) continue;  // not servable now
      out.push_back({absl::StrCat(policy.name, ":", a.alias), policy.name, a.alias, a.revision,
                     rev->created_us});
    }
  }
  return out;
}

const std::string& CompletionService::base_name() const { return s_->base_name; }
int64_t CompletionService::vocab_size() const { return s_->model->config().vocab_size; }
int64_t CompletionService::max_context() const {
  return s_->model->config().max_position_embeddings;
}

ServiceStats CompletionService::stats() const {
  const decoder::DecoderStats d = s_->decoder->stats();
  ServiceStats out;
  {
    MutexLock lock(&s_->mu);
    out.submitted = s_->submitted;
    out.rejected = s_->rejected;
    out.outstanding_sequences = s_->reserved;
  }
  out.steps = d.steps;
  out.prefill_tokens = d.prefill_tokens;
  out.decode_tokens = d.decode_tokens;
  out.deferrals = d.deferrals;
  out.finished = d.finished;
  out.failed = d.failed;
  out.queued = d.queued;
  out.running = d.running;
  out.kv_sequences = d.kv_sequences;
  out.kv_bytes = d.kv_bytes;
  out.leased_adapters = d.leased_adapters;
  return out;
}

}  // namespace loradb::serving

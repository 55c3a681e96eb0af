#include "compute/decoder/decoder.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compute/model/peft_adapter.h"
#include "compute/model/torch_dtype.h"
#include "storage/formats/peft.h"
#include "storage/store/lora_peft.h"
#include "storage/util/status_macros.h"

namespace loradb::decoder {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kError:
      return "error";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

absl::StatusOr<model::LoadOptions> ModelLoadOptions(const std::string& dtype) {
  model::LoadOptions lo;
  if (dtype == "f32") {
    lo.dtype = at::kFloat;
  } else if (dtype == "bf16") {
    lo.dtype = at::kBFloat16;
  } else if (dtype == "f16") {
    lo.dtype = at::kHalf;
  } else if (!dtype.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype \"", dtype, "\": expected f32, bf16 or f16"));
  }
  return lo;
}

struct Decoder::Sequence {
  uint64_t id = 0;
  uint64_t revision = 0;
  GenerateRequest request;
  std::mt19937_64 rng;
  model::KvCache::SeqId cache_seq = -1;
  bool prefilled = false;
  GenerateResult result;
  int64_t waiting_steps = 0;  // consecutive steps deferred for capacity
  // Sequences of the same group (SubmitGroup) waiting for this one's prefill.
  std::vector<std::unique_ptr<Sequence>> followers;
};

struct Decoder::BuiltAdapter {
  const tiers::DeviceAdapter* device = nullptr;
  model::LoraAdapter adapter;
};

Decoder::Decoder(const model::Qwen3Model* model, Store* store, DecoderOptions options)
    : model_(model), store_(store), options_(std::move(options)), cache_(model->NewKvCache()) {}

Decoder::~Decoder() {
  built_.clear();
  prev_lease_.Release();
}

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::Create(const model::Qwen3Model* model,
                                                         Store* store, DecoderOptions options,
                                                         tiers::DeviceSlots* slots) {
  if (model == nullptr) return absl::InvalidArgumentError("decoder: no model");
  if (options.max_running < 1 || options.max_prefill_tokens < 1) {
    return absl::InvalidArgumentError("decoder: max_running and max_prefill_tokens must be >= 1");
  }
  std::unique_ptr<Decoder> d(new Decoder(model, store, options));
  if (slots != nullptr) {
    d->slots_ = slots;
  } else if (store != nullptr) {
    tiers::CpuCacheOptions co;
    co.budget_bytes = options.cpu_cache_bytes;
    tiers::AdapterLoadFn load =
        [store](uint64_t revision) -> absl::StatusOr<std::shared_ptr<const tiers::CachedAdapter>> {
      LORADB_ASSIGN_OR_RETURN(RevisionRecord rec, store->GetRevision(revision));
      LORADB_ASSIGN_OR_RETURN(TensorSet set, store->ReadTensors(rec));
      auto entry = std::make_shared<tiers::CachedAdapter>();
      uint64_t bytes = 0;
      for (const TensorView& t : set.tensors()) bytes += t.nbytes;
      entry->tensors = std::move(set);
      entry->bytes = std::max<uint64_t>(bytes, 1);
      return std::shared_ptr<const tiers::CachedAdapter>(std::move(entry));
    };
    LORADB_ASSIGN_OR_RETURN(d->own_cache_, tiers::CpuCache::Create(co, std::move(load)));
    LORADB_ASSIGN_OR_RETURN(
        d->own_slots_,
        tiers::DeviceSlots::Create(options.device, d->own_cache_.get(), tiers::MakeHostBackend()));
    d->slots_ = d->own_slots_.get();
  }
  return d;
}

absl::StatusOr<uint64_t> Decoder::ResolveAdapter(const std::string& ref) {
  if (ref.empty()) return uint64_t{0};
  if (store_ == nullptr || slots_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("adapter ", ref, " requested but the decoder has no store"));
  }
  LORADB_ASSIGN_OR_RETURN(RevisionRecord rev, store_->Resolve(ref));
  if (rev.state != RevisionState::kLive) {
    return absl::FailedPreconditionError(absl::StrCat("revision ", rev.id, " is deleted"));
  }
  LORADB_ASSIGN_OR_RETURN(BaseRecord base, store_->GetBase(rev.base));
  if (!base.weights_fingerprint.empty() &&
      base.weights_fingerprint != model_->fingerprint().Hex()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "adapter ", ref, " (revision ", rev.id, ") is for base ", rev.base, " with weights ",
        base.weights_fingerprint, ", not the loaded model (", model_->fingerprint().Hex(), ")"));
  }
  return rev.id;
}

absl::Status Decoder::Validate(const GenerateRequest& request) const {
  const ModelConfig& c = model_->config();
  if (request.prompt_ids.empty()) return absl::InvalidArgumentError("empty prompt");
  for (int64_t t : request.prompt_ids) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token ", t, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  if (request.max_new_tokens < 1) {
    return absl::InvalidArgumentError("max_new_tokens must be >= 1");
  }
  const int64_t total = static_cast<int64_t>(request.prompt_ids.size()) + request.max_new_tokens;
  if (c.max_position_embeddings > 0 && total > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("prompt + max_new_tokens = ", total,
                                                   " exceeds max_position_embeddings ",
                                                   c.max_position_embeddings));
  }
  const SamplingParams& sp = request.sampling;
  if (!(sp.temperature >= 0) || !std::isfinite(sp.temperature) || sp.top_k < 0 ||
      !(sp.top_p > 0 && sp.top_p <= 1)) {
    return absl::InvalidArgumentError(
        "sampling: temperature must be >= 0, top_k >= 0 and top_p in (0, 1]");
  }
  if (request.logprobs < -1 || request.logprobs > c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("logprobs ", request.logprobs,
                                                   " must be -1 (none) or in [0, vocab size ",
                                                   c.vocab_size, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Decoder::Submit(GenerateRequest request) {
  std::vector<GenerateRequest> one;
  one.push_back(std::move(request));
  LORADB_ASSIGN_OR_RETURN(std::vector<uint64_t> ids, SubmitGroup(std::move(one)));
  return ids[0];
}

absl::StatusOr<std::vector<uint64_t>> Decoder::SubmitGroup(std::vector<GenerateRequest> requests) {
  std::vector<std::vector<GenerateRequest>> one;
  one.push_back(std::move(requests));
  LORADB_ASSIGN_OR_RETURN(std::vector<std::vector<uint64_t>> ids, SubmitGroups(std::move(one)));
  return std::move(ids[0]);
}

absl::StatusOr<std::vector<std::vector<uint64_t>>> Decoder::SubmitGroups(
    std::vector<std::vector<GenerateRequest>> groups) {
  if (groups.empty()) return absl::InvalidArgumentError("no request groups");
  auto named = [&](size_t g, const absl::Status& st) {
    return groups.size() == 1
               ? st
               : absl::Status(st.code(), absl::StrCat("group ", g, ": ", st.message()));
  };
  // Every group is checked and resolved before any is queued.
  std::vector<std::unique_ptr<Sequence>> leaders;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<GenerateRequest>& requests = groups[g];
    if (requests.empty()) return named(g, absl::InvalidArgumentError("empty request group"));
    for (const GenerateRequest& r : requests) {
      if (absl::Status st = Validate(r); !st.ok()) return named(g, st);
      if (r.adapter != requests[0].adapter || r.prompt_ids != requests[0].prompt_ids) {
        return named(g, absl::InvalidArgumentError(
                            "a request group shares one adapter reference and one prompt"));
      }
    }
    absl::StatusOr<uint64_t> revision = ResolveAdapter(requests[0].adapter);
    if (!revision.ok()) return named(g, revision.status());
    std::unique_ptr<Sequence> leader;
    for (GenerateRequest& r : requests) {
      auto seq = std::make_unique<Sequence>();
      seq->revision = *revision;
      seq->rng.seed(r.sampling.seed);
      seq->request = std::move(r);
      seq->result.revision = *revision;
      // The first sequence prefills the prompt; the others wait inside it and fork its KV cache.
      if (leader == nullptr) {
        leader = std::move(seq);
      } else {
        leader->followers.push_back(std::move(seq));
      }
    }
    leaders.push_back(std::move(leader));
  }
  std::vector<std::vector<uint64_t>> ids(leaders.size());
  MutexLock lock(&mu_);
  for (size_t g = 0; g < leaders.size(); ++g) {
    std::vector<Sequence*> members = {leaders[g].get()};
    for (auto& f : leaders[g]->followers) members.push_back(f.get());
    for (Sequence* seq : members) {
      seq->id = next_id_++;
      seq->result.id = seq->id;
      live_[seq->id] = true;
      ids[g].push_back(seq->id);
    }
    queued_.push_back(std::move(leaders[g]));
  }
  return ids;
}

absl::StatusOr<std::optional<GenerateResult>> Decoder::Poll(uint64_t id) {
  MutexLock lock(&mu_);
  auto it = done_.find(id);
  if (it != done_.end()) {
    GenerateResult r = std::move(it->second);
    done_.erase(it);
    return std::optional<GenerateResult>(std::move(r));
  }
  if (live_.contains(id)) return std::optional<GenerateResult>();
  return absl::NotFoundError(absl::StrCat("request ", id, " is unknown or already polled"));
}

absl::Status Decoder::Cancel(uint64_t id) {
  MutexLock lock(&mu_);
  if (!live_.contains(id)) {
    return absl::NotFoundError(absl::StrCat("request ", id, " is not queued or running"));
  }
  cancel_[id] = true;
  return absl::OkStatus();
}

bool Decoder::Idle() const {
  MutexLock lock(&mu_);
  return live_.empty();
}

DecoderStats Decoder::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void Decoder::Finish(Sequence& seq, FinishReason reason, absl::Status status) {
  ReleaseFollowers(seq, reason, status);
  if (seq.cache_seq >= 0) {
    cache_.RemoveSequence(seq.cache_seq).IgnoreError();  // known id; nothing to report
    seq.cache_seq = -1;
  }
  seq.result.finish = reason;
  seq.result.status = std::move(status);
  std::function<void(GenerateResult)> cb = std::move(seq.request.on_done);
  {
    MutexLock lock(&mu_);
    live_.erase(seq.id);
    cancel_.erase(seq.id);
    if (reason == FinishReason::kError) {
      ++stats_.failed;
    } else {
      ++stats_.finished;
    }
    stats_.kv_sequences = static_cast<int64_t>(cache_.num_sequences());
    if (!cb) done_[seq.id] = std::move(seq.result);
  }
  if (cb) cb(std::move(seq.result));
}

absl::StatusOr<const model::LoraAdapter*> Decoder::AdapterFor(const tiers::DeviceAdapter& dev,
                                                              uint64_t revision) {
  auto it = built_.find(revision);
  if (it != built_.end() && it->second->device == &dev) {
    MutexLock lock(&mu_);
    ++stats_.adapter_reuses;
    return &it->second->adapter;
  }
  LORADB_ASSIGN_OR_RETURN(RevisionRecord rec, store_->GetRevision(revision));
  const peft::LoraConfig config = ToPeftConfig(rec.lora);
  // A PEFT feature the decoder does not apply refuses the revision by name (never dropped).
  std::vector<std::string> names;
  names.reserve(dev.tensors.size());
  for (const tiers::DeviceTensor& t : dev.tensors) names.push_back(t.name);
  LORADB_ASSIGN_OR_RETURN(uint32_t features,
                          peft::StoredAdapterFeatures(config, dev.metadata, names));
  const std::string who = absl::StrCat("the decoder (revision ", revision, ")");
  LORADB_RETURN_IF_ERROR(peft::RefuseUnapplied(features, model::kAppliedPeftFeatures, who));
  std::vector<model::PeftNamedTensor> tensors;
  tensors.reserve(dev.tensors.size());
  for (const tiers::DeviceTensor& t : dev.tensors) {
    LORADB_ASSIGN_OR_RETURN(
        at::ScalarType st,
        model::TorchFloatScalarType(t.dtype, absl::StrCat("adapter tensor ", t.name)));
    // Read in place: a view over the lease's memory (never written through).
    tensors.push_back({t.name, at::from_blob(t.data, t.shape, at::TensorOptions().dtype(st))});
  }
  LORADB_ASSIGN_OR_RETURN(model::PeftModelInputs in,
                          model::PeftInputs(config, std::move(tensors), who));
  LORADB_ASSIGN_OR_RETURN(
      model::LoraAdapter adapter,
      model::LoraAdapter::Create(model_->config(), std::move(in.modules), model_->dtype(),
                                 model_->device(), std::move(in.weights)));
  LORADB_RETURN_IF_ERROR(model_->PrepareAdapter(&adapter));
  auto built = std::make_unique<BuiltAdapter>(BuiltAdapter{&dev, std::move(adapter)});
  const model::LoraAdapter* out = &built->adapter;
  built_[revision] = std::move(built);
  {
    MutexLock lock(&mu_);
    ++stats_.adapter_builds;
  }
  return out;
}

std::vector<uint64_t> Decoder::RevisionsByPriority(const std::vector<Sequence*>& candidates) {
  std::vector<std::pair<int64_t, uint64_t>> ranked;  // (longest wait, revision), first seen first
  absl::flat_hash_map<uint64_t, size_t> index;
  for (const Sequence* s : candidates) {
    if (s->revision == 0) continue;
    auto [it, inserted] = index.emplace(s->revision, ranked.size());
    if (inserted) {
      ranked.emplace_back(s->waiting_steps, s->revision);
    } else {
      ranked[it->second].first = std::max(ranked[it->second].first, s->waiting_steps);
    }
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<uint64_t> revs;
  revs.reserve(ranked.size());
  for (const auto& [wait, rev] : ranked) revs.push_back(rev);
  return revs;
}

absl::Status Decoder::LeaseAdapters(std::vector<Sequence*>& candidates, std::vector<Sequence*>* run,
                                    tiers::DeviceBatchLease* lease) {
  std::vector<uint64_t> revs = RevisionsByPriority(candidates);
  absl::flat_hash_map<uint64_t, absl::Status> failed;  // revisions whose requests fail
  size_t k = revs.size();
  bool acquired = false;
  while (k > 0 && !acquired) {
    std::vector<uint64_t> want(revs.begin(), revs.begin() + static_cast<ptrdiff_t>(k));
    absl::StatusOr<tiers::DeviceBatchLease> got = slots_->AcquireBatch(want);
    if (got.ok()) {
      *lease = std::move(*got);
      acquired = true;
      break;
    }
    if (absl::IsResourceExhausted(got.status())) {
      if (prev_lease_.size() > 0) {
        // The previous step's pin may be what crowds the arena: drop it and retry.
        built_.clear();
        prev_lease_.Release();
        prev_lease_ = tiers::DeviceBatchLease();
        continue;
      }
      if (k > 1) {
        k = k / 2;
        continue;
      }
      // One adapter alone does not fit: it never will if it is larger than the arena.
      const tiers::DeviceSlotsStats ds = slots_->stats();
      const uint64_t arena = ds.pages_total * slots_->options().page_bytes;
      absl::StatusOr<RevisionRecord> rec = store_->GetRevision(revs[0]);
      if (rec.ok() && rec->blob.bytes > arena) {
        failed[revs[0]] = absl::ResourceExhaustedError(
            absl::StrCat("revision ", revs[0], " (", rec->blob.bytes,
                         " bytes) is larger than the device arena (", arena, " bytes)"));
        revs.erase(revs.begin());
        k = revs.size();
        continue;
      }
      k = 0;  // defer every adapter request this step
      break;
    }
    // Another error (a blob that cannot be read, a deleted revision): find whose it is by
    // acquiring each alone; those revisions' requests fail, the others go on.
    std::vector<uint64_t> keep;
    for (uint64_t r : want) {
      const uint64_t one[1] = {r};
      absl::StatusOr<tiers::DeviceBatchLease> single = slots_->AcquireBatch(one);
      if (single.ok() || absl::IsResourceExhausted(single.status())) {
        keep.push_back(r);
      } else {
        failed[r] = absl::Status(single.status().code(),
                                 absl::StrCat("adapter revision ", r,
                                              " could not be loaded: ", single.status().message()));
      }
    }
    if (keep.size() == want.size()) return got.status();  // not attributable: a real failure
    revs.erase(revs.begin(), revs.begin() + static_cast<ptrdiff_t>(k));
    keep.insert(keep.end(), revs.begin(), revs.end());
    revs = std::move(keep);
    k = revs.size();
  }
  if (!acquired) *lease = tiers::DeviceBatchLease();
  int64_t deferred = 0;
  for (Sequence* s : candidates) {
    if (s->revision == 0) {
      run->push_back(s);
      continue;
    }
    auto f = failed.find(s->revision);
    if (f != failed.end()) {
      Finish(*s, FinishReason::kError, f->second);
      continue;
    }
    if (acquired && lease->Find(s->revision) != nullptr) {
      run->push_back(s);
    } else {
      ++s->result.deferred_steps;
      ++s->waiting_steps;
      ++deferred;
    }
  }
  for (Sequence* s : *run) s->waiting_steps = 0;
  MutexLock lock(&mu_);
  stats_.deferrals += deferred;
  return absl::OkStatus();
}

int64_t Decoder::Sample(Sequence& seq, const float* logits, int64_t vocab) {
  const SamplingParams& sp = seq.request.sampling;
  if (sp.temperature <= 0) {
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return best;
  }
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto by_logit = [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t keep = order.size();
  if (sp.top_k > 0 && static_cast<size_t>(sp.top_k) < keep) {
    keep = static_cast<size_t>(sp.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(keep), order.end(),
                      by_logit);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }
  order.resize(keep);
  const double max_logit = logits[order[0]];
  std::vector<double> p(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp((static_cast<double>(logits[order[i]]) - max_logit) / sp.temperature);
    total += p[i];
  }
  if (sp.top_p < 1) {
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      cum += p[n] / total;
      ++n;
      if (cum >= sp.top_p) break;
    }
    keep = n;
    total = std::accumulate(p.begin(), p.begin() + static_cast<ptrdiff_t>(keep), 0.0);
  }
  // 53 random bits -> [0, 1): the same on every platform for a given seed.
  const double u = static_cast<double>(seq.rng() >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

absl::Status Decoder::Step() {
  c10::InferenceMode inference;
  // Admit queued requests; collect cancellations.
  std::vector<std::unique_ptr<Sequence>> cancelled_queued;
  absl::flat_hash_map<uint64_t, bool> cancel;
  {
    MutexLock lock(&mu_);
    for (auto it = queued_.begin(); it != queued_.end();) {
      if (cancel_.contains((*it)->id)) {
        cancelled_queued.push_back(std::move(*it));
        it = queued_.erase(it);
      } else {
        ++it;
      }
    }
    while (!queued_.empty() &&
           (running_.empty() ||
            static_cast<int64_t>(running_.size() + 1 + queued_.front()->followers.size()) <=
                options_.max_running)) {
      running_.push_back(std::move(queued_.front()));
      queued_.pop_front();
    }
    cancel = cancel_;
  }
  for (auto& s : cancelled_queued) Finish(*s, FinishReason::kCancelled, absl::OkStatus());
  for (auto& s : running_) {
    if (cancel.contains(s->id)) Finish(*s, FinishReason::kCancelled, absl::OkStatus());
  }
  auto erase_finished = [&] {
    MutexLock lock(&mu_);
    running_.erase(
        std::remove_if(running_.begin(), running_.end(),
                       [&](const std::unique_ptr<Sequence>& s)
                           ABSL_NO_THREAD_SAFETY_ANALYSIS { return !live_.contains(s->id); }),
        running_.end());
  };
  erase_finished();
  // The gauges count the admitted sequences before this step emits their first tokens: a
  // client that has a token finds its sequence running in the stats.
  UpdateGauges();
  if (running_.empty()) {
    ReleaseLeaseWhenIdle();
    UpdateGauges();
    return absl::OkStatus();
  }

  // Candidates: every decoding sequence, plus prompts up to the prefill budget.
  std::vector<Sequence*> candidates;
  int64_t prefill_budget = options_.max_prefill_tokens;
  bool any_prefill = false;
  for (auto& s : running_) {
    if (!s->prefilled) {
      const auto n = static_cast<int64_t>(s->request.prompt_ids.size());
      if (any_prefill && n > prefill_budget) continue;
      prefill_budget -= n;
      any_prefill = true;
    }
    candidates.push_back(s.get());
  }
  tiers::DeviceBatchLease lease;
  std::vector<Sequence*> run;
  if (slots_ != nullptr) {
    LORADB_RETURN_IF_ERROR(LeaseAdapters(candidates, &run, &lease));
  } else {
    run = candidates;
  }
  // Index the lease's adapters; drop indexes of adapters the new lease does not hold.
  for (auto it = built_.begin(); it != built_.end();) {
    const tiers::DeviceAdapter* now = lease.Find(it->first);
    if (now != it->second->device) {
      built_.erase(it++);
    } else {
      ++it;
    }
  }
  model::LoraBatch lora;
  absl::flat_hash_map<uint64_t, int32_t> slot_of;
  absl::flat_hash_map<uint64_t, absl::Status> bad;  // adapters that cannot be applied
  std::vector<Sequence*> ready;
  for (Sequence* s : run) {
    const uint64_t rev = s->revision;
    if (rev != 0 && !slot_of.contains(rev) && !bad.contains(rev)) {
      const tiers::DeviceAdapter* dev = lease.Find(rev);
      absl::StatusOr<const model::LoraAdapter*> a =
          dev == nullptr ? absl::InternalError(absl::StrCat("revision ", rev, " is not leased"))
                         : AdapterFor(*dev, rev);
      if (a.ok()) {
        slot_of[rev] = static_cast<int32_t>(lora.adapters.size());
        lora.adapters.push_back(*a);
      } else {
        bad[rev] = a.status();
      }
    }
    if (rev != 0 && bad.contains(rev)) {
      Finish(*s, FinishReason::kError, bad[rev]);
      continue;
    }
    ready.push_back(s);
  }
  prev_lease_ = std::move(lease);
  if (ready.empty()) {
    erase_finished();
    ReleaseLeaseWhenIdle();
    UpdateGauges();
    MutexLock lock(&mu_);
    ++stats_.steps;
    return absl::OkStatus();
  }

  // One forward over every ready sequence.
  std::vector<int64_t> ids;
  model::ForwardInput in;
  bool full_logits = false;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  for (Sequence* s : ready) {
    if (s->cache_seq < 0) {
      s->cache_seq = cache_.AddSequence(static_cast<int64_t>(s->request.prompt_ids.size()) +
                                        s->request.max_new_tokens);
    }
    int64_t n = 0;
    if (!s->prefilled) {
      ids.insert(ids.end(), s->request.prompt_ids.begin(), s->request.prompt_ids.end());
      n = static_cast<int64_t>(s->request.prompt_ids.size());
      prefill_tokens += n;
    } else {
      ids.push_back(s->result.tokens.back());
      n = 1;
      ++decode_tokens;
    }
    in.seq_lens.push_back(n);
    in.cache_seqs.push_back(s->cache_seq);
    const int32_t slot = s->revision == 0 ? -1 : slot_of[s->revision];
    lora.row_slot.insert(lora.row_slot.end(), static_cast<size_t>(n), slot);
    full_logits =
        full_logits || s->request.record_logits || (s->request.prompt_logprobs && !s->prefilled);
    for (const auto& f : s->followers) {
      full_logits = full_logits || f->request.record_logits || f->request.prompt_logprobs;
    }
  }
  in.token_ids = at::tensor(ids, at::TensorOptions().dtype(at::kLong)).to(model_->device());
  in.lora = lora.adapters.empty() ? nullptr : &lora;
  in.last_row_logits_only = !full_logits;
  absl::StatusOr<model::ForwardOutput> out = model_->Forward(in, &cache_);
  if (!out.ok()) {
    for (Sequence* s : ready) Finish(*s, FinishReason::kError, out.status());
    erase_finished();
    ReleaseLeaseWhenIdle();
    UpdateGauges();
    return out.status();
  }
  const at::Tensor logits = out->logits.to(at::kCPU, at::kFloat).contiguous();
  const int64_t vocab = logits.size(1);
  const float* base = logits.data_ptr<float>();
  int64_t row = 0;
  for (size_t i = 0; i < ready.size(); ++i) {
    Sequence* s = ready[i];
    const int64_t n = in.seq_lens[i];
    const int64_t last = full_logits ? row + n - 1 : static_cast<int64_t>(i);
    if (!s->followers.empty()) {
      ForkFollowers(*s, full_logits ? base + row * vocab : nullptr, base + last * vocab, vocab, n,
                    cancel);
    }
    if (s->request.record_logits) {
      for (int64_t r = row; r < row + n; ++r) {
        s->result.logits.emplace_back(base + r * vocab, base + (r + 1) * vocab);
      }
    }
    if (!s->prefilled && s->request.prompt_logprobs)
      RecordPromptLogprobs(*s, base + row * vocab, vocab);
    row += full_logits ? n : 1;
    s->prefilled = true;
    s->result.tokens.push_back(Sample(*s, base + last * vocab, vocab));
    EndOfToken(*s, base + last * vocab, vocab);
  }
  erase_finished();
  ReleaseLeaseWhenIdle();
  {
    MutexLock lock(&mu_);
    ++stats_.steps;
    stats_.prefill_tokens += prefill_tokens;
    stats_.decode_tokens += decode_tokens;
  }
  // The gauges last: once they show nothing running, the counters include the step that
  // finished the last request.
  UpdateGauges();
  return absl::OkStatus();
}

TokenLogprob Decoder::Logprobs(const float* logits, int64_t vocab, int64_t token, int64_t top) {
  // log p_i = l_i - (max + log sum_j exp(l_j - max)), accumulated in double.
  float max_logit = logits[0];
  for (int64_t i = 1; i < vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    sum += std::exp(static_cast<double>(logits[i]) - static_cast<double>(max_logit));
  }
  const double log_z = static_cast<double>(max_logit) + std::log(sum);
  auto logprob = [&](int64_t i) { return static_cast<float>(logits[i] - log_z); };
  TokenLogprob out;
  out.token = token;
  out.logprob = logprob(token);
  if (top > 0) {
    std::vector<int64_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    const auto k = static_cast<ptrdiff_t>(std::min(top, vocab));
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    out.top.reserve(static_cast<size_t>(k));
    for (ptrdiff_t i = 0; i < k; ++i) out.top.emplace_back(order[i], logprob(order[i]));
  }
  return out;
}

void Decoder::RecordPromptLogprobs(Sequence& seq, const float* rows, int64_t vocab) {
  const std::vector<int64_t>& prompt = seq.request.prompt_ids;
  const int64_t top = std::max<int64_t>(seq.request.logprobs, 0);
  for (size_t p = 1; p < prompt.size(); ++p) {
    seq.result.prompt_logprobs.push_back(
        Logprobs(rows + static_cast<int64_t>(p - 1) * vocab, vocab, prompt[p], top));
  }
}

bool Decoder::AfterToken(Sequence& seq, const float* logits, int64_t vocab) {
  const TokenLogprob* lp = nullptr;
  if (seq.request.logprobs >= 0) {
    seq.result.logprobs.push_back(
        Logprobs(logits, vocab, seq.result.tokens.back(), seq.request.logprobs));
    lp = &seq.result.logprobs.back();
  }
  if (!seq.request.on_token) return false;
  TokenEvent event;
  event.id = seq.id;
  event.token = seq.result.tokens.back();
  event.logprob = lp;
  event.tokens = &seq.result.tokens;
  return seq.request.on_token(event);
}

void Decoder::ReleaseFollowers(Sequence& leader, FinishReason reason, const absl::Status& status) {
  if (leader.followers.empty()) return;
  std::vector<std::unique_ptr<Sequence>> followers = std::move(leader.followers);
  leader.followers.clear();
  if (reason == FinishReason::kError) {
    for (auto& f : followers) Finish(*f, reason, status);
    return;
  }
  // The leader left before prefilling (cancelled): the others prefill for themselves, first in
  // line, as a group of their own.
  std::unique_ptr<Sequence> next = std::move(followers[0]);
  for (size_t i = 1; i < followers.size(); ++i) next->followers.push_back(std::move(followers[i]));
  MutexLock lock(&mu_);
  queued_.push_front(std::move(next));
}

void Decoder::ForkFollowers(Sequence& leader, const float* rows, const float* last, int64_t vocab,
                            int64_t n, const absl::flat_hash_map<uint64_t, bool>& cancel) {
  while (!leader.followers.empty()) {
    std::unique_ptr<Sequence> f = std::move(leader.followers.front());
    leader.followers.erase(leader.followers.begin());
    if (cancel.contains(f->id)) {
      Finish(*f, FinishReason::kCancelled, absl::OkStatus());
      continue;
    }
    absl::StatusOr<model::KvCache::SeqId> forked =
        cache_.Fork(leader.cache_seq, f->request.max_new_tokens);
    if (!forked.ok()) {
      Finish(*f, FinishReason::kError, forked.status());
      continue;
    }
    f->cache_seq = *forked;
    f->prefilled = true;
    if (f->request.record_logits && rows != nullptr) {
      for (int64_t r = 0; r < n; ++r) {
        f->result.logits.emplace_back(rows + r * vocab, rows + (r + 1) * vocab);
      }
    }
    if (f->request.prompt_logprobs && rows != nullptr) RecordPromptLogprobs(*f, rows, vocab);
    f->result.tokens.push_back(Sample(*f, last, vocab));
    EndOfToken(*f, last, vocab);
    running_.push_back(std::move(f));
  }
}

void Decoder::EndOfToken(Sequence& seq, const float* logits, int64_t vocab) {
  const bool hook_stop = AfterToken(seq, logits, vocab);
  const auto& stops = seq.request.stop_token_ids;
  if (hook_stop || std::find(stops.begin(), stops.end(), seq.result.tokens.back()) != stops.end()) {
    Finish(seq, FinishReason::kStop, absl::OkStatus());
  } else if (static_cast<int64_t>(seq.result.tokens.size()) >= seq.request.max_new_tokens) {
    Finish(seq, FinishReason::kLength, absl::OkStatus());
  }
}

void Decoder::ReleaseLeaseWhenIdle() {
  if (!running_.empty()) return;
  built_.clear();
  prev_lease_.Release();
}

void Decoder::UpdateGauges() {
  const auto running = static_cast<int64_t>(running_.size());
  const auto kv = static_cast<int64_t>(cache_.num_sequences());
  const int64_t kv_bytes = cache_.allocated_bytes();
  const auto leased = static_cast<int64_t>(prev_lease_.size());
  MutexLock lock(&mu_);
  stats_.queued = static_cast<int64_t>(queued_.size());
  stats_.running = running;
  stats_.kv_sequences = kv;
  stats_.kv_bytes = kv_bytes;
  stats_.leased_adapters = leased;
}

absl::Status Decoder::RunUntilIdle() {
  while (!Idle()) LORADB_RETURN_IF_ERROR(Step());
  return absl::OkStatus();
}

}  // namespace loradb::decoder

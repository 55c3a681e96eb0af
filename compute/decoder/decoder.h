// The multi-LoRA decoder: continuous batching of generation requests over one resident Qwen3
// base, each request naming its adapter in the store ("POLICY:ALIAS", "POLICY@SEQ", a revision
// id, or nothing for the base). Every step leases the step's distinct adapters from the device
// tier with one DeviceSlots::AcquireBatch call and runs one Forward over all running sequences:
// new sequences' prompts (prefill) and one token of every other sequence (decode), each row
// taking its own adapter through the model's multi-LoRA path, weights read in place from the
// lease.
//
// Semantics worth knowing:
// - A request's adapter reference is resolved once, at Submit: the request is pinned to that
//   revision for its whole life. Moving an alias mid-stream does not change running requests;
//   requests submitted after the move get the new revision.
// - When the step's adapters do not all fit in the device arena (or the CPU tier is at its
//   load bound), the decoder runs the adapters that fit (those whose requests have waited the
//   most consecutive steps first, then the oldest) and defers the others' requests to later
//   steps; they are never failed for capacity. Only an adapter larger
//   than the whole arena, a revision whose blob cannot be read, or an adapter that does not fit
//   the base fails its request (with that error).
// - KV cache: the model's contiguous per-sequence cache (compute/model/kv_cache.h).
// - Sampling is per request: greedy (temperature 0), or temperature with optional top-k and
//   top-p, driven by a per-request seeded generator, so a request's tokens do not depend on
//   which other requests share its batches.
//
// Thread safety: Submit, Poll, Cancel and stats may be called from any thread; Step (and
// RunUntilIdle) from one driver thread at a time.
#ifndef LORADB_COMPUTE_DECODER_DECODER_H_
#define LORADB_COMPUTE_DECODER_DECODER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compute/decoder/generate_types.h"
#include "compute/model/qwen3_model.h"
#include "storage/store/store.h"
#include "storage/tiers/cpu_cache.h"
#include "storage/tiers/device_slots.h"
#include "storage/util/mutex.h"

namespace loradb::decoder {

struct SamplingParams {
  // 0: greedy (argmax, lowest token id on ties). > 0: sample from softmax(logits / temperature).
  double temperature = 0;
  // Keep only the k most likely tokens (0: all).
  int64_t top_k = 0;
  // Keep the smallest set of most likely tokens whose probability reaches top_p (1: all).
  double top_p = 1.0;
  uint64_t seed = 0;
};

// What GenerateRequest::on_token sees after each generated token.
struct TokenEvent {
  uint64_t id = 0;
  int64_t token = 0;
  // The token's log-probs; null unless GenerateRequest::logprobs >= 0.
  const TokenLogprob* logprob = nullptr;
  // Every token generated so far, this one last.
  const std::vector<int64_t>* tokens = nullptr;
};

struct GenerateResult {
  uint64_t id = 0;
  // The revision the request was pinned to at Submit (0: base only).
  uint64_t revision = 0;
  std::vector<int64_t> tokens;  // generated tokens (a stop token is included)
  FinishReason finish = FinishReason::kLength;
  absl::Status status;         // non-OK only for kError
  int64_t deferred_steps = 0;  // steps this request waited because its adapter did not fit
  // With GenerateRequest::record_logits: fp32 logits, one row per prompt position then one per
  // generated token except the last ([prompt + tokens - 1][vocab]).
  std::vector<std::vector<float>> logits;
  // With GenerateRequest::logprobs >= 0: one entry per generated token.
  std::vector<TokenLogprob> logprobs;
  // With GenerateRequest::prompt_logprobs: one entry per prompt token after the first (the
  // first has no preceding context), each under the logits of the position before it.
  std::vector<TokenLogprob> prompt_logprobs;
};

struct GenerateRequest {
  // "" (base only), "POLICY:ALIAS", "POLICY@SEQ" or a revision id.
  std::string adapter;
  std::vector<int64_t> prompt_ids;
  int64_t max_new_tokens = 16;
  std::vector<int64_t> stop_token_ids;
  SamplingParams sampling;
  bool record_logits = false;
  // -1: no log-probs. k >= 0: each generated token's log-prob plus the k most likely tokens'
  // (TokenLogprob), in GenerateResult::logprobs and TokenEvent::logprob.
  int64_t logprobs = -1;
  // Also the prompt tokens' log-probs (with the same k; logprobs -1 counts as 0).
  bool prompt_logprobs = false;
  // Called on the driver thread after each generated token, before the stop and length checks;
  // returning true ends the request with FinishReason::kStop (the token is kept). It must not
  // call Step.
  std::function<bool(const TokenEvent&)> on_token;
  // Called on the driver thread when the request finishes (also when it fails); the result is
  // then not kept for Poll.
  std::function<void(GenerateResult)> on_done;
};

struct DecoderOptions {
  // Most sequences decoded together in one step; more requests wait in arrival order.
  int64_t max_running = 64;
  // Most prompt tokens prefilled in one step (a prompt longer than this still runs alone).
  int64_t max_prefill_tokens = 4096;
  // The tiers the decoder creates for itself when none are given to Create.
  uint64_t cpu_cache_bytes = uint64_t{1} << 30;
  // Default arena 256 MiB (the host backend pre-faults it).
  tiers::DeviceSlotsOptions device = {uint64_t{256} << 20, 64 << 10, 2 << 20, {}};
};

struct DecoderStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t deferrals = 0;  // request-steps deferred for capacity
  int64_t finished = 0;
  int64_t failed = 0;
  int64_t adapter_builds = 0;  // adapters (re)indexed from a lease
  int64_t adapter_reuses = 0;  // adapters reused from the previous step's lease
  // Gauges, as of the end of the last step (KV sequences also as soon as one is freed):
  int64_t queued = 0;           // requests submitted, not yet admitted
  int64_t running = 0;          // admitted requests not finished
  int64_t kv_sequences = 0;     // sequences holding KV cache
  int64_t kv_bytes = 0;         // KV cache bytes allocated
  int64_t leased_adapters = 0;  // adapters the decoder holds a device lease on
};

// Model::Load options for a compute dtype name: "f32", "bf16", "f16", or "" (the checkpoint's).
// InvalidArgument for another name.
[[nodiscard]] absl::StatusOr<model::LoadOptions> ModelLoadOptions(const std::string& dtype);

class Decoder {
 public:
  // `model` (not owned) must outlive the decoder; LoRA is applied by whatever applier the
  // caller installed on it (model::KernelLoraApplier for the kernels' BGMV path). `store` may be
  // null (base-only requests). With a store and no `slots`, the decoder creates its own CPU cache
  // (loading revisions through Store::ReadTensors) and host-backend device slots from `options`; a
  // given `slots` (not owned, must outlive the decoder) is shared, e.g. with a trainer.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Decoder>> Create(
      const model::Qwen3Model* model, Store* store, DecoderOptions options = {},
      tiers::DeviceSlots* slots = nullptr);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Queues a request and returns its id. Resolves (and pins) the adapter now. Errors, with
  // nothing queued: InvalidArgument (empty prompt, token ids outside the vocabulary,
  // max_new_tokens < 1, prompt + max_new_tokens beyond max_position_embeddings, bad sampling
  // parameters); NotFound for an unknown adapter reference; FailedPrecondition when the
  // revision is for another base (weights fingerprint differs) or no store was given.
  [[nodiscard]] absl::StatusOr<uint64_t> Submit(GenerateRequest request);

  // Queues requests that share one adapter reference and one prompt (n samples of a prompt) and
  // returns their ids in order. The prompt is prefilled once, by the first; the others copy its
  // KV cache (KvCache::Fork) and sample their first token from the same logits row, so each gets
  // the tokens it would get alone. The group is admitted as a whole (beyond max_running only
  // when nothing else runs). Errors as Submit, for any member, with nothing queued;
  // InvalidArgument when adapters or prompts differ.
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> SubmitGroup(
      std::vector<GenerateRequest> requests);

  // Queues several groups (each as SubmitGroup) at once: the next step finds all of them queued,
  // so requests that arrive together are prefilled together (as far as max_running and the
  // prefill budget allow) rather than the first alone. Returns each group's ids. Errors as
  // SubmitGroup, with nothing queued; the message names the failing group ("group 2: ...") when
  // there is more than one.
  [[nodiscard]] absl::StatusOr<std::vector<std::vector<uint64_t>>> SubmitGroups(
      std::vector<std::vector<GenerateRequest>> groups);

  // The finished result of `id` (removed on return); nullopt while it runs. NotFound for an id
  // that was never submitted or was already polled.
  [[nodiscard]] absl::StatusOr<std::optional<GenerateResult>> Poll(uint64_t id);

  // Cancels a queued or running request (finished with kCancelled at the next step).
  // NotFound when it is not queued or running.
  [[nodiscard]] absl::Status Cancel(uint64_t id);

  // Runs one step: admits queued requests, leases adapters, one forward, samples. OK when
  // nothing is queued. Request-level problems fail those requests, not the step; a non-OK
  // status (an internal model error) fails the step's requests and is returned.
  [[nodiscard]] absl::Status Step();
  // Steps until no request is queued or running.
  [[nodiscard]] absl::Status RunUntilIdle();
  bool Idle() const;

  DecoderStats stats() const;
  const model::Qwen3Model& model() const { return *model_; }

 private:
  struct Sequence;
  struct BuiltAdapter;

  Decoder(const model::Qwen3Model* model, Store* store, DecoderOptions options);
  absl::StatusOr<uint64_t> ResolveAdapter(const std::string& ref);
  absl::Status Validate(const GenerateRequest& request) const;
  // A group leader finishing before its prefill: with an error its followers fail alike;
  // otherwise they go back to the head of the queue as a group of their own.
  void ReleaseFollowers(Sequence& leader, FinishReason reason, const absl::Status& status);
  // After the leader's prefill: each follower forks its KV cache, samples its first token from
  // the `last` logits row (`rows`: the leader's n prompt rows when full logits were computed,
  // else null) and joins running_. Followers in `cancel` finish cancelled.
  void ForkFollowers(Sequence& leader, const float* rows, const float* last, int64_t vocab,
                     int64_t n, const absl::flat_hash_map<uint64_t, bool>& cancel);
  // After a token was appended to `seq`: log-probs, the on_token hook, stop and length checks.
  void EndOfToken(Sequence& seq, const float* logits, int64_t vocab);
  void Finish(Sequence& seq, FinishReason reason, absl::Status status);
  // The candidates' distinct revisions, those with the longest-deferred sequence first, then in
  // arrival order: under slot pressure adapters take turns instead of the oldest requests
  // holding the arena until they finish (which would push later requests' first token back by
  // whole generations).
  static std::vector<uint64_t> RevisionsByPriority(const std::vector<Sequence*>& candidates);
  // Leases the adapters of `running`; fills `run` with the sequences that can run this step.
  absl::Status LeaseAdapters(std::vector<Sequence*>& running, std::vector<Sequence*>* run,
                             tiers::DeviceBatchLease* lease);
  absl::StatusOr<const model::LoraAdapter*> AdapterFor(const tiers::DeviceAdapter& dev,
                                                       uint64_t revision);
  static int64_t Sample(Sequence& seq, const float* logits, int64_t vocab);
  // Log-probs of `token` and the `top` most likely tokens under one logits row.
  static TokenLogprob Logprobs(const float* logits, int64_t vocab, int64_t token, int64_t top);
  // Records the prompt log-probs of a sequence just prefilled from its `n` logits rows.
  static void RecordPromptLogprobs(Sequence& seq, const float* rows, int64_t vocab);
  // After a sampled token: its log-probs and the on_token hook. True when the hook ends the
  // sequence.
  static bool AfterToken(Sequence& seq, const float* logits, int64_t vocab);
  // With nothing running, drops the previous step's device lease (kept otherwise so that the
  // next step reuses its adapters), so an idle decoder pins nothing in the device tier.
  void ReleaseLeaseWhenIdle();
  // Refreshes the gauges in stats_.
  void UpdateGauges();

  const model::Qwen3Model* model_;
  Store* store_;
  const DecoderOptions options_;
  std::unique_ptr<tiers::CpuCache> own_cache_;
  std::unique_ptr<tiers::DeviceSlots> own_slots_;
  tiers::DeviceSlots* slots_ = nullptr;
  model::KvCache cache_;

  // Driver-thread state.
  std::vector<std::unique_ptr<Sequence>> running_;
  tiers::DeviceBatchLease prev_lease_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<BuiltAdapter>> built_;  // by revision
  absl::flat_hash_map<uint64_t, absl::Status> revision_base_ok_;        // checked revisions

  mutable Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<std::unique_ptr<Sequence>> queued_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, bool> cancel_ ABSL_GUARDED_BY(mu_);  // ids asked to cancel
  absl::flat_hash_map<uint64_t, bool> live_ ABSL_GUARDED_BY(mu_);    // queued or running ids
  std::map<uint64_t, GenerateResult> done_ ABSL_GUARDED_BY(mu_);
  DecoderStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loradb::decoder

#endif  // LORADB_COMPUTE_DECODER_DECODER_H_

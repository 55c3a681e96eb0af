// CompletionService: the compute side of OpenAI-compatible completions, behind a LibTorch-free
// header (token ids, floats and statuses in and out; no tensors), so protocol code outside
// compute/ (api/openai) can drive it.
//
// One service owns one resident base model (loaded from a base directory), a continuous-batching
// decoder::Decoder over it and one driver thread that steps the decoder whenever any request is
// queued or running. Requests submitted while others decode join the next step (their prompts
// are prefilled beside the others' decode tokens); nobody waits for a batch to finish.
//
// - Model reference: "" or the base's name (base only), "POLICY:ALIAS", "POLICY@SEQ" or a
//   revision id. It is resolved once, at Submit; the request is pinned to that revision for its
//   whole life (its lease holds it), so alias moves and rollbacks affect the next Submit only.
// - n > 1: n sequences of one prompt; sequence i samples with seed + i, so each is exactly the
//   single-sequence request with that seed.
// - Log-probs: log-softmax of the model's unscaled fp32 logits (before temperature, top-k and
//   top-p), from the same logits row the sampler draws from: what vLLM reports by default.
// - Callbacks (on_token, stop_check, on_done) run on the driver thread, one at a time, without
//   any service lock held: they may call Cancel or Submit, and must return quickly (the whole
//   batch waits for them).
// - Backpressure: at most max_running + max_queued sequences are outstanding; past that Submit
//   returns ResourceExhausted carrying a retry-after hint (RetryAfterMs), and queues nothing.
// - An adapter whose blob cannot be loaded (missing, checksum mismatch) finishes the requests
//   that named it with FinishReason::kError and that error; every other request goes on.
//
// Thread-safe: every public call may come from any thread.
#ifndef LORADB_COMPUTE_SERVING_COMPLETION_SERVICE_H_
#define LORADB_COMPUTE_SERVING_COMPLETION_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compute/decoder/generate_types.h"

namespace loradb {
class Store;
}  // namespace loradb

namespace loradb::serving {

struct ServiceOptions {
  // The base: a Hugging Face checkpoint directory (config.json + model.safetensors).
  std::string model_dir;
  // Compute dtype: "f32", "bf16", "f16"; empty: the checkpoint's.
  std::string dtype;
  // The name the base answers to in `model` and ListModels; empty: the store's base whose
  // weights fingerprint matches the model, else the model directory's last path component.
  std::string base_name;
  // Sequences decoded together in one step; more wait in arrival order.
  int64_t max_running = 64;
  // Sequences that may wait beyond max_running; past that Submit is ResourceExhausted.
  int64_t max_queued = 256;
  // Prompt tokens prefilled in one step (a longer prompt still runs alone).
  int64_t max_prefill_tokens = 4096;
  // Largest `logprobs` a request may ask for (vLLM's default max_logprobs).
  int64_t max_logprobs = 20;
  // The adapter tiers the service creates when the store has none (Store::tiers()): CPU cache
  // budget, device arena and page size (the host backend pre-faults the arena).
  uint64_t cpu_cache_bytes = uint64_t{1} << 30;
  uint64_t device_arena_bytes = uint64_t{256} << 20;
  uint64_t device_page_bytes = 64 << 10;
  // Threads of the kernels' LoRA applier: > 0, a pool of its own; 0, LibTorch's intra-op
  // threads (the ones the base's linear layers run on, so the two never compete for cores).
  int lora_threads = 0;
  // > 0: sets LibTorch's intra-op thread count for the whole process; 0 leaves it.
  int torch_threads = 0;
};

// length / stop / error / cancelled (decoder::FinishReasonName gives the name).
using decoder::FinishReason;
// One position's log-probs: its token's, and the request's `logprobs` most likely tokens'.
using decoder::TokenLogprob;

// What on_token sees for each generated token.
struct TokenEvent {
  int64_t index = 0;  // which of the request's n sequences
  int64_t token = 0;
  // Set when CompletionRequest::logprobs >= 0.
  const TokenLogprob* logprobs = nullptr;
};

struct Choice {
  int64_t index = 0;
  std::vector<int64_t> tokens;         // generated tokens (a stop token id is included)
  std::vector<TokenLogprob> logprobs;  // one per token when logprobs >= 0
  FinishReason finish = FinishReason::kLength;
  absl::Status status;  // non-OK only for kError
};

struct Usage {
  int64_t prompt_tokens = 0;      // the prompt, counted once however large n is
  int64_t completion_tokens = 0;  // generated tokens over all n sequences
  int64_t total_tokens = 0;
};

struct CompletionResult {
  uint64_t id = 0;
  uint64_t revision = 0;        // the revision the request was pinned to (0: base only)
  std::vector<Choice> choices;  // n entries, by index
  // With echo: the prompt tokens' log-probs. The first prompt token has no context, so its
  // entry is nullopt (vLLM reports null there).
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  Usage usage;
  // The first error among the choices, else OK.
  absl::Status status;
};

struct CompletionRequest {
  // "" or the base's name, "POLICY:ALIAS", "POLICY@SEQ" or a revision id.
  std::string model;
  std::vector<int64_t> prompt;
  int64_t max_tokens = 16;
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;        // (0, 1]
  int64_t top_k = 0;         // 0: all tokens (vLLM's -1 means the same; the route maps it)
  uint64_t seed = 0;
  std::vector<int64_t> stop_token_ids;
  int64_t n = 1;
  // -1: none; k in [0, max_logprobs]: each generated token's log-prob and the k most likely.
  int64_t logprobs = -1;
  // Report the prompt's log-probs (CompletionResult::prompt_logprobs) with the same k.
  bool echo = false;
  // After each generated token, in order per sequence.
  std::function<void(const TokenEvent&)> on_token;
  // After each generated token (after on_token), with sequence `index`'s tokens so far; true
  // ends that sequence with FinishReason::kStop, keeping the token. The routes match stop
  // strings here.
  std::function<bool(int64_t index, const std::vector<int64_t>& tokens)> stop_check;
  // Once, when all n sequences have finished (including cancelled and failed ones).
  std::function<void(CompletionResult)> on_done;
};

// One entry of ListModels.
struct ModelEntry {
  std::string id;          // what `model` accepts: the base's name or "POLICY:ALIAS"
  std::string policy;      // empty for the base
  std::string alias;       // empty for the base
  uint64_t revision = 0;   // what the alias resolves to now (0: the base)
  int64_t created_us = 0;  // when the base was registered / the revision published
};

struct ServiceStats {
  int64_t submitted = 0;  // requests accepted
  int64_t rejected = 0;   // Submit calls refused for the queue bound
  int64_t outstanding_sequences = 0;
  // The decoder's counters (see decoder::DecoderStats).
  int64_t steps = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t deferrals = 0;
  int64_t finished = 0;
  int64_t failed = 0;
  int64_t queued = 0;
  int64_t running = 0;
  int64_t kv_sequences = 0;
  int64_t kv_bytes = 0;
  int64_t leased_adapters = 0;
};

// The retry-after hint a ResourceExhausted from Submit carries (the
// "type.loradb.dev/retry_after_ms" payload the HTTP layer turns into Retry-After).
std::optional<int64_t> RetryAfterMs(const absl::Status& status);

class CompletionService {
 public:
  // Loads the model from options.model_dir and starts the driver thread. `store` (not owned,
  // must outlive the service) may be null: then only the base is served. When the store owns
  // tiers with device slots (Store::tiers()), the decoder leases from those; otherwise it
  // creates its own CPU cache and host-backend device slots from `options`. Errors: bad
  // options (InvalidArgument), the model's load errors.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CompletionService>> Create(
      ServiceOptions options, Store* store);
  // Cancels everything outstanding (on_done runs with kCancelled) and joins the driver.
  ~CompletionService();
  CompletionService(const CompletionService&) = delete;
  CompletionService& operator=(const CompletionService&) = delete;

  // Queues `request` and returns its id; the callbacks then run on the driver thread. Errors,
  // with nothing queued and no callback run: InvalidArgument (empty prompt, a token id outside
  // [0, vocab), max_tokens < 1 or prompt + max_tokens beyond the context length, n < 1, logprobs
  // outside [-1, max_logprobs], bad sampling parameters); NotFound (unknown model, policy, alias
  // or revision); FailedPrecondition (a revision for another base, a deleted revision, an adapter
  // named without a store); ResourceExhausted (queue bound; RetryAfterMs gives the hint).
  [[nodiscard]] absl::StatusOr<uint64_t> Submit(CompletionRequest request);

  // Queues several requests at once (the prompts of one OpenAI request, or a batch an embedding
  // application has at hand) and returns their ids in order: all are checked first, each model
  // name is resolved once (requests naming the same alias share its revision), and the decoder's
  // next step finds all of them queued, so their prompts are prefilled together rather than the
  // first alone. All or nothing: errors as Submit, naming the request ("prompt 2: ...") when
  // there are several, and InvalidArgument when their sequences together exceed what the service
  // holds at once.
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> SubmitBatch(
      std::vector<CompletionRequest> requests);

  // Submit, then waits for the result (on_done, if set, still runs first).
  [[nodiscard]] absl::StatusOr<CompletionResult> Complete(CompletionRequest request);

  // Cancels every sequence of request `id`: each leaves the batch at the next decoder step,
  // freeing its KV cache and, from that step's lease on, its adapter lease; on_done then reports
  // kCancelled for them (tokens produced so far are kept). NotFound when `id` is not outstanding.
  [[nodiscard]] absl::Status Cancel(uint64_t id);

  // Every servable model: the base first, then each alias of each non-archived policy on this
  // base (by policy name, then alias), with the revision it resolves to now. Empty besides the
  // base without a store.
  [[nodiscard]] absl::StatusOr<std::vector<ModelEntry>> ListModels() const;

  const std::string& base_name() const;
  int64_t vocab_size() const;
  int64_t max_context() const;  // max_position_embeddings
  ServiceStats stats() const;

 private:
  struct State;
  explicit CompletionService(std::unique_ptr<State> state);
  void DriverLoop();
  absl::Status CheckRequest(const CompletionRequest& request) const;
  // The revision a request's model names (0: the base).
  absl::StatusOr<uint64_t> ResolveModel(const std::string& model) const;
  std::unique_ptr<State> s_;
};

}  // namespace loradb::serving

#endif  // LORADB_COMPUTE_SERVING_COMPLETION_SERVICE_H_

// The training service beneath the Tinker-compatible routes (docs/tinker-protocol.md): sessions,
// training runs (a LoRA policy on the served base), forward/backward with the Tinker token losses
// (cross_entropy, importance_sampling, ppo), Adam steps, training checkpoints in the store,
// publishing for sampling (a revision plus an alias), rollouts from a run's current weights,
// listings, and the futures every long call returns.
//
// LibTorch-free: token ids, floats and absl::Status in and out, so api/tinker can use it without
// a torch header. Every request is checked when it is submitted (InvalidArgument / NotFound /
// AlreadyExists with a message naming the field), so a submitted call fails later only for a
// reason found while running it.
//
// Work runs on the service's queue, one trainer call at a time: each run's calls run in seq_id
// order (the SDK numbers them 1, 2, ...; a gap waits for the missing call, seq_id 0 means "after
// what was submitted before"), and forward/backward calls of different runs that are ready at
// the same time share one forward (and one backward) through the multi-LoRA path. Thread-safe.
#ifndef LORADB_COMPUTE_TRAINING_TRAINING_SERVICE_H_
#define LORADB_COMPUTE_TRAINING_TRAINING_SERVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compute/model/cpu_block_cache.h"
#include "storage/store/store.h"

namespace loradb::training {

struct TrainingServiceOptions {
  std::string model_dir;  // the served base: a Hugging Face checkpoint directory (Qwen3 family)
  // The base's name in the store and the `base_model` clients name; default: the model
  // directory's last component. Registered from config.json when the store lacks it.
  std::string base_name;
  // LoRA alpha of every run (the Tinker API sends only the rank; the Tinker cookbook assumes 32).
  double lora_alpha = 32;
  // LibTorch intra-op threads for the service's work; 0 leaves LibTorch's setting.
  int64_t threads = 0;
  // Forward/backward calls of different runs that are queued together run as one trainer batch
  // (one pass over the base for all their rows) instead of one after another. That pays off
  // where a bigger batch costs little more (a device with idle capacity); on CPU the cost grows
  // with the rows either way and the shared batch holds every run's activations at once
  // (loradb-bench tinker concurrent: 0.84x the sequential time and 1.41x its peak memory shared,
  // 1.19x and 1.07x one after another, bench-60m on two cores).
  bool shared_batches = false;
  // Freed CPU tensor blocks kept for the next step's tensors of the same sizes, at most this many
  // bytes (compute/model/cpu_block_cache.h; process-wide, the largest limit asked wins); 0: the
  // service does not turn the cache on.
  uint64_t cpu_block_cache_bytes = model::DefaultCpuBlockCacheBytes();
};

// Which modules of the base a run adapts (the Tinker LoraConfig). train_unembed (LoRA on lm_head)
// is refused by name: the model cannot adapt its output layer.
struct LoraSpec {
  int64_t rank = 0;
  std::optional<uint64_t> seed;  // LoRA initialisation; unset: drawn from the run id
  bool train_attn = true;        // q/k/v/o_proj
  bool train_mlp = true;         // gate/up/down_proj
  bool train_unembed = false;
};

// One loss_fn_inputs tensor as the SDK sends it (dense, row-major; int64 or float32).
struct TensorInput {
  enum class DType { kInt64, kFloat32 };
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // empty: 1-D of the data's length
  std::vector<int64_t> ints;   // kInt64
  std::vector<float> floats;   // kFloat32
};

// One Tinker Datum: position i of model_input predicts loss_fn_inputs["target_tokens"][i].
struct DatumInput {
  std::vector<int64_t> model_input;
  std::map<std::string, TensorInput> loss_fn_inputs;
};

struct ForwardBackwardRequest {
  std::string run_id;
  int64_t seq_id = 0;
  std::string loss_fn;  // cross_entropy | importance_sampling | ppo; others refused by name
  // ppo: clip_low_threshold, clip_high_threshold (ratio bounds, default 0.8 and 1.2); any other
  // key, or a key for a loss that reads none, is refused by name.
  std::map<std::string, double> loss_fn_config;
  std::vector<DatumInput> data;
  bool forward_only = false;  // loss and outputs without a backward
};

// Per datum, one value per position: log p(target) under the run's weights before this call's
// update, and the position's loss.
struct DatumOutput {
  std::vector<float> logprobs;
  std::vector<float> elementwise_loss;
};
struct ForwardBackwardResult {
  std::vector<DatumOutput> outputs;
  std::map<std::string, double> metrics;  // "loss:sum"
};

// The Tinker AdamParams; every field is sent by the SDK on every step.
struct AdamParams {
  double learning_rate = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-12;
  double weight_decay = 0;    // decoupled (AdamW)
  double grad_clip_norm = 0;  // 0: no clipping
};
struct OptimStepResult {
  std::map<std::string, double> metrics;  // "grad_norm", "learning_rate", "step"
};

struct CreateRunRequest {
  std::string session_id;
  int64_t model_seq_id = 0;
  std::string base_model;
  LoraSpec lora;
  std::string optimizer = "adamw";  // the only family served
  std::map<std::string, std::string> user_metadata;
};
struct CreateRunResult {
  std::string run_id;
};

// A training checkpoint (`weights/NAME`) or sampler weights (`sampler_weights/NAME`) of a run.
struct CheckpointInfo {
  std::string checkpoint_id;  // "weights/NAME" | "sampler_weights/NAME"
  std::string type;           // "training" | "sampler"
  std::string tinker_path;    // tinker://RUN/CHECKPOINT_ID
  int64_t time_us = 0;
  uint64_t size_bytes = 0;
  int64_t step = 0;
  uint64_t store_id = 0;  // the store checkpoint id, or the revision id
};

struct SaveWeightsRequest {
  std::string run_id;
  int64_t seq_id = 0;
  std::string name;  // 1-56 of letters, digits, `_ . -`; empty: "step-<optimizer step>"
  bool overwrite = false;
};
struct SaveWeightsResult {
  std::string path;
  CheckpointInfo checkpoint;
};

// Two forms: onto an existing run (run_id, seq_id), or creating run SESSION:train:MODEL_SEQ_ID
// from the checkpoint (session_id, model_seq_id; the LoRA shape comes from the checkpoint's run).
struct LoadWeightsRequest {
  std::string run_id;
  int64_t seq_id = 0;
  std::string session_id;
  int64_t model_seq_id = -1;
  std::string path;        // tinker://RUN/weights/NAME
  bool optimizer = false;  // also restore the Adam moments and step (else a fresh optimizer)
  std::string base_model;  // create form: must be the checkpoint's base when set
  std::map<std::string, std::string> user_metadata;
};
struct LoadWeightsResult {
  std::string path;
  std::string run_id;
};

struct SaveForSamplerRequest {
  std::string run_id;
  int64_t seq_id = 0;
  std::string name;  // empty: unnamed (path tinker://RUN/sampler_weights/@SEQ)
};
struct SaveForSamplerResult {
  std::string path;          // resolves back to the revision (ResolveSamplerPath)
  uint64_t revision_id = 0;  // the published revision
  std::string revision_ref;  // "POLICY@SEQ"
};

struct UnloadResult {
  std::string run_id;
};

struct SampleRequest {
  std::string run_id;
  std::vector<int64_t> prompt;
  int64_t num_samples = 1;
  int64_t max_tokens = 0;
  double temperature = 1.0;  // 0: greedy
  std::vector<int64_t> stop_tokens;
};
struct SampledSequence {
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;  // log softmax(logits / T) of each sampled token
  std::string stop_reason;      // "stop" | "length"
};
struct SampleResult {
  std::vector<SampledSequence> sequences;
};

using FutureValue =
    std::variant<CreateRunResult, ForwardBackwardResult, OptimStepResult, SaveWeightsResult,
                 LoadWeightsResult, SaveForSamplerResult, UnloadResult, SampleResult>;

enum class FutureState { kPending, kDone, kFailed };

// What Retrieve reports. kFailed carries `error`; `user_error` tells the caller's mistakes
// (InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, Unimplemented) from the server's.
struct FutureStatus {
  std::string request_id;
  std::string run_id;
  std::string request_type;  // "CreateModel", "ForwardBackward", "Forward", "OptimStep", ...
  FutureState state = FutureState::kPending;
  std::optional<FutureValue> value;
  absl::Status error;
  bool user_error = false;
};

// A submitted call: its future and the run it is about.
struct Submitted {
  std::string request_id;
  std::string run_id;
};

struct RunInfo {
  std::string run_id;
  std::string policy;  // the store policy: tinker/SESSION/train-N
  std::string base_model;
  LoraSpec lora;
  bool loaded = false;  // served by this process (else only in the store)
  int64_t step = 0;     // optimizer steps taken (loaded runs)
  int64_t created_us = 0;
  int64_t last_request_us = 0;
  std::map<std::string, std::string> user_metadata;
  std::optional<CheckpointInfo> last_checkpoint;
  std::optional<CheckpointInfo> last_sampler_checkpoint;
};

// The public facts of a checkpoint path (weights_info).
struct WeightsInfo {
  std::string base_model;
  bool is_lora = true;
  int64_t lora_rank = 0;
  bool train_unembed = false;
  bool train_mlp = true;
  bool train_attn = true;
};

class TrainingService {
 public:
  // Loads the model, registers its base in `store` when missing and starts the worker. `store`
  // is borrowed and must outlive the service. NotFound / InvalidArgument from the model load.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TrainingService>> Create(
      Store* store, const TrainingServiceOptions& options);
  // Stops the worker after the call it is running; calls still queued fail (Cancelled).
  ~TrainingService();
  TrainingService(const TrainingService&) = delete;
  TrainingService& operator=(const TrainingService&) = delete;

  const std::string& base_model() const;
  int64_t vocab_size() const;
  int64_t max_context_length() const;

  // ---- sessions: an id the runs of one client are named under; heartbeats keep a record of
  // liveness (nothing expires a session's runs).
  [[nodiscard]] absl::StatusOr<std::string> CreateSession(
      const std::vector<std::string>& tags, const std::map<std::string, std::string>& metadata);
  // NotFound for an unknown session.
  [[nodiscard]] absl::Status Heartbeat(const std::string& session_id);

  // ---- long calls: checked now, run on the queue; the result comes from Retrieve. A second
  // submission with the same (run, seq_id) (or for create, the same (session, model_seq_id))
  // returns the first one's future instead of running again.
  // NotFound (unknown session), InvalidArgument (base, rank, modules, optimizer),
  // Unimplemented (train_unembed).
  [[nodiscard]] absl::StatusOr<Submitted> CreateRun(const CreateRunRequest& request);
  // NotFound (unknown or unloaded run), Unimplemented (a loss or input this service does not
  // compute, by name), InvalidArgument (missing or extra loss_fn_inputs, lengths that disagree
  // with the datum, token ids >= vocab, non-finite values, bad loss_fn_config).
  [[nodiscard]] absl::StatusOr<Submitted> ForwardBackward(const ForwardBackwardRequest& request);
  // NotFound (run), InvalidArgument (Adam parameters). The step fails (FailedPrecondition) when
  // no forward_backward ran since the last step.
  [[nodiscard]] absl::StatusOr<Submitted> OptimStep(const std::string& run_id, int64_t seq_id,
                                                    const AdamParams& params);
  // NotFound (run), InvalidArgument (name), AlreadyExists (name taken and !overwrite).
  [[nodiscard]] absl::StatusOr<Submitted> SaveWeights(const SaveWeightsRequest& request);
  // NotFound (run, session, or the path's checkpoint), InvalidArgument (path, both or neither
  // form, base mismatch); the load fails (InvalidArgument) when the LoRA shapes differ.
  [[nodiscard]] absl::StatusOr<Submitted> LoadWeights(const LoadWeightsRequest& request);
  // NotFound (run), InvalidArgument (name).
  [[nodiscard]] absl::StatusOr<Submitted> SaveWeightsForSampler(
      const SaveForSamplerRequest& request);
  // Stops serving the run (its store policy, checkpoints and revisions stay). NotFound (run).
  [[nodiscard]] absl::StatusOr<Submitted> UnloadRun(const std::string& run_id, int64_t seq_id);
  // num_samples rollouts from the run's current weights, after the run's calls submitted before
  // it. NotFound (run), InvalidArgument (prompt ids, num_samples, max_tokens, temperature).
  [[nodiscard]] absl::StatusOr<Submitted> Sample(const SampleRequest& request);

  // The future's state; waits up to `wait` for a pending one. NotFound for an unknown id.
  [[nodiscard]] absl::StatusOr<FutureStatus> Retrieve(const std::string& request_id,
                                                      absl::Duration wait = absl::ZeroDuration());

  // ---- listings (from memory for loaded runs, else from the store)
  // NotFound for a run neither loaded nor in the store.
  [[nodiscard]] absl::StatusOr<RunInfo> GetRun(const std::string& run_id) const;
  // Every run in the store (loaded or not), newest first.
  [[nodiscard]] absl::StatusOr<std::vector<RunInfo>> ListRuns() const;
  // The run's named training checkpoints (newest per name) and sampler weights, oldest first.
  [[nodiscard]] absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(
      const std::string& run_id) const;
  // InvalidArgument for a malformed path, NotFound for an unknown run or checkpoint.
  [[nodiscard]] absl::StatusOr<WeightsInfo> GetWeightsInfo(const std::string& tinker_path) const;
  // The revision a sampler path (tinker://RUN/sampler_weights/NAME or /@SEQ) names now.
  [[nodiscard]] absl::StatusOr<RevisionRecord> ResolveSamplerPath(
      const std::string& tinker_path) const;

  // Stops starting queued calls (a running one finishes) until Resume: submissions made
  // meanwhile are grouped as if they had arrived together (maintenance, tests).
  void Pause();
  void Resume();

  struct Stats {
    int64_t trainer_calls = 0;           // trainer calls the queue has made
    int64_t forward_backward_calls = 0;  // forward/backward (and forward) calls run
    int64_t shared_calls = 0;  // ... of those, run in one batch with another run's (shared_batches)
  };
  Stats stats() const;

  struct Impl;

 private:
  explicit TrainingService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loradb::training

#endif  // LORADB_COMPUTE_TRAINING_TRAINING_SERVICE_H_

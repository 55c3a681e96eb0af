// The LoRA trainer: K policies on one frozen, resident Qwen3 base. The API follows the shape of
// the public training APIs users know (forward_backward on a batch, optim_step, save_state /
// load_state, save weights for sampling, sample):
//
//   ForwardBackward  one forward + backward over the rows of any number of policies at once
//                    (per-row adapters through the model's multi-LoRA path); gradients
//                    accumulate into each policy's fp32 masters until OptimStep.
//   OptimStep        AdamW with the policy's schedule over the mean of the accumulated grads.
//   Sample           rollouts from the policies' current weights; rows of different policies
//                    share each decode step's batch (KV cache, greedy or temperature sampling).
//   Snapshot/Restore the complete training state of a policy (checkpoint.h puts it in the store).
//
// Threads: calls that touch disjoint sets of policies (ForwardBackward, OptimStep, Sample,
// Logprobs, Snapshot, Restore, ExportWeights, rng(), step()) may run at once from different
// threads (time_slicer.h does); calls that share a policy must not overlap, nor may AddPolicy or
// SetReference overlap anything. Sampling the base (policy -1) uses one shared RNG: one thread at
// a time. The model must outlive the trainer.
#ifndef LORADB_COMPUTE_TRAINER_TRAINER_H_
#define LORADB_COMPUTE_TRAINER_TRAINER_H_

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compute/model/lora.h"
#include "compute/model/qwen3_model.h"
#include "compute/trainer/lora_params.h"
#include "compute/trainer/losses.h"
#include "compute/trainer/optimizer.h"
#include "compute/trainer/rng.h"

namespace loradb::trainer {

enum class LossKind { kCrossEntropy, kDpo, kGrpo };
const char* LossKindName(LossKind kind);

// One training sequence. Position i (0 <= i < tokens.size() - 1) predicts tokens[i + 1] with
// weight weights[i] (the loss mask: 0 for prompt tokens, 1 for trained completion tokens).
// With explicit `targets` (token losses only) every position i < tokens.size() predicts
// targets[i] instead, and weights, targets (and the token losses' sampling_logprobs and
// advantages) have one entry per token.
struct Datum {
  std::vector<int64_t> tokens;
  std::vector<float> weights;
  std::vector<int64_t> targets;
  // Token losses (importance_sampling, ppo): per-position advantages.
  std::vector<float> advantages;
  // GRPO only: the log-probability each target token had when it was sampled (same length as
  // weights; ignored where the weight is 0) and the sequence's advantage.
  std::vector<float> sampling_logprobs;
  float advantage = 0;
  // Log-probabilities of this datum are those of softmax(logits / temperature): GRPO rollouts
  // carry the temperature they were sampled at, so the ratio compares like with like.
  float temperature = 1.0f;
};

struct PolicyOptions {
  std::string name;  // the policy's name in the store
  LoraConfig lora;
  AdamWOptions adamw;
  LrSchedule schedule;
  uint64_t seed = 0;  // LoRA initialisation and the policy's RNG stream
  double dpo_beta = 0.1;
  GrpoOptions grpo;
};

// A policy's rows in one ForwardBackward call. DPO data come in pairs: data[2i] is the chosen
// and data[2i + 1] the rejected sequence of pair i.
struct PolicyBatch {
  int policy = 0;
  LossKind loss = LossKind::kCrossEntropy;
  std::vector<Datum> data;
};

struct LossReport {
  int policy = 0;
  double loss = 0;
  int64_t tokens = 0;  // weighted target tokens
  // SFT: argmax accuracy on weighted tokens. DPO: mean implicit reward margin; `accuracy` the
  // fraction of pairs with a positive margin. GRPO: clip fraction in `metric`, KL in `kl`.
  double accuracy = 0;
  double metric = 0;
  double kl = 0;
};

// A policy's data in one TokenLosses call (losses.h's token-level losses). Every datum has
// explicit targets; cross_entropy reads weights (any finite value, negative included: a caller
// back-propagating its own loss sends its gradient), importance_sampling and ppo also
// sampling_logprobs and advantages.
struct TokenBatch {
  int policy = 0;
  TokenLossKind loss = TokenLossKind::kCrossEntropy;
  TokenLossOptions options;
  std::vector<Datum> data;
};

struct TokenBatchResult {
  int policy = 0;
  double loss_sum = 0;  // sum of the batch's elementwise losses
  // Per datum, one entry per position: log p(target) under the policy's current weights (every
  // position, whatever its weight), and the position's loss.
  std::vector<std::vector<float>> logprobs;
  std::vector<std::vector<float>> elementwise_loss;
};

struct SampleRequest {
  int policy = -1;  // -1: the base without an adapter
  std::vector<int64_t> prompt;
  int64_t max_tokens = 1;
  double temperature = 1.0;  // 0: greedy
  // Token ids that end the completion (included in it).
  std::vector<int64_t> stop_tokens;
};
struct SampleResult {
  std::vector<int64_t> tokens;  // the completion
  // log p(token) under the sampling distribution: softmax(logits / temperature), or at
  // temperature 1 for greedy requests.
  std::vector<float> logprobs;
};

// Everything needed to resume one policy's training exactly.
struct PolicySnapshot {
  std::map<std::string, at::Tensor> master;     // fp32 masters by PEFT name
  std::map<std::string, at::Tensor> optimizer;  // AdamW::ExportState
  std::map<std::string, at::Tensor> gradients;  // accumulated grads (empty unless mid-way)
  int64_t micro_steps = 0;                      // ForwardBackward calls since the last step
  std::string scheduler_name;
  int64_t scheduler_position = 0;  // optimizer steps taken
  std::string rng_state;           // Rng::Serialize
  // The LoRA scaling the masters were trained with; Restore applies it. lora_alpha == 0: not
  // recorded (an older checkpoint): the policy keeps its own.
  int64_t lora_rank = 0;
  double lora_alpha = 0;
  bool use_rslora = false;
};

class Trainer {
 public:
  // `model` is borrowed and must outlive the trainer.
  explicit Trainer(const model::Qwen3Model* model);

  const model::Qwen3Model& model() const { return *model_; }

  // Adds a policy with fresh LoRA parameters; returns its index. InvalidArgument for bad
  // options or a duplicate name.
  [[nodiscard]] absl::StatusOr<int> AddPolicy(const PolicyOptions& options);
  int num_policies() const { return static_cast<int>(policies_.size()); }
  [[nodiscard]] absl::StatusOr<int> FindPolicy(const std::string& name) const;
  const PolicyOptions& options(int policy) const { return policies_[policy].options; }
  const LoraParameters& parameters(int policy) const { return policies_[policy].params; }
  int64_t step(int policy) const { return policies_[policy].adamw.step(); }
  int64_t micro_steps(int policy) const { return policies_[policy].micro_steps; }
  Rng& rng(int policy) { return policies_[policy].rng; }

  // Sets the adapter DPO and GRPO's KL use as reference for `policy` (default: none = the base).
  // The factors are copied (fp32) and never trained.
  [[nodiscard]] absl::Status SetReference(int policy, std::vector<model::LoraModuleInput> modules);

  // One forward and one backward over all batches' rows together. Gradients add to the masters'
  // .grad; each batch counts as one micro-batch of its policy. InvalidArgument (no gradient
  // touched) for an unknown policy, an empty batch, a datum with fewer than two tokens or
  // mismatched weights, token ids outside the vocabulary, odd DPO batches, or all-zero masks.
  [[nodiscard]] absl::StatusOr<std::vector<LossReport>> ForwardBackward(
      const std::vector<PolicyBatch>& batches);

  // The same losses without gradients (evaluation).
  [[nodiscard]] absl::StatusOr<std::vector<LossReport>> Evaluate(
      const std::vector<PolicyBatch>& batches);

  // AdamW step of `policy` over the mean of its accumulated micro-batch gradients, at the
  // schedule's rate for this step; clears the gradients. FailedPrecondition when nothing was
  // accumulated.
  [[nodiscard]] absl::StatusOr<StepStats> OptimStep(int policy);

  // Token losses over all batches' rows in one forward (per-row adapters), every position of every
  // datum computed. With `backward`, the gradient of the sum of the losses adds to the masters'
  // .grad (each batch one micro-batch); without, nothing is recorded. InvalidArgument (no
  // gradient touched) for an unknown policy, an empty batch or datum, data without explicit
  // targets, lengths that disagree, token ids outside the vocabulary or non-finite inputs.
  [[nodiscard]] absl::StatusOr<std::vector<TokenBatchResult>> TokenLosses(
      const std::vector<TokenBatch>& batches, bool backward);

  // AdamW step of `policy` at learning rate `lr` with `hyper` over the sum of the gradients
  // accumulated since the last step (no averaging over micro-batches: the token losses are sums
  // already); clears them. The policy's schedule is not consulted. FailedPrecondition when
  // nothing was accumulated; InvalidArgument for lr < 0 or bad hyper-parameters.
  [[nodiscard]] absl::StatusOr<StepStats> OptimStep(int policy, double lr,
                                                    const AdamWOptions& hyper);

  // Losses run one forward per call in which data of one policy that agree up to their first
  // weighted target (a GRPO group's prompt, a DPO pair's) compute those rows once, and logits
  // only from each datum's first to its last weighted target. Off: every datum runs whole (the
  // same losses and gradients up to float reassociation; for tests and measurements). Not while
  // other calls run.
  void set_share_prefixes(bool share) { share_prefixes_ = share; }
  bool share_prefixes() const { return share_prefixes_; }
  // Rows the losses (ForwardBackward, Evaluate, their reference passes) have run through the
  // model so far: what sharing saves.
  int64_t loss_forward_rows() const { return loss_forward_rows_.load(); }

  // Rollouts. Requests of different policies share decode steps (one forward per step).
  // Uses each policy's RNG stream (the base's requests use `base_rng`).
  [[nodiscard]] absl::StatusOr<std::vector<SampleResult>> Sample(
      const std::vector<SampleRequest>& requests);

  // Per-position log-probabilities of data[i]'s targets under `policy` (-1: base), no grad.
  [[nodiscard]] absl::StatusOr<std::vector<std::vector<float>>> Logprobs(
      int policy, const std::vector<Datum>& data);

  [[nodiscard]] absl::StatusOr<PolicySnapshot> Snapshot(int policy) const;
  // Restores `policy` from `snapshot` (all checked first; on error nothing changes), including
  // the snapshot's alpha / rsLoRA (its rank must match the policy's).
  [[nodiscard]] absl::Status Restore(int policy, const PolicySnapshot& snapshot);

  // The policy's current weights for serving: PEFT-named factors in `dtype`.
  [[nodiscard]] absl::StatusOr<std::map<std::string, at::Tensor>> ExportWeights(
      int policy, at::ScalarType dtype) const;

 private:
  struct Policy {
    PolicyOptions options;
    LoraParameters params;
    AdamW adamw;
    Rng rng;
    int64_t micro_steps = 0;
    std::optional<model::LoraAdapter> reference;
  };

  [[nodiscard]] absl::StatusOr<std::vector<SampleResult>> SampleImpl(
      const std::vector<SampleRequest>& requests);
  [[nodiscard]] absl::Status Validate(const std::vector<PolicyBatch>& batches) const;
  [[nodiscard]] absl::Status ValidateTokenBatches(const std::vector<TokenBatch>& batches) const;
  [[nodiscard]] absl::StatusOr<std::vector<TokenBatchResult>> RunTokenLosses(
      const std::vector<TokenBatch>& batches, bool backward);
  // Builds each distinct policy's adapter once; `slots[i]` is data i's adapter index.
  [[nodiscard]] absl::Status BuildAdapters(const std::vector<int>& policy_of_datum,
                                           std::vector<model::LoraAdapter>* built,
                                           std::vector<int32_t>* slots) const;
  // Clears the masters' gradients after a step.
  void ClearGradients(Policy& p);
  [[nodiscard]] absl::StatusOr<std::vector<LossReport>> RunLosses(
      const std::vector<PolicyBatch>& batches, bool backward);
  // Target log-probs of the flattened data, [sum of token counts]: position j of datum i at
  // (tokens before datum i) + j, 0 where nothing is computed (a datum's last position, and
  // unless `all_positions` the positions outside its first..last weighted target). `slots[i]`:
  // the adapter of datum i (index into `adapters`, -1 for the base). Unless `all_positions` (or
  // with sharing off), data of one adapter whose tokens agree up to their first weighted target
  // share those rows in the forward (ForwardInput::continues).
  [[nodiscard]] absl::StatusOr<at::Tensor> RowLogprobs(
      const std::vector<const Datum*>& data, const std::vector<const model::LoraAdapter*>& adapters,
      const std::vector<int32_t>& slots, bool all_positions, at::Tensor* argmax_hits) const;

  const model::Qwen3Model* model_;
  bool share_prefixes_ = true;
  mutable std::atomic<int64_t> loss_forward_rows_{0};
  std::vector<Policy> policies_;
  Rng base_rng_{0};
};

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_TRAINER_H_

// The trainer's losses over per-token log-probabilities. All take and return at::Tensors and
// stay differentiable with respect to the policy's log-probabilities.
//   SFT:  masked mean negative log-likelihood.
//   DPO:  -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), sequence log-prob sums.
//   GRPO: PPO-style clipped surrogate with group-relative advantages, optional k3 KL penalty.
// and the token-level losses of the Tinker API (sums over tokens, no normalisation):
//   cross_entropy:       -w * logp
//   importance_sampling: -w * exp(logp - q) * A
//   ppo:                 -w * min(r * A, clip(r, low, high) * A),  r = exp(logp - q)
#ifndef LORADB_COMPUTE_TRAINER_LOSSES_H_
#define LORADB_COMPUTE_TRAINER_LOSSES_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace loradb::trainer {

// log softmax(logits)[row, target[row]] in fp32: logits [rows, vocab], targets int64 [rows].
at::Tensor TokenLogprobs(const at::Tensor& logits, const at::Tensor& targets);

// Sum over tokens of mask * -logprob divided by the mask's sum. InvalidArgument when shapes
// differ or the mask is all zero.
[[nodiscard]] absl::StatusOr<at::Tensor> SftLoss(const at::Tensor& logprobs,
                                                 const at::Tensor& mask);

struct DpoOutput {
  at::Tensor loss;     // scalar, mean over pairs
  at::Tensor margins;  // [pairs] beta * ((pi_c - ref_c) - (pi_r - ref_r)), detached
};
// Inputs are [pairs] sequence log-prob sums (reference ones are treated as constants).
// InvalidArgument for shape mismatches, no pairs or beta <= 0.
[[nodiscard]] absl::StatusOr<DpoOutput> DpoLoss(const at::Tensor& policy_chosen,
                                                const at::Tensor& policy_rejected,
                                                const at::Tensor& ref_chosen,
                                                const at::Tensor& ref_rejected, double beta);

// (r - mean(group)) / (std(group) + eps) per group of `group_size` consecutive rewards (GRPO's
// group-relative advantage); with `scale_by_std` false only the mean is subtracted.
// InvalidArgument when the count is not a positive multiple of group_size.
[[nodiscard]] absl::StatusOr<std::vector<float>> GroupAdvantages(const std::vector<float>& rewards,
                                                                 int64_t group_size,
                                                                 bool scale_by_std = true);

struct GrpoOptions {
  double clip_epsilon = 0.2;
  double kl_beta = 0.0;  // > 0 adds beta * KL(policy || reference) (k3 estimator)
};
struct GrpoOutput {
  at::Tensor loss;  // scalar
  double clip_fraction = 0;
  double mean_kl = 0;
};
// Per-token tensors [tokens]: the policy's current logprobs (differentiable), the logprobs the
// rollout was sampled with, per-token advantages, the completion mask, and (when kl_beta > 0)
// the reference logprobs. Loss = -masked mean of min(ratio * A, clip(ratio) * A) - beta * KL.
[[nodiscard]] absl::StatusOr<GrpoOutput> GrpoLoss(
    const at::Tensor& logprobs, const at::Tensor& old_logprobs, const at::Tensor& advantages,
    const at::Tensor& mask, const at::Tensor& ref_logprobs, const GrpoOptions& options);

// The Tinker API's token-level losses: every position counts on its own and the batch loss is the
// plain sum of the elementwise losses (callers scale through the weights or advantages).
enum class TokenLossKind { kCrossEntropy, kImportanceSampling, kPpo };
const char* TokenLossName(TokenLossKind kind);  // "cross_entropy", "importance_sampling", "ppo"

struct TokenLossOptions {
  // PPO's clip range of the ratio r = p / q: [clip_low, clip_high], 0 <= low < high.
  double clip_low = 0.8;
  double clip_high = 1.2;
};

// Elementwise losses [tokens] (differentiable through `logprobs`): `weights` multiplies every
// loss; `sampling_logprobs` (q) and `advantages` (A) are read by importance_sampling and ppo
// (ignored, and may be undefined, for cross_entropy). InvalidArgument for shape mismatches or a
// PPO clip range outside 0 <= low < high.
[[nodiscard]] absl::StatusOr<at::Tensor> TokenLossElements(TokenLossKind kind,
                                                           const at::Tensor& logprobs,
                                                           const at::Tensor& weights,
                                                           const at::Tensor& sampling_logprobs,
                                                           const at::Tensor& advantages,
                                                           const TokenLossOptions& options);

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_LOSSES_H_

#include "compute/trainer/losses.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace loradb::trainer {
namespace {

bool SameShape(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.sizes().equals(b.sizes());
}

}  // namespace

at::Tensor TokenLogprobs(const at::Tensor& logits, const at::Tensor& targets) {
  at::Tensor lp = at::log_softmax(logits.to(at::kFloat), -1);
  return lp.gather(1, targets.unsqueeze(1)).squeeze(1);
}

absl::StatusOr<at::Tensor> SftLoss(const at::Tensor& logprobs, const at::Tensor& mask) {
  if (!SameShape(logprobs, mask)) {
    return absl::InvalidArgumentError("SFT loss: logprobs and mask shapes differ");
  }
  at::Tensor m = mask.to(at::kFloat);
  const double total = m.sum().item<double>();
  if (!(total > 0)) return absl::InvalidArgumentError("SFT loss: the loss mask is all zero");
  return -(logprobs * m).sum() / total;
}

absl::StatusOr<DpoOutput> DpoLoss(const at::Tensor& policy_chosen,
                                  const at::Tensor& policy_rejected, const at::Tensor& ref_chosen,
                                  const at::Tensor& ref_rejected, double beta) {
  if (!SameShape(policy_chosen, policy_rejected) || !SameShape(policy_chosen, ref_chosen) ||
      !SameShape(policy_chosen, ref_rejected) || policy_chosen.dim() != 1) {
    return absl::InvalidArgumentError("DPO loss: inputs must all be [pairs]");
  }
  if (policy_chosen.size(0) == 0) return absl::InvalidArgumentError("DPO loss: no pairs");
  if (!(beta > 0)) return absl::InvalidArgumentError("DPO loss: beta must be > 0");
  at::Tensor logits =
      (policy_chosen - ref_chosen.detach()) - (policy_rejected - ref_rejected.detach());
  DpoOutput out;
  out.loss = -at::log_sigmoid(logits * beta).mean();
  out.margins = (logits * beta).detach();
  return out;
}

absl::StatusOr<std::vector<float>> GroupAdvantages(const std::vector<float>& rewards,
                                                   int64_t group_size, bool scale_by_std) {
  if (group_size < 1 || rewards.empty() || rewards.size() % static_cast<size_t>(group_size) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GRPO: ", rewards.size(), " rewards do not form groups of ", group_size));
  }
  std::vector<float> adv(rewards.size());
  const size_t g = static_cast<size_t>(group_size);
  for (size_t start = 0; start < rewards.size(); start += g) {
    double mean = 0;
    for (size_t i = 0; i < g; ++i) mean += rewards[start + i];
    mean /= static_cast<double>(g);
    double var = 0;
    for (size_t i = 0; i < g; ++i) var += (rewards[start + i] - mean) * (rewards[start + i] - mean);
    // Unbiased std, as GRPO implementations compute it; 0 for a group of one.
    const double sd = g > 1 ? std::sqrt(var / static_cast<double>(g - 1)) : 0.0;
    for (size_t i = 0; i < g; ++i) {
      const double centred = rewards[start + i] - mean;
      adv[start + i] = static_cast<float>(scale_by_std ? centred / (sd + 1e-4) : centred);
    }
  }
  return adv;
}

absl::StatusOr<GrpoOutput> GrpoLoss(const at::Tensor& logprobs, const at::Tensor& old_logprobs,
                                    const at::Tensor& advantages, const at::Tensor& mask,
                                    const at::Tensor& ref_logprobs, const GrpoOptions& options) {
  if (!SameShape(logprobs, old_logprobs) || !SameShape(logprobs, advantages) ||
      !SameShape(logprobs, mask)) {
    return absl::InvalidArgumentError("GRPO loss: per-token inputs have different shapes");
  }
  if (!(options.clip_epsilon > 0)) {
    return absl::InvalidArgumentError("GRPO loss: clip epsilon must be > 0");
  }
  if (options.kl_beta > 0 && !SameShape(logprobs, ref_logprobs)) {
    return absl::InvalidArgumentError("GRPO loss: KL needs reference logprobs of the same shape");
  }
  at::Tensor m = mask.to(at::kFloat);
  const double total = m.sum().item<double>();
  if (!(total > 0)) return absl::InvalidArgumentError("GRPO loss: the completion mask is all zero");
  at::Tensor ratio = at::exp(logprobs - old_logprobs.detach());
  at::Tensor adv = advantages.to(at::kFloat);
  at::Tensor unclipped = ratio * adv;
  at::Tensor clipped =
      at::clamp(ratio, 1.0 - options.clip_epsilon, 1.0 + options.clip_epsilon) * adv;
  at::Tensor objective = at::minimum(unclipped, clipped);
  GrpoOutput out;
  {
    at::NoGradGuard no_grad;
    at::Tensor was_clipped = (unclipped != clipped).to(at::kFloat) * m;
    out.clip_fraction = was_clipped.sum().item<double>() / total;
  }
  if (options.kl_beta > 0) {
    at::Tensor d = ref_logprobs.detach() - logprobs;
    at::Tensor kl = at::exp(d) - d - 1.0;
    objective = objective - kl * options.kl_beta;
    out.mean_kl = (kl.detach() * m).sum().item<double>() / total;
  }
  out.loss = -(objective * m).sum() / total;
  return out;
}

const char* TokenLossName(TokenLossKind kind) {
  switch (kind) {
    case TokenLossKind::kCrossEntropy:
      return "cross_entropy";
    case TokenLossKind::kImportanceSampling:
      return "importance_sampling";
    case TokenLossKind::kPpo:
      return "ppo";
  }
  return "?";
}

absl::StatusOr<at::Tensor> TokenLossElements(TokenLossKind kind, const at::Tensor& logprobs,
                                             const at::Tensor& weights,
                                             const at::Tensor& sampling_logprobs,
                                             const at::Tensor& advantages,
                                             const TokenLossOptions& options) {
  if (!SameShape(logprobs, weights) || logprobs.dim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(TokenLossName(kind), " loss: logprobs and weights must both be [tokens]"));
  }
  at::Tensor w = weights.to(at::kFloat);
  if (kind == TokenLossKind::kCrossEntropy) return -logprobs * w;
  if (!SameShape(logprobs, sampling_logprobs) || !SameShape(logprobs, advantages)) {
    return absl::InvalidArgumentError(absl::StrCat(
        TokenLossName(kind), " loss: sampling logprobs and advantages must be [tokens]"));
  }
  at::Tensor ratio = at::exp(logprobs - sampling_logprobs.to(at::kFloat));
  at::Tensor adv = advantages.to(at::kFloat);
  if (kind == TokenLossKind::kImportanceSampling) return -(ratio * adv) * w;
  if (!(options.clip_low >= 0) || !(options.clip_high > options.clip_low) ||
      !std::isfinite(options.clip_high)) {
    return absl::InvalidArgumentError(absl::StrCat("ppo loss: clip range [", options.clip_low, ", ",
                                                   options.clip_high, "] needs 0 <= low < high"));
  }
  at::Tensor clipped = at::clamp(ratio, options.clip_low, options.clip_high);
  return -at::min(ratio * adv, clipped * adv) * w;
}

}  // namespace loradb::trainer

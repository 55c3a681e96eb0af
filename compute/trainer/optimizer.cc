#include "compute/trainer/optimizer.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "storage/util/status_macros.h"

namespace loradb::trainer {

absl::Status ValidateAdamWOptions(const AdamWOptions& o) {
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW betas must be in [0, 1), got ", o.beta1, ", ", o.beta2));
  }
  if (!(o.eps > 0)) return absl::InvalidArgumentError("AdamW eps must be > 0");
  if (!(o.weight_decay >= 0)) return absl::InvalidArgumentError("weight decay must be >= 0");
  return absl::OkStatus();
}

absl::StatusOr<StepStats> AdamW::Step(const std::map<std::string, at::Tensor>& params, double lr,
                                      double grad_scale) {
  return Step(params, lr, grad_scale, options_);
}

absl::StatusOr<StepStats> AdamW::Step(const std::map<std::string, at::Tensor>& params, double lr,
                                      double grad_scale, const AdamWOptions& hyper) {
  LORADB_RETURN_IF_ERROR(ValidateAdamWOptions(hyper));
  at::NoGradGuard no_grad;
  // Gather gradients (zero where absent) and check shapes before touching anything.
  std::map<std::string, at::Tensor> grads;
  double sq = 0;
  for (const auto& [name, p] : params) {
    at::Tensor g = p.grad();
    if (!g.defined()) {
      g = at::zeros_like(p);
    } else {
      g = g * grad_scale;
    }
    auto it = state_.find(name);
    if (it != state_.end() && !it->second.exp_avg.sizes().equals(p.sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state of ", name, " does not match the parameter's shape"));
    }
    sq += g.to(at::kDouble).square().sum().item<double>();
    grads[name] = g;
  }
  StepStats stats;
  stats.grad_norm = std::sqrt(sq);
  stats.lr = lr;
  if (!std::isfinite(stats.grad_norm)) {
    return absl::InvalidArgumentError("non-finite gradient norm; optimizer step skipped");
  }
  double clip = 1.0;
  if (hyper.max_grad_norm > 0 && stats.grad_norm > hyper.max_grad_norm) {
    clip = hyper.max_grad_norm / (stats.grad_norm + 1e-6);
  }
  ++step_;
  const double bc1 = 1.0 - std::pow(hyper.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(hyper.beta2, static_cast<double>(step_));
  for (const auto& [name, p] : params) {
    at::Tensor g = grads[name];
    if (clip != 1.0) g = g * clip;
    Moments& m = state_[name];
    if (!m.exp_avg.defined()) {
      m.exp_avg = at::zeros_like(p);
      m.exp_avg_sq = at::zeros_like(p);
    }
    m.exp_avg.mul_(hyper.beta1).add_(g, 1.0 - hyper.beta1);
    m.exp_avg_sq.mul_(hyper.beta2).addcmul_(g, g, 1.0 - hyper.beta2);
    at::Tensor denom = (m.exp_avg_sq / bc2).sqrt_().add_(hyper.eps);
    at::Tensor param = p;  // shares storage
    if (hyper.weight_decay > 0) param.mul_(1.0 - lr * hyper.weight_decay);
    param.addcdiv_(m.exp_avg, denom, -lr / bc1);
  }
  return stats;
}

std::map<std::string, at::Tensor> AdamW::ExportState() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, m] : state_) {
    out[name + ".exp_avg"] = m.exp_avg;
    out[name + ".exp_avg_sq"] = m.exp_avg_sq;
  }
  out["adamw.step"] = at::full({1}, step_, at::kLong);
  return out;
}

absl::Status AdamW::ImportState(const std::map<std::string, at::Tensor>& state,
                                const std::map<std::string, at::Tensor>& params) {
  auto step_it = state.find("adamw.step");
  if (step_it == state.end() || step_it->second.numel() != 1) {
    return absl::InvalidArgumentError("optimizer state has no adamw.step");
  }
  const int64_t step = step_it->second.to(at::kLong).item<int64_t>();
  if (step < 0) return absl::InvalidArgumentError("optimizer state has a negative step");
  std::map<std::string, Moments> next;
  size_t used = 1;
  for (const auto& [name, p] : params) {
    auto a = state.find(name + ".exp_avg");
    auto b = state.find(name + ".exp_avg_sq");
    if (a == state.end() && b == state.end() && step == 0) continue;
    if (a == state.end() || b == state.end()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state has no moments for ", name));
    }
    if (!a->second.sizes().equals(p.sizes()) || !b->second.sizes().equals(p.sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer moments of ", name, " do not match the parameter's shape"));
    }
    next[name] = {a->second.to(p.device(), at::kFloat).clone(),
                  b->second.to(p.device(), at::kFloat).clone()};
    used += 2;
  }
  if (used != state.size()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer state has ", state.size() - used,
                                                   " tensors for unknown parameters"));
  }
  state_ = std::move(next);
  step_ = step;
  return absl::OkStatus();
}

double LrSchedule::At(int64_t step) const {
  if (kind == Kind::kConstant) return lr;
  if (step < warmup_steps) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
  }
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
}

std::string LrSchedule::Name() const { return kind == Kind::kConstant ? "constant" : "cosine"; }

absl::StatusOr<LrSchedule::Kind> ParseScheduleKind(const std::string& name) {
  if (name == "constant") return LrSchedule::Kind::kConstant;
  if (name == "cosine") return LrSchedule::Kind::kCosine;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown LR schedule '", name, "' (constant | cosine)"));
}

absl::Status ValidateSchedule(const LrSchedule& s) {
  if (!(s.lr > 0)) return absl::InvalidArgumentError("learning rate must be > 0");
  if (s.warmup_steps < 0 || s.total_steps < 0) {
    return absl::InvalidArgumentError("schedule steps must be >= 0");
  }
  if (s.kind == LrSchedule::Kind::kCosine && s.total_steps <= s.warmup_steps) {
    return absl::InvalidArgumentError("cosine schedule needs total_steps > warmup_steps");
  }
  if (!(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1)) {
    return absl::InvalidArgumentError("min_lr_ratio must be in [0, 1]");
  }
  return absl::OkStatus();
}

}  // namespace loradb::trainer

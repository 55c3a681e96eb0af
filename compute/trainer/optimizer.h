// AdamW (decoupled weight decay, Loshchilov & Hutter) over named fp32 parameters, with global
// gradient-norm clipping, and the learning-rate schedules the trainer uses. Optimizer state is
// keyed by parameter name (not by position or tensor address), so a checkpoint restores into a
// freshly built parameter set.
#ifndef LORADB_COMPUTE_TRAINER_OPTIMIZER_H_
#define LORADB_COMPUTE_TRAINER_OPTIMIZER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loradb::trainer {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // Clip the global L2 norm of all gradients to this value; <= 0 disables clipping.
  double max_grad_norm = 1.0;
};

// InvalidArgument for betas outside [0, 1), eps <= 0 or negative weight decay.
[[nodiscard]] absl::Status ValidateAdamWOptions(const AdamWOptions& options);

struct StepStats {
  double grad_norm = 0;  // before clipping
  double lr = 0;
};

class AdamW {
 public:
  explicit AdamW(AdamWOptions options = {}) : options_(options) {}

  // One update of every parameter in `params` from its .grad() (a parameter without a grad
  // is treated as having a zero gradient), scaled by `grad_scale` first (1/N to average N
  // accumulated micro-batches), clipped, then AdamW with learning rate `lr`. InvalidArgument
  // (nothing updated) for a non-finite gradient norm or a parameter whose state shape differs.
  [[nodiscard]] absl::StatusOr<StepStats> Step(const std::map<std::string, at::Tensor>& params,
                                               double lr, double grad_scale = 1.0);
  // The same update with `hyper` (betas, eps, weight decay, clipping) in place of the options
  // given at construction, for callers that send them with every step (the Tinker optim_step).
  // InvalidArgument (nothing updated) also for hyper-parameters ValidateAdamWOptions refuses.
  [[nodiscard]] absl::StatusOr<StepStats> Step(const std::map<std::string, at::Tensor>& params,
                                               double lr, double grad_scale,
                                               const AdamWOptions& hyper);

  int64_t step() const { return step_; }
  const AdamWOptions& options() const { return options_; }

  // State as named tensors: `<param>.exp_avg`, `<param>.exp_avg_sq` (fp32) and `adamw.step`
  // (int64 scalar as shape [1]).
  std::map<std::string, at::Tensor> ExportState() const;
  // Restores what ExportState produced for the parameters `params` (names and shapes checked;
  // InvalidArgument and no change on mismatch).
  [[nodiscard]] absl::Status ImportState(const std::map<std::string, at::Tensor>& state,
                                         const std::map<std::string, at::Tensor>& params);

 private:
  struct Moments {
    at::Tensor exp_avg, exp_avg_sq;
  };
  AdamWOptions options_;
  int64_t step_ = 0;
  std::map<std::string, Moments> state_;
};

// Learning rate as a function of the optimizer step (0-based: the rate of the update that
// makes step `step` + 1).
struct LrSchedule {
  enum class Kind { kConstant, kCosine };
  Kind kind = Kind::kConstant;
  double lr = 1e-3;
  // Cosine: linear warmup from 0 over `warmup_steps`, then cosine decay to `min_lr_ratio` * lr
  // at `total_steps` (held there after).
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double min_lr_ratio = 0.0;

  double At(int64_t step) const;
  // "constant" or "cosine" (the checkpoint's scheduler name).
  std::string Name() const;
};

// "constant" | "cosine"; InvalidArgument otherwise.
[[nodiscard]] absl::StatusOr<LrSchedule::Kind> ParseScheduleKind(const std::string& name);
// InvalidArgument for lr <= 0, negative steps, cosine without total_steps > warmup_steps, or a
// min ratio outside [0, 1].
[[nodiscard]] absl::Status ValidateSchedule(const LrSchedule& schedule);

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_OPTIMIZER_H_

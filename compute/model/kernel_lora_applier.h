// A LoraApplier backed by the multi-LoRA kernels (kernels/lora_kernels.h): BGMV over the batch's
// per-row adapter slots (SGMV segments when rows come in runs, as in prefill) with the fast CPU
// path, adding the deltas into the projection output in place. It falls back to the torch
// reference (TorchLoraApplier) where the kernels do not apply: tensors not on the CPU, dtypes
// other than f32/bf16/f16, or when autograd must see the delta (grad mode on and x or a factor
// requires grad, as in training).
#ifndef LORADB_COMPUTE_MODEL_KERNEL_LORA_APPLIER_H_
#define LORADB_COMPUTE_MODEL_KERNEL_LORA_APPLIER_H_

#include <memory>

#include "compute/model/lora.h"
#include "kernels/lora_kernels.h"

namespace loradb::model {

class KernelLoraApplier final : public LoraApplier {
 public:
  // Where the kernels' work runs when a call is split: LibTorch's intra-op threads, as row ranges
  // through at::parallel_for. Those are the threads the base's linear layers run on; a pool of
  // the applier's own would compete with them for the cores (LibTorch's OpenMP threads spin for
  // a while after each parallel region).
  static constexpr int kIntraOpThreads = -1;

  // `num_threads`: kIntraOpThreads, or the thread count of a CPU context of the applier's own
  // (0: hardware concurrency).
  explicit KernelLoraApplier(int num_threads = 0);
  ~KernelLoraApplier() override;

  // Same contract as LoraApplier::Apply. `y` is updated in place (and returned) on the kernel
  // path, so it must be a fresh projection output. Calls on one applier must not overlap.
  at::Tensor Apply(const at::Tensor& x, const at::Tensor& y, int64_t layer, LoraTarget target,
                   int64_t expert, const at::Tensor& rows, const LoraBatch& batch,
                   const LoraRowGroups& groups) const override;

  // Calls served by the kernels and by the torch fallback (for tests and stats).
  int64_t kernel_calls() const { return kernel_calls_; }
  int64_t fallback_calls() const { return fallback_calls_; }
  // Kernel calls that used SGMV segments (prefill-shaped batches) rather than BGMV.
  int64_t sgmv_calls() const { return sgmv_calls_; }

 private:
  std::unique_ptr<kernels::cpu::CpuContext> ctx_;
  TorchLoraApplier fallback_;
  mutable int64_t kernel_calls_ = 0;
  mutable int64_t fallback_calls_ = 0;
  mutable int64_t sgmv_calls_ = 0;
};

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_KERNEL_LORA_APPLIER_H_

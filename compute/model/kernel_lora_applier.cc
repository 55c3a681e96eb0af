#include "compute/model/kernel_lora_applier.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <vector>

namespace loradb::model {
namespace {

std::optional<kernels::DType> KernelDType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return kernels::DType::kF32;
    case at::kBFloat16:
      return kernels::DType::kBF16;
    case at::kHalf:
      return kernels::DType::kF16;
    default:
      return std::nullopt;
  }
}

}  // namespace

KernelLoraApplier::KernelLoraApplier(int num_threads)
    : ctx_(num_threads == kIntraOpThreads
               ? nullptr
               : std::make_unique<kernels::cpu::CpuContext>(std::max(0, num_threads))) {}

KernelLoraApplier::~KernelLoraApplier() = default;

at::Tensor KernelLoraApplier::Apply(const at::Tensor& x, const at::Tensor& y, int64_t layer,
                                    LoraTarget target, int64_t expert, const at::Tensor& rows,
                                    const LoraBatch& batch, const LoraRowGroups& groups) const {
  if (groups.empty()) return y;
  // Gather this module's factors per batch slot; decide whether the kernels can serve the call.
  const size_t num_slots = batch.adapters.size();
  std::vector<const void*> a_ptrs(num_slots, nullptr), b_ptrs(num_slots, nullptr);
  std::vector<int32_t> ranks(num_slots, 0);
  std::vector<float> scales(num_slots, 0.0f);
  int32_t max_rank = 0;
  std::optional<kernels::DType> weight_dtype;
  const std::optional<kernels::DType> dtype = KernelDType(x.scalar_type());
  bool usable = dtype.has_value() && x.device().is_cpu() && y.device().is_cpu() &&
                y.scalar_type() == x.scalar_type() && x.dim() == 2 && y.dim() == 2;
  const bool grad = at::GradMode::is_enabled();
  if (usable && grad && x.requires_grad()) usable = false;
  bool any = false;
  for (int32_t slot : groups.slots) {
    if (!usable) break;
    const LoraFactors* f = batch.adapters[slot]->Find(layer, target);
    if (f == nullptr) continue;
    const at::Tensor& a = f->a;
    const at::Tensor& b = f->b;
    // Factors may be stored in another dtype than the activations (bf16 serving layout on an
    // fp32 base): the kernels read any of f32/bf16/f16 and accumulate in fp32.
    if (!a.device().is_cpu() || b.scalar_type() != a.scalar_type() ||
        !KernelDType(a.scalar_type()).has_value() ||
        (weight_dtype.has_value() && *KernelDType(a.scalar_type()) != *weight_dtype) ||
        !a.is_contiguous() || !b.is_contiguous() ||
        (grad && (a.requires_grad() || b.requires_grad()))) {
      usable = false;
      break;
    }
    weight_dtype = KernelDType(a.scalar_type());
    const int64_t r = a.size(-2);
    if (r > kernels::kMaxRank) {
      usable = false;
      break;
    }
    const size_t esize = kernels::DTypeSize(*weight_dtype);
    const auto* ab = static_cast<const std::byte*>(a.data_ptr());
    const auto* bb = static_cast<const std::byte*>(b.data_ptr());
    if (expert >= 0) {
      ab += static_cast<size_t>(expert) * static_cast<size_t>(r * a.size(-1)) * esize;
      bb += static_cast<size_t>(expert) * static_cast<size_t>(b.size(-2) * r) * esize;
    }
    a_ptrs[slot] = ab;
    b_ptrs[slot] = bb;
    ranks[slot] = static_cast<int32_t>(r);
    scales[slot] = static_cast<float>(f->scale);
    max_rank = std::max(max_rank, static_cast<int32_t>(r));
    any = true;
  }
  if (!usable) {
    ++fallback_calls_;
    return fallback_.Apply(x, y, layer, target, expert, rows, batch, groups);
  }
  if (!any) return y;

  at::Tensor xc = x.contiguous();
  at::Tensor out = y.is_contiguous() ? y : y.contiguous();
  at::Tensor row_slot =
      rows.defined() ? groups.row_slot.index_select(0, rows).contiguous() : groups.row_slot;
  kernels::AdapterTable table;
  table.num_adapters = static_cast<int32_t>(num_slots);
  table.in_features = x.size(1);
  table.out_features = y.size(1);
  table.dtype = *weight_dtype;
  table.a = a_ptrs.data();
  table.b = b_ptrs.data();
  table.ranks = ranks.data();
  table.scales = scales.data();
  table.max_rank = max_rank;
  const kernels::ConstRows xr{xc.data_ptr(), *dtype, xc.size(1)};
  const kernels::OutputRows yr{out.data_ptr(), *dtype, out.size(1), 0};
  // Prefill-shaped batches (runs of rows sharing an adapter, average run >= 2 rows) go through
  // SGMV segments; decode-shaped ones (about one row per sequence) through BGMV.
  const int32_t* rs = row_slot.data_ptr<int32_t>();
  const int64_t n = x.size(0);
  int64_t runs = 0;
  for (int64_t i = 0; i < n; ++i) runs += i == 0 || rs[i] != rs[i - 1] ? 1 : 0;
  const bool sgmv = 2 * runs <= n;
  // Rows [begin, end) as one kernel call: a row's result does not depend on the rows beside it.
  auto call = [&](int64_t begin, int64_t end, kernels::cpu::CpuContext* ctx) {
    const int64_t count = end - begin;
    const kernels::ConstRows xpart{
        static_cast<const char*>(xc.data_ptr()) + begin * xc.stride(0) * xc.element_size(), *dtype,
        xc.size(1)};
    const kernels::OutputRows ypart{
        static_cast<char*>(out.data_ptr()) + begin * out.stride(0) * out.element_size(), *dtype,
        out.size(1), 0};
    std::vector<int32_t> seg_starts, seg_adapter;
    if (sgmv) {
      for (int64_t i = begin; i < end; ++i) {
        if (i == begin || rs[i] != rs[i - 1]) {
          seg_starts.push_back(static_cast<int32_t>(i - begin));
          seg_adapter.push_back(rs[i]);
        }
      }
      seg_starts.push_back(static_cast<int32_t>(count));
    }
    const kernels::RowMapping m =
        sgmv ? kernels::RowMapping::Sgmv(count, static_cast<int64_t>(seg_adapter.size()),
                                         seg_starts.data(), seg_adapter.data())
             : kernels::RowMapping::Bgmv(count, rs + begin);
    return kernels::cpu::ShrinkExpand(xpart, table, m, ypart, ctx);
  };
  kernels::KernelStatus st;
  if (ctx_ != nullptr || at::get_num_threads() == 1 || n == 1) {
    st = call(0, n, ctx_.get());
  } else {
    // The arguments are the same for every range: checked once here, a range cannot fail alone.
    st = kernels::ValidateShrinkExpand(xr, table, kernels::RowMapping::Bgmv(n, rs), yr,
                                       /*host_indices=*/true);
    if (st.ok()) {
      at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
        static_cast<void>(call(begin, end, nullptr));
      });
    }
  }
  if (!st.ok()) {
    // The argument checks failed (nothing was written): the reference path still gives the
    // right answer, and the mismatch is worth a note.
    std::fprintf(stderr, "loradb: LoRA kernel refused a call (%s); using the torch path\n",
                 st.message().c_str());
    ++fallback_calls_;
    return fallback_.Apply(x, y, layer, target, expert, rows, batch, groups);
  }
  ++kernel_calls_;
  if (sgmv) ++sgmv_calls_;
  return out;
}

}  // namespace loradb::model

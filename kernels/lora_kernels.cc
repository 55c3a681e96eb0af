// Shared pieces of the kernels API: dtype helpers and the argument checks every
// implementation runs before touching memory.
#include "kernels/lora_kernels.h"

#include <cmath>
#include <string>

namespace loradb::kernels {

size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
  }
  return "unknown";
}

namespace {

bool ValidDType(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

KernelStatus Invalid(const std::string& what) { return KernelStatus::InvalidArgument(what); }

std::string S(int64_t v) { return std::to_string(v); }

KernelStatus CheckTable(const AdapterTable& w, bool host_indices) {
  if (w.in_features <= 0 || w.out_features <= 0) {
    return Invalid("adapter table: in_features and out_features must be positive (got " +
                   S(w.in_features) + ", " + S(w.out_features) + ")");
  }
  if (!ValidDType(w.dtype)) return Invalid("adapter table: unknown weight dtype");
  if (w.num_adapters < 0) return Invalid("adapter table: num_adapters is negative");
  if (w.max_rank < 0 || w.max_rank > kMaxRank) {
    return Invalid("adapter table: max_rank " + S(w.max_rank) + " is outside 0.." + S(kMaxRank));
  }
  if (w.num_experts < 0) return Invalid("adapter table: num_experts is negative");
  if (w.num_adapters > 0 &&
      (w.a == nullptr || w.b == nullptr || w.ranks == nullptr || w.scales == nullptr)) {
    return Invalid("adapter table: a, b, ranks and scales tables are required");
  }
  if (!host_indices) return KernelStatus::Ok();
  for (int32_t j = 0; j < w.num_adapters; ++j) {
    int32_t r = w.ranks[j];
    if (r < 0 || r > w.max_rank) {
      return Invalid("adapter " + S(j) + ": rank " + S(r) + " is outside 0..max_rank (" +
                     S(w.max_rank) + ")");
    }
    if (r > 0 && (w.a[j] == nullptr || w.b[j] == nullptr)) {
      return Invalid("adapter " + S(j) + ": null A or B pointer");
    }
    if (!std::isfinite(w.scales[j])) return Invalid("adapter " + S(j) + ": scale is not finite");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckAdapterExpert(const AdapterTable& w, const char* what, int64_t index,
                                int32_t adapter, const int32_t* experts) {
  if (adapter >= w.num_adapters) {
    return Invalid(std::string(what) + " " + S(index) + ": adapter " + S(adapter) +
                   " >= num_adapters (" + S(w.num_adapters) + ")");
  }
  if (adapter >= 0 && experts != nullptr) {
    int32_t e = experts[index];
    if (e < 0 || e >= w.num_experts) {
      return Invalid(std::string(what) + " " + S(index) + ": expert " + S(e) +
                     " is outside 0..num_experts-1 (" + S(w.num_experts) + " experts)");
    }
  }
  return KernelStatus::Ok();
}

KernelStatus CheckMapping(const AdapterTable& w, const RowMapping& m, bool host_indices) {
  if (m.num_rows < 0) return Invalid("row mapping: num_rows is negative");
  if (m.num_rows > INT32_MAX) return Invalid("row mapping: more than 2^31-1 rows");
  const bool moe = w.num_experts > 0;
  if (m.is_segmented()) {
    if (m.row_adapter != nullptr) {
      return Invalid("row mapping: give either per-row adapters (BGMV) or segments (SGMV)");
    }
    if (m.num_segments < 0) return Invalid("row mapping: num_segments is negative");
    if (m.num_segments > 0 && m.segment_adapter == nullptr) {
      return Invalid("row mapping: segment_adapter is required with segments");
    }
    if (moe && m.num_segments > 0 && m.segment_expert == nullptr) {
      return Invalid("row mapping: MoE adapter table needs segment_expert");
    }
    if (!moe && m.segment_expert != nullptr) {
      return Invalid("row mapping: expert indices given for a dense (non-MoE) adapter table");
    }
    if (!host_indices) return KernelStatus::Ok();
    const int32_t* st = m.segment_starts;
    if (st[0] < 0) return Invalid("row mapping: segment_starts[0] is negative");
    for (int64_t s = 0; s < m.num_segments; ++s) {
      if (st[s + 1] < st[s]) {
        return Invalid("row mapping: segment_starts decreases at segment " + S(s));
      }
      KernelStatus c = CheckAdapterExpert(w, "segment", s, m.segment_adapter[s], m.segment_expert);
      if (!c.ok()) return c;
    }
    if (st[m.num_segments] > m.num_rows) {
      return Invalid("row mapping: segments end at row " + S(st[m.num_segments]) +
                     ", past num_rows (" + S(m.num_rows) + ")");
    }
    return KernelStatus::Ok();
  }
  if (m.num_rows > 0 && m.row_adapter == nullptr) {
    return Invalid("row mapping: neither per-row adapters nor segments given");
  }
  if (moe && m.num_rows > 0 && m.row_expert == nullptr) {
    return Invalid("row mapping: MoE adapter table needs row_expert");
  }
  if (!moe && m.row_expert != nullptr) {
    return Invalid("row mapping: expert indices given for a dense (non-MoE) adapter table");
  }
  if (!host_indices) return KernelStatus::Ok();
  for (int64_t i = 0; i < m.num_rows; ++i) {
    KernelStatus c = CheckAdapterExpert(w, "row", i, m.row_adapter[i], m.row_expert);
    if (!c.ok()) return c;
  }
  return KernelStatus::Ok();
}

KernelStatus CheckX(const ConstRows& x, const AdapterTable& w, const RowMapping& m) {
  if (!ValidDType(x.dtype)) return Invalid("x: unknown dtype");
  if (m.num_rows > 0 && x.data == nullptr) return Invalid("x: data is null");
  if (x.stride < w.in_features) {
    return Invalid("x: row stride " + S(x.stride) + " is smaller than in_features (" +
                   S(w.in_features) + ")");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckY(const OutputRows& y, const AdapterTable& w, const RowMapping& m) {
  if (!ValidDType(y.dtype)) return Invalid("y: unknown dtype");
  if (m.num_rows > 0 && y.data == nullptr) return Invalid("y: data is null");
  if (y.offset < 0) return Invalid("y: negative column offset");
  if (y.stride < y.offset + w.out_features) {
    return Invalid("y: row stride " + S(y.stride) + " cannot hold columns [" + S(y.offset) + ", " +
                   S(y.offset + w.out_features) + ")");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckT(const RankBuffer& t, const AdapterTable& w, const RowMapping& m) {
  if (m.num_rows > 0 && t.data == nullptr) return Invalid("rank buffer: data is null");
  if (t.stride < w.max_rank) {
    return Invalid("rank buffer: stride " + S(t.stride) + " is smaller than max_rank (" +
                   S(w.max_rank) + ")");
  }
  return KernelStatus::Ok();
}

}  // namespace

KernelStatus ValidateShrink(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                            const RankBuffer& t, bool host_indices) {
  KernelStatus s = CheckTable(w, host_indices);
  if (s.ok()) s = CheckMapping(w, m, host_indices);
  if (s.ok()) s = CheckX(x, w, m);
  if (s.ok()) s = CheckT(t, w, m);
  return s;
}

KernelStatus ValidateExpand(const RankBuffer& t, const AdapterTable& w, const RowMapping& m,
                            const OutputRows& y, bool host_indices) {
  KernelStatus s = CheckTable(w, host_indices);
  if (s.ok()) s = CheckMapping(w, m, host_indices);
  if (s.ok()) s = CheckT(t, w, m);
  if (s.ok()) s = CheckY(y, w, m);
  return s;
}

KernelStatus ValidateShrinkExpand(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                                  const OutputRows& y, bool host_indices) {
  KernelStatus s = CheckTable(w, host_indices);
  if (s.ok()) s = CheckMapping(w, m, host_indices);
  if (s.ok()) s = CheckX(x, w, m);
  if (s.ok()) s = CheckY(y, w, m);
  return s;
}

}  // namespace loradb::kernels

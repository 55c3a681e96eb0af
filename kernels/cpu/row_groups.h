// Turns a RowMapping into the (row, adapter, expert) triples the CPU kernels iterate over.
// Internal to kernels/cpu.
#ifndef LORADB_KERNELS_CPU_ROW_GROUPS_H_
#define LORADB_KERNELS_CPU_ROW_GROUPS_H_

#include <cstdint>
#include <vector>

#include "kernels/lora_kernels.h"

namespace loradb::kernels::cpu_internal {

// Calls fn(row, adapter, expert) for every row that has an adapter, in row order. `expert` is 0
// for dense tables. Indices must already be validated.
template <typename Fn>
void ForEachMappedRow(const AdapterTable& w, const RowMapping& m, Fn&& fn) {
  const bool moe = w.num_experts > 0;
  if (m.is_segmented()) {
    for (int64_t s = 0; s < m.num_segments; ++s) {
      int32_t a = m.segment_adapter[s];
      if (a < 0) continue;
      int32_t e = moe ? m.segment_expert[s] : 0;
      for (int64_t i = m.segment_starts[s]; i < m.segment_starts[s + 1]; ++i) fn(i, a, e);
    }
    return;
  }
  for (int64_t i = 0; i < m.num_rows; ++i) {
    int32_t a = m.row_adapter[i];
    if (a >= 0) fn(i, a, moe ? m.row_expert[i] : 0);
  }
}

// A_a (for expert e) as a [rank, in] matrix, in weight elements.
inline const void* ExpertA(const AdapterTable& w, int32_t a, int32_t e) {
  const char* base = static_cast<const char*>(w.a[a]);
  int64_t elems = static_cast<int64_t>(e) * w.ranks[a] * w.in_features;
  return base + elems * static_cast<int64_t>(DTypeSize(w.dtype));
}

// B_a (for expert e) as an [out, rank] matrix.
inline const void* ExpertB(const AdapterTable& w, int32_t a, int32_t e) {
  const char* base = static_cast<const char*>(w.b[a]);
  int64_t elems = static_cast<int64_t>(e) * w.ranks[a] * w.out_features;
  return base + elems * static_cast<int64_t>(DTypeSize(w.dtype));
}

}  // namespace loradb::kernels::cpu_internal

#endif  // LORADB_KERNELS_CPU_ROW_GROUPS_H_

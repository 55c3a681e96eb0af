// Fast CPU path: rows are grouped by (adapter, expert) so each adapter's weights are read once
// per group; groups are cut into work items (row chunks, and output chunks for Expand) that the
// context's threads take from a shared counter; the arithmetic runs in the per-ISA micro-kernels.
#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cpu/fast_isa.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/lora_kernels.h"

namespace loradb::kernels::cpu {

using cpu_internal::ActiveKernels;
using cpu_internal::ExpertA;
using cpu_internal::ExpertB;
using cpu_internal::IsaKernels;
using cpu_internal::ThreadPool;

struct CpuContext::Impl {
  explicit Impl(int n) : pool(n), scratch(static_cast<size_t>(n)) {}
  ThreadPool pool;
  std::vector<std::vector<float>> scratch;  // one per thread
  std::vector<float> rank_buffer;           // ShrinkExpand's intermediate
};

CpuContext::CpuContext(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  impl_ = std::make_unique<Impl>(std::max(1, num_threads));
}

CpuContext::~CpuContext() = default;

int CpuContext::num_threads() const { return impl_->pool.num_threads(); }

const char* CpuContext::Isa() { return ActiveKernels().name; }

namespace {

// Rows sharing one (adapter, expert): rows[begin, end) of Plan::rows.
struct Group {
  int32_t adapter;
  int32_t expert;
  int32_t begin;
  int32_t end;
};

// A piece of work: rows [row_begin, row_end) of a group, outputs [out_begin, out_end).
struct Item {
  int32_t group;
  int32_t row_begin;
  int32_t row_end;
  int64_t out_begin;
  int64_t out_end;
};

struct Plan {
  std::vector<int32_t> rows;
  std::vector<Group> groups;
};

Plan MakePlan(const AdapterTable& w, const RowMapping& m) {
  Plan p;
  const bool moe = w.num_experts > 0;
  if (m.is_segmented()) {
    for (int64_t s = 0; s < m.num_segments; ++s) {
      int32_t a = m.segment_adapter[s];
      int32_t b = m.segment_starts[s], e = m.segment_starts[s + 1];
      if (a < 0 || b == e || w.ranks[a] == 0) continue;
      Group g{a, moe ? m.segment_expert[s] : 0, static_cast<int32_t>(p.rows.size()), 0};
      for (int32_t i = b; i < e; ++i) p.rows.push_back(i);
      g.end = static_cast<int32_t>(p.rows.size());
      p.groups.push_back(g);
    }
    return p;
  }
  // BGMV: sort (adapter, expert, row) keys so rows of one adapter become one group.
  std::vector<std::pair<int64_t, int32_t>> keyed;
  keyed.reserve(static_cast<size_t>(m.num_rows));
  const int64_t experts = std::max<int64_t>(1, w.num_experts);
  for (int64_t i = 0; i < m.num_rows; ++i) {
    int32_t a = m.row_adapter[i];
    if (a < 0 || w.ranks[a] == 0) continue;
    int32_t e = moe ? m.row_expert[i] : 0;
    keyed.emplace_back(a * experts + e, static_cast<int32_t>(i));
  }
  std::sort(keyed.begin(), keyed.end());
  p.rows.reserve(keyed.size());
  for (size_t i = 0; i < keyed.size(); ++i) {
    if (i == 0 || keyed[i].first != keyed[i - 1].first) {
      if (!p.groups.empty()) p.groups.back().end = static_cast<int32_t>(i);
      p.groups.push_back(Group{static_cast<int32_t>(keyed[i].first / experts),
                               static_cast<int32_t>(keyed[i].first % experts),
                               static_cast<int32_t>(i), 0});
    }
    p.rows.push_back(keyed[i].second);
  }
  if (!p.groups.empty()) p.groups.back().end = static_cast<int32_t>(keyed.size());
  return p;
}

// Below this many multiply-adds a call runs on the calling thread (waking workers costs more).
constexpr int64_t kParallelMacs = 1 << 18;
constexpr int32_t kShrinkChunkRows = 16;
constexpr int32_t kExpandChunkRows = 256;  // a packed B tile serves this many rows
constexpr int64_t kExpandChunkOut = 256;

class Runner {
 public:
  explicit Runner(CpuContext* ctx) : ctx_(ctx), k_(ActiveKernels()) {}

  const IsaKernels& k() const { return k_; }

  std::vector<float>& Scratch(int thread, size_t n) {
    std::vector<float>& s =
        ctx_ != nullptr ? ctx_->impl()->scratch[static_cast<size_t>(thread)] : local_scratch_;
    if (s.size() < n) s.resize(n);
    return s;
  }

  template <typename Fn>
  void Run(const std::vector<Item>& items, int64_t macs, Fn&& fn) {
    auto call = [&](int64_t i, int thread) { fn(items[static_cast<size_t>(i)], thread); };
    if (ctx_ == nullptr || macs < kParallelMacs || ctx_->num_threads() == 1) {
      for (size_t i = 0; i < items.size(); ++i) call(static_cast<int64_t>(i), 0);
      return;
    }
    ctx_->impl()->pool.ParallelFor(static_cast<int64_t>(items.size()), call);
  }

 private:
  CpuContext* ctx_;
  const IsaKernels& k_;
  std::vector<float> local_scratch_;
};

const char* RowAddr(const void* base, DType dtype, int64_t row, int64_t stride, int64_t col) {
  return static_cast<const char*>(base) +
         (row * stride + col) * static_cast<int64_t>(DTypeSize(dtype));
}

// Groups this small skip the packed-tile expand: each row does a dot product per output, in the
// shrink's work item (one pass, one parallel phase). Packing B^T costs about as much as dot
// products for 16 rows; below that the fused path measured ~1.2x faster on one thread and ~2x
// on two (batch 256 over 64 / 32 adapters, 4 / 8 rows each, 2560 -> 4096, rank 16, caches cold).
constexpr int32_t kFusedMaxRows = kShrinkChunkRows - 1;
bool IsSmallGroup(const Group& g) { return g.end - g.begin <= kFusedMaxRows; }

// y[row, offset + o] += scale * t[row] B^T for o in [o_begin, o_end), rows [row_begin, row_end)
// of the plan, by dot products (no packing). `acc` holds expand_tile floats.
void ExpandRowsByDot(const IsaKernels& k, const AdapterTable& w, const Group& gr, const Plan& plan,
                     int32_t row_begin, int32_t row_end, const float* t, int64_t t_stride,
                     const OutputRows& y, int64_t o_begin, int64_t o_end, float* acc) {
  const int32_t rank = w.ranks[gr.adapter];
  const float scale = w.scales[gr.adapter];
  const void* b = ExpertB(w, gr.adapter, gr.expert);
  const int64_t ysize = static_cast<int64_t>(DTypeSize(y.dtype));
  for (int64_t o0 = o_begin; o0 < o_end; o0 += k.expand_tile) {
    const int valid = static_cast<int>(std::min<int64_t>(k.expand_tile, o_end - o0));
    for (int32_t r = row_begin; r < row_end; ++r) {
      int32_t row = plan.rows[static_cast<size_t>(r)];
      k.expand_row_dot(b, w.dtype, rank, o0, valid, t + row * t_stride, acc);
      char* yrow = static_cast<char*>(y.data) + (row * y.stride + y.offset + o0) * ysize;
      k.update_y(acc, valid, scale, yrow, y.dtype);
    }
  }
}

// Shrink; when `fused_y` is set, small groups also do their whole expand in the same work item
// (decode: no second pass, the rank intermediate is still in L1).
void RunShrink(Runner& run, const ConstRows& x, const AdapterTable& w, const Plan& plan, float* t,
               int64_t t_stride, const OutputRows* fused_y) {
  std::vector<Item> items;
  int64_t macs = 0;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const Group& gr = plan.groups[g];
    macs += static_cast<int64_t>(gr.end - gr.begin) * w.ranks[gr.adapter] * w.in_features;
    if (fused_y != nullptr && IsSmallGroup(gr)) {
      macs += static_cast<int64_t>(gr.end - gr.begin) * w.ranks[gr.adapter] * w.out_features;
    }
    for (int32_t b = gr.begin; b < gr.end; b += kShrinkChunkRows) {
      items.push_back(
          Item{static_cast<int32_t>(g), b, std::min(gr.end, b + kShrinkChunkRows), 0, 0});
    }
  }
  const IsaKernels& k = run.k();
  const int64_t in = w.in_features;
  const int SK = k.shrink_k, SR = k.shrink_rows;
  run.Run(items, macs, [&](const Item& it, int thread) {
    const Group& gr = plan.groups[static_cast<size_t>(it.group)];
    const int32_t rank = w.ranks[gr.adapter];
    const int32_t nrows = it.row_end - it.row_begin;
    const bool convert_x = x.dtype != DType::kF32;
    const bool convert_a = w.dtype != DType::kF32;
    // Scratch: converted x rows, converted A rows, the output block.
    size_t need = static_cast<size_t>((convert_x ? nrows : 0) * in + (convert_a ? SK : 0) * in +
                                      SR * SK + k.expand_tile);
    std::vector<float>& scratch = run.Scratch(thread, need);
    float* xs = scratch.data();
    float* as = xs + (convert_x ? nrows * in : 0);
    float* block = as + (convert_a ? SK * in : 0);
    std::vector<const float*> xrows(static_cast<size_t>(nrows));
    for (int32_t r = 0; r < nrows; ++r) {
      int32_t row = plan.rows[static_cast<size_t>(it.row_begin + r)];
      const char* src = RowAddr(x.data, x.dtype, row, x.stride, 0);
      if (convert_x) {
        k.to_f32(src, x.dtype, in, xs + r * in);
        xrows[static_cast<size_t>(r)] = xs + r * in;
      } else {
        xrows[static_cast<size_t>(r)] = reinterpret_cast<const float*>(src);
      }
    }
    const void* a = ExpertA(w, gr.adapter, gr.expert);
    // A's rows are contiguous: a row's prefetches that pass its end skip to the next block's
    // row at that offset instead of the row below it, which this block is reading already
    // (a 512-wide row is no longer than the prefetch distance). Converted rows are in scratch,
    // in L1. Decode-shaped calls over bench-60m's modules (8 rows on 8 adapters, caches evicted
    // between steps, one thread): 2.8-3.5 -> 2.4-3.0 ms a step (six alternating pairs' means);
    // 2560 -> 4096 within the spread.
    const int64_t wrap = convert_a ? 0 : (SK - 1) * in * static_cast<int64_t>(sizeof(float));
    const float* arows[16];
    const float* xblock[16];
    for (int32_t k0 = 0; k0 < rank; k0 += SK) {
      const int nk = std::min<int32_t>(SK, rank - k0);
      for (int kk = 0; kk < SK; ++kk) {
        int kr = k0 + std::min(kk, nk - 1);  // pad a short block by repeating its last row
        if (convert_a) {
          if (kk < nk) {
            k.to_f32(
                static_cast<const char*>(a) + kr * in * static_cast<int64_t>(DTypeSize(w.dtype)),
                w.dtype, in, as + kk * in);
          }
          arows[kk] = as + std::min(kk, nk - 1) * in;
        } else {
          arows[kk] = static_cast<const float*>(a) + kr * in;
        }
      }
      for (int32_t r0 = 0; r0 < nrows; r0 += SR) {
        const int nr = std::min<int32_t>(SR, nrows - r0);
        for (int rr = 0; rr < SR; ++rr)
          xblock[rr] = xrows[static_cast<size_t>(r0 + std::min(rr, nr - 1))];
        const int which = nr >= 3 ? 2 : nr - 1;  // 1, 2 or a full block of rows
        k.shrink_block[which](arows, xblock, in, wrap, block, SK);
        for (int rr = 0; rr < nr; ++rr) {
          int32_t row = plan.rows[static_cast<size_t>(it.row_begin + r0 + rr)];
          std::memcpy(t + row * t_stride + k0, block + rr * SK,
                      sizeof(float) * static_cast<size_t>(nk));
        }
      }
    }
    if (fused_y != nullptr && IsSmallGroup(gr)) {
      ExpandRowsByDot(k, w, gr, plan, it.row_begin, it.row_end, t, t_stride, *fused_y, 0,
                      w.out_features, block + SR * SK);
    }
  });
}

// Expand; `skip_small` leaves out the small groups a fused RunShrink already expanded.
void RunExpand(Runner& run, const float* t, int64_t t_stride, const AdapterTable& w,
               const Plan& plan, const OutputRows& y, bool skip_small) {
  std::vector<Item> items;
  int64_t macs = 0;
  const int64_t out = w.out_features;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const Group& gr = plan.groups[g];
    if (skip_small && IsSmallGroup(gr)) continue;
    macs += static_cast<int64_t>(gr.end - gr.begin) * w.ranks[gr.adapter] * out;
    for (int32_t b = gr.begin; b < gr.end; b += kExpandChunkRows) {
      for (int64_t o = 0; o < out; o += kExpandChunkOut) {
        items.push_back(Item{static_cast<int32_t>(g), b, std::min(gr.end, b + kExpandChunkRows), o,
                             std::min(out, o + kExpandChunkOut)});
      }
    }
  }
  const IsaKernels& k = run.k();
  const int ET = k.expand_tile, ER = k.expand_rows;
  const size_t ysize = DTypeSize(y.dtype);
  run.Run(items, macs, [&](const Item& it, int thread) {
    const Group& gr = plan.groups[static_cast<size_t>(it.group)];
    const int32_t rank = w.ranks[gr.adapter];
    const float scale = w.scales[gr.adapter];
    const void* b = ExpertB(w, gr.adapter, gr.expert);
    std::vector<float>& scratch = run.Scratch(thread, static_cast<size_t>(rank * ET + ER * ET));
    float* bt = scratch.data();
    float* acc = bt + rank * ET;
    const float* trows[16];
    const int32_t nrows = it.row_end - it.row_begin;
    for (int64_t o0 = it.out_begin; o0 < it.out_end; o0 += ET) {
      const int valid = static_cast<int>(std::min<int64_t>(ET, it.out_end - o0));
      if (nrows < ER) {  // decode: dot products per output beat packing a transposed tile
        ExpandRowsByDot(k, w, gr, plan, it.row_begin, it.row_end, t, t_stride, y, o0, o0 + valid,
                        acc);
        continue;
      }
      k.pack_bt(b, w.dtype, rank, o0, valid, bt);
      for (int32_t r0 = 0; r0 < nrows; r0 += ER) {
        const int nr = std::min<int32_t>(ER, nrows - r0);
        for (int rr = 0; rr < ER; ++rr) {
          int32_t row = plan.rows[static_cast<size_t>(it.row_begin + r0 + std::min(rr, nr - 1))];
          trows[rr] = t + row * t_stride;
        }
        k.expand_block(bt, rank, trows, acc);
        for (int rr = 0; rr < nr; ++rr) {
          int32_t row = plan.rows[static_cast<size_t>(it.row_begin + r0 + rr)];
          char* yrow = static_cast<char*>(y.data) +
                       (row * y.stride + y.offset + o0) * static_cast<int64_t>(ysize);
          k.update_y(acc + rr * ET, valid, scale, yrow, y.dtype);
        }
      }
    }
  });
}

}  // namespace

KernelStatus Shrink(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                    const RankBuffer& t, CpuContext* ctx) {
  KernelStatus s = ValidateShrink(x, w, m, t, /*host_indices=*/true);
  if (!s.ok()) return s;
  Plan plan = MakePlan(w, m);
  Runner run(ctx);
  RunShrink(run, x, w, plan, t.data, t.stride, /*fused_y=*/nullptr);
  return s;
}

KernelStatus Expand(const RankBuffer& t, const AdapterTable& w, const RowMapping& m,
                    const OutputRows& y, CpuContext* ctx) {
  KernelStatus s = ValidateExpand(t, w, m, y, /*host_indices=*/true);
  if (!s.ok()) return s;
  Plan plan = MakePlan(w, m);
  Runner run(ctx);
  RunExpand(run, t.data, t.stride, w, plan, y, /*skip_small=*/false);
  return s;
}

KernelStatus ShrinkExpand(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                          const OutputRows& y, CpuContext* ctx) {
  KernelStatus s = ValidateShrinkExpand(x, w, m, y, /*host_indices=*/true);
  if (!s.ok()) return s;
  Plan plan = MakePlan(w, m);
  if (plan.groups.empty()) return s;
  Runner run(ctx);
  std::vector<float> local;
  std::vector<float>& tbuf = ctx != nullptr ? ctx->impl()->rank_buffer : local;
  const int64_t stride = std::max<int32_t>(1, w.max_rank);
  if (tbuf.size() < static_cast<size_t>(m.num_rows * stride)) {
    tbuf.resize(static_cast<size_t>(m.num_rows * stride));
  }
  RunShrink(run, x, w, plan, tbuf.data(), stride, &y);
  RunExpand(run, tbuf.data(), stride, w, plan, y, /*skip_small=*/true);
  return s;
}

}  // namespace loradb::kernels::cpu

// The fast CPU path against the reference over the kernel sweep: mixed ranks 1..256 in one
// batch, hidden 64/2049/4096, batch 1..256, every adapter popularity, empty batches, y_offset
// slices, BGMV/SGMV/MoE, every dtype pair. Tolerances: fp32 1e-5 relative to the magnitude of the
// summed terms; bf16/fp16 outputs additionally one ulp of the output dtype (2^-7, 2^-10
// relative) for the final rounding. The full cross product runs with LORADB_SLOW_TESTS=1.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/fast_isa.h"
#include "kernels/lora_kernels.h"
#include "tests/kernels/lora_problem.h"
#include "tests/kernels/runnable_isas.h"
#include "tests/test_util.h"

namespace loradb::kernels {
namespace {

using testing::Popularity;
using testing::Problem;
using testing::ProblemSpec;
using testing::RunnableIsas;

// Fused, and Shrink + Expand through a caller-owned intermediate, both against the reference.
void CheckFastMatchesReference(const ProblemSpec& spec, cpu::CpuContext* ctx) {
  Problem p(spec);
  std::vector<uint8_t> want = testing::ReferenceOutput(p);

  std::vector<uint8_t> got = p.y0();
  KernelStatus s = cpu::ShrinkExpand(p.X(), p.Table(), p.Mapping(), p.Y(got), ctx);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(testing::ExpectMatchesReference(p, got, want, "cpu::ShrinkExpand"), 0);

  const int64_t ts = std::max(1, p.max_rank()) + 3;  // a padded stride
  std::vector<float> t_fast(static_cast<size_t>(spec.rows * ts), 0.0f);
  std::vector<float> t_ref = t_fast;
  s = cpu::Shrink(p.X(), p.Table(), p.Mapping(), RankBuffer{t_fast.data(), ts}, ctx);
  ASSERT_TRUE(s.ok()) << s.message();
  s = reference::Shrink(p.X(), p.Table(), p.Mapping(), RankBuffer{t_ref.data(), ts});
  ASSERT_TRUE(s.ok()) << s.message();
  int bad = 0;
  for (int64_t i = 0; i < spec.rows; ++i) {
    int32_t a = p.AdapterOfRow(i);
    for (int32_t k = 0; k < ts; ++k) {
      size_t idx = static_cast<size_t>(i * ts + k);
      bool used = a >= 0 && k < p.ranks()[static_cast<size_t>(a)];
      double tol = used ? testing::kF32RelTol * p.ShrinkMagnitude(i, k) : 0.0;
      if (std::isnan(t_fast[idx]) || std::fabs(t_fast[idx] - t_ref[idx]) > tol) {
        if (++bad <= 5) {
          ADD_FAILURE() << "cpu::Shrink [" << spec.Name() << "] row " << i << " k " << k << ": got "
                        << t_fast[idx] << " want " << t_ref[idx];
        }
      }
    }
  }
  // Expand from the same (reference) intermediate.
  got = p.y0();
  s = cpu::Expand(RankBuffer{t_ref.data(), ts}, p.Table(), p.Mapping(), p.Y(got), ctx);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(testing::ExpectMatchesReference(p, got, want, "cpu::Expand"), 0);
}

struct SweepCase {
  int64_t in, out, rows;
  Popularity pop;
};

// Default sweep: every hidden size, batch size and popularity appears, sized to stay fast.
TEST(CpuFastKernels, MatchesReferenceOverTheSweep) {
  cpu::CpuContext ctx(2);
  const SweepCase cases[] = {
      {64, 64, 1, Popularity::kUniform},       {64, 64, 256, Popularity::kZipf},
      {64, 64, 0, Popularity::kUniform},       {64, 2049, 33, Popularity::kSomeNone},
      {2049, 64, 17, Popularity::kAllButOne},  {2049, 2049, 5, Popularity::kZipf},
      {2049, 2049, 64, Popularity::kOne},      {4096, 4096, 1, Popularity::kOne},
      {4096, 4096, 24, Popularity::kUniform},  {4096, 64, 256, Popularity::kZipf},
      {64, 4096, 256, Popularity::kAllButOne}, {2049, 4096, 16, Popularity::kNone},
  };
  uint32_t seed = 11;
  for (const SweepCase& c : cases) {
    for (bool segmented : {false, true}) {
      ProblemSpec spec;
      spec.in = c.in;
      spec.out = c.out;
      spec.rows = c.rows;
      spec.popularity = c.pop;
      spec.segmented = segmented;
      spec.y_offset = (seed % 3 == 0) ? 0 : 5;
      spec.y_extra = seed % 2;
      spec.seed = seed++;
      SCOPED_TRACE(spec.Name());
      CheckFastMatchesReference(spec, &ctx);
    }
  }
}

// Every (x/y, weight) dtype pair, mixed ranks, odd hidden size, on every runnable ISA.
TEST(CpuFastKernels, MatchesReferenceForEveryDtypePairAndIsa) {
  cpu::CpuContext ctx(2);
  for (const cpu_internal::IsaKernels* isa : RunnableIsas()) {
    cpu_internal::ForceKernelsForTesting(isa);
    SCOPED_TRACE(isa->name);
    for (DType xd : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (DType wd : {DType::kF32, DType::kBF16, DType::kF16}) {
        ProblemSpec spec;
        spec.in = 2049;
        spec.out = 129;
        spec.rows = 37;
        spec.x_dtype = xd;
        spec.w_dtype = wd;
        spec.popularity = Popularity::kSomeNone;
        spec.y_offset = 64;
        spec.y_extra = 7;
        spec.seed = 100 + static_cast<uint32_t>(xd) * 3 + static_cast<uint32_t>(wd);
        SCOPED_TRACE(spec.Name());
        CheckFastMatchesReference(spec, &ctx);
      }
    }
  }
  cpu_internal::ForceKernelsForTesting(nullptr);
}

// x and y in different dtypes (e.g. bf16 activations accumulating into an fp32 output).
TEST(CpuFastKernels, MixedActivationDtypes) {
  cpu::CpuContext ctx(2);
  const DType pairs[][2] = {
      {DType::kBF16, DType::kF32}, {DType::kF32, DType::kBF16}, {DType::kF16, DType::kBF16}};
  for (const auto& pr : pairs) {
    ProblemSpec spec;
    spec.in = 300;
    spec.out = 170;
    spec.rows = 21;
    spec.x_dtype = pr[0];
    spec.y_dtype = static_cast<int>(pr[1]);
    spec.w_dtype = DType::kBF16;
    spec.y_offset = 3;
    spec.seed = 77;
    SCOPED_TRACE(spec.Name());
    CheckFastMatchesReference(spec, &ctx);
  }
}

TEST(CpuFastKernels, MoeMatchesReference) {
  cpu::CpuContext ctx(2);
  for (bool segmented : {false, true}) {
    for (DType wd : {DType::kF32, DType::kBF16}) {
      ProblemSpec spec;
      spec.in = 96;
      spec.out = 200;
      spec.rows = 70;
      spec.experts = 8;
      spec.num_adapters = 4;
      spec.rank_cycle = {1, 16, 4, 32};
      spec.w_dtype = wd;
      spec.x_dtype = DType::kBF16;
      spec.popularity = Popularity::kSomeNone;
      spec.segmented = segmented;
      spec.seed = 7;
      SCOPED_TRACE(spec.Name());
      CheckFastMatchesReference(spec, &ctx);
    }
  }
}

// A rank-0 adapter contributes nothing; rows using it are left as they were.
TEST(CpuFastKernels, RankZeroAdapterAddsNothing) {
  ProblemSpec spec;
  spec.rank_cycle = {0, 8};
  spec.num_adapters = 2;
  spec.rows = 12;
  spec.popularity = Popularity::kUniform;
  Problem p(spec);
  std::vector<uint8_t> want = testing::ReferenceOutput(p);
  std::vector<uint8_t> got = p.y0();
  ASSERT_TRUE(cpu::ShrinkExpand(p.X(), p.Table(), p.Mapping(), p.Y(got), nullptr).ok());
  EXPECT_EQ(testing::ExpectMatchesReference(p, got, want, "rank 0"), 0);
}

// Work is split the same way whatever the thread count, so results are bit-identical.
TEST(CpuFastKernels, ResultsDoNotDependOnThreadCount) {
  ProblemSpec spec;
  spec.in = 2049;
  spec.out = 1000;
  spec.rows = 200;
  spec.popularity = Popularity::kZipf;
  spec.x_dtype = DType::kBF16;
  Problem p(spec);
  std::vector<uint8_t> first;
  for (int threads : {0, 1, 2, 3}) {
    std::unique_ptr<cpu::CpuContext> ctx;
    if (threads > 0) ctx = std::make_unique<cpu::CpuContext>(threads);
    std::vector<uint8_t> y = p.y0();
    ASSERT_TRUE(cpu::ShrinkExpand(p.X(), p.Table(), p.Mapping(), p.Y(y), ctx.get()).ok());
    if (first.empty()) {
      first = y;
    } else {
      EXPECT_EQ(y, first) << threads << " threads";
    }
  }
}

// Decode batches with one row per adapter take the fused single-row path (shrink, then expand
// by dot products, in one work item, with software prefetch of both weight streams). Odd sizes
// exercise the vector tails; mixed ranks the rank tails; every thread count gives the same bits.
TEST(CpuFastKernels, DistinctAdapterRowsMatchReferenceOnAnyThreadCount) {
  for (DType wd : {DType::kF32, DType::kBF16}) {
    ProblemSpec spec;
    spec.in = 2049;
    spec.out = 1031;
    spec.rows = 37;
    spec.num_adapters = 37;
    spec.rank_cycle = {16, 1, 7, 33, 16, 64};
    spec.popularity = Popularity::kDistinct;
    spec.w_dtype = wd;
    spec.y_offset = 5;
    spec.y_extra = 3;
    spec.seed = 21 + static_cast<uint32_t>(wd);
    SCOPED_TRACE(spec.Name());
    cpu::CpuContext ctx2(2);
    CheckFastMatchesReference(spec, &ctx2);
    Problem p(spec);
    std::vector<uint8_t> first;
    for (int threads : {0, 1, 2, 3}) {
      std::unique_ptr<cpu::CpuContext> ctx;
      if (threads > 0) ctx = std::make_unique<cpu::CpuContext>(threads);
      std::vector<uint8_t> y = p.y0();
      ASSERT_TRUE(cpu::ShrinkExpand(p.X(), p.Table(), p.Mapping(), p.Y(y), ctx.get()).ok());
      if (first.empty()) {
        first = y;
      } else {
        EXPECT_EQ(y, first) << threads << " threads";
      }
    }
  }
}

// Groups of up to 15 rows expand by dot products inside the shrink's work item; 16 and more use
// the packed B^T tiles. Group sizes on both sides of that line, BGMV and SGMV, odd sizes, every
// thread count giving the same bits.
TEST(CpuFastKernels, GroupSizesAroundTheFusedLimit) {
  for (int32_t rows_per_adapter : {3, 4, 15, 16, 17}) {
    for (bool segmented : {false, true}) {
      ProblemSpec spec;
      spec.in = 523;
      spec.out = 777;
      spec.num_adapters = 4;
      spec.rows = 4 * rows_per_adapter;
      spec.rank_cycle = {16, 5, 33, 1};
      spec.popularity = Popularity::kDistinct;  // row i on adapter i % 4
      spec.segmented = segmented;
      spec.y_offset = 2;
      spec.seed = 300 + static_cast<uint32_t>(rows_per_adapter);
      SCOPED_TRACE(spec.Name() + " rows_per_adapter=" + std::to_string(rows_per_adapter));
      cpu::CpuContext ctx2(2);
      CheckFastMatchesReference(spec, &ctx2);
      Problem p(spec);
      std::vector<uint8_t> first;
      for (int threads : {0, 1, 2, 3}) {
        std::unique_ptr<cpu::CpuContext> ctx;
        if (threads > 0) ctx = std::make_unique<cpu::CpuContext>(threads);
        std::vector<uint8_t> y = p.y0();
        ASSERT_TRUE(cpu::ShrinkExpand(p.X(), p.Table(), p.Mapping(), p.Y(y), ctx.get()).ok());
        if (first.empty()) {
          first = y;
        } else {
          EXPECT_EQ(y, first) << threads << " threads";
        }
      }
    }
  }
}

// Anonymous memory whose last bytes are followed by an inaccessible page: data placed at the
// end ends exactly where a read past it would fault.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes) {
    page_ = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    usable_ = (bytes + page_ - 1) / page_ * page_;
    void* m = ::mmap(nullptr, usable_ + page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (m == MAP_FAILED) return;
    base_ = static_cast<char*>(m);
    if (::mprotect(base_ + usable_, page_, PROT_NONE) != 0) {
      ::munmap(base_, usable_ + page_);
      base_ = nullptr;
    }
  }
  ~GuardedBuffer() {
    if (base_ != nullptr) ::munmap(base_, usable_ + page_);
  }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  bool ok() const { return base_ != nullptr; }
  // `bytes` of room that end at the guard page.
  void* Tail(size_t bytes) const { return base_ + usable_ - bytes; }

 private:
  size_t page_ = 0;
  size_t usable_ = 0;
  char* base_ = nullptr;
};

// The micro-kernels prefetch up to 2 KiB past the end of a weight matrix; prefetches must not
// fault, so weights that end right before an unmapped page still work (decode and prefill rows,
// every runnable ISA).
TEST(CpuFastKernels, WeightsEndingAtAGuardPage) {
  for (int64_t rows : {1, 3, 9}) {
    ProblemSpec spec;
    spec.in = 1024;
    spec.out = 512;
    spec.rows = rows;
    spec.num_adapters = 1;
    spec.rank_cycle = {16};
    spec.popularity = Popularity::kOne;
    spec.seed = 5;
    Problem p(spec);
    std::vector<uint8_t> want = testing::ReferenceOutput(p);
    AdapterTable t = p.Table();
    const size_t a_bytes = static_cast<size_t>(16 * spec.in) * sizeof(float);
    const size_t b_bytes = static_cast<size_t>(spec.out * 16) * sizeof(float);
    GuardedBuffer ga(a_bytes), gb(b_bytes);
    ASSERT_TRUE(ga.ok() && gb.ok());
    std::memcpy(ga.Tail(a_bytes), t.a[0], a_bytes);
    std::memcpy(gb.Tail(b_bytes), t.b[0], b_bytes);
    const void* a_ptr = ga.Tail(a_bytes);
    const void* b_ptr = gb.Tail(b_bytes);
    t.a = &a_ptr;
    t.b = &b_ptr;
    for (const cpu_internal::IsaKernels* isa : RunnableIsas()) {
      cpu_internal::ForceKernelsForTesting(isa);
      SCOPED_TRACE(std::string(isa->name) + " rows=" + std::to_string(rows));
      std::vector<uint8_t> got = p.y0();
      ASSERT_TRUE(cpu::ShrinkExpand(p.X(), t, p.Mapping(), p.Y(got), nullptr).ok());
      EXPECT_EQ(testing::ExpectMatchesReference(p, got, want, "guarded weights"), 0);
    }
    cpu_internal::ForceKernelsForTesting(nullptr);
  }
}

// Calls accumulate: applying the same batch twice adds the update twice.
TEST(CpuFastKernels, AccumulatesIntoY) {
  ProblemSpec spec;
  spec.rows = 20;
  spec.rank_cycle = {4};
  spec.num_adapters = 3;
  Problem p(spec);
  std::vector<uint8_t> once = testing::ReferenceOutput(p);
  std::vector<uint8_t> y = p.y0();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(cpu::ShrinkExpand(p.X(), p.Table(), p.Mapping(), p.Y(y), nullptr).ok());
  }
  const float* y0 = reinterpret_cast<const float*>(p.y0().data());
  const float* y1 = reinterpret_cast<const float*>(once.data());
  const float* y2 = reinterpret_cast<const float*>(y.data());
  for (size_t i = 0; i < p.y0().size() / 4; ++i) {
    EXPECT_NEAR(y2[i] - y1[i], y1[i] - y0[i], 1e-4 * (1 + std::fabs(y1[i]))) << i;
  }
}

// The full cross product of the kernel sweep (minutes on two cores).
TEST(CpuFastKernels, FullSweep) {
  LORADB_SLOW_TEST();
  cpu::CpuContext ctx(2);
  uint32_t seed = 1000;
  for (int64_t in : {64, 2049, 4096}) {
    for (int64_t out : {64, 2049, 4096}) {
      for (int64_t rows : {1, 2, 7, 16, 64, 255, 256}) {
        for (Popularity pop : {Popularity::kUniform, Popularity::kZipf, Popularity::kOne,
                               Popularity::kAllButOne, Popularity::kNone, Popularity::kSomeNone}) {
          for (bool segmented : {false, true}) {
            ProblemSpec spec;
            spec.in = in;
            spec.out = out;
            spec.rows = rows;
            spec.popularity = pop;
            spec.segmented = segmented;
            spec.num_adapters = 12;
            spec.x_dtype = static_cast<DType>(seed % 3);
            spec.w_dtype = static_cast<DType>((seed / 3) % 3);
            spec.y_offset = seed % 4 == 0 ? 0 : 3;
            spec.seed = seed++;
            SCOPED_TRACE(spec.Name());
            CheckFastMatchesReference(spec, &ctx);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace loradb::kernels

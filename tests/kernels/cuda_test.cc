// The CUDA kernels against the CPU reference, with the same problems and tolerances as the fast
// CPU path (cpu_fast_test.cc). Skips, visibly, where there is no GPU; kernels/cuda/
// check-on-gpu.sh runs these on a GPU machine.
#include <gtest/gtest.h>

#if defined(LORADB_HAVE_CUDA_KERNELS)
#include <cuda_runtime_api.h>

#include <vector>

#include "kernels/cuda/lora_cuda.h"
#include "kernels/lora_kernels.h"
#include "tests/kernels/lora_problem.h"
#include "tests/test_util.h"

namespace loradb::kernels {
namespace {

using testing::Popularity;
using testing::Problem;
using testing::ProblemSpec;

#define SKIP_WITHOUT_GPU()                                                     \
  do {                                                                         \
    int n = 0;                                                                 \
    cudaError_t e = cudaGetDeviceCount(&n);                                    \
    if (e != cudaSuccess || n == 0) {                                          \
      GTEST_SKIP() << "no CUDA device ("                                       \
                   << (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) \
                   << "): run kernels/cuda/check-on-gpu.sh on a GPU machine";  \
    }                                                                          \
  } while (0)

// Device copies of a Problem's arrays, freed on destruction.
class DeviceProblem {
 public:
  explicit DeviceProblem(const Problem& p) : p_(p) {
    for (int32_t j = 0; j < p.spec().num_adapters; ++j) {
      a_ptrs_.push_back(Upload(p.a_bytes(j)));
      b_ptrs_.push_back(Upload(p.b_bytes(j)));
    }
    da_ = Upload(a_ptrs_);
    db_ = Upload(b_ptrs_);
    ranks_ = Upload(p.ranks());
    scales_ = Upload(p.scales());
    x_ = Upload(p.x_bytes());
    y_ = Upload(p.y0());
    row_adapter_ = Upload(p.row_adapter());
    row_expert_ = Upload(p.row_expert());
    seg_starts_ = Upload(p.segment_starts());
    seg_adapter_ = Upload(p.segment_adapter());
    seg_expert_ = Upload(p.segment_expert());
    t_ = Upload(std::vector<float>(
        static_cast<size_t>(std::max<int64_t>(1, p.spec().rows) * std::max(1, p.max_rank()))));
  }
  ~DeviceProblem() {
    for (void* q : owned_) cudaFree(q);
  }

  AdapterTable Table() const {
    AdapterTable w = p_.Table();
    w.a = static_cast<const void* const*>(da_);
    w.b = static_cast<const void* const*>(db_);
    w.ranks = static_cast<const int32_t*>(ranks_);
    w.scales = static_cast<const float*>(scales_);
    return w;
  }
  RowMapping Mapping() const {
    const bool moe = p_.spec().experts > 0;
    if (p_.spec().segmented) {
      return RowMapping::Sgmv(p_.spec().rows, p_.num_segments(),
                              static_cast<const int32_t*>(seg_starts_),
                              static_cast<const int32_t*>(seg_adapter_),
                              moe ? static_cast<const int32_t*>(seg_expert_) : nullptr);
    }
    return RowMapping::Bgmv(p_.spec().rows, static_cast<const int32_t*>(row_adapter_),
                            moe ? static_cast<const int32_t*>(row_expert_) : nullptr);
  }
  ConstRows X() const { return ConstRows{x_, p_.spec().x_dtype, p_.spec().in}; }
  OutputRows Y() const {
    return OutputRows{y_, p_.spec().YType(), p_.y_stride(), p_.spec().y_offset};
  }
  RankBuffer T() const { return RankBuffer{static_cast<float*>(t_), std::max(1, p_.max_rank())}; }
  void ResetY() {
    ASSERT_EQ(cudaMemcpy(y_, p_.y0().data(), p_.y0().size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<uint8_t> DownloadY() const {
    std::vector<uint8_t> y(p_.y0().size());
    EXPECT_EQ(cudaMemcpy(y.data(), y_, y.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return y;
  }

 private:
  template <typename T>
  void* Upload(const std::vector<T>& v) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, v.size() * sizeof(T))), cudaSuccess);
    owned_.push_back(d);
    if (!v.empty()) {
      EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
    return d;
  }

  const Problem& p_;
  std::vector<void*> owned_;
  std::vector<void*> a_ptrs_, b_ptrs_;
  void *da_, *db_, *ranks_, *scales_, *x_, *y_, *row_adapter_, *row_expert_, *seg_starts_,
      *seg_adapter_, *seg_expert_, *t_;
};

void CheckCudaMatchesReference(const ProblemSpec& spec) {
  Problem p(spec);
  std::vector<uint8_t> want = testing::ReferenceOutput(p);
  DeviceProblem d(p);
  ASSERT_EQ(cuda::ShrinkExpand(d.X(), d.Table(), d.Mapping(), d.Y(), nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(testing::ExpectMatchesReference(p, d.DownloadY(), want, "cuda::ShrinkExpand"), 0);
  d.ResetY();
  ASSERT_EQ(cuda::Shrink(d.X(), d.Table(), d.Mapping(), d.T(), nullptr), cudaSuccess);
  ASSERT_EQ(cuda::Expand(d.T(), d.Table(), d.Mapping(), d.Y(), nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(testing::ExpectMatchesReference(p, d.DownloadY(), want, "cuda::Shrink+Expand"), 0);
}

TEST(CudaKernels, MatchesReferenceOverTheSweep) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t in, out, rows;
    Popularity pop;
  };
  const Case cases[] = {
      {64, 64, 1, Popularity::kUniform},       {64, 64, 256, Popularity::kZipf},
      {64, 64, 0, Popularity::kUniform},       {64, 2049, 33, Popularity::kSomeNone},
      {2049, 64, 17, Popularity::kAllButOne},  {2049, 2049, 5, Popularity::kZipf},
      {2049, 2049, 64, Popularity::kOne},      {4096, 4096, 1, Popularity::kOne},
      {4096, 4096, 24, Popularity::kUniform},  {4096, 64, 256, Popularity::kZipf},
      {64, 4096, 256, Popularity::kAllButOne}, {2049, 4096, 16, Popularity::kNone},
  };
  uint32_t seed = 11;
  for (const Case& c : cases) {
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
      CheckCudaMatchesReference(spec);
    }
  }
}

TEST(CudaKernels, MatchesReferenceForEveryDtypePair) {
  SKIP_WITHOUT_GPU();
  for (DType xd : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType wd : {DType::kF32, DType::kBF16, DType::kF16}) {
      ProblemSpec spec;
      spec.in = 2049;
      spec.out = 1029;
      spec.rows = 37;
      spec.x_dtype = xd;
      spec.w_dtype = wd;
      spec.popularity = Popularity::kSomeNone;
      spec.y_offset = 64;
      spec.y_extra = 7;
      spec.seed = 100 + static_cast<uint32_t>(xd) * 3 + static_cast<uint32_t>(wd);
      SCOPED_TRACE(spec.Name());
      CheckCudaMatchesReference(spec);
    }
  }
}

TEST(CudaKernels, MixedActivationDtypes) {
  SKIP_WITHOUT_GPU();
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
    CheckCudaMatchesReference(spec);
  }
}

TEST(CudaKernels, MoeMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (bool segmented : {false, true}) {
    ProblemSpec spec;
    spec.in = 96;
    spec.out = 200;
    spec.rows = 70;
    spec.experts = 8;
    spec.num_adapters = 4;
    spec.rank_cycle = {1, 16, 4, 32};
    spec.w_dtype = DType::kBF16;
    spec.x_dtype = DType::kBF16;
    spec.popularity = Popularity::kSomeNone;
    spec.segmented = segmented;
    spec.seed = 7;
    SCOPED_TRACE(spec.Name());
    CheckCudaMatchesReference(spec);
  }
}

// Bad scalar arguments are refused before launch; y is untouched.
TEST(CudaKernels, RefusesBadArguments) {
  SKIP_WITHOUT_GPU();
  ProblemSpec spec;
  spec.rows = 9;
  Problem p(spec);
  DeviceProblem d(p);
  AdapterTable w = d.Table();
  w.max_rank = kMaxRank + 1;
  EXPECT_EQ(cuda::ShrinkExpand(d.X(), w, d.Mapping(), d.Y(), nullptr), cudaErrorInvalidValue);
  OutputRows y = d.Y();
  y.offset = y.stride;
  EXPECT_EQ(cuda::Expand(d.T(), d.Table(), d.Mapping(), y, nullptr), cudaErrorInvalidValue);
  ConstRows x = d.X();
  x.stride = 1;
  EXPECT_EQ(cuda::Shrink(x, d.Table(), d.Mapping(), d.T(), nullptr), cudaErrorInvalidValue);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d.DownloadY(), p.y0());
}

// Out-of-range indices cannot be checked on the host: the device skips those rows.
TEST(CudaKernels, SkipsRowsWithOutOfRangeIndices) {
  SKIP_WITHOUT_GPU();
  ProblemSpec spec;
  spec.rows = 4;
  spec.popularity = Popularity::kUniform;
  Problem p(spec);
  DeviceProblem d(p);
  std::vector<int32_t> bad = {spec.num_adapters, 1000, -1, -5};
  int32_t* dbad = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dbad), bad.size() * sizeof(int32_t)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dbad, bad.data(), bad.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cuda::ShrinkExpand(d.X(), d.Table(), RowMapping::Bgmv(4, dbad), d.Y(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d.DownloadY(), p.y0());
  cudaFree(dbad);
}

TEST(CudaKernels, FullSweep) {
  LORADB_SLOW_TEST();
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1000;
  for (int64_t in : {64, 2049, 4096}) {
    for (int64_t out : {64, 2049, 4096}) {
      for (int64_t rows : {1, 2, 7, 16, 64, 255, 256}) {
        for (Popularity pop : {Popularity::kUniform, Popularity::kZipf, Popularity::kOne,
                               Popularity::kAllButOne, Popularity::kNone, Popularity::kSomeNone}) {
          ProblemSpec spec;
          spec.in = in;
          spec.out = out;
          spec.rows = rows;
          spec.popularity = pop;
          spec.segmented = seed % 2 == 0;
          spec.num_adapters = 12;
          spec.x_dtype = static_cast<DType>(seed % 3);
          spec.w_dtype = static_cast<DType>((seed / 3) % 3);
          spec.y_offset = seed % 4 == 0 ? 0 : 3;
          spec.seed = seed++;
          SCOPED_TRACE(spec.Name());
          CheckCudaMatchesReference(spec);
        }
      }
    }
  }
}

}  // namespace
}  // namespace loradb::kernels

#else

TEST(CudaKernels, NotBuilt) {
  GTEST_SKIP() << "built without the CUDA kernels (no nvcc, or -DLORADB_CUDA=OFF)";
}

#endif  // LORADB_HAVE_CUDA_KERNELS

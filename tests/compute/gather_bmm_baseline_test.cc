// The LibTorch baselines the kernels benchmark compares against compute what the kernels
// compute (so the benchmark compares equal work).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "compute/baselines/gather_bmm.h"
#include "kernels/lora_kernels.h"

namespace loradb::compute::baselines {
namespace {

TEST(GatherBmmBaseline, MatchesTheReferenceKernel) {
  const int64_t rows = 9, in = 67, out = 45, rank = 8, adapters = 5;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(adapters * rank * in), b(adapters * out * rank), x(rows * in),
      y0(rows * out), scales = {0.5f, 1.0f, 2.0f, -1.0f, 0.25f};
  for (auto* v : {&a, &b, &x, &y0})
    for (float& f : *v) f = u(rng);
  std::vector<int32_t> idx = {0, 4, -1, 2, 2, 3, 1, -1, 0};
  std::vector<const void*> ap, bp;
  std::vector<int32_t> ranks(adapters, rank);
  for (int64_t j = 0; j < adapters; ++j) {
    ap.push_back(a.data() + j * rank * in);
    bp.push_back(b.data() + j * out * rank);
  }
  kernels::AdapterTable w{
      adapters,  in,           out,           kernels::DType::kF32,       ap.data(),
      bp.data(), ranks.data(), scales.data(), static_cast<int32_t>(rank), 0};
  std::vector<float> want = y0;
  kernels::KernelStatus ks = kernels::reference::ShrinkExpand(
      kernels::ConstRows{x.data(), kernels::DType::kF32, in}, w,
      kernels::RowMapping::Bgmv(rows, idx.data()),
      kernels::OutputRows{want.data(), kernels::DType::kF32, out, 0});
  ASSERT_TRUE(ks.ok()) << ks.message();

  std::vector<float> got = y0;
  absl::Status s = GatherBmmLora(x.data(), a.data(), b.data(), idx.data(), scales.data(), rows, in,
                                 out, rank, adapters, got.data());
  ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
  }
  // Rows without an adapter are untouched.
  for (int64_t o = 0; o < out; ++o) EXPECT_EQ(got[2 * out + o], y0[2 * out + o]);

  std::vector<int32_t> bad = idx;
  bad[1] = adapters;
  EXPECT_EQ(GatherBmmLora(x.data(), a.data(), b.data(), bad.data(), scales.data(), rows, in, out,
                          rank, adapters, got.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GatherBmmBaseline, TorchLinearIsXTimesWTransposed) {
  const int64_t rows = 3, in = 5, out = 4;
  std::vector<float> x(rows * in), w(out * in), y(rows * out, -1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3;
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 5) - 2;
  ASSERT_TRUE(TorchLinear(x.data(), w.data(), rows, in, out, y.data()).ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      float want = 0;
      for (int64_t j = 0; j < in; ++j) want += x[r * in + j] * w[o * in + j];
      EXPECT_FLOAT_EQ(y[r * out + o], want) << r << "," << o;
    }
  }
  EXPECT_FALSE(TorchLinear(x.data(), w.data(), rows, 0, out, y.data()).ok());
}

}  // namespace
}  // namespace loradb::compute::baselines

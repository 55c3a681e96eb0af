// The reference kernels against hand-computed results, plus the argument checks every
// implementation shares.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/lora_kernels.h"
#include "tests/kernels/lora_problem.h"

namespace loradb::kernels {
namespace {

std::vector<uint8_t> Encode(const std::vector<float>& v, DType d) {
  std::vector<uint8_t> out(v.size() * DTypeSize(d));
  for (size_t i = 0; i < v.size(); ++i)
    StoreFromFloat(out.data(), d, static_cast<int64_t>(i), v[i]);
  return out;
}

std::vector<float> Decode(const std::vector<uint8_t>& v, DType d) {
  std::vector<float> out(v.size() / DTypeSize(d));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = LoadAsFloat(v.data(), d, static_cast<int64_t>(i));
  return out;
}

// Three rows, in=3, out=2 written into columns [1, 3) of a 4-wide y. Every value is exact in
// bf16 and fp16, so every dtype combination must give exactly these numbers.
class HandComputed : public ::testing::TestWithParam<std::tuple<DType, DType>> {};

TEST_P(HandComputed, DenseBgmvAndSgmv) {
  auto [xd, wd] = GetParam();
  // Adapter 0: rank 2, scale 0.5. Adapter 1: rank 1, scale 2.
  auto a0 = Encode({1, 0, 0, 0, 1, 1}, wd);  // [2, 3]
  auto b0 = Encode({1, 2, 3, -1}, wd);       // [2, 2]
  auto a1 = Encode({2, 1, -1}, wd);          // [1, 3]
  auto b1 = Encode({4, 0.5}, wd);            // [2, 1]
  const void* as[] = {a0.data(), a1.data()};
  const void* bs[] = {b0.data(), b1.data()};
  int32_t ranks[] = {2, 1};
  float scales[] = {0.5f, 2.0f};
  AdapterTable w{2, 3, 2, wd, as, bs, ranks, scales, 2, 0};
  auto x = Encode({1, 2, 3, -1, 0, 1, 7, 7, 7}, xd);
  const std::vector<float> y_init = {10, 20, 30, 40, 1, 1, 1, 1, 5, 6, 7, 8};
  // row 0: t = [1, 5], B t = [11, -2], * 0.5 -> [5.5, -1]
  // row 1: t = [-3], B t = [-12, -1.5], * 2 -> [-24, -3]
  // row 2: no adapter
  const std::vector<float> want = {10, 25.5, 29, 40, 1, -23, -2, 1, 5, 6, 7, 8};

  int32_t row_adapter[] = {0, 1, -1};
  auto y = Encode(y_init, xd);
  KernelStatus s =
      reference::ShrinkExpand(ConstRows{x.data(), xd, 3}, w, RowMapping::Bgmv(3, row_adapter),
                              OutputRows{y.data(), xd, 4, 1});
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(Decode(y, xd), want);

  int32_t starts[] = {0, 1, 2};
  int32_t seg_adapter[] = {0, 1};
  y = Encode(y_init, xd);
  s = reference::ShrinkExpand(ConstRows{x.data(), xd, 3}, w,
                              RowMapping::Sgmv(3, 2, starts, seg_adapter),
                              OutputRows{y.data(), xd, 4, 1});
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(Decode(y, xd), want);

  // Shrink then Expand through a caller-owned fp32 intermediate gives the same numbers.
  std::vector<float> t(3 * 2, -99.0f);
  y = Encode(y_init, xd);
  s = reference::Shrink(ConstRows{x.data(), xd, 3}, w, RowMapping::Bgmv(3, row_adapter),
                        RankBuffer{t.data(), 2});
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(t, (std::vector<float>{1, 5, -3, -99, -99, -99}));
  s = reference::Expand(RankBuffer{t.data(), 2}, w, RowMapping::Bgmv(3, row_adapter),
                        OutputRows{y.data(), xd, 4, 1});
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(Decode(y, xd), want);

  // The fast path gives the same exact numbers.
  for (int threads : {0, 2}) {
    cpu::CpuContext ctx(threads == 0 ? 1 : threads);
    y = Encode(y_init, xd);
    s = cpu::ShrinkExpand(ConstRows{x.data(), xd, 3}, w, RowMapping::Bgmv(3, row_adapter),
                          OutputRows{y.data(), xd, 4, 1}, threads == 0 ? nullptr : &ctx);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(Decode(y, xd), want);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypes, HandComputed,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16)));

TEST(ReferenceKernels, MoeRowsPickTheirExpert) {
  // One adapter, rank 1, 2 experts, in=2, out=1. Expert 0: A=[1,1], B=[2]; expert 1: A=[1,-1],
  // B=[3]. x=[3,1]: expert 0 adds 0.5*2*4 = 4, expert 1 adds 0.5*3*2 = 3.
  std::vector<float> a = {1, 1, 1, -1}, b = {2, 3};
  const void* as[] = {a.data()};
  const void* bs[] = {b.data()};
  int32_t ranks[] = {1};
  float scales[] = {0.5f};
  AdapterTable w{1, 2, 1, DType::kF32, as, bs, ranks, scales, 1, 2};
  std::vector<float> x = {3, 1, 3, 1, 3, 1};
  int32_t adapters[] = {0, 0, -1};
  int32_t experts[] = {0, 1, 0};
  for (bool fast : {false, true}) {
    std::vector<float> y = {0, 0, 0};
    KernelStatus s = fast ? cpu::ShrinkExpand(ConstRows{x.data(), DType::kF32, 2}, w,
                                              RowMapping::Bgmv(3, adapters, experts),
                                              OutputRows{y.data(), DType::kF32, 1, 0}, nullptr)
                          : reference::ShrinkExpand(ConstRows{x.data(), DType::kF32, 2}, w,
                                                    RowMapping::Bgmv(3, adapters, experts),
                                                    OutputRows{y.data(), DType::kF32, 1, 0});
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(y, (std::vector<float>{4, 3, 0})) << (fast ? "fast" : "reference");
  }
}

TEST(Conversions, RoundTripAndRounding) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToF16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);  // ties to even -> overflows to inf
  EXPECT_EQ(FloatToF16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToF16(0x1p-25f), 0x0000);  // tie rounds to even (0)
  EXPECT_EQ(FloatToF16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(F16ToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(F16ToFloat(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(F16ToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  // bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1).
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 0x1.8p-8f), 0x3f81);
  // Every fp16 value survives fp16 -> fp32 -> fp16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;  // NaN payloads
    ASSERT_EQ(FloatToF16(F16ToFloat(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: every implementation must refuse them with a clear message and write nothing.

// Which argument a bad case breaks: the table/mapping (every call), or x, y, or t (the calls that
// take that argument).
enum Arg { kTableOrMapping = 0, kX = 1, kY = 2, kT = 4 };

struct BadCase {
  std::string name;
  Arg arg;
  std::function<void(ConstRows&, AdapterTable&, RowMapping&, OutputRows&, RankBuffer&)> mutate;
  std::string message;  // substring of the expected error
};

std::vector<BadCase> BadCases(std::vector<int32_t>& bad_ranks, std::vector<int32_t>& bad_rows,
                              std::vector<int32_t>& bad_starts, std::vector<float>& bad_scales) {
  using C = ConstRows;
  using A = AdapterTable;
  using M = RowMapping;
  using Y = OutputRows;
  using T = RankBuffer;
  const Arg tm = kTableOrMapping;
  return {
      {"zero in_features", tm, [](C&, A& w, M&, Y&, T&) { w.in_features = 0; }, "in_features"},
      {"max_rank too big", tm, [](C&, A& w, M&, Y&, T&) { w.max_rank = 257; }, "max_rank 257"},
      {"rank above max_rank", tm,
       [&](C&, A& w, M&, Y&, T&) {
         bad_ranks.assign(w.ranks, w.ranks + w.num_adapters);
         bad_ranks[1] = w.max_rank + 1;
         w.ranks = bad_ranks.data();
       },
       "adapter 1: rank"},
      {"NaN scale", tm,
       [&](C&, A& w, M&, Y&, T&) {
         bad_scales.assign(w.scales, w.scales + w.num_adapters);
         bad_scales[2] = NAN;
         w.scales = bad_scales.data();
       },
       "adapter 2: scale is not finite"},
      {"null tables", tm, [](C&, A& w, M&, Y&, T&) { w.b = nullptr; }, "tables are required"},
      {"adapter index out of range", tm,
       [&](C&, A& w, M& m, Y&, T&) {
         bad_rows.assign(m.row_adapter, m.row_adapter + m.num_rows);
         bad_rows[3] = w.num_adapters;
         m.row_adapter = bad_rows.data();
       },
       "row 3: adapter 6 >= num_adapters"},
      {"expert index for dense table", tm,
       [&](C&, A&, M& m, Y&, T&) { m.row_expert = m.row_adapter; }, "dense (non-MoE)"},
      {"MoE table without experts", tm, [](C&, A& w, M&, Y&, T&) { w.num_experts = 2; },
       "needs row_expert"},
      {"no mapping", tm, [](C&, A&, M& m, Y&, T&) { m.row_adapter = nullptr; }, "neither"},
      {"both mappings", tm,
       [&](C&, A&, M& m, Y&, T&) {
         bad_starts = {0, 2};
         m.segment_starts = bad_starts.data();
         m.num_segments = 1;
         m.segment_adapter = m.row_adapter;
       },
       "either per-row"},
      {"segments past the batch", tm,
       [&](C&, A&, M& m, Y&, T&) {
         bad_starts = {0, 4, static_cast<int32_t>(m.num_rows) + 1};
         bad_rows = {0, 1};
         m = RowMapping::Sgmv(m.num_rows, 2, bad_starts.data(), bad_rows.data());
       },
       "past num_rows"},
      {"decreasing segments", tm,
       [&](C&, A&, M& m, Y&, T&) {
         bad_starts = {0, 4, 2};
         bad_rows = {0, 1};
         m = RowMapping::Sgmv(m.num_rows, 2, bad_starts.data(), bad_rows.data());
       },
       "decreases at segment 1"},
      {"x stride too small", kX, [](C& x, A& w, M&, Y&, T&) { x.stride = w.in_features - 1; },
       "x: row stride"},
      {"null x", kX, [](C& x, A&, M&, Y&, T&) { x.data = nullptr; }, "x: data is null"},
      {"y slice past the row", kY, [](C&, A&, M&, Y& y, T&) { y.offset = y.stride; },
       "y: row stride"},
      {"negative y offset", kY, [](C&, A&, M&, Y& y, T&) { y.offset = -1; }, "negative column"},
      {"rank buffer too narrow", kT, [](C&, A&, M&, Y&, T& t) { t.stride = 1; }, "rank buffer"},
  };
}

TEST(KernelArguments, EveryImplementationRefusesBadInputAndWritesNothing) {
  testing::ProblemSpec spec;
  spec.rows = 9;
  spec.y_offset = 3;
  spec.y_extra = 2;
  spec.popularity = testing::Popularity::kUniform;
  testing::Problem p(spec);
  std::vector<int32_t> bad_ranks, bad_rows, bad_starts;
  std::vector<float> bad_scales;
  cpu::CpuContext ctx(2);
  // The six calls and the arguments each takes.
  struct Call {
    const char* name;
    int uses;
  };
  const Call calls[] = {{"reference::Shrink", kX | kT},
                        {"reference::Expand", kY | kT},
                        {"reference::ShrinkExpand", kX | kY},
                        {"cpu::Shrink", kX | kT},
                        {"cpu::Expand", kY | kT},
                        {"cpu::ShrinkExpand", kX | kY}};
  for (const BadCase& c : BadCases(bad_ranks, bad_rows, bad_starts, bad_scales)) {
    for (int ci = 0; ci < 6; ++ci) {
      if (c.arg != kTableOrMapping && (calls[ci].uses & c.arg) == 0) continue;
      std::vector<uint8_t> y = p.y0();
      std::vector<float> tbuf(static_cast<size_t>(spec.rows * p.max_rank()), 7.0f);
      ConstRows x = p.X();
      AdapterTable w = p.Table();
      RowMapping m = p.Mapping();
      OutputRows yr = p.Y(y);
      RankBuffer t{tbuf.data(), p.max_rank()};
      c.mutate(x, w, m, yr, t);
      KernelStatus s;
      switch (ci) {
        case 0:
          s = reference::Shrink(x, w, m, t);
          break;
        case 1:
          s = reference::Expand(t, w, m, yr);
          break;
        case 2:
          s = reference::ShrinkExpand(x, w, m, yr);
          break;
        case 3:
          s = cpu::Shrink(x, w, m, t, &ctx);
          break;
        case 4:
          s = cpu::Expand(t, w, m, yr, &ctx);
          break;
        default:
          s = cpu::ShrinkExpand(x, w, m, yr, &ctx);
          break;
      }
      const std::string where = c.name + " via " + calls[ci].name;
      EXPECT_FALSE(s.ok()) << where;
      EXPECT_NE(s.message().find(c.message), std::string::npos)
          << where << ": message was '" << s.message() << "'";
      EXPECT_EQ(y, p.y0()) << where << " wrote to y";
      EXPECT_EQ(tbuf, std::vector<float>(tbuf.size(), 7.0f)) << where << " wrote to t";
    }
  }
}

TEST(KernelArguments, EmptyBatchIsAValidNoOp) {
  testing::ProblemSpec spec;
  spec.rows = 0;
  testing::Problem p(spec);
  std::vector<uint8_t> y;
  ConstRows x{nullptr, DType::kF32, spec.in};
  OutputRows yr{nullptr, DType::kF32, spec.out, 0};
  EXPECT_TRUE(reference::ShrinkExpand(x, p.Table(), p.Mapping(), yr).ok());
  EXPECT_TRUE(cpu::ShrinkExpand(x, p.Table(), p.Mapping(), yr, nullptr).ok());
  int32_t start[] = {0};
  EXPECT_TRUE(
      cpu::ShrinkExpand(x, p.Table(), RowMapping::Sgmv(0, 0, start, nullptr), yr, nullptr).ok());
}

}  // namespace
}  // namespace loradb::kernels

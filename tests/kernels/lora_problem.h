// Random multi-LoRA problems for the kernel tests: owns adapters, activations and the row
// mapping, builds the kernels' argument structs, and checks a result against the reference
// with the stated per-dtype tolerances.
#ifndef LORADB_TESTS_KERNELS_LORA_PROBLEM_H_
#define LORADB_TESTS_KERNELS_LORA_PROBLEM_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/lora_kernels.h"

namespace loradb::kernels::testing {

enum class Popularity {
  kUniform,    // adapters drawn uniformly
  kZipf,       // p(j) ~ 1 / (j + 1)^1.1
  kOne,        // every row on adapter 0
  kAllButOne,  // every row but the last on adapter 0, the last on adapter 1
  kNone,       // no row has an adapter
  kSomeNone,   // uniform, but about a third of the rows have no adapter
  kDistinct,   // row i on adapter i % num_adapters (decode with one row per adapter)
};

inline const char* PopularityName(Popularity p) {
  switch (p) {
    case Popularity::kUniform:
      return "uniform";
    case Popularity::kZipf:
      return "zipf";
    case Popularity::kOne:
      return "one";
    case Popularity::kAllButOne:
      return "all_but_one";
    case Popularity::kNone:
      return "none";
    case Popularity::kSomeNone:
      return "some_none";
    case Popularity::kDistinct:
      return "distinct";
  }
  return "?";
}

struct ProblemSpec {
  int64_t in = 64;
  int64_t out = 64;
  int64_t rows = 8;
  int32_t num_adapters = 6;
  std::vector<int32_t> rank_cycle = {1, 8, 16, 64, 128, 256};  // adapter j gets rank_cycle[j % n]
  DType x_dtype = DType::kF32;                                 // x, and y unless y_dtype is set
  int y_dtype = -1;  // a DType value for y, or -1: same as x
  DType w_dtype = DType::kF32;
  Popularity popularity = Popularity::kZipf;
  bool segmented = false;  // SGMV mapping (rows sorted into runs; row 0 left outside)
  int32_t experts = 0;     // > 0: MoE tables
  int64_t y_offset = 0;    // column slice of a wider y
  int64_t y_extra = 0;     // columns after the slice
  uint32_t seed = 1;

  DType YType() const { return y_dtype < 0 ? x_dtype : static_cast<DType>(y_dtype); }

  std::string Name() const {
    return "in=" + std::to_string(in) + " out=" + std::to_string(out) +
           " rows=" + std::to_string(rows) + " adapters=" + std::to_string(num_adapters) +
           " x=" + DTypeName(x_dtype) + " y=" + DTypeName(YType()) + " w=" + DTypeName(w_dtype) +
           " pop=" + PopularityName(popularity) + (segmented ? " sgmv" : " bgmv") +
           " experts=" + std::to_string(experts) + " y_offset=" + std::to_string(y_offset);
  }
};

class Problem {
 public:
  explicit Problem(const ProblemSpec& spec) : spec_(spec) {
    std::mt19937 rng(spec.seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int64_t e = std::max<int32_t>(1, spec.experts);
    for (int32_t j = 0; j < spec.num_adapters; ++j) {
      int32_t r = spec.rank_cycle[static_cast<size_t>(j) % spec.rank_cycle.size()];
      ranks_.push_back(r);
      max_rank_ = std::max(max_rank_, r);
      scales_.push_back(0.5f + 0.25f * static_cast<float>(j % 7));
      a_store_.push_back(Random(e * r * spec.in, spec.w_dtype,
                                1.0f / std::sqrt(static_cast<float>(spec.in)), rng));
      b_store_.push_back(Random(e * spec.out * r, spec.w_dtype, 1.0f, rng));
    }
    for (int32_t j = 0; j < spec.num_adapters; ++j) {
      a_ptrs_.push_back(a_store_[static_cast<size_t>(j)].data());
      b_ptrs_.push_back(b_store_[static_cast<size_t>(j)].data());
    }
    x_ = Random(spec.rows * spec.in, spec.x_dtype, 1.0f, rng);
    y_stride_ = spec.y_offset + spec.out + spec.y_extra;
    y0_ = Random(spec.rows * y_stride_, spec.YType(), 1.0f, rng);

    // Row adapters by popularity.
    std::vector<double> zipf;
    for (int32_t j = 0; j < spec.num_adapters; ++j) zipf.push_back(1.0 / std::pow(j + 1.0, 1.1));
    std::discrete_distribution<int32_t> zipf_dist(zipf.begin(), zipf.end());
    std::uniform_int_distribution<int32_t> uni(0, std::max(0, spec.num_adapters - 1));
    std::uniform_int_distribution<int32_t> expert(0, std::max(0, spec.experts - 1));
    for (int64_t i = 0; i < spec.rows; ++i) {
      int32_t a = -1;
      switch (spec.popularity) {
        case Popularity::kUniform:
          a = uni(rng);
          break;
        case Popularity::kZipf:
          a = zipf_dist(rng);
          break;
        case Popularity::kOne:
          a = 0;
          break;
        case Popularity::kAllButOne:
          a = i + 1 == spec.rows ? std::min(1, spec.num_adapters - 1) : 0;
          break;
        case Popularity::kNone:
          a = -1;
          break;
        case Popularity::kSomeNone:
          a = (rng() % 3 == 0) ? -1 - static_cast<int32_t>(rng() % 5) : uni(rng);
          break;
        case Popularity::kDistinct:
          a = static_cast<int32_t>(i % std::max(1, spec.num_adapters));
          break;
      }
      row_adapter_.push_back(a);
      row_expert_.push_back(spec.experts > 0 ? expert(rng) : 0);
    }
    if (spec.segmented) {
      // Sort rows into runs; each run of one (adapter, expert) becomes a segment. Row 0 stays
      // outside every segment when there are several rows.
      std::vector<std::pair<int32_t, int32_t>> keyed;
      for (int64_t i = 0; i < spec.rows; ++i) keyed.emplace_back(row_adapter_[i], row_expert_[i]);
      std::sort(keyed.begin(), keyed.end());
      int64_t first = spec.rows > 2 ? 1 : 0;
      row_adapter_.assign(static_cast<size_t>(spec.rows), -7);
      if (first == 1) row_expert_[0] = 0;
      segment_starts_.push_back(static_cast<int32_t>(first));
      for (int64_t i = first; i < spec.rows; ++i) {
        auto k = keyed[static_cast<size_t>(i)];
        if (i > first && k != keyed[static_cast<size_t>(i - 1)]) {
          segment_starts_.push_back(static_cast<int32_t>(i));
        }
        if (i == first || k != keyed[static_cast<size_t>(i - 1)]) {
          segment_adapter_.push_back(k.first);
          segment_expert_.push_back(k.second);
        }
        row_adapter_[static_cast<size_t>(i)] = k.first;
        row_expert_[static_cast<size_t>(i)] = k.second;
      }
      segment_starts_.push_back(static_cast<int32_t>(spec.rows));
      if (segment_adapter_.empty()) segment_starts_.resize(1);
    }
  }

  const ProblemSpec& spec() const { return spec_; }
  int32_t max_rank() const { return max_rank_; }
  int64_t y_stride() const { return y_stride_; }
  const std::vector<uint8_t>& x_bytes() const { return x_; }
  const std::vector<uint8_t>& y0() const { return y0_; }
  const std::vector<uint8_t>& a_bytes(int32_t j) const { return a_store_[static_cast<size_t>(j)]; }
  const std::vector<uint8_t>& b_bytes(int32_t j) const { return b_store_[static_cast<size_t>(j)]; }
  const std::vector<int32_t>& ranks() const { return ranks_; }
  const std::vector<float>& scales() const { return scales_; }
  const std::vector<int32_t>& row_adapter() const { return row_adapter_; }
  const std::vector<int32_t>& row_expert() const { return row_expert_; }
  const std::vector<int32_t>& segment_starts() const { return segment_starts_; }
  const std::vector<int32_t>& segment_adapter() const { return segment_adapter_; }
  const std::vector<int32_t>& segment_expert() const { return segment_expert_; }
  int64_t num_segments() const { return static_cast<int64_t>(segment_adapter_.size()); }

  // Host argument structs (the tables point into this object).
  AdapterTable Table() const {
    AdapterTable w;
    w.num_adapters = spec_.num_adapters;
    w.in_features = spec_.in;
    w.out_features = spec_.out;
    w.dtype = spec_.w_dtype;
    w.a = a_ptrs_.data();
    w.b = b_ptrs_.data();
    w.ranks = ranks_.data();
    w.scales = scales_.data();
    w.max_rank = max_rank_;
    w.num_experts = spec_.experts;
    return w;
  }
  RowMapping Mapping() const {
    if (spec_.segmented) {
      return RowMapping::Sgmv(spec_.rows, num_segments(), segment_starts_.data(),
                              segment_adapter_.data(),
                              spec_.experts > 0 ? segment_expert_.data() : nullptr);
    }
    return RowMapping::Bgmv(spec_.rows, row_adapter_.data(),
                            spec_.experts > 0 ? row_expert_.data() : nullptr);
  }
  ConstRows X() const { return ConstRows{x_.data(), spec_.x_dtype, spec_.in}; }
  OutputRows Y(std::vector<uint8_t>& y) const {
    return OutputRows{y.data(), spec_.YType(), y_stride_, spec_.y_offset};
  }

  // Row i's adapter (after SGMV sorting; rows outside segments report -1).
  int32_t AdapterOfRow(int64_t i) const {
    if (spec_.segmented && (segment_adapter_.empty() || i < segment_starts_.front())) return -1;
    return row_adapter_[static_cast<size_t>(i)];
  }

  // sum_j |A[k, j]| |x[i, j]| for row i (bound of the rank intermediate's terms).
  double ShrinkMagnitude(int64_t i, int32_t k) const {
    int32_t a = AdapterOfRow(i);
    int32_t r = ranks_[static_cast<size_t>(a)];
    int64_t e = spec_.experts > 0 ? row_expert_[static_cast<size_t>(i)] : 0;
    double s = 0;
    for (int64_t j = 0; j < spec_.in; ++j) {
      s += std::fabs(LoadAsFloat(a_ptrs_[static_cast<size_t>(a)], spec_.w_dtype,
                                 (e * r + k) * spec_.in + j)) *
           std::fabs(LoadAsFloat(x_.data(), spec_.x_dtype, i * spec_.in + j));
    }
    return s;
  }

  // |y0| + |scale| sum_k |B[o, k]| sum_j |A[k, j]| |x[j]|: what the fp32 sums' error scales with.
  std::vector<double> OutputMagnitude() const {
    std::vector<double> mag(static_cast<size_t>(spec_.rows * y_stride_));
    for (int64_t i = 0; i < spec_.rows; ++i) {
      for (int64_t c = 0; c < y_stride_; ++c) {
        mag[static_cast<size_t>(i * y_stride_ + c)] =
            std::fabs(LoadAsFloat(y0_.data(), spec_.YType(), i * y_stride_ + c));
      }
      int32_t a = AdapterOfRow(i);
      if (a < 0) continue;
      int32_t r = ranks_[static_cast<size_t>(a)];
      int64_t e = spec_.experts > 0 ? row_expert_[static_cast<size_t>(i)] : 0;
      std::vector<double> tm(static_cast<size_t>(r));
      for (int32_t k = 0; k < r; ++k) tm[static_cast<size_t>(k)] = ShrinkMagnitude(i, k);
      for (int64_t o = 0; o < spec_.out; ++o) {
        double s = 0;
        for (int32_t k = 0; k < r; ++k) {
          s += std::fabs(LoadAsFloat(b_ptrs_[static_cast<size_t>(a)], spec_.w_dtype,
                                     (e * spec_.out + o) * r + k)) *
               tm[static_cast<size_t>(k)];
        }
        mag[static_cast<size_t>(i * y_stride_ + spec_.y_offset + o)] +=
            std::fabs(scales_[static_cast<size_t>(a)]) * s;
      }
    }
    return mag;
  }

 private:
  static std::vector<uint8_t> Random(int64_t n, DType dtype, float amp, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-amp, amp);
    std::vector<uint8_t> v(static_cast<size_t>(n) * DTypeSize(dtype));
    for (int64_t i = 0; i < n; ++i) StoreFromFloat(v.data(), dtype, i, u(rng));
    return v;
  }

  ProblemSpec spec_;
  std::vector<std::vector<uint8_t>> a_store_, b_store_;
  std::vector<const void*> a_ptrs_, b_ptrs_;
  std::vector<int32_t> ranks_;
  std::vector<float> scales_;
  int32_t max_rank_ = 0;
  std::vector<uint8_t> x_, y0_;
  int64_t y_stride_ = 0;
  std::vector<int32_t> row_adapter_, row_expert_;
  std::vector<int32_t> segment_starts_, segment_adapter_, segment_expert_;
};

// Relative tolerance of one rounding of y to `dtype` (one ulp at the value's magnitude).
inline double RoundingTolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 0.0;
    case DType::kBF16:
      return 1.0 / 128;  // 2^-7: bf16 keeps 8 significant bits
    case DType::kF16:
      return 1.0 / 1024;  // 2^-10: fp16 keeps 11 significant bits
  }
  return 0.0;
}

// fp32 accumulation tolerance, relative to the magnitude of the summed terms.
inline constexpr double kF32RelTol = 1e-5;

// Checks `got` (a whole y buffer) against the reference's `want`: no NaN anywhere; outside the
// slice and on rows without an adapter bit-identical to y0; inside within
// RoundingTolerance(dtype) * |want| + 1e-5 * magnitude. Returns the number of mismatches.
inline int64_t ExpectMatchesReference(const Problem& p, const std::vector<uint8_t>& got,
                                      const std::vector<uint8_t>& want, const std::string& what) {
  const ProblemSpec& s = p.spec();
  std::vector<double> mag = p.OutputMagnitude();
  const double rtol = RoundingTolerance(s.YType());
  int64_t bad = 0;
  const size_t esz = DTypeSize(s.YType());
  for (int64_t i = 0; i < s.rows; ++i) {
    const bool mapped = p.AdapterOfRow(i) >= 0;
    for (int64_t c = 0; c < p.y_stride(); ++c) {
      int64_t idx = i * p.y_stride() + c;
      float g = LoadAsFloat(got.data(), s.YType(), idx);
      float w = LoadAsFloat(want.data(), s.YType(), idx);
      bool in_slice = mapped && c >= s.y_offset && c < s.y_offset + s.out;
      bool ok;
      if (std::isnan(g)) {
        ok = false;
      } else if (!in_slice) {
        ok = std::memcmp(got.data() + idx * esz, p.y0().data() + idx * esz, esz) == 0;
      } else {
        double tol = rtol * std::fabs(w) + kF32RelTol * mag[static_cast<size_t>(idx)];
        ok = std::fabs(static_cast<double>(g) - w) <= tol;
      }
      if (!ok && ++bad <= 5) {
        ADD_FAILURE() << what << " [" << s.Name() << "] row " << i << " col " << c
                      << (in_slice ? " (updated)" : " (must be untouched)") << ": got " << g
                      << " want " << w << " magnitude " << mag[static_cast<size_t>(idx)];
      }
    }
  }
  return bad;
}

// Runs the reference ShrinkExpand on a copy of y0.
inline std::vector<uint8_t> ReferenceOutput(const Problem& p) {
  std::vector<uint8_t> y = p.y0();
  KernelStatus s = reference::ShrinkExpand(p.X(), p.Table(), p.Mapping(), p.Y(y));
  EXPECT_TRUE(s.ok()) << s.message();
  return y;
}

}  // namespace loradb::kernels::testing

#endif  // LORADB_TESTS_KERNELS_LORA_PROBLEM_H_

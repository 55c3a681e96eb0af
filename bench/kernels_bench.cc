// Scenario `kernels`: the multi-LoRA kernels on a Qwen3-4B-shaped projection (2560 -> 4096,
// rank 16, fp32) at batch 1, 16, 64, 256 (issue 5). Cases:
//   cpu (default): base matmul alone; base + LoRA with 1 adapter; base + LoRA with 64 distinct
//        adapters (BGMV, fast CPU path); the reference loop; LibTorch gather + bmm (when compute/
//        is built). Goal lines: fast >= 5x reference, 64 adapters <= 1.5x one adapter (base +
//        LoRA), fast faster than gather + bmm.
//   gpu: BGMV decode on the CUDA kernels, achieved memory bandwidth vs the device's peak (when
//        the CUDA kernels are built and a GPU is present).
// Flags: --batches=1,16,64,256 --threads=N --min-seconds=S.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "kernels/lora_kernels.h"

#if defined(LORADB_COMPUTE_AVAILABLE)
#include "compute/baselines/gather_bmm.h"
#endif
#if defined(LORADB_KERNELS_CUDA_AVAILABLE)
#include "bench/kernels_bench_gpu.h"
#endif

namespace loradb::bench {
namespace {

namespace k = ::loradb::kernels;

struct Options {
  std::vector<int64_t> batches = {1, 16, 64, 256};
  int threads = 2;
  double min_seconds = 0.3;
  bool gpu = false;
};

absl::Status ParseArgs(const std::vector<std::string>& args, Options* o) {
  for (const std::string& a : args) {
    if (a == "cpu") continue;
    if (a == "gpu") {
      o->gpu = true;
    } else if (a.rfind("--batches=", 0) == 0) {
      o->batches.clear();
      for (absl::string_view part : absl::StrSplit(a.substr(10), ',')) {
        int64_t v;
        if (!absl::SimpleAtoi(part, &v) || v <= 0) {
          return absl::InvalidArgumentError("bad --batches value: " + a);
        }
        o->batches.push_back(v);
      }
    } else if (a.rfind("--threads=", 0) == 0) {
      if (!absl::SimpleAtoi(a.substr(10), &o->threads) || o->threads <= 0) {
        return absl::InvalidArgumentError("bad --threads value: " + a);
      }
    } else if (a.rfind("--min-seconds=", 0) == 0) {
      if (!absl::SimpleAtod(a.substr(14), &o->min_seconds)) {
        return absl::InvalidArgumentError("bad --min-seconds value: " + a);
      }
    } else {
      return absl::InvalidArgumentError("unknown argument: " + a +
                                        " (use cpu|gpu, --batches=, --threads=, --min-seconds=)");
    }
  }
  return absl::OkStatus();
}

// Median milliseconds of each of `fns`, timed round-robin (one run of each per round, after one
// warm-up round) for at least min_seconds and 3 rounds, so that every variant sees the same
// machine load (this VM is shared; a variant timed alone would see a different load).
absl::StatusOr<std::vector<double>> InterleavedMedianMs(
    double min_seconds, const std::vector<std::function<absl::Status()>>& fns) {
  for (const auto& fn : fns) {
    absl::Status st = fn();
    if (!st.ok()) return st;
  }
  std::vector<std::vector<double>> samples(fns.size());
  double start = NowSeconds();
  for (size_t round = 0; round < 3 || (NowSeconds() - start < min_seconds && round < 1000);
       ++round) {
    for (size_t i = 0; i < fns.size(); ++i) {
      double t0 = NowSeconds();
      absl::Status st = fns[i]();
      if (!st.ok()) return st;
      samples[i].push_back((NowSeconds() - t0) * 1e3);
    }
  }
  std::vector<double> medians;
  for (auto& s : samples) medians.push_back(Quantile(s, 0.5));
  return medians;
}

absl::Status ToStatus(const k::KernelStatus& s) {
  return s.ok() ? absl::OkStatus() : absl::InternalError(s.message());
}

// A blocked fp32 y = x W^T for builds without LibTorch (W is [out, in]).
[[maybe_unused]] absl::Status BlockedLinear(const float* x, const float* w, int64_t rows,
                                            int64_t in, int64_t out, float* y) {
  constexpr int64_t kBo = 64, kBi = 256;
  std::fill(y, y + rows * out, 0.0f);
  for (int64_t o0 = 0; o0 < out; o0 += kBo) {
    for (int64_t i0 = 0; i0 < in; i0 += kBi) {
      const int64_t o1 = std::min(out, o0 + kBo), i1 = std::min(in, i0 + kBi);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t o = o0; o < o1; ++o) {
          float acc[8] = {};
          int64_t i = i0;
          for (; i + 8 <= i1; i += 8)
            for (int l = 0; l < 8; ++l) acc[l] += x[r * in + i + l] * w[o * in + i + l];
          float s = 0;
          for (int l = 0; l < 8; ++l) s += acc[l];
          for (; i < i1; ++i) s += x[r * in + i] * w[o * in + i];
          y[r * out + o] += s;
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RunCpu(const Options& opt) {
  constexpr int64_t kIn = 2560, kOut = 4096, kRank = 16, kAdapters = 64;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, float amp) {
    for (float& f : v) f = amp * u(rng);
  };
  const int64_t max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  std::vector<float> w_base(static_cast<size_t>(kIn * kOut));
  std::vector<float> a(static_cast<size_t>(kAdapters * kRank * kIn));
  std::vector<float> b(static_cast<size_t>(kAdapters * kOut * kRank));
  std::vector<float> x(static_cast<size_t>(max_batch * kIn));
  fill(w_base, 0.02f);
  fill(a, 0.02f);
  fill(b, 0.1f);
  fill(x, 1.0f);
  std::vector<const void*> a_ptrs, b_ptrs;
  std::vector<int32_t> ranks(kAdapters, kRank);
  std::vector<float> scales(kAdapters, 2.0f);
  for (int64_t j = 0; j < kAdapters; ++j) {
    a_ptrs.push_back(a.data() + j * kRank * kIn);
    b_ptrs.push_back(b.data() + j * kOut * kRank);
  }
  k::AdapterTable table{static_cast<int32_t>(kAdapters),
                        kIn,
                        kOut,
                        k::DType::kF32,
                        a_ptrs.data(),
                        b_ptrs.data(),
                        ranks.data(),
                        scales.data(),
                        static_cast<int32_t>(kRank),
                        0};
  k::cpu::CpuContext ctx(opt.threads);

#if defined(LORADB_COMPUTE_AVAILABLE)
  const std::string base_impl = "libtorch_mm";
  auto base = [&](int64_t rows, float* y) {
    return compute::baselines::TorchLinear(x.data(), w_base.data(), rows, kIn, kOut, y);
  };
  const int base_threads = compute::baselines::TorchNumThreads();
#else
  const std::string base_impl = "blocked_fp32_loop";
  auto base = [&](int64_t rows, float* y) {
    return BlockedLinear(x.data(), w_base.data(), rows, kIn, kOut, y);
  };
  const int base_threads = 1;
#endif
  Progress("kernels: " + std::string(k::cpu::CpuContext::Isa()) + ", " +
           std::to_string(opt.threads) + " kernel threads, base matmul " + base_impl);

  for (int64_t batch : opt.batches) {
    std::vector<float> y(static_cast<size_t>(batch * kOut), 0.0f);
    std::vector<int32_t> one(static_cast<size_t>(batch), 0), distinct(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i)
      distinct[static_cast<size_t>(i)] = static_cast<int32_t>(i % kAdapters);
    const int64_t n_distinct = std::min(batch, kAdapters);
    k::ConstRows xr{x.data(), k::DType::kF32, kIn};
    k::OutputRows yr{y.data(), k::DType::kF32, kOut, 0};
    auto lora = [&](const std::vector<int32_t>& idx) {
      return ToStatus(
          k::cpu::ShrinkExpand(xr, table, k::RowMapping::Bgmv(batch, idx.data()), yr, &ctx));
    };
    const double ms_min = opt.min_seconds;
    Progress("batch " + std::to_string(batch));
    std::vector<std::function<absl::Status()>> fns = {
        [&] { return base(batch, y.data()); },
        [&] { return lora(one); },
        [&] { return lora(distinct); },
        [&] {
          absl::Status s = base(batch, y.data());
          return s.ok() ? lora(one) : s;
        },
        [&] {
          absl::Status s = base(batch, y.data());
          return s.ok() ? lora(distinct) : s;
        },
        [&] {
          return ToStatus(k::reference::ShrinkExpand(
              xr, table, k::RowMapping::Bgmv(batch, distinct.data()), yr));
        },
    };
#if defined(LORADB_COMPUTE_AVAILABLE)
    fns.push_back([&] {
      return compute::baselines::GatherBmmLora(x.data(), a.data(), b.data(), distinct.data(),
                                               scales.data(), batch, kIn, kOut, kRank, kAdapters,
                                               y.data());
    });
#endif
    auto medians = InterleavedMedianMs(ms_min, fns);
    if (!medians.ok()) return medians.status();
    const std::vector<double>& md = *medians;
    const double base_ms = md[0];
    const double lora1_ms = md[1];
    const double lora64_ms = md[2];
    const double base_lora1_ms = md[3];
    const double base_lora64_ms = md[4];
    const double ref_ms = md[5];
    const double gather_ms = md.size() > 6 ? md[6] : -1;
    const double lora_macs = static_cast<double>(batch) * kRank * (kIn + kOut);
    nlohmann::json line = {{"bench", "kernels"},
                           {"case", "cpu"},
                           {"in", kIn},
                           {"out", kOut},
                           {"rank", kRank},
                           {"batch", batch},
                           {"distinct_adapters", n_distinct},
                           {"dtype", "f32"},
                           {"isa", k::cpu::CpuContext::Isa()},
                           {"kernel_threads", opt.threads},
                           {"base_impl", base_impl},
                           {"base_threads", base_threads},
                           {"base_ms", base_ms},
                           {"base_lora1_ms", base_lora1_ms},
                           {"base_lora64_ms", base_lora64_ms},
                           {"lora1_ms", lora1_ms},
                           {"lora64_ms", lora64_ms},
                           {"reference_ms", ref_ms},
                           {"lora_only_64_vs_1_ratio", lora64_ms / lora1_ms},
                           {"lora64_gflops", 2 * lora_macs / (lora64_ms * 1e6)}};
    if (gather_ms >= 0) line["gather_bmm_ms"] = gather_ms;
    Emit(line);
    const std::string b = "_b" + std::to_string(batch);
    double speedup = ref_ms / lora64_ms;
    EmitGoal("kernels", "fast_vs_reference_speedup" + b, speedup, ">= 5", speedup >= 5);
    double ratio = base_lora64_ms / base_lora1_ms;
    EmitGoal("kernels", "distinct64_vs_one_adapter_cost" + b, ratio, "<= 1.5", ratio <= 1.5);
    if (gather_ms >= 0) {
      double vs = gather_ms / lora64_ms;
      EmitGoal("kernels", "fast_vs_gather_bmm_speedup" + b, vs, "> 1", vs > 1);
    }
  }
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  Options opt;
  absl::Status st = ParseArgs(args, &opt);
  if (!st.ok()) return st;
  if (opt.gpu) {
#if defined(LORADB_KERNELS_CUDA_AVAILABLE)
    return RunGpuKernelsBench(opt.min_seconds);
#else
    return absl::FailedPreconditionError("kernels gpu: built without the CUDA kernels");
#endif
  }
  return RunCpu(opt);
}

LORADB_REGISTER_SCENARIO(ScenarioDef{
    "kernels",
    "multi-LoRA kernels: CPU table (base, 1 vs 64 adapters, reference, gather+bmm) | gpu",
    Run,
    {"cpu", "--batches=1,16,64,256", "--min-seconds=1"}});

}  // namespace
}  // namespace loradb::bench

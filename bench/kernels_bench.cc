// Scenario `kernels`: the multi-LoRA kernels on a Qwen3-4B-shaped projection (2560 -> 4096,
// rank 16, fp32) at batch 1, 16, 64, 256. Cases:
//   cpu (default): two phases per batch.
//        1. Interleaved with LibTorch: base matmul alone; base + LoRA with 1 adapter; base + LoRA
//           with 64 distinct adapters (BGMV, fast CPU path); the LoRA calls alone; the reference
//           loop; LibTorch gather + bmm (when compute/ is built).
//        2. Kernels alone, caches cold: before every timed call the caches are evicted (untimed),
//           as in decode, where the base matmul streams its weights between two LoRA calls of a
//           projection. Arms: the fast path (kernel threads, and one thread), the reference loop,
//           and a traffic probe that moves the same bytes as the fast call (reads every A, B and
//           x row, read-modify-writes y) with no arithmetic, on the kernel threads and on one:
//           the machine's memory bandwidth for this access, measured in the same run.
//        Goal lines: fast >= 5x reference (phase 1), 64 adapters <= 1.5x one adapter
//        (base + LoRA, phase 1), fast faster than gather + bmm (phase 1), and fast within 1.3x
//        of the traffic probe's faster arm (phase 2, batches with one row per adapter).
//        LibTorch's OpenMP threads (libgomp) spin for milliseconds after each parallel region
//        by default, taking the second core from the kernel's second thread in the LoRA call
//        that follows a matmul (the single-threaded reference does not notice). libgomp reads
//        OMP_WAIT_POLICY only when it loads, so when it is unset this scenario re-executes
//        itself with OMP_WAIT_POLICY=PASSIVE (the setting the kernels figures are measured
//        with); an explicit OMP_WAIT_POLICY is kept and reported.
//   gpu: BGMV decode on the CUDA kernels, achieved memory bandwidth vs the device's peak (when
//        the CUDA kernels are built and a GPU is present).
// Flags: --batches=1,16,64,256 --threads=N --min-seconds=S.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "kernels/lora_kernels.h"
#include "storage/util/status_macros.h"

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
  CLI::App app("kernels: multi-LoRA kernels against their references", "kernels");
  std::string device = "cpu";
  app.add_option("device", device, "cpu or gpu")->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_option("--batches", o->batches, "batch sizes, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", o->threads, "CPU threads")->check(CLI::PositiveNumber);
  app.add_option("--min-seconds", o->min_seconds, "minimum timing per variant")
      ->check(CLI::NonNegativeNumber);
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  o->gpu = device == "gpu";
  return absl::OkStatus();
}

// Median milliseconds of each of `fns`, timed round-robin (one run of each per round, after one
// warm-up round) for at least min_seconds and 3 rounds, so that every variant sees the same
// machine load (this VM is shared; a variant timed alone would see a different load).
// `before`, when set, runs untimed before every timed call (e.g. a cache eviction).
absl::StatusOr<std::vector<double>> InterleavedMedianMs(
    double min_seconds, const std::vector<std::function<absl::Status()>>& fns,
    const std::function<void()>& before = nullptr) {
  for (const auto& fn : fns) {
    absl::Status st = fn();
    if (!st.ok()) return st;
  }
  std::vector<std::vector<double>> samples(fns.size());
  double start = NowSeconds();
  for (size_t round = 0; round < 3 || (NowSeconds() - start < min_seconds && round < 1000);
       ++round) {
    for (size_t i = 0; i < fns.size(); ++i) {
      if (before) before();
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

// Reads a buffer larger than the last-level cache (64 MiB, twice this VM's 32 MiB L3) so that
// the next call finds its data in DRAM. Reads only: no dirty lines are left to write back
// during the timed call.
class CacheEvictor {
 public:
  CacheEvictor() : buf_(size_t{64} << 17, 1) {}  // 8 Mi uint64 = 64 MiB
  void Evict() {
    uint64_t s = 0;
    for (size_t i = 0; i < buf_.size(); i += 8) s += buf_[i];  // one load per 64-byte line
    sink_ = s;
  }

 private:
  std::vector<uint64_t> buf_;
  volatile uint64_t sink_ = 0;
};

// A region the traffic probe touches: read, or read-modify-written.
struct Region {
  float* data;
  int64_t floats;
  bool write;
};

// The memory traffic of one kernel call without its arithmetic. The regions are cut into 256 KiB
// chunks (about one decode row's weights) that `threads` threads (the calling one and workers woken
// through a condition variable) claim from a shared counter, as the kernels' pool hands out work
// items, so a worker that wakes late costs the probe what it costs the kernel. Each chunk is read
// in 16-byte vectors into 8 independent sums (8 read ~31 GB/s on one core of this VM, 4 only ~21
// GB/s, 16 ~28 GB/s; software prefetch did not help), and the written regions get a value that is
// always 0 added.
class TrafficProbe {
 public:
  TrafficProbe(int threads, const std::vector<Region>& regions) : threads_(std::max(1, threads)) {
    constexpr int64_t kChunkFloats = 65536;
    for (const Region& r : regions) {
      for (int64_t i = 0; i < r.floats; i += kChunkFloats) {
        chunks_.push_back(Region{r.data + i, std::min(kChunkFloats, r.floats - i), r.write});
      }
    }
    for (int t = 1; t < threads_; ++t) workers_.emplace_back([this] { Worker(); });
  }
  ~TrafficProbe() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& w : workers_) w.join();
  }
  TrafficProbe(const TrafficProbe&) = delete;
  TrafficProbe& operator=(const TrafficProbe&) = delete;

  void Run() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      next_.store(0, std::memory_order_relaxed);
      active_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    cv_.notify_all();
    Claim();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return active_ == 0; });
  }

 private:
  typedef float V4 __attribute__((vector_size(16), aligned(4), may_alias));
  static constexpr int kUnroll = 8;

  // Takes chunks until none are left.
  void Claim() {
    V4 acc[kUnroll] = {};
    const float zero = zero_;
    for (;;) {
      const size_t c = next_.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks_.size()) break;
      const Region& r = chunks_[c];
      V4* v = reinterpret_cast<V4*>(r.data);
      const int64_t vecs = r.floats / 4;
      int64_t i = 0;
      for (; i + kUnroll <= vecs; i += kUnroll) {
        for (int u = 0; u < kUnroll; ++u) {
          acc[u] += v[i + u];
          if (r.write) v[i + u] += zero;
        }
      }
      for (; i < vecs; ++i) {
        acc[0] += v[i];
        if (r.write) v[i] += zero;
      }
    }
    V4 s = {};
    for (int u = 0; u < kUnroll; ++u) s += acc[u];
    sink_ = s[0] + s[1] + s[2] + s[3];
  }

  void Worker() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      Claim();
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_cv_.notify_all();
    }
  }

  const int threads_;
  std::vector<Region> chunks_;
  std::vector<std::thread> workers_;
  std::atomic<size_t> next_{0};
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t generation_ = 0;  // guarded by mu_
  int active_ = 0;           // workers still in the current run; guarded by mu_
  bool stop_ = false;        // guarded by mu_
  volatile float zero_ = 0.0f;
  volatile float sink_ = 0.0f;
};

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
  k::cpu::CpuContext ctx1(1);
  const char* omp_env = std::getenv("OMP_WAIT_POLICY");
  const std::string omp_wait_policy = omp_env != nullptr ? omp_env : "unset";
  CacheEvictor evictor;

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

    // Phase 2: the kernels alone, each timed call after an untimed cache eviction.
    // The bytes a 64-adapter call must move: A and B of its distinct adapters (adjacent in
    // a/b), the x rows, the y rows (read and written).
    std::vector<Region> traffic = {
        {a.data(), n_distinct * kRank * kIn, false},
        {b.data(), n_distinct * kOut * kRank, false},
        {x.data(), batch * kIn, false},
        {y.data(), batch * kOut, true},
    };
    TrafficProbe probe(opt.threads, traffic), probe1(1, traffic);
    const double traffic_bytes =
        4.0 * static_cast<double>(n_distinct * kRank * (kIn + kOut) + batch * (kIn + 2 * kOut));
    std::vector<std::function<absl::Status()>> cold_fns = {
        [&] { return lora(distinct); },
        [&] {
          return ToStatus(k::cpu::ShrinkExpand(
              xr, table, k::RowMapping::Bgmv(batch, distinct.data()), yr, &ctx1));
        },
        fns[5],  // the reference loop
        [&] {
          probe.Run();
          return absl::OkStatus();
        },
        [&] {
          probe1.Run();
          return absl::OkStatus();
        },
    };
    auto cold = InterleavedMedianMs(ms_min, cold_fns, [&] { evictor.Evict(); });
    if (!cold.ok()) return cold.status();
    const double cold_lora64_ms = (*cold)[0];
    const double cold_lora64_1t_ms = (*cold)[1];
    const double cold_ref_ms = (*cold)[2];
    const double probe_ms = (*cold)[3];
    const double probe_1t_ms = (*cold)[4];
    // The bound: the faster of the probe's two arms (on this VM one core often reads about as
    // fast as two).
    const double bound_ms = std::min(probe_ms, probe_1t_ms);
    auto gbps = [&](double ms) { return traffic_bytes / (ms * 1e6); };

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
                           {"lora64_gflops", 2 * lora_macs / (lora64_ms * 1e6)},
                           {"cold_fast_vs_reference_speedup", cold_ref_ms / cold_lora64_ms},
                           {"omp_wait_policy", omp_wait_policy},
                           {"cold_lora64_ms", cold_lora64_ms},
                           {"cold_lora64_1thread_ms", cold_lora64_1t_ms},
                           {"cold_reference_ms", cold_ref_ms},
                           {"traffic_bytes", traffic_bytes},
                           {"probe_ms", probe_ms},
                           {"probe_1thread_ms", probe_1t_ms},
                           {"cold_lora64_gbps", gbps(cold_lora64_ms)},
                           {"cold_lora64_1thread_gbps", gbps(cold_lora64_1t_ms)},
                           {"probe_gbps", gbps(probe_ms)},
                           {"probe_1thread_gbps", gbps(probe_1t_ms)},
                           {"cold_lora64_vs_bandwidth_bound", cold_lora64_ms / bound_ms}};
    if (gather_ms >= 0) line["gather_bmm_ms"] = gather_ms;
    Emit(line);
    const std::string b = "_b" + std::to_string(batch);
    double speedup = ref_ms / lora64_ms;
    EmitGoal("kernels", "fast_vs_reference_speedup" + b, speedup, ">= 5", speedup >= 5);
    if (n_distinct == batch && batch > 1) {
      // One row per adapter: every weight byte comes from DRAM once; the probe's best time for
      // the same traffic is the bound.
      double vs_bound = cold_lora64_ms / bound_ms;
      EmitGoal("kernels", "fast_vs_bandwidth_bound" + b, vs_bound, "<= 1.3", vs_bound <= 1.3);
    }
    double ratio = base_lora64_ms / base_lora1_ms;
    EmitGoal("kernels", "distinct64_vs_one_adapter_cost" + b, ratio, "<= 1.5", ratio <= 1.5);
    if (gather_ms >= 0) {
      double vs = gather_ms / lora64_ms;
      EmitGoal("kernels", "fast_vs_gather_bmm_speedup" + b, vs, "> 1", vs > 1);
    }
  }
  return absl::OkStatus();
}

// Re-executes this process with OMP_WAIT_POLICY=PASSIVE when it is unset (see the top comment).
// Returns only when no re-execution was needed or it could not be done (then the run goes on
// with libgomp's default, which the JSON lines report as omp_wait_policy "unset").
void EnsurePassiveOpenMp() {
#if defined(LORADB_COMPUTE_AVAILABLE)
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // NUL-terminated arguments; an argument may itself be empty.
  std::vector<std::string> parts = absl::StrSplit(cmdline, '\0');
  if (!parts.empty() && parts.back().empty()) parts.pop_back();
  if (parts.empty()) {
    Progress("kernels: cannot read /proc/self/cmdline; OMP_WAIT_POLICY stays unset");
    return;
  }
  std::vector<char*> argv;
  for (std::string& p : parts) argv.push_back(p.data());
  argv.push_back(nullptr);
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  std::fflush(stdout);
  std::fflush(stderr);
  ::execv("/proc/self/exe", argv.data());
  ::unsetenv("OMP_WAIT_POLICY");
  Progress("kernels: re-executing with OMP_WAIT_POLICY=PASSIVE failed; it stays unset");
#endif
}

absl::Status Run(const std::vector<std::string>& args) {
  EnsurePassiveOpenMp();
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

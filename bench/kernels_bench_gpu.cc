// `loradb-bench kernels gpu`: BGMV decode on the CUDA kernels. Each case: `batch` rows, each on
// its own adapter (up to 64 distinct), rank 16, bf16 weights and activations, Qwen3-4B-shaped
// projections. Bytes moved = the distinct adapters' A and B + x read + y read and written;
// bandwidth = bytes / median kernel time (CUDA events), compared with the peak computed from
// the memory clock and bus width.
#if defined(LORADB_KERNELS_CUDA_AVAILABLE)
#include "bench/kernels_bench_gpu.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cpu/convert.h"
#include "kernels/cuda/lora_cuda.h"
#include "kernels/lora_kernels.h"

namespace loradb::bench {
namespace {

namespace k = ::loradb::kernels;

absl::Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string(what) + ": " + cudaGetErrorString(e));
}

#define LORADB_CUDA_RETURN_IF_ERROR(expr)    \
  do {                                       \
    absl::Status _st = Check((expr), #expr); \
    if (!_st.ok()) return _st;               \
  } while (0)

// Device buffers freed on scope exit.
class DeviceBuffers {
 public:
  ~DeviceBuffers() {
    for (void* p : ptrs_) cudaFree(p);
  }
  absl::Status Alloc(size_t bytes, void** out) {
    LORADB_CUDA_RETURN_IF_ERROR(cudaMalloc(out, std::max<size_t>(bytes, 1)));
    ptrs_.push_back(*out);
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status Upload(const std::vector<T>& v, T** out) {
    void* p;
    absl::Status s = Alloc(v.size() * sizeof(T), &p);
    if (!s.ok()) return s;
    LORADB_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    *out = static_cast<T*>(p);
    return absl::OkStatus();
  }

 private:
  std::vector<void*> ptrs_;
};

}  // namespace

absl::Status RunGpuKernelsBench(double min_seconds) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError("kernels gpu: no CUDA device");
  }
  cudaDeviceProp prop;
  LORADB_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  int mem_clock_khz = 0, bus_bits = 0;
  LORADB_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, 0));
  LORADB_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
  const double peak_gbs = 2.0 * mem_clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  Progress(std::string("kernels gpu: ") + prop.name + ", peak " + std::to_string(peak_gbs) +
           " GB/s");

  struct Shape {
    const char* name;
    int64_t in, out;
  };
  const Shape shapes[] = {{"qwen3_4b_q", 2560, 4096}, {"qwen3_4b_down", 9728, 2560}};
  constexpr int32_t kRank = 16, kAdapters = 64;
  for (const Shape& sh : shapes) {
    for (int64_t batch : {1, 16, 64, 256}) {
      DeviceBuffers buf;
      const int64_t distinct = std::min<int64_t>(batch, kAdapters);
      std::vector<uint16_t> a(static_cast<size_t>(kAdapters * kRank * sh.in));
      std::vector<uint16_t> b(static_cast<size_t>(kAdapters * sh.out * kRank));
      std::vector<uint16_t> x(static_cast<size_t>(batch * sh.in));
      for (size_t i = 0; i < a.size(); ++i)
        a[i] = k::FloatToBf16(0.01f * static_cast<float>(i % 13));
      for (size_t i = 0; i < b.size(); ++i)
        b[i] = k::FloatToBf16(0.02f * static_cast<float>(i % 7));
      for (size_t i = 0; i < x.size(); ++i) x[i] = k::FloatToBf16(0.1f * static_cast<float>(i % 5));
      uint16_t *da = nullptr, *db = nullptr, *dx = nullptr, *dy = nullptr;
      absl::Status s = buf.Upload(a, &da);
      if (s.ok()) s = buf.Upload(b, &db);
      if (s.ok()) s = buf.Upload(x, &dx);
      if (s.ok()) s = buf.Upload(std::vector<uint16_t>(static_cast<size_t>(batch * sh.out)), &dy);
      std::vector<const void*> a_ptrs, b_ptrs;
      for (int32_t j = 0; j < kAdapters; ++j) {
        a_ptrs.push_back(da + static_cast<int64_t>(j) * kRank * sh.in);
        b_ptrs.push_back(db + static_cast<int64_t>(j) * sh.out * kRank);
      }
      std::vector<int32_t> idx(static_cast<size_t>(batch));
      for (int64_t i = 0; i < batch; ++i)
        idx[static_cast<size_t>(i)] = static_cast<int32_t>(i % kAdapters);
      const void** dap = nullptr;
      const void** dbp = nullptr;
      int32_t *dranks = nullptr, *didx = nullptr;
      float *dscales = nullptr, *dt = nullptr;
      if (s.ok()) s = buf.Upload(a_ptrs, &dap);
      if (s.ok()) s = buf.Upload(b_ptrs, &dbp);
      if (s.ok()) s = buf.Upload(std::vector<int32_t>(kAdapters, kRank), &dranks);
      if (s.ok()) s = buf.Upload(std::vector<float>(kAdapters, 2.0f), &dscales);
      if (s.ok()) s = buf.Upload(idx, &didx);
      if (s.ok()) s = buf.Upload(std::vector<float>(static_cast<size_t>(batch * kRank)), &dt);
      if (!s.ok()) return s;
      k::AdapterTable w{kAdapters, sh.in,  sh.out,  k::DType::kBF16, dap,
                        dbp,       dranks, dscales, kRank,           0};
      k::ConstRows xr{dx, k::DType::kBF16, sh.in};
      k::OutputRows yr{dy, k::DType::kBF16, sh.out, 0};
      k::RankBuffer tr{dt, kRank};
      k::RowMapping m = k::RowMapping::Bgmv(batch, didx);
      const double bytes = static_cast<double>(distinct) * kRank * (sh.in + sh.out) * 2 +
                           static_cast<double>(batch) * (sh.in + 2 * sh.out) * 2;

      auto time_ms = [&](auto&& launch, double* median_ms) -> absl::Status {
        cudaEvent_t e0, e1;
        LORADB_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e0));
        LORADB_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e1));
        LORADB_CUDA_RETURN_IF_ERROR(launch());
        LORADB_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
        std::vector<double> samples;
        double start = NowSeconds();
        while (samples.size() < 20 ||
               (NowSeconds() - start < min_seconds && samples.size() < 2000)) {
          LORADB_CUDA_RETURN_IF_ERROR(cudaEventRecord(e0));
          LORADB_CUDA_RETURN_IF_ERROR(launch());
          LORADB_CUDA_RETURN_IF_ERROR(cudaEventRecord(e1));
          LORADB_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e1));
          float ms = 0;
          LORADB_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, e0, e1));
          samples.push_back(ms);
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        *median_ms = Quantile(samples, 0.5);
        return absl::OkStatus();
      };
      double split_ms = 0, fused_ms = 0;
      s = time_ms(
          [&]() -> cudaError_t {
            cudaError_t e = k::cuda::Shrink(xr, w, m, tr, nullptr);
            return e != cudaSuccess ? e : k::cuda::Expand(tr, w, m, yr, nullptr);
          },
          &split_ms);
      if (!s.ok()) return s;
      s = time_ms([&]() { return k::cuda::ShrinkExpand(xr, w, m, yr, nullptr); }, &fused_ms);
      if (!s.ok()) return s;
      const double split_gbs = bytes / (split_ms * 1e6), fused_gbs = bytes / (fused_ms * 1e6);
      Emit({{"bench", "kernels"},
            {"case", "gpu_bgmv_decode"},
            {"device", prop.name},
            {"shape", sh.name},
            {"in", sh.in},
            {"out", sh.out},
            {"rank", kRank},
            {"batch", batch},
            {"distinct_adapters", distinct},
            {"dtype", "bf16"},
            {"bytes", bytes},
            {"shrink_expand_ms", split_ms},
            {"fused_ms", fused_ms},
            {"shrink_expand_gbs", split_gbs},
            {"fused_gbs", fused_gbs},
            {"peak_gbs", peak_gbs},
            {"shrink_expand_fraction_of_peak", split_gbs / peak_gbs},
            {"fused_fraction_of_peak", fused_gbs / peak_gbs}});
    }
  }
  return absl::OkStatus();
}

}  // namespace loradb::bench
#endif  // LORADB_KERNELS_CUDA_AVAILABLE

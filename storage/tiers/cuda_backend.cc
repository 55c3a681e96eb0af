// The CUDA runtime device backend. Compiled against cudart only when CMake found CUDA
// (LORADB_HAVE_CUDA); otherwise MakeCudaBackend says Unavailable.
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "storage/tiers/device_backend.h"
#include "storage/tiers/host_buffer.h"
#include "storage/util/mutex.h"

#if defined(LORADB_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace loradb::tiers {

#if defined(LORADB_HAVE_CUDA)
namespace {

absl::Status CudaError(cudaError_t err, absl::string_view what) {
  (void)cudaGetLastError();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(int device) : device_(device), name_(absl::StrCat("cuda:", device)) {}
  ~CudaBackend() override {
    MutexLock lock(&mu_);
    for (auto& s : free_) {
      (void)cudaEventDestroy(s.done);
      (void)cudaStreamDestroy(s.stream);
    }
  }
  const char* name() const override { return name_.c_str(); }
  bool is_device() const override { return true; }

  absl::StatusOr<std::byte*> AllocateArena(uint64_t bytes) override {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaError(e, "cudaSetDevice");
    }
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc(", bytes, ") failed: ", cudaGetErrorString(e)));
    }
    return static_cast<std::byte*>(p);
  }
  void FreeArena(std::byte* base) override { (void)cudaFree(base); }

  absl::Status Copy(std::span<const CopyOp> ops) override {
    Stream s;
    if (absl::Status st = TakeStream(&s); !st.ok()) return st;
    absl::Status st;
    for (const CopyOp& op : ops) {
      cudaError_t e = cudaMemcpyAsync(op.dst, op.src, op.bytes, cudaMemcpyHostToDevice, s.stream);
      if (e != cudaSuccess) {
        st = CudaError(e, "cudaMemcpyAsync");
        break;
      }
    }
    if (cudaError_t e = cudaEventRecord(s.done, s.stream); e != cudaSuccess && st.ok()) {
      st = CudaError(e, "cudaEventRecord");
    }
    if (cudaError_t e = cudaEventSynchronize(s.done); e != cudaSuccess && st.ok()) {
      st = CudaError(e, "cudaEventSynchronize");
    }
    MutexLock lock(&mu_);
    free_.push_back(s);
    return st;
  }

  absl::Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    if (cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost); e != cudaSuccess) {
      return CudaError(e, "cudaMemcpy D2H");
    }
    return absl::OkStatus();
  }

 private:
  struct Stream {
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
  };
  absl::Status TakeStream(Stream* out) {
    {
      MutexLock lock(&mu_);
      if (!free_.empty()) {
        *out = free_.back();
        free_.pop_back();
        return absl::OkStatus();
      }
    }
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaError(e, "cudaSetDevice");
    }
    if (cudaError_t e = cudaStreamCreateWithFlags(&out->stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return CudaError(e, "cudaStreamCreate");
    }
    if (cudaError_t e = cudaEventCreateWithFlags(&out->done, cudaEventDisableTiming);
        e != cudaSuccess) {
      (void)cudaStreamDestroy(out->stream);
      return CudaError(e, "cudaEventCreate");
    }
    return absl::OkStatus();
  }

  int device_;
  std::string name_;
  Mutex mu_;
  std::vector<Stream> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBackend>> MakeCudaBackend(int device) {
  if (!CudaDeviceAvailable()) {
    return absl::UnavailableError("CUDA backend: no CUDA device is present");
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    (void)cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat("CUDA backend: no device ", device));
  }
  return std::unique_ptr<DeviceBackend>(new CudaBackend(device));
}

#else

absl::StatusOr<std::unique_ptr<DeviceBackend>> MakeCudaBackend(int /*device*/) {
  return absl::UnavailableError("CUDA backend: loradb was built without CUDA");
}

#endif

}  // namespace loradb::tiers

// The loader: reads adapter files (packed blobs, safetensors files, PEFT directories) from the
// storage tier into page-aligned host buffers and hands back tensor views over them.
//
// Backends: io_uring (liburing; a ring per concurrently loading thread, each read split into
// chunks with up to `queue_depth` in flight, O_DIRECT when the file system accepts it) and a
// pread thread pool, used when io_uring cannot be initialised (EPERM/ENOSYS under container
// seccomp profiles) or when asked for (option or LORADB_LOADER=pread). `stats().backend` says
// which one runs. Content is verified right after the read: the whole-file xxh3-128 when the
// caller knows it, and whatever the format's parser checks (per-tensor xxh3-64 for blobs). A
// mismatch is DataLoss, logged with the hash; the bytes are never handed out.
#ifndef LORADB_STORAGE_TIERS_LOADER_H_
#define LORADB_STORAGE_TIERS_LOADER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/formats/tensor.h"
#include "storage/tiers/host_buffer.h"
#include "storage/util/hash.h"
#include "storage/util/mutex.h"

namespace loradb::tiers {

enum class LoaderBackend {
  kAuto,     // io_uring if it initialises, else the pread pool
  kIoUring,  // io_uring or an error from Create
  kPread,    // the pread thread pool
};

// "auto", "io_uring", "pread".
const char* LoaderBackendName(LoaderBackend backend);

struct LoaderOptions {
  // kAuto honours the environment variable LORADB_LOADER=pread|io_uring.
  LoaderBackend backend = LoaderBackend::kAuto;
  // Size of one read request; large files are split into chunks of this size.
  uint64_t chunk_bytes = 1 << 20;
  // io_uring: chunks in flight per file read (and the ring size).
  unsigned queue_depth = 32;
  // Try O_DIRECT first (falls back to buffered reads where open says EINVAL).
  bool o_direct = true;
  // io_uring: register each destination buffer with the ring (io_uring_register_buffers) and
  // read with READ_FIXED. Off by default: `loradb-bench tiers fixed-buffers` measured it (see
  // docs/bench/notes/measurements.md, tiers); a registration failure (e.g. RLIMIT_MEMLOCK) falls
  // back to plain reads.
  bool registered_buffers = false;
  // pread backend: worker threads.
  unsigned pread_threads = 8;
  // Pin host buffers with cudaHostRegister when a CUDA device is present.
  bool pin_host_buffers = true;
};

struct LoaderStats {
  LoaderBackend backend = LoaderBackend::kAuto;  // the resolved backend (never kAuto)
  int io_uring_init_errno = 0;         // why io_uring was not used (0: it was, or not tried)
  uint64_t files = 0;                  // successful reads
  uint64_t bytes = 0;                  // bytes read by successful reads
  uint64_t chunks = 0;                 // read requests issued
  uint64_t o_direct_files = 0;         // files read with O_DIRECT
  uint64_t buffered_files = 0;         // files read through the page cache
  uint64_t checksum_failures = 0;      // content hash or parser checksum mismatches
  uint64_t read_errors = 0;            // open/read failures
  uint64_t rings = 0;                  // io_uring rings created (one per loading thread)
  uint64_t fixed_buffer_files = 0;     // files read into a registered buffer (READ_FIXED)
  uint64_t fixed_buffer_failures = 0;  // registrations refused (read with plain reads instead)
};

// Parses a loaded file: `bytes` is the file content, `backing` keeps it alive (the TensorSet
// must hold it). Errors from the parser are returned as they are.
using ParseFn = std::function<absl::StatusOr<TensorSet>(std::span<const std::byte> bytes,
                                                        std::shared_ptr<const void> backing)>;

class Loader {
 public:
  // Builds the backend. With kIoUring, fails (Unavailable, naming the errno) when io_uring
  // cannot be set up; with kAuto it falls back to pread and records why.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Loader>> Create(LoaderOptions options = {});
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Reads the whole file at `path` into a new host buffer. With `expected`, the content's
  // xxh3-128 must match it (DataLoss otherwise, logged to stderr with both hashes). NotFound for a
  // missing file; other I/O errors are Internal/PermissionDenied naming the path. Thread-safe:
  // concurrent calls read in parallel, each on its own ring.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<HostBuffer>> ReadFile(
      const std::string& path, const std::optional<Hash128>& expected = std::nullopt);

  // ReadFile, then `parse` over the buffer. A parser error of code DataLoss counts as a
  // checksum failure and is logged; the buffer is dropped on any error.
  [[nodiscard]] absl::StatusOr<TensorSet> LoadTensors(
      const std::string& path, const ParseFn& parse,
      const std::optional<Hash128>& expected = std::nullopt);

  LoaderStats stats() const;
  LoaderBackend backend() const { return backend_; }
  const LoaderOptions& options() const { return options_; }

 private:
  struct Ring;
  class PreadPool;

  explicit Loader(LoaderOptions options);

  // Reads [0, size) of `fd` into `buf`; `direct` says whether fd was opened with O_DIRECT.
  absl::Status ReadIoUring(int fd, bool direct, uint64_t size, std::byte* buf,
                           const std::string& path);
  absl::Status ReadPread(int fd, uint64_t size, std::byte* buf, const std::string& path);

  std::unique_ptr<Ring> TakeRing(absl::Status* error);
  void ReturnRing(std::unique_ptr<Ring> ring);

  LoaderOptions options_;
  LoaderBackend backend_ = LoaderBackend::kPread;
  int io_uring_init_errno_ = 0;
  std::unique_ptr<PreadPool> pool_;

  Mutex rings_mu_;
  std::vector<std::unique_ptr<Ring>> free_rings_ ABSL_GUARDED_BY(rings_mu_);

  std::atomic<uint64_t> files_{0}, bytes_{0}, chunks_{0}, o_direct_files_{0}, buffered_files_{0},
      checksum_failures_{0}, read_errors_{0}, rings_{0}, fixed_buffer_files_{0},
      fixed_buffer_failures_{0};
};

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_LOADER_H_

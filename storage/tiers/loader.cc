#include "storage/tiers/loader.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"

namespace loradb::tiers {
namespace {

// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// Reads [off, off+len) with pread until done or EOF at `size`. `*fd` may be an O_DIRECT
// descriptor; an unaligned remainder after a short read is finished through `*buffered`,
// opened on demand.
absl::Status PreadRange(int fd, bool direct, FdCloser* buffered, const std::string& path,
                        std::byte* buf, uint64_t off, uint64_t len, uint64_t size) {
  uint64_t end = off + len;
  while (off < end && off < size) {
    int use_fd = fd;
    if (direct && off % kHostAlignment != 0) {
      if (buffered->get() < 0) {
        int bfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (bfd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
        buffered->reset(bfd);
      }
      use_fd = buffered->get();
    }
    ssize_t n = ::pread(use_fd, buf + off, end - off, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat("read ", path, ": file ended at ", off, " of ", size, " bytes"));
    }
    off += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

const char* LoaderBackendName(LoaderBackend backend) {
  switch (backend) {
    case LoaderBackend::kAuto:
      return "auto";
    case LoaderBackend::kIoUring:
      return "io_uring";
    case LoaderBackend::kPread:
      return "pread";
  }
  return "?";
}

struct Loader::Ring {
  io_uring ring;
  bool initialised = false;
  ~Ring() {
    if (initialised) io_uring_queue_exit(&ring);
  }
};

// A fixed pool of threads running queued closures; used by the pread backend.
class Loader::PreadPool {
 public:
  explicit PreadPool(unsigned threads) {
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~PreadPool() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    for (auto& t : threads_) t.join();
  }
  void Submit(std::function<void()> task) {
    MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }

 private:
  void Run() {
    while (true) {
      std::function<void()> task;
      {
        MutexLock lock(&mu_);
        mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(LoaderOptions options) {
  if (options.chunk_bytes == 0 || options.chunk_bytes % kHostAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("loader chunk_bytes must be a positive multiple of ", kHostAlignment));
  }
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError("loader queue_depth must be in 1..4096");
  }
  if (options.pread_threads == 0) {
    return absl::InvalidArgumentError("loader pread_threads must be at least 1");
  }
  LoaderBackend want = options.backend;
  if (want == LoaderBackend::kAuto) {
    const char* env = std::getenv("LORADB_LOADER");
    if (env != nullptr && std::string(env) == "pread") want = LoaderBackend::kPread;
    if (env != nullptr && std::string(env) == "io_uring") want = LoaderBackend::kIoUring;
  }
  std::unique_ptr<Loader> loader(new Loader(options));
  if (want != LoaderBackend::kPread) {
    auto ring = std::make_unique<Ring>();
    int ret = io_uring_queue_init(options.queue_depth, &ring->ring, 0);
    if (ret < 0) {
      loader->io_uring_init_errno_ = -ret;
      if (want == LoaderBackend::kIoUring) {
        return absl::UnavailableError(
            absl::StrCat("io_uring_queue_init failed: ", std::strerror(-ret)));
      }
    } else {
      ring->initialised = true;
      loader->backend_ = LoaderBackend::kIoUring;
      loader->rings_.fetch_add(1);
      MutexLock lock(&loader->rings_mu_);
      loader->free_rings_.push_back(std::move(ring));
    }
  }
  if (loader->backend_ == LoaderBackend::kPread) {
    loader->pool_ = std::make_unique<PreadPool>(options.pread_threads);
  }
  return loader;
}

Loader::Loader(LoaderOptions options) : options_(std::move(options)) {}

Loader::~Loader() = default;

std::unique_ptr<Loader::Ring> Loader::TakeRing(absl::Status* error) {
  {
    MutexLock lock(&rings_mu_);
    if (!free_rings_.empty()) {
      auto ring = std::move(free_rings_.back());
      free_rings_.pop_back();
      return ring;
    }
  }
  auto ring = std::make_unique<Ring>();
  int ret = io_uring_queue_init(options_.queue_depth, &ring->ring, 0);
  if (ret < 0) {
    *error = absl::ResourceExhaustedError(
        absl::StrCat("io_uring_queue_init failed: ", std::strerror(-ret)));
    return nullptr;
  }
  ring->initialised = true;
  rings_.fetch_add(1);
  return ring;
}

void Loader::ReturnRing(std::unique_ptr<Ring> ring) {
  MutexLock lock(&rings_mu_);
  free_rings_.push_back(std::move(ring));
}

absl::Status Loader::ReadIoUring(int fd, bool direct, uint64_t size, std::byte* buf,
                                 const std::string& path) {
  absl::Status st;
  std::unique_ptr<Ring> ring = TakeRing(&st);
  if (ring == nullptr) return st;
  io_uring* r = &ring->ring;

  struct Req {
    uint64_t off;
    uint64_t len;
  };
  const uint64_t read_end = direct ? AlignUp(size, kHostAlignment) : size;
  const unsigned depth = options_.queue_depth;
  std::vector<Req> reqs(depth);
  std::vector<unsigned> free_slots;
  for (unsigned i = 0; i < depth; ++i) free_slots.push_back(depth - 1 - i);
  std::deque<Req> retry;
  uint64_t next = 0;
  unsigned inflight = 0;
  FdCloser buffered(-1);
  bool fixed = false;
  if (options_.registered_buffers) {
    iovec iov{buf, static_cast<size_t>(AlignUp(read_end, kHostAlignment))};
    if (io_uring_register_buffers(r, &iov, 1) == 0) {
      fixed = true;
      fixed_buffer_files_.fetch_add(1, std::memory_order_relaxed);
    } else {
      fixed_buffer_failures_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // A buffered read that hits the page cache completes inline in the submitting thread, so a
  // warm file would be copied by this thread alone. IOSQE_ASYNC hands each chunk to io_uring's
  // workers, which copy chunks on every core (a warm 110 MB adapter: ~12 -> ~16-18 GB/s on two
  // cores); a chunk that misses the cache blocks a worker, not us. A file of one chunk has
  // nothing to split and stays inline (no hand-off latency). The flag came with Linux 5.6, the
  // release that also added IORING_FEAT_RW_CUR_POS: an older kernel reads inline as before.
  const bool async_chunks = !direct && read_end > options_.chunk_bytes &&
                            (r->features & IORING_FEAT_RW_CUR_POS) != 0;
  while (true) {
    while (st.ok() && !free_slots.empty() && (!retry.empty() || next < read_end)) {
      io_uring_sqe* sqe = io_uring_get_sqe(r);
      if (sqe == nullptr) break;
      Req req;
      if (!retry.empty()) {
        req = retry.front();
        retry.pop_front();
      } else {
        req = {next, std::min<uint64_t>(options_.chunk_bytes, read_end - next)};
        next += req.len;
      }
      unsigned slot = free_slots.back();
      free_slots.pop_back();
      reqs[slot] = req;
      if (fixed) {
        io_uring_prep_read_fixed(sqe, fd, buf + req.off, static_cast<unsigned>(req.len), req.off,
                                 0);
      } else {
        io_uring_prep_read(sqe, fd, buf + req.off, static_cast<unsigned>(req.len), req.off);
      }
      if (async_chunks) io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
      io_uring_sqe_set_data64(sqe, slot);
      ++inflight;
      chunks_.fetch_add(1, std::memory_order_relaxed);
    }
    if (inflight == 0) break;
    int ret = io_uring_submit_and_wait(r, 1);
    if (ret < 0 && ret != -EINTR) {
      // The ring is in an unknown state: drop it (its destructor waits for nothing we own
      // once the queue exits) and report.
      st = ErrnoToStatus(-ret, absl::StrCat("io_uring submit for ", path));
      ring.reset();
      return st;
    }
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(r, &cqe) == 0 && cqe != nullptr) {
      unsigned slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
      int res = cqe->res;
      io_uring_cqe_seen(r, cqe);
      --inflight;
      Req req = reqs[slot];
      free_slots.push_back(slot);
      if (!st.ok()) continue;  // draining after an error
      if (res == -EINTR || res == -EAGAIN) {
        retry.push_back(req);
      } else if (res < 0) {
        st = ErrnoToStatus(-res, absl::StrCat("read ", path));
      } else if (static_cast<uint64_t>(res) < req.len) {
        uint64_t got_end = req.off + static_cast<uint64_t>(res);
        if (got_end >= size) continue;  // EOF inside the aligned tail
        if (res == 0) {
          st = absl::DataLossError(
              absl::StrCat("read ", path, ": file ended at ", req.off, " of ", size, " bytes"));
        } else if (direct && got_end % kHostAlignment != 0) {
          // O_DIRECT cannot continue from an unaligned offset; finish this piece buffered.
          st = PreadRange(fd, direct, &buffered, path, buf, got_end, req.off + req.len - got_end,
                          size);
        } else {
          retry.push_back({got_end, req.off + req.len - got_end});
        }
      }
    }
  }
  if (fixed && io_uring_unregister_buffers(r) != 0) {
    ring.reset();  // a ring that still holds our buffer must not be reused
    return st;
  }
  ReturnRing(std::move(ring));
  return st;
}

absl::Status Loader::ReadPread(int fd, uint64_t size, std::byte* buf, const std::string& path) {
  // O_DIRECT reads need aligned lengths; the buffer's capacity covers the aligned tail.
  const uint64_t read_end = AlignUp(size, kHostAlignment);
  struct Shared {
    Mutex mu;
    uint64_t remaining ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);
  } shared;
  uint64_t nchunks = (read_end + options_.chunk_bytes - 1) / options_.chunk_bytes;
  if (nchunks == 0) return absl::OkStatus();
  {
    MutexLock lock(&shared.mu);
    shared.remaining = nchunks;
  }
  int flags = ::fcntl(fd, F_GETFL);
  bool direct = flags >= 0 && (flags & O_DIRECT) != 0;
  for (uint64_t i = 0; i < nchunks; ++i) {
    uint64_t off = i * options_.chunk_bytes;
    uint64_t len = std::min<uint64_t>(options_.chunk_bytes, read_end - off);
    chunks_.fetch_add(1, std::memory_order_relaxed);
    pool_->Submit([&shared, fd, direct, &path, buf, off, len, size] {
      FdCloser buffered(-1);
      absl::Status s = PreadRange(fd, direct, &buffered, path, buf, off, len, size);
      MutexLock lock(&shared.mu);
      if (!s.ok() && shared.status.ok()) shared.status = s;
      --shared.remaining;
    });
  }
  MutexLock lock(&shared.mu);
  shared.mu.Await([&shared]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return shared.remaining == 0; });
  return shared.status;
}

absl::StatusOr<std::shared_ptr<HostBuffer>> Loader::ReadFile(
    const std::string& path, const std::optional<Hash128>& expected) {
  auto fail = [this](absl::Status s) {
    read_errors_.fetch_add(1, std::memory_order_relaxed);
    return s;
  };
  bool direct = false;
  int fd = -1;
  if (options_.o_direct) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd >= 0) direct = true;
    if (fd < 0 && errno != EINVAL) return fail(ErrnoToStatus(errno, absl::StrCat("open ", path)));
  }
  if (fd < 0) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(ErrnoToStatus(errno, absl::StrCat("open ", path)));
  }
  FdCloser closer(fd);
  struct stat sb;
  if (::fstat(fd, &sb) != 0) return fail(ErrnoToStatus(errno, absl::StrCat("stat ", path)));
  if (!S_ISREG(sb.st_mode)) {
    return fail(absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file")));
  }
  uint64_t size = static_cast<uint64_t>(sb.st_size);
  // Every byte of [0, size) is read below: a recycled buffer will do.
  auto buf_or = HostBuffer::AllocateForOverwrite(size, options_.pin_host_buffers);
  if (!buf_or.ok()) return fail(buf_or.status());
  std::shared_ptr<HostBuffer> buf = std::move(*buf_or);

  absl::Status st = backend_ == LoaderBackend::kIoUring
                        ? ReadIoUring(fd, direct, size, buf->data(), path)
                        : ReadPread(fd, size, buf->data(), path);
  if (!st.ok()) return fail(st);
  if (expected.has_value()) {
    Hash128 got = Xxh3_128(buf->data(), size);
    if (!(got == *expected)) {
      checksum_failures_.fetch_add(1, std::memory_order_relaxed);
      std::fprintf(stderr, "loradb: corrupt blob %s: xxh3-128 %s, expected %s\n", path.c_str(),
                   got.Hex().c_str(), expected->Hex().c_str());
      return absl::DataLossError(absl::StrCat("corrupt blob ", path, ": xxh3-128 ", got.Hex(),
                                              ", expected ", expected->Hex()));
    }
  }
  (direct ? o_direct_files_ : buffered_files_).fetch_add(1, std::memory_order_relaxed);
  files_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(size, std::memory_order_relaxed);
  return buf;
}

absl::StatusOr<TensorSet> Loader::LoadTensors(const std::string& path, const ParseFn& parse,
                                              const std::optional<Hash128>& expected) {
  LORADB_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buf, ReadFile(path, expected));
  std::span<const std::byte> bytes = buf->bytes();
  absl::StatusOr<TensorSet> set = parse(bytes, std::shared_ptr<const void>(buf, buf.get()));
  if (!set.ok()) {
    if (set.status().code() == absl::StatusCode::kDataLoss) {
      checksum_failures_.fetch_add(1, std::memory_order_relaxed);
      std::fprintf(stderr, "loradb: corrupt file %s: %s\n", path.c_str(),
                   std::string(set.status().message()).c_str());
    }
    return set.status();
  }
  return set;
}

LoaderStats Loader::stats() const {
  LoaderStats s;
  s.backend = backend_;
  s.io_uring_init_errno = io_uring_init_errno_;
  s.files = files_.load();
  s.bytes = bytes_.load();
  s.chunks = chunks_.load();
  s.o_direct_files = o_direct_files_.load();
  s.buffered_files = buffered_files_.load();
  s.checksum_failures = checksum_failures_.load();
  s.read_errors = read_errors_.load();
  s.rings = rings_.load();
  s.fixed_buffer_files = fixed_buffer_files_.load();
  s.fixed_buffer_failures = fixed_buffer_failures_.load();
  return s;
}

}  // namespace loradb::tiers

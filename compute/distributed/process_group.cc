#include "compute/distributed/process_group.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

#ifdef LORADB_HAVE_C10D
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef LORADB_HAVE_NCCL
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#endif

namespace loradb::dist {

absl::StatusOr<Backend> ParseBackend(const std::string& name) {
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown distributed backend '", name, "' (gloo | nccl)"));
}

const char* BackendName(Backend backend) { return backend == Backend::kNccl ? "nccl" : "gloo"; }

bool C10dAvailable(std::string* reason) {
#ifdef LORADB_HAVE_C10D
  if (reason != nullptr) reason->clear();
  return true;
#else
  if (reason != nullptr) {
    *reason = absl::StrCat("built without torch.distributed (c10d): ", LORADB_C10D_MISSING_REASON);
  }
  return false;
#endif
}

bool NcclAvailable(std::string* reason) {
#if defined(LORADB_HAVE_C10D) && defined(LORADB_HAVE_NCCL)
  if (!at::cuda::is_available()) {
    if (reason != nullptr) *reason = "no CUDA device visible";
    return false;
  }
  if (reason != nullptr) reason->clear();
  return true;
#else
  if (reason != nullptr) *reason = "built without the NCCL backend (no CUDA LibTorch or nccl.h)";
  return false;
#endif
}

absl::StatusOr<GroupOptions> GroupOptionsFromEnvironment() {
  const char* rank = std::getenv("LORADB_RANK");
  if (rank == nullptr) return absl::NotFoundError("LORADB_RANK is not set");
  const char* world = std::getenv("LORADB_WORLD_SIZE");
  const char* rdv = std::getenv("LORADB_RENDEZVOUS");
  GroupOptions o;
  if (!absl::SimpleAtoi(rank, &o.rank) || world == nullptr ||
      !absl::SimpleAtoi(world, &o.world_size) || rdv == nullptr || *rdv == '\0') {
    return absl::InvalidArgumentError(
        "LORADB_RANK, LORADB_WORLD_SIZE and LORADB_RENDEZVOUS must all be set (integers, and "
        "file:PATH or tcp:HOST:PORT)");
  }
  o.rendezvous = rdv;
  if (const char* t = std::getenv("LORADB_DIST_TIMEOUT_MS"); t != nullptr) {
    int64_t ms = 0;
    if (!absl::SimpleAtoi(t, &ms) || ms <= 0) {
      return absl::InvalidArgumentError("LORADB_DIST_TIMEOUT_MS must be a positive integer");
    }
    o.timeout = std::chrono::milliseconds(ms);
  }
  return o;
}

#ifdef LORADB_HAVE_C10D

struct ProcessGroup::Impl {
  int cuda_device = 0;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

namespace {

// c10d reports failures by exception; none crosses this API.
absl::Status FromException(const std::exception& e, const std::string& what) {
  const std::string msg = e.what();
  // Keep the first line: c10d appends long C++ stack traces.
  const std::string first = msg.substr(0, msg.find('\n'));
  if (absl::StrContains(msg, "imeout") || absl::StrContains(msg, "imed out")) {
    return absl::DeadlineExceededError(absl::StrCat(what, " timed out: ", first));
  }
  return absl::UnavailableError(
      absl::StrCat(what, " failed (a rank died or left the group?): ", first));
}

absl::Status Wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    return FromException(e, what);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(const GroupOptions& o) {
  if (o.world_size < 1) return absl::InvalidArgumentError("world size must be >= 1");
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is outside [0, ", o.world_size, ")"));
  }
  if (o.timeout.count() <= 0) return absl::InvalidArgumentError("timeout must be positive");
#ifndef LORADB_HAVE_NCCL
  if (o.backend == Backend::kNccl) {
    std::string why;
    NcclAvailable(&why);
    return absl::UnimplementedError(why);
  }
#endif
  auto impl = std::make_unique<Impl>();
  try {
    c10::intrusive_ptr<c10d::Store> store;
    if (absl::StartsWith(o.rendezvous, "file:") && o.rendezvous.size() > 5) {
      store = c10::make_intrusive<c10d::FileStore>(o.rendezvous.substr(5), o.world_size);
    } else if (absl::StartsWith(o.rendezvous, "tcp:")) {
      const std::string hp = o.rendezvous.substr(4);
      const size_t colon = hp.rfind(':');
      int port = 0;
      if (colon == std::string::npos || colon == 0 ||
          !absl::SimpleAtoi(hp.substr(colon + 1), &port) || port <= 0 || port > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat("rendezvous '", o.rendezvous, "': expected tcp:HOST:PORT"));
      }
      c10d::TCPStoreOptions so;
      so.port = static_cast<uint16_t>(port);
      so.isServer = o.rank == 0;
      so.numWorkers = static_cast<size_t>(o.world_size);
      so.waitWorkers = true;
      so.timeout = o.timeout;
      store = c10::make_intrusive<c10d::TCPStore>(hp.substr(0, colon), so);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("rendezvous '", o.rendezvous, "': expected file:PATH or tcp:HOST:PORT"));
    }
    store->setTimeout(o.timeout);
    impl->store = c10::make_intrusive<c10d::PrefixStore>(o.name, store);
    if (o.backend == Backend::kGloo) {
      auto go = c10d::ProcessGroupGloo::Options::create(o.timeout);
      // Loopback by default; LORADB_GLOO_HOST names this rank's interface across machines.
      const char* host = std::getenv("LORADB_GLOO_HOST");
      go->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname(host != nullptr ? host : "127.0.0.1"));
      impl->backend =
          c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, o.rank, o.world_size, go);
    } else {
#ifdef LORADB_HAVE_NCCL
      if (!at::cuda::is_available()) return absl::UnavailableError("nccl: no CUDA device");
      impl->cuda_device = o.rank % at::cuda::device_count();
      at::cuda::set_device(static_cast<c10::DeviceIndex>(impl->cuda_device));
      auto no = c10d::ProcessGroupNCCL::Options::create();
      no->timeout = o.timeout;
      impl->backend =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(impl->store, o.rank, o.world_size, no);
#endif
    }
  } catch (const std::exception& e) {
    return FromException(e, absl::StrCat("joining the ", BackendName(o.backend), " group (rank ",
                                         o.rank, " of ", o.world_size, ", ", o.rendezvous, ")"));
  }
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(o, std::move(impl)));
}

ProcessGroup::ProcessGroup(GroupOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)), cuda_device_(impl_->cuda_device) {}

ProcessGroup::~ProcessGroup() = default;

absl::Status ProcessGroup::AllReduce(at::Tensor& tensor, ReduceOp op) {
  if (!tensor.defined() || !tensor.is_contiguous()) {
    return absl::InvalidArgumentError("all-reduce needs a defined, contiguous tensor");
  }
  if (op == ReduceOp::kAverage && !at::isFloatingType(tensor.scalar_type())) {
    return absl::InvalidArgumentError("average all-reduce needs a floating tensor");
  }
  ++collective_calls_;
  c10d::AllreduceOptions ao;
  ao.reduceOp = op == ReduceOp::kMax ? c10d::ReduceOp(c10d::ReduceOp::MAX)
                                     : c10d::ReduceOp(c10d::ReduceOp::SUM);
  std::vector<at::Tensor> ts = {tensor};
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = impl_->backend->allreduce(ts, ao);
  } catch (const std::exception& e) {
    return FromException(e, "all-reduce");
  }
  absl::Status s = Wait(work, "all-reduce");
  if (!s.ok()) return s;
  if (op == ReduceOp::kAverage) tensor.div_(static_cast<double>(options_.world_size));
  return absl::OkStatus();
}

absl::Status ProcessGroup::Broadcast(at::Tensor& tensor, int root) {
  if (root < 0 || root >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank"));
  }
  if (!tensor.defined() || !tensor.is_contiguous()) {
    return absl::InvalidArgumentError("broadcast needs a defined, contiguous tensor");
  }
  ++collective_calls_;
  c10d::BroadcastOptions bo;
  bo.rootRank = root;
  std::vector<at::Tensor> ts = {tensor};
  try {
    return Wait(impl_->backend->broadcast(ts, bo), "broadcast");
  } catch (const std::exception& e) {
    return FromException(e, "broadcast");
  }
}

absl::StatusOr<std::vector<at::Tensor>> ProcessGroup::AllGather(const at::Tensor& input) {
  if (!input.defined()) return absl::InvalidArgumentError("all-gather needs a defined tensor");
  ++collective_calls_;
  std::vector<at::Tensor> in = {input.contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < options_.world_size; ++r) out[0].push_back(at::empty_like(in[0]));
  try {
    absl::Status s = Wait(impl_->backend->allgather(out, in), "all-gather");
    if (!s.ok()) return s;
  } catch (const std::exception& e) {
    return FromException(e, "all-gather");
  }
  return std::move(out[0]);
}

absl::Status ProcessGroup::BroadcastBytes(std::string* bytes, int root) {
  // NCCL carries device tensors only: stage through the current CUDA device there.
  const at::Device dev = options_.backend == Backend::kNccl
                             ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_device_))
                             : at::Device(at::kCPU);
  at::Tensor size = at::zeros({1}, at::kLong);
  if (options_.rank == root) size[0] = static_cast<int64_t>(bytes->size());
  size = size.to(dev);
  absl::Status s = Broadcast(size, root);
  if (!s.ok()) return s;
  const int64_t n = size.cpu()[0].item<int64_t>();
  if (n == 0) {
    bytes->clear();
    return absl::OkStatus();
  }
  at::Tensor data = at::empty({n}, at::kByte);
  if (options_.rank == root) std::memcpy(data.data_ptr(), bytes->data(), bytes->size());
  data = data.to(dev);
  s = Broadcast(data, root);
  if (!s.ok()) return s;
  data = data.cpu();
  bytes->assign(static_cast<const char*>(data.data_ptr()), static_cast<size_t>(n));
  return absl::OkStatus();
}

absl::Status ProcessGroup::Barrier() {
  ++collective_calls_;
  try {
    return Wait(impl_->backend->barrier(), "barrier");
  } catch (const std::exception& e) {
    return FromException(e, "barrier");
  }
}

#else  // !LORADB_HAVE_C10D

struct ProcessGroup::Impl {};

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(const GroupOptions&) {
  std::string why;
  C10dAvailable(&why);
  return absl::UnimplementedError(why);
}
ProcessGroup::ProcessGroup(GroupOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;
absl::Status ProcessGroup::AllReduce(at::Tensor&, ReduceOp) {
  return absl::UnimplementedError("no c10d");
}
absl::Status ProcessGroup::Broadcast(at::Tensor&, int) {
  return absl::UnimplementedError("no c10d");
}
absl::StatusOr<std::vector<at::Tensor>> ProcessGroup::AllGather(const at::Tensor&) {
  return absl::UnimplementedError("no c10d");
}
absl::Status ProcessGroup::BroadcastBytes(std::string*, int) {
  return absl::UnimplementedError("no c10d");
}
absl::Status ProcessGroup::Barrier() { return absl::UnimplementedError("no c10d"); }

#endif  // LORADB_HAVE_C10D

}  // namespace loradb::dist

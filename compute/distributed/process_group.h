// A process group over torch.distributed (c10d): K processes (ranks 0..K-1) that meet through a
// rendezvous store and then run collectives. Gloo carries CPU tensors; NCCL carries CUDA tensors
// (built when the LibTorch has CUDA and nccl.h is found; see cmake/LoradbC10d.cmake).
//
//   rendezvous "file:/dir/x"      a c10d::FileStore at that path (every rank must see the same
//                                 file: loopback / one machine, or a shared file system)
//   rendezvous "tcp:HOST:PORT"    a c10d::TCPStore; rank 0 listens on PORT, the others connect
//
// Every collective blocks until it completes on this rank and returns a Status: a peer that
// died or left (Gloo: connection closed) gives Unavailable; no progress within `timeout`
// gives DeadlineExceeded. After an error the group is unusable: the job must abort (DP and TP
// ranks are not independently useful; docs/distributed.md).
//
// Built without c10d (LORADB_HAVE_C10D undefined), Create returns Unimplemented with the
// reason, so callers and tests can say why they skip.
#ifndef LORADB_COMPUTE_DISTRIBUTED_PROCESS_GROUP_H_
#define LORADB_COMPUTE_DISTRIBUTED_PROCESS_GROUP_H_

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loradb::dist {

enum class Backend { kGloo, kNccl };
// "gloo" | "nccl"; InvalidArgument otherwise.
[[nodiscard]] absl::StatusOr<Backend> ParseBackend(const std::string& name);
const char* BackendName(Backend backend);

// True when this build has c10d (Gloo); `reason` (optional) gets why not.
bool C10dAvailable(std::string* reason = nullptr);
// True when this build has the NCCL backend and a CUDA device is visible.
bool NcclAvailable(std::string* reason = nullptr);

struct GroupOptions {
  int rank = 0;
  int world_size = 1;
  std::string rendezvous;  // "file:PATH" or "tcp:HOST:PORT"
  Backend backend = Backend::kGloo;
  std::chrono::milliseconds timeout{60000};  // rendezvous and every collective
  // A prefix for the store keys, so several groups can share one rendezvous store.
  std::string name = "loradb";
};

enum class ReduceOp { kSum, kAverage, kMax };

class ProcessGroup {
 public:
  // Joins the group: blocks until all `world_size` ranks arrived (or `timeout`:
  // DeadlineExceeded). InvalidArgument for rank outside [0, world_size), world_size < 1, or a
  // malformed rendezvous; Unimplemented when the backend is not built.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ProcessGroup>> Create(
      const GroupOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  Backend backend() const { return options_.backend; }
  const GroupOptions& options() const { return options_; }
  // The CUDA device this rank's NCCL communicator uses (rank % device count); 0 for Gloo.
  int cuda_device() const { return cuda_device_; }

  // In place on `tensor` (contiguous; CPU for Gloo, CUDA for NCCL). kAverage divides the sum
  // by world_size (floating dtypes only).
  [[nodiscard]] absl::Status AllReduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // In place: every rank ends with root's `tensor` (same shape and dtype on every rank).
  [[nodiscard]] absl::Status Broadcast(at::Tensor& tensor, int root = 0);
  // Every rank's `input` (same shape and dtype everywhere), in rank order.
  [[nodiscard]] absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& input);
  // Root's bytes on every rank (any length: the size is broadcast first).
  [[nodiscard]] absl::Status BroadcastBytes(std::string* bytes, int root = 0);
  [[nodiscard]] absl::Status Barrier();

  // Collective calls made so far (each counts once, whatever its size); tests use it to check
  // that gradients travel as one bucket per step.
  int64_t collective_calls() const { return collective_calls_; }

  struct Impl;

 private:
  ProcessGroup(GroupOptions options, std::unique_ptr<Impl> impl);
  GroupOptions options_;
  std::unique_ptr<Impl> impl_;
  int64_t collective_calls_ = 0;
  int cuda_device_ = 0;
};

// The rank, world size and rendezvous of a process started by the launcher (launcher.h), from
// LORADB_RANK, LORADB_WORLD_SIZE and LORADB_RENDEZVOUS. NotFound when LORADB_RANK is unset;
// InvalidArgument for malformed values.
[[nodiscard]] absl::StatusOr<GroupOptions> GroupOptionsFromEnvironment();

}  // namespace loradb::dist

#endif  // LORADB_COMPUTE_DISTRIBUTED_PROCESS_GROUP_H_

#include "compute/distributed/process_group_selfcheck.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "compute/distributed/process_group.h"
#include "storage/util/status_macros.h"

namespace loradb::dist {
namespace {

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("self-check mismatch: ", what));
}

}  // namespace

absl::StatusOr<SelfCheckResult> RunSelfCheck(const SelfCheckOptions& o) {
  LORADB_ASSIGN_OR_RETURN(GroupOptions go, GroupOptionsFromEnvironment());
  LORADB_ASSIGN_OR_RETURN(go.backend, ParseBackend(o.backend));
  if (o.device != "cpu" && o.device != "cuda") {
    return absl::InvalidArgumentError("--device must be cpu or cuda");
  }
  if (o.elements < 1) return absl::InvalidArgumentError("--elements must be >= 1");
  if (o.device == "cuda" && !at::hasCUDA()) {
    return absl::FailedPreconditionError("--device cuda: this LibTorch or machine has no CUDA");
  }
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> pg, ProcessGroup::Create(go));
  if (o.die_rank == pg->rank()) raise(SIGKILL);
  const int r = pg->rank(), k = pg->world_size();
  const at::Device dev =
      o.device == "cuda" ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(pg->cuda_device()))
                         : at::Device(at::kCPU);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);

  SelfCheckResult res;
  res.rank = r;
  res.world_size = k;
  // Sum: element i of rank r holds (r + 1) * (i % 7); the sum is k(k+1)/2 * (i % 7), exact in
  // fp32 for these small integers.
  at::Tensor pattern = at::arange(o.elements, f32).remainder(7);
  at::Tensor t = pattern * static_cast<float>(r + 1);
  const auto t0 = std::chrono::steady_clock::now();
  LORADB_RETURN_IF_ERROR(pg->AllReduce(t, ReduceOp::kSum));
  res.allreduce_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  LORADB_RETURN_IF_ERROR(
      Expect(at::equal(t, pattern * static_cast<float>(k * (k + 1) / 2)), "all-reduce sum"));
  at::Tensor avg = at::full({3}, static_cast<float>(2 * r), f32);
  LORADB_RETURN_IF_ERROR(pg->AllReduce(avg, ReduceOp::kAverage));
  LORADB_RETURN_IF_ERROR(
      Expect(at::allclose(avg, at::full({3}, static_cast<float>(k - 1), f32)), "average"));
  at::Tensor mx = at::full({2}, static_cast<float>(r), f32);
  LORADB_RETURN_IF_ERROR(pg->AllReduce(mx, ReduceOp::kMax));
  LORADB_RETURN_IF_ERROR(
      Expect(at::equal(mx, at::full({2}, static_cast<float>(k - 1), f32)), "all-reduce max"));
  at::Tensor b = at::full({5}, static_cast<float>(r == k - 1 ? 42 : -1), f32);
  LORADB_RETURN_IF_ERROR(pg->Broadcast(b, k - 1));
  LORADB_RETURN_IF_ERROR(Expect(at::equal(b, at::full({5}, 42.0f, f32)), "broadcast"));
  LORADB_ASSIGN_OR_RETURN(std::vector<at::Tensor> g,
                          pg->AllGather(at::full({4}, static_cast<float>(10 * r), f32)));
  LORADB_RETURN_IF_ERROR(Expect(static_cast<int>(g.size()) == k, "all-gather count"));
  for (int i = 0; i < k; ++i) {
    LORADB_RETURN_IF_ERROR(Expect(at::equal(g[i], at::full({4}, static_cast<float>(10 * i), f32)),
                                  absl::StrCat("all-gather slot ", i)));
  }
  const std::string want("loradb dist self-check \0 bytes", 31);
  std::string bytes = r == 0 ? want : std::string("x");
  LORADB_RETURN_IF_ERROR(pg->BroadcastBytes(&bytes, 0));
  LORADB_RETURN_IF_ERROR(Expect(bytes == want, "byte broadcast"));
  LORADB_RETURN_IF_ERROR(pg->Barrier());
  res.collectives = pg->collective_calls();
  return res;
}

}  // namespace loradb::dist

#include "compute/distributed/tp_c10d.h"

#include <c10/util/Exception.h>

#include <memory>
#include <string>

#include "storage/util/status_macros.h"

namespace loradb::distributed {

at::Tensor C10dSumReducer::AllReduceSum(at::Tensor partial) const {
  at::Tensor t = partial.contiguous();
  const absl::Status st = group_->AllReduce(t, dist::ReduceOp::kSum);
  ++calls_;
  TORCH_CHECK(st.ok(), "tensor-parallel all-reduce failed: ", std::string(st.ToString()));
  return t;
}

absl::StatusOr<TpDecodeResult> RunTpDecodeRank(const TpDecodeOptions& options,
                                               dist::Backend backend, int* rank, int* degree) {
  LORADB_ASSIGN_OR_RETURN(dist::GroupOptions go, dist::GroupOptionsFromEnvironment());
  go.backend = backend;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<dist::ProcessGroup> group,
                          dist::ProcessGroup::Create(go));
  *rank = group->rank();
  *degree = group->world_size();
  C10dSumReducer reducer(group.get());
  TpDecodeOptions local = options;
  if (backend == dist::Backend::kNccl) {
    // NCCL carries CUDA tensors: the rank's model lives on its device.
    local.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(group->cuda_device()));
  }
  LORADB_ASSIGN_OR_RETURN(TpDecodeResult result,
                          RunTpDecode(local, {group->rank(), group->world_size()}, &reducer));
  // Keep every rank alive until all finished their collectives.
  LORADB_RETURN_IF_ERROR(group->Barrier());
  return result;
}

}  // namespace loradb::distributed

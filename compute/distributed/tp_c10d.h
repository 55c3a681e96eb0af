// The c10d side of tensor parallelism: a model::PartialSumReducer over a dist::ProcessGroup
// (Gloo on CPU, NCCL on GPU), and the TP decode run as one rank of a launched group.
#ifndef LORADB_COMPUTE_DISTRIBUTED_TP_C10D_H_
#define LORADB_COMPUTE_DISTRIBUTED_TP_C10D_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "compute/distributed/process_group.h"
#include "compute/distributed/tp_decode.h"
#include "compute/model/qwen3_model.h"

namespace loradb::distributed {

// Sums partial outputs with one in-place all-reduce per call. A failed collective (a dead
// peer, a timeout) throws c10::Error carrying the Status text, which Qwen3Model::Forward
// returns as InternalError; the group is unusable afterwards (docs/distributed.md).
class C10dSumReducer final : public model::PartialSumReducer {
 public:
  explicit C10dSumReducer(dist::ProcessGroup* group) : group_(group) {}
  at::Tensor AllReduceSum(at::Tensor partial) const override;
  int64_t calls() const { return calls_; }

 private:
  dist::ProcessGroup* group_;
  mutable int64_t calls_ = 0;
};

// Joins the group described by the launcher's environment (dist::GroupOptionsFromEnvironment)
// over `backend` and runs RunTpDecode as that rank with TP degree = the world size (NCCL: the
// rank's model on its CUDA device). Errors: the group's (NotFound outside a launched rank,
// Unimplemented without c10d or NCCL) and RunTpDecode's.
[[nodiscard]] absl::StatusOr<TpDecodeResult> RunTpDecodeRank(const TpDecodeOptions& options,
                                                             dist::Backend backend, int* rank,
                                                             int* degree);

}  // namespace loradb::distributed

#endif  // LORADB_COMPUTE_DISTRIBUTED_TP_C10D_H_

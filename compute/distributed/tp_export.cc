#include "compute/distributed/tp_export.h"

#include <ATen/ATen.h>

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "compute/distributed/tp_shard.h"
#include "storage/tiers/host_buffer.h"
#include "storage/util/status_macros.h"

namespace loradb::distributed {
namespace {

constexpr uint64_t kAlign = 64;

// One line per tensor: name, dtype, shape, bytes. Equal layouts mean equal bucket offsets.
std::string LayoutOf(const TensorSet& shard) {
  std::string out;
  for (const TensorView& v : shard.tensors()) {
    absl::StrAppend(&out, v.name, "\t", DTypeName(v.dtype), "\t", ShapeString(v.shape), "\t",
                    v.nbytes, "\n");
  }
  return out;
}

// Offsets of each tensor in the flat bucket (64-byte aligned), and the bucket's size.
uint64_t BucketOffsets(const TensorSet& shard, std::vector<uint64_t>* offsets) {
  uint64_t total = 0;
  offsets->clear();
  for (const TensorView& v : shard.tensors()) {
    offsets->push_back(total);
    total = tiers::AlignUp(total + v.nbytes, kAlign);
  }
  return total;
}

// Rank 0's outcome as text: "ok <revision> <hash>" or "error <code> <message>".
std::string EncodeOutcome(const absl::StatusOr<RevisionRecord>& rec) {
  if (rec.ok()) return absl::StrCat("ok ", rec->id, " ", rec->blob.hash.Hex());
  return absl::StrCat("error ", static_cast<int>(rec.status().code()), " ", rec.status().message());
}

absl::StatusOr<GatheredExport> DecodeOutcome(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits(' ', 2));
  GatheredExport out;
  if (parts.size() == 3 && parts[0] == "ok" && absl::SimpleAtoi(parts[1], &out.revision)) {
    out.blob_hash = parts[2];
    return out;
  }
  int code = 0;
  if (parts.size() == 3 && parts[0] == "error" && absl::SimpleAtoi(parts[1], &code)) {
    return absl::Status(static_cast<absl::StatusCode>(code),
                        absl::StrCat("rank 0 did not publish: ", parts[2]));
  }
  return absl::InternalError(absl::StrCat("unreadable export outcome from rank 0: ", text));
}

}  // namespace

absl::StatusOr<RevisionRecord> PublishGatheredAdapter(Store& store, const std::string& policy,
                                                      const std::vector<const TensorSet*>& shards,
                                                      const PublishOptions& options) {
  LORADB_ASSIGN_OR_RETURN(TensorSet whole, GatherAdapterShards(shards));
  return store.PublishTensors(policy, whole.tensors(), options);
}

absl::StatusOr<GatheredExport> GatherAndPublishAdapter(dist::ProcessGroup& group,
                                                       const TensorSet& shard, Store* store,
                                                       const std::string& policy,
                                                       const PublishOptions& options,
                                                       const GatherExportHooks& hooks) {
  const int rank = group.rank(), world = group.world_size();
  if (rank == 0 && store == nullptr) {
    return absl::InvalidArgumentError("rank 0 of a TP export needs the store to publish into");
  }
  // NCCL carries device tensors only: the small verdicts and the buckets travel from the rank's
  // CUDA device there (Gloo: CPU).
  const at::Device dev =
      group.backend() == dist::Backend::kNccl
          ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(group.cuda_device()))
          : at::Device(at::kCPU);
  // (1) The layout: rank 0's, checked by every rank; every rank learns every verdict.
  const std::string mine = LayoutOf(shard);
  std::string layout = mine;
  LORADB_RETURN_IF_ERROR(group.BroadcastBytes(&layout, 0));
  at::Tensor verdict = at::full({1}, layout == mine ? 0.0f : 1.0f, at::kFloat).to(dev);
  LORADB_ASSIGN_OR_RETURN(std::vector<at::Tensor> verdicts, group.AllGather(verdict));
  std::vector<int> differ;
  for (int r = 0; r < world; ++r) {
    if (verdicts[static_cast<size_t>(r)].cpu().item<float>() != 0.0f) differ.push_back(r);
  }
  if (!differ.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TP export: the shard layout (names, dtypes, shapes) of rank(s) ",
                     absl::StrJoin(differ, ", "), " differs from rank 0's; nothing was published"));
  }
  if (hooks.before_payload) hooks.before_payload(rank);

  // (2) Every shard to rank 0: one flat byte bucket per rank, one all-gather.
  std::vector<uint64_t> offsets;
  const uint64_t bucket_bytes = BucketOffsets(shard, &offsets);
  at::Tensor bucket = at::zeros({static_cast<int64_t>(bucket_bytes)}, at::kByte);
  auto* dst = reinterpret_cast<std::byte*>(bucket.data_ptr<uint8_t>());
  for (size_t i = 0; i < shard.tensors().size(); ++i) {
    const TensorView& v = shard.tensors()[i];
    if (v.nbytes > 0) std::memcpy(dst + offsets[i], v.data, v.nbytes);
  }
  absl::StatusOr<std::vector<at::Tensor>> gathered = group.AllGather(bucket.to(dev));
  if (!gathered.ok()) {
    return absl::Status(gathered.status().code(),
                        absl::StrCat("TP export: gathering the shards failed on rank ", rank,
                                     " (nothing was published): ", gathered.status().message()));
  }
  GatheredExport result;
  for (const TensorView& v : shard.tensors()) result.shard_bytes += v.nbytes;

  // (3) Rank 0 gathers and publishes; (4) everyone learns the outcome.
  std::string outcome;
  if (rank == 0) {
    std::vector<TensorSet> sets;
    sets.reserve(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      auto holder =
          std::make_shared<at::Tensor>((*gathered)[static_cast<size_t>(r)].cpu().contiguous());
      result.gathered_bytes += static_cast<uint64_t>(holder->nbytes());
      const auto* base = reinterpret_cast<const std::byte*>(holder->data_ptr<uint8_t>());
      TensorSet set(std::shared_ptr<const void>(holder, holder.get()));
      absl::Status added = absl::OkStatus();
      for (size_t i = 0; i < shard.tensors().size() && added.ok(); ++i) {
        const TensorView& v = shard.tensors()[i];
        added = set.Add(TensorView{v.name, v.dtype, v.shape, base + offsets[i], v.nbytes});
      }
      if (!added.ok()) {
        outcome = EncodeOutcome(added);
        break;
      }
      sets.push_back(std::move(set));
    }
    if (outcome.empty()) {
      std::vector<const TensorSet*> ptrs;
      for (const TensorSet& s : sets) ptrs.push_back(&s);
      outcome = EncodeOutcome(PublishGatheredAdapter(*store, policy, ptrs, options));
    }
  }
  LORADB_RETURN_IF_ERROR(group.BroadcastBytes(&outcome, 0));
  LORADB_ASSIGN_OR_RETURN(GatheredExport told, DecodeOutcome(outcome));
  result.revision = told.revision;
  result.blob_hash = told.blob_hash;
  return result;
}

}  // namespace loradb::distributed

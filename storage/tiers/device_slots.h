// The device tier: adapters copied into one device-memory arena that many adapters of
// different ranks share without padding (S-LoRA's insight). The arena is cut into fixed pages;
// an adapter's tensors are grouped, in host order, into chunks of at most `max_chunk_bytes`
// that each take a contiguous run of pages, so every tensor is contiguous on the device while
// an adapter needs no contiguous space beyond one chunk. Fragmentation (free pages not in the
// largest free run, and bytes lost to page rounding) is reported.
//
// A decode step calls AcquireBatch with the revisions of its batch and gets one lease over all
// of them, loading through the CPU cache and copying as needed, or a clear error when they
// cannot all fit; unleased adapters are evicted least recently used first.
#ifndef LORADB_STORAGE_TIERS_DEVICE_SLOTS_H_
#define LORADB_STORAGE_TIERS_DEVICE_SLOTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/formats/tensor.h"
#include "storage/tiers/cpu_cache.h"
#include "storage/tiers/device_backend.h"
#include "storage/tiers/latency_histogram.h"
#include "storage/tiers/tp_shard.h"
#include "storage/util/mutex.h"

namespace loradb::tiers {

struct DeviceSlotsOptions {
  uint64_t arena_bytes = uint64_t{1} << 30;
  // Page size of the arena (a power of two, at least 256).
  uint64_t page_bytes = 64 << 10;
  // Tensors are grouped into chunks spanning at most this many host bytes (a tensor larger
  // than this is a chunk of its own).
  uint64_t max_chunk_bytes = 2 << 20;
  // Tensor-parallel placement of this device: rank `tp.rank` of a TP group of `tp.degree` ranks.
  // With degree > 1 every slot holds only the rank's shard of its adapter (tp_shard.h's rules:
  // B of q/k/v/gate/up by output rows, A of o/down by input columns, the other factor whole; MoE
  // experts likewise), sliced on the host from the CPU tier's copy (or taken as is when that
  // copy already is this rank's shard, a derived blob); pages and stats count shard bytes.
  TpShardSpec tp;
};

// One tensor of a slotted adapter. `data` is a device pointer (host pointer with the host
// backend) into the arena, valid while a lease covering the adapter lives.
struct DeviceTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::byte* data = nullptr;
  uint64_t nbytes = 0;
};

// An adapter revision resident in the arena: per-tensor device pointers by name, plus the
// host tensor set's metadata (rank, alpha, PEFT config...) so consumers can derive the scale.
struct DeviceAdapter {
  DeviceAdapter() = default;
  // Not copyable: the name index points into `tensors`.
  DeviceAdapter(const DeviceAdapter&) = delete;
  DeviceAdapter& operator=(const DeviceAdapter&) = delete;

  uint64_t revision = 0;
  uint32_t slot = 0;
  std::vector<DeviceTensor> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t bytes = 0;  // payload bytes copied (the shard's under a TP placement)
  uint64_t pages = 0;  // pages held
  TpShardSpec tp;      // the placement its tensors were sliced for ({0, 1}: whole)

  // nullptr if absent.
  const DeviceTensor* Find(absl::string_view name) const;

 private:
  friend class DeviceSlots;
  absl::flat_hash_map<absl::string_view, uint32_t> index_;  // views of tensors[i].name
};

class DeviceSlots;

// A pin on every adapter of one batch. Move-only; releases on destruction. DeviceSlots must
// outlive its leases.
class DeviceBatchLease {
 public:
  DeviceBatchLease() = default;
  DeviceBatchLease(DeviceBatchLease&& other) noexcept { *this = std::move(other); }
  DeviceBatchLease& operator=(DeviceBatchLease&& other) noexcept;
  DeviceBatchLease(const DeviceBatchLease&) = delete;
  DeviceBatchLease& operator=(const DeviceBatchLease&) = delete;
  ~DeviceBatchLease() { Release(); }

  // The distinct revisions of the batch, in first-requested order.
  size_t size() const { return adapters_.size(); }
  const DeviceAdapter& operator[](size_t i) const { return *adapters_[i]; }
  // nullptr when `revision` is not in this batch.
  const DeviceAdapter* Find(uint64_t revision) const;
  void Release();

 private:
  friend class DeviceSlots;
  DeviceSlots* slots_ = nullptr;
  std::vector<std::shared_ptr<const DeviceAdapter>> adapters_;
};

struct DeviceSlotsStats {
  uint64_t batches = 0;         // successful AcquireBatch calls
  uint64_t batch_failures = 0;  // failed AcquireBatch calls
  uint64_t hits = 0;            // adapters already resident when requested
  uint64_t misses = 0;          // adapters copied in
  uint64_t evictions = 0;       // adapters evicted (LRU or Evict)
  uint64_t bytes_copied = 0;
  uint64_t resident_adapters = 0;
  uint64_t leased_adapters = 0;
  uint64_t pages_total = 0;
  uint64_t pages_free = 0;
  uint64_t largest_free_run = 0;  // pages
  uint64_t payload_bytes = 0;     // bytes of resident tensors
  uint64_t page_waste_bytes = 0;  // pages held x page size - payload (internal fragmentation)
  // External fragmentation: 1 - largest_free_run / pages_free (0 when nothing is free).
  double fragmentation = 0;
  LatencyHistogram copy_latency;  // per copied adapter batch
};

// Where a revision is in the device tier.
struct DeviceResidency {
  bool resident = false;
  uint32_t slot = 0;
  int leases = 0;
  uint64_t bytes = 0;  // payload bytes in the arena (the rank's shard under a TP placement)
  TpShardSpec tp;      // the slots' placement
};

class DeviceSlots {
 public:
  // `cache` (not owned) must outlive this. InvalidArgument on bad options (a TP placement with
  // rank outside [0, degree) included); the backend's error
  // when the arena cannot be allocated.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DeviceSlots>> Create(
      DeviceSlotsOptions options, CpuCache* cache, std::unique_ptr<DeviceBackend> backend);
  ~DeviceSlots();
  DeviceSlots(const DeviceSlots&) = delete;
  DeviceSlots& operator=(const DeviceSlots&) = delete;

  // One lease over the distinct `revisions` (duplicates allowed). Loads misses through the CPU
  // cache (all at once, decode priority), evicts unleased adapters LRU to make room, copies.
  // Errors (nothing stays pinned): the CPU cache's error for a revision, naming it;
  // ResourceExhausted when the batch cannot fit beside the adapters other leases pin
  // (naming pages needed and available); InvalidArgument for an empty batch, or (naming the
  // revision and tensor) when a split dimension is not divisible by the TP degree;
  // FailedPrecondition when the CPU tier holds a shard of another TP placement.
  [[nodiscard]] absl::StatusOr<DeviceBatchLease> AcquireBatch(std::span<const uint64_t> revisions);

  // Drops an unleased adapter. NotFound if absent; FailedPrecondition if leased or copying.
  [[nodiscard]] absl::Status Evict(uint64_t revision);

  DeviceResidency Find(uint64_t revision) const;
  DeviceSlotsStats stats() const;
  const DeviceBackend& backend() const { return *backend_; }
  const DeviceSlotsOptions& options() const { return options_; }

 private:
  friend class DeviceBatchLease;
  struct Run {
    uint64_t first_page;
    uint64_t pages;
  };
  struct Slot {
    std::shared_ptr<DeviceAdapter> adapter;
    std::vector<Run> runs;
    int leases = 0;
    bool ready = false;   // copy finished
    bool failed = false;  // copy failed; being removed
    uint64_t last_use = 0;
  };
  // One contiguous group of host tensors copied as one piece.
  struct Chunk {
    const std::byte* host_begin;
    uint64_t span;
    std::vector<size_t> tensors;  // indices into the host TensorSet
  };

  // What can be worked out from a loaded host adapter before taking the lock: its chunks and
  // pages, and the device adapter with names, shapes and index (device pointers still null).
  struct Prepared {
    std::vector<Chunk> chunks;
    uint64_t pages = 0;
    std::shared_ptr<DeviceAdapter> adapter;
  };

  DeviceSlots(DeviceSlotsOptions options, CpuCache* cache, std::unique_ptr<DeviceBackend> backend);
  std::vector<Chunk> PlanChunks(const TensorSet& set) const;
  Prepared Prepare(uint64_t revision, const TensorSet& host) const;
  uint64_t PagesFor(uint64_t bytes) const {
    return (bytes + options_.page_bytes - 1) / options_.page_bytes;
  }
  std::optional<uint64_t> AllocRun(uint64_t pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeRun(Run run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the least recently used unleased ready slot; false if none.
  bool EvictLru() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveSlot(uint64_t revision) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpin(std::span<const uint64_t> revisions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(const std::vector<std::shared_ptr<const DeviceAdapter>>& adapters);

  const DeviceSlotsOptions options_;
  CpuCache* const cache_;
  const std::unique_ptr<DeviceBackend> backend_;
  std::byte* arena_ = nullptr;
  uint64_t total_pages_ = 0;

  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> free_runs_ ABSL_GUARDED_BY(mu_);  // first page -> pages
  uint64_t free_pages_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> free_slot_ids_ ABSL_GUARDED_BY(mu_);
  uint32_t next_slot_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  DeviceSlotsStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_DEVICE_SLOTS_H_

#include "storage/tiers/device_slots.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace loradb::tiers {

const DeviceTensor* DeviceAdapter::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors[it->second];
}

DeviceBatchLease& DeviceBatchLease::operator=(DeviceBatchLease&& other) noexcept {
  if (this != &other) {
    Release();
    slots_ = other.slots_;
    adapters_ = std::move(other.adapters_);
    other.slots_ = nullptr;
    other.adapters_.clear();
  }
  return *this;
}

const DeviceAdapter* DeviceBatchLease::Find(uint64_t revision) const {
  for (const auto& a : adapters_) {
    if (a->revision == revision) return a.get();
  }
  return nullptr;
}

void DeviceBatchLease::Release() {
  if (slots_ == nullptr) return;
  DeviceSlots* slots = slots_;
  slots_ = nullptr;
  slots->Release(adapters_);
  adapters_.clear();
}

DeviceSlots::DeviceSlots(DeviceSlotsOptions options, CpuCache* cache,
                         std::unique_ptr<DeviceBackend> backend)
    : options_(options), cache_(cache), backend_(std::move(backend)) {}

absl::StatusOr<std::unique_ptr<DeviceSlots>> DeviceSlots::Create(
    DeviceSlotsOptions options, CpuCache* cache, std::unique_ptr<DeviceBackend> backend) {
  if (cache == nullptr || backend == nullptr) {
    return absl::InvalidArgumentError("device slots need a cpu cache and a backend");
  }
  if (options.page_bytes < 256 || !std::has_single_bit(options.page_bytes)) {
    return absl::InvalidArgumentError("device page_bytes must be a power of two >= 256");
  }
  if (options.arena_bytes < options.page_bytes) {
    return absl::InvalidArgumentError("device arena_bytes is smaller than one page");
  }
  if (options.max_chunk_bytes == 0) {
    return absl::InvalidArgumentError("device max_chunk_bytes is zero");
  }
  if (absl::Status tp = ValidateTpShard(options.tp); !tp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("device TP placement: ", tp.message()));
  }
  std::unique_ptr<DeviceSlots> slots(new DeviceSlots(options, cache, std::move(backend)));
  slots->total_pages_ = options.arena_bytes / options.page_bytes;
  auto arena = slots->backend_->AllocateArena(slots->total_pages_ * options.page_bytes);
  if (!arena.ok()) return arena.status();
  slots->arena_ = *arena;
  MutexLock lock(&slots->mu_);
  slots->free_runs_[0] = slots->total_pages_;
  slots->free_pages_ = slots->total_pages_;
  slots->stats_.pages_total = slots->total_pages_;
  return slots;
}

DeviceSlots::~DeviceSlots() {
  if (arena_ != nullptr) backend_->FreeArena(arena_);
}

std::vector<DeviceSlots::Chunk> DeviceSlots::PlanChunks(const TensorSet& set) const {
  std::vector<size_t> order;
  for (size_t i = 0; i < set.tensors().size(); ++i) {
    if (set.tensors()[i].nbytes > 0) order.push_back(i);
  }
  auto by_address = [&](size_t a, size_t b) {
    return set.tensors()[a].data < set.tensors()[b].data;
  };
  // Parsers list tensors in file order, so this is usually sorted already.
  if (!std::is_sorted(order.begin(), order.end(), by_address)) {
    std::sort(order.begin(), order.end(), by_address);
  }
  std::vector<Chunk> chunks;
  for (size_t i : order) {
    const TensorView& t = set.tensors()[i];
    const std::byte* end = t.data + t.nbytes;
    if (chunks.empty() ||
        static_cast<uint64_t>(end - chunks.back().host_begin) > options_.max_chunk_bytes) {
      // Overlapping views (packed groups and their members) stay in the chunk they start in.
      if (chunks.empty() || t.data >= chunks.back().host_begin + chunks.back().span) {
        chunks.push_back({t.data, 0, {}});
      }
    }
    Chunk& c = chunks.back();
    c.span = std::max<uint64_t>(c.span, static_cast<uint64_t>(end - c.host_begin));
    c.tensors.push_back(i);
  }
  return chunks;
}

DeviceSlots::Prepared DeviceSlots::Prepare(uint64_t revision, const TensorSet& host) const {
  Prepared p;
  p.chunks = PlanChunks(host);
  for (const Chunk& c : p.chunks) p.pages += PagesFor(c.span);
  auto adapter = std::make_shared<DeviceAdapter>();
  adapter->revision = revision;
  adapter->tp = options_.tp;
  adapter->metadata = host.metadata();
  const std::vector<TensorView>& views = host.tensors();
  adapter->tensors.resize(views.size());
  adapter->index_.reserve(views.size());
  for (size_t t = 0; t < views.size(); ++t) {
    DeviceTensor& d = adapter->tensors[t];
    d.name = views[t].name;
    d.dtype = views[t].dtype;
    d.shape = views[t].shape;
    d.nbytes = views[t].nbytes;
    adapter->index_.emplace(d.name, static_cast<uint32_t>(t));
  }
  p.adapter = std::move(adapter);
  return p;
}

std::optional<uint64_t> DeviceSlots::AllocRun(uint64_t pages) {
  for (auto it = free_runs_.begin(); it != free_runs_.end(); ++it) {
    if (it->second < pages) continue;
    uint64_t first = it->first;
    uint64_t left = it->second - pages;
    free_runs_.erase(it);
    if (left > 0) free_runs_[first + pages] = left;
    free_pages_ -= pages;
    return first;
  }
  return std::nullopt;
}

void DeviceSlots::FreeRun(Run run) {
  uint64_t first = run.first_page, pages = run.pages;
  auto next = free_runs_.lower_bound(first);
  if (next != free_runs_.end() && first + pages == next->first) {
    pages += next->second;
    next = free_runs_.erase(next);
  }
  if (next != free_runs_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == first) {
      prev->second += pages;
      free_pages_ += run.pages;
      return;
    }
  }
  free_runs_[first] = pages;
  free_pages_ += run.pages;
}

void DeviceSlots::RemoveSlot(uint64_t revision) {
  auto it = slots_.find(revision);
  if (it == slots_.end()) return;
  for (const Run& r : it->second.runs) FreeRun(r);
  stats_.payload_bytes -= it->second.adapter->bytes;
  stats_.page_waste_bytes -=
      it->second.adapter->pages * options_.page_bytes - it->second.adapter->bytes;
  free_slot_ids_.push_back(it->second.adapter->slot);
  slots_.erase(it);
}

bool DeviceSlots::EvictLru() {
  uint64_t victim = 0, oldest = UINT64_MAX;
  bool found = false;
  for (const auto& [rev, slot] : slots_) {
    if (slot.leases == 0 && slot.ready && slot.last_use < oldest) {
      oldest = slot.last_use;
      victim = rev;
      found = true;
    }
  }
  if (!found) return false;
  RemoveSlot(victim);
  stats_.evictions++;
  return true;
}

void DeviceSlots::Unpin(std::span<const uint64_t> revisions) {
  for (uint64_t rev : revisions) {
    auto it = slots_.find(rev);
    if (it != slots_.end() && it->second.leases > 0) it->second.leases--;
  }
}

void DeviceSlots::Release(const std::vector<std::shared_ptr<const DeviceAdapter>>& adapters) {
  MutexLock lock(&mu_);
  for (const auto& a : adapters) {
    auto it = slots_.find(a->revision);
    if (it == slots_.end() || it->second.adapter.get() != a.get()) continue;
    if (it->second.leases > 0) it->second.leases--;
    it->second.last_use = ++tick_;
  }
}

absl::StatusOr<DeviceBatchLease> DeviceSlots::AcquireBatch(std::span<const uint64_t> revisions) {
  if (revisions.empty()) return absl::InvalidArgumentError("empty batch");
  std::vector<uint64_t> unique;
  for (uint64_t r : revisions) {
    if (std::find(unique.begin(), unique.end(), r) == unique.end()) unique.push_back(r);
  }
  // Revisions pinned by this call, with the adapter object pinned (a slot can be replaced).
  std::vector<std::pair<uint64_t, std::shared_ptr<DeviceAdapter>>> pinned;
  auto unpin_all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [rev, adapter] : pinned) {
      auto it = slots_.find(rev);
      if (it != slots_.end() && it->second.adapter == adapter && it->second.leases > 0) {
        it->second.leases--;
      }
    }
    pinned.clear();
    stats_.batch_failures++;
  };
  auto pin = [&](uint64_t rev, Slot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    slot.leases++;
    slot.last_use = ++tick_;
    pinned.emplace_back(rev, slot.adapter);
  };

  std::vector<uint64_t> missing;
  {
    MutexLock lock(&mu_);
    for (uint64_t rev : unique) {
      auto it = slots_.find(rev);
      if (it != slots_.end() && !it->second.failed) {
        pin(rev, it->second);
        stats_.hits++;
      } else {
        missing.push_back(rev);
      }
    }
  }

  // Load the misses through the CPU cache, all started before waiting for any.
  // Each adapter's device-side description is built as soon as its load is done, while the
  // others may still be loading, and outside the lock.
  for (uint64_t rev : missing) (void)cache_->Prefetch(rev, LoadPriority::kDecode);
  std::vector<CpuLease> cpu;
  std::vector<Prepared> prepared;
  // Under a TP placement the slots hold the rank's shard: each host copy is sliced (kept alive
  // in `shards` until the copy is done) unless it already is that shard.
  std::vector<TensorSet> shards(missing.size());
  std::vector<const TensorSet*> hosts;
  for (size_t i = 0; i < missing.size(); ++i) {
    const uint64_t rev = missing[i];
    absl::StatusOr<CpuLease> lease = cache_->Acquire(rev, LoadPriority::kDecode);
    if (!lease.ok()) {
      MutexLock lock(&mu_);
      unpin_all();
      return absl::Status(lease.status().code(),
                          absl::StrCat("revision ", rev, ": ", lease.status().message()));
    }
    cpu.push_back(*std::move(lease));
    absl::StatusOr<const TensorSet*> host =
        AdapterShardFor(cpu.back().tensors(), options_.tp, &shards[i]);
    if (!host.ok()) {
      MutexLock lock(&mu_);
      unpin_all();
      return absl::Status(host.status().code(),
                          absl::StrCat("revision ", rev, " on TP rank ", options_.tp.rank, " of ",
                                       options_.tp.degree, ": ", host.status().message()));
    }
    hosts.push_back(*host);
    prepared.push_back(Prepare(rev, **host));
  }

  // Allocate pages for the adapters still missing, evicting unleased ones LRU.
  std::vector<size_t> created;  // indices into `missing`
  std::vector<CopyOp> ops;
  {
    MutexLock lock(&mu_);
    std::vector<size_t> to_create;
    uint64_t need = 0;
    for (size_t i = 0; i < missing.size(); ++i) {
      auto it = slots_.find(missing[i]);
      if (it != slots_.end() && !it->second.failed) {  // another batch brought it meanwhile
        pin(missing[i], it->second);
        stats_.hits++;
      } else {
        to_create.push_back(i);
        need += prepared[i].pages;
      }
    }
    uint64_t leased_pages = 0;
    for (const auto& [rev, slot] : slots_) {
      if (slot.leases > 0) leased_pages += slot.adapter->pages;
    }
    if (need > total_pages_ - leased_pages) {
      unpin_all();
      return absl::ResourceExhaustedError(
          absl::StrCat("device arena: batch of ", unique.size(), " adapters needs ", need,
                       " more pages (", need * options_.page_bytes, " bytes) but only ",
                       total_pages_ - leased_pages, " of ", total_pages_, " pages are not leased"));
    }
    for (size_t i : to_create) {
      const TensorSet& host = *hosts[i];
      std::shared_ptr<DeviceAdapter> adapter = std::move(prepared[i].adapter);
      Slot slot;
      bool ok = true;
      for (const Chunk& c : prepared[i].chunks) {
        uint64_t pages = PagesFor(c.span);
        std::optional<uint64_t> first = AllocRun(pages);
        while (!first.has_value() && EvictLru()) first = AllocRun(pages);
        if (!first.has_value()) {
          ok = false;
          break;
        }
        slot.runs.push_back({*first, pages});
        std::byte* dev = arena_ + *first * options_.page_bytes;
        for (size_t t : c.tensors) {
          adapter->tensors[t].data = dev + (host.tensors()[t].data - c.host_begin);
        }
        ops.push_back({dev, c.host_begin, c.span});
        adapter->bytes += c.span;
        adapter->pages += pages;
      }
      if (!ok) {  // fragmented beyond what eviction can fix: undo this call
        for (const Run& r : slot.runs) FreeRun(r);
        for (size_t j : created) RemoveSlot(missing[j]);
        unpin_all();
        return absl::ResourceExhaustedError(
            absl::StrCat("device arena: no contiguous run of pages for revision ", missing[i],
                         " (free pages ", free_pages_, " are fragmented between leased adapters)"));
      }
      if (!free_slot_ids_.empty()) {
        adapter->slot = free_slot_ids_.back();
        free_slot_ids_.pop_back();
      } else {
        adapter->slot = next_slot_id_++;
      }
      slot.adapter = adapter;
      slot.leases = 0;
      stats_.payload_bytes += adapter->bytes;
      stats_.page_waste_bytes += adapter->pages * options_.page_bytes - adapter->bytes;
      auto& placed = slots_[missing[i]] = std::move(slot);
      pin(missing[i], placed);
      created.push_back(i);
    }
  }

  absl::Time start = absl::Now();
  absl::Status copied = ops.empty() ? absl::OkStatus() : backend_->Copy(ops);
  absl::Duration took = absl::Now() - start;

  MutexLock lock(&mu_);
  if (!copied.ok()) {
    for (size_t i : created) {
      auto it = slots_.find(missing[i]);
      if (it != slots_.end()) it->second.failed = true;
    }
    unpin_all();
    for (size_t i : created) RemoveSlot(missing[i]);
    return copied;
  }
  for (size_t i : created) {
    Slot& s = slots_.at(missing[i]);
    s.ready = true;
    stats_.misses++;
    stats_.bytes_copied += s.adapter->bytes;
  }
  if (!created.empty()) stats_.copy_latency.Record(took);
  // Adapters pinned from other batches may still be copying: wait for them.
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [rev, adapter] : pinned) {
      auto it = slots_.find(rev);
      if (it != slots_.end() && it->second.adapter == adapter && !it->second.ready &&
          !it->second.failed) {
        return false;
      }
    }
    return true;
  };
  mu_.Await(settled);
  DeviceBatchLease lease;
  for (uint64_t rev : unique) {
    for (const auto& [prev, adapter] : pinned) {
      if (prev != rev) continue;
      auto it = slots_.find(rev);
      if (it == slots_.end() || it->second.adapter != adapter || !it->second.ready) {
        unpin_all();
        return absl::UnavailableError(
            absl::StrCat("revision ", rev, ": its copy into the device arena failed"));
      }
      lease.adapters_.push_back(adapter);
      break;
    }
  }
  lease.slots_ = this;
  stats_.batches++;
  return lease;
}

absl::Status DeviceSlots::Evict(uint64_t revision) {
  MutexLock lock(&mu_);
  auto it = slots_.find(revision);
  if (it == slots_.end()) {
    return absl::NotFoundError(absl::StrCat("revision ", revision, " is not in the device tier"));
  }
  if (it->second.leases > 0 || !it->second.ready) {
    return absl::FailedPreconditionError(
        absl::StrCat("revision ", revision, " is leased or being copied"));
  }
  RemoveSlot(revision);
  stats_.evictions++;
  return absl::OkStatus();
}

DeviceResidency DeviceSlots::Find(uint64_t revision) const {
  MutexLock lock(&mu_);
  DeviceResidency r;
  auto it = slots_.find(revision);
  if (it != slots_.end() && it->second.ready) {
    r.resident = true;
    r.slot = it->second.adapter->slot;
    r.leases = it->second.leases;
    r.bytes = it->second.adapter->bytes;
  }
  r.tp = options_.tp;
  return r;
}

DeviceSlotsStats DeviceSlots::stats() const {
  MutexLock lock(&mu_);
  DeviceSlotsStats s = stats_;
  s.pages_free = free_pages_;
  s.largest_free_run = 0;
  for (const auto& [first, pages] : free_runs_)
    s.largest_free_run = std::max(s.largest_free_run, pages);
  s.fragmentation = free_pages_ == 0 ? 0.0
                                     : 1.0 - static_cast<double>(s.largest_free_run) /
                                                 static_cast<double>(free_pages_);
  s.resident_adapters = slots_.size();
  s.leased_adapters = 0;
  for (const auto& [rev, slot] : slots_) s.leased_adapters += slot.leases > 0;
  return s;
}

}  // namespace loradb::tiers

// The C API's residency calls: CPU leases, device batch leases, prefetch, evict, and the tier
// statistics (loradb_stats).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/time/time.h"
#include "api/c/internal.h"

using loradb::Tier;
using loradb::capi::ClearKeepingSize;
using loradb::capi::CopyOut;
using loradb::capi::Fail;
using loradb::capi::FillView;
using loradb::capi::FromCEnum;
using loradb::capi::Guarded;
using loradb::capi::kTiers;
using loradb::capi::Registry;
using loradb::capi::Report;
using loradb::capi::ToString;

namespace {

#define LORADB_C_CHECK_TIERS(h)                                                                 \
  do {                                                                                          \
    if ((h)->tiers == nullptr) {                                                                \
      return Fail(LORADB_UNAVAILABLE,                                                           \
                  "the store was opened without residency tiers (CPU cache budget 0)", errmsg); \
    }                                                                                           \
  } while (0)

// The suggested wait after a ResourceExhausted: the cache's own hint when it gave one, else
// the CPU cache's median load time (at least 10 ms). Always >= 1.
uint32_t RetryAfterMs(const absl::Status& status, loradb::tiers::StoreTiers* tiers) {
  std::optional<absl::Duration> hint = loradb::tiers::RetryAfterHint(status);
  double ms = 10;
  if (hint.has_value()) {
    ms = absl::ToDoubleMilliseconds(*hint);
  } else if (tiers != nullptr) {
    ms = std::max(ms, absl::ToDoubleMilliseconds(tiers->cpu().stats().load_latency.Quantile(0.5)));
  }
  ms = std::ceil(std::max(ms, 1.0));
  return ms > 3.6e6 ? 3600000u : static_cast<uint32_t>(ms);
}

loradb_status_t ReportResidency(const absl::Status& status, loradb_store_t* store,
                                uint32_t* retry_after_ms, char** errmsg) {
  if (retry_after_ms != nullptr && status.code() == absl::StatusCode::kResourceExhausted) {
    *retry_after_ms = RetryAfterMs(status, store->tiers);
  }
  return Report(status, errmsg);
}

bool LeaseLive(const loradb_lease_t* l) { return l != nullptr && Registry().Contains(l); }
bool BatchLive(const loradb_batch_lease_t* b) { return b != nullptr && Registry().Contains(b); }

uint64_t Micros(absl::Duration d) { return static_cast<uint64_t>(absl::ToInt64Microseconds(d)); }

// The full (current-version) stats of `t` (nullptr: no tiers, all zero).
void FillStats(loradb::tiers::StoreTiers* t, loradb_stats_t* o) {
  o->tp_degree = 1;
  if (t == nullptr) return;
  o->tiers = 1;
  const loradb::tiers::CpuCacheStats c = t->cpu().stats();
  o->cpu_budget_bytes = t->cpu().options().budget_bytes;
  o->cpu_hits = c.hits;
  o->cpu_misses = c.misses;
  o->cpu_loads = c.loads;
  o->cpu_load_failures = c.load_failures;
  o->cpu_joined = c.joined_waiters;
  o->cpu_rejections = c.rejections;
  o->cpu_negative_hits = c.negative_hits;
  o->cpu_prefetches = c.prefetches;
  o->cpu_evictions = c.evictions;
  o->cpu_bytes_in = c.bytes_in;
  o->cpu_bytes_out = c.bytes_out;
  o->cpu_resident_bytes = c.resident_bytes;
  o->cpu_resident_entries = c.resident_entries;
  o->cpu_leased_bytes = c.leased_bytes;
  o->cpu_inflight_loads = c.inflight_loads;
  o->cpu_queued_loads = c.queued_loads;
  o->cpu_load_p50_us = Micros(c.load_latency.Quantile(0.5));
  o->cpu_load_p99_us = Micros(c.load_latency.Quantile(0.99));
  o->cpu_pooled_bytes = c.pooled_bytes;
  o->cpu_pool_cap_bytes = c.pool_cap_bytes;
  o->tp_rank = static_cast<uint32_t>(t->tp().rank);
  o->tp_degree = static_cast<uint32_t>(t->tp().degree);
  o->tp_derived = t->tp_derived() ? 1 : 0;
  std::snprintf(o->eviction, sizeof(o->eviction), "%s",
                loradb::tiers::EvictionPolicyName(t->cpu().options().policy));
  const loradb::tiers::LoaderStats l = t->loader().stats();
  o->loader = l.backend == loradb::tiers::LoaderBackend::kIoUring ? LORADB_LOADER_IO_URING
                                                                  : LORADB_LOADER_PREAD;
  o->loader_io_uring_errno = l.io_uring_init_errno;
  o->loader_files = l.files;
  o->loader_bytes = l.bytes;
  o->loader_checksum_failures = l.checksum_failures;
  o->loader_read_errors = l.read_errors;
  loradb::tiers::DeviceSlots* device = t->device();
  if (device == nullptr) return;
  const loradb::tiers::DeviceSlotsStats d = device->stats();
  o->device = device->backend().is_device() ? LORADB_DEVICE_CUDA : LORADB_DEVICE_HOST;
  o->device_batches = d.batches;
  o->device_batch_failures = d.batch_failures;
  o->device_hits = d.hits;
  o->device_misses = d.misses;
  o->device_evictions = d.evictions;
  o->device_bytes_copied = d.bytes_copied;
  o->device_resident_adapters = d.resident_adapters;
  o->device_leased_adapters = d.leased_adapters;
  o->device_arena_bytes = device->options().arena_bytes;
  o->device_page_bytes = device->options().page_bytes;
  o->device_pages_total = d.pages_total;
  o->device_pages_free = d.pages_free;
  o->device_largest_free_run = d.largest_free_run;
  o->device_payload_bytes = d.payload_bytes;
  o->device_page_waste_bytes = d.page_waste_bytes;
  o->device_fragmentation = d.fragmentation;
}

}  // namespace

extern "C" {

loradb_status_t loradb_acquire(loradb_store_t* store, uint64_t revision, uint32_t timeout_ms,
                               loradb_lease_t** out, uint32_t* retry_after_ms, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (retry_after_ms != nullptr) *retry_after_ms = 0;
    LORADB_C_CHECK_STORE(store);
    if (out == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "out is NULL", errmsg);
    *out = nullptr;
    LORADB_C_CHECK_TIERS(store);
    std::optional<absl::Duration> timeout;
    if (timeout_ms > 0) timeout = absl::Milliseconds(timeout_ms);
    absl::StatusOr<loradb::tiers::CpuLease> lease =
        store->tiers->cpu().Acquire(revision, loradb::tiers::LoadPriority::kDecode, timeout);
    if (!lease.ok()) return ReportResidency(lease.status(), store, retry_after_ms, errmsg);
    auto handle = std::make_unique<loradb_lease_t>();
    handle->store = store;
    handle->lease = *std::move(lease);
    store->leases.fetch_add(1);
    Registry().Add(handle.get());
    *out = handle.release();
    return LORADB_OK;
  });
}

loradb_status_t loradb_lease_revision(const loradb_lease_t* lease, uint64_t* revision) {
  if (lease == nullptr || revision == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!LeaseLive(lease)) return LORADB_INVALID_HANDLE;
  *revision = lease->lease.revision();
  return LORADB_OK;
}

size_t loradb_lease_tensor_count(const loradb_lease_t* lease) {
  return LeaseLive(lease) ? lease->lease.tensors().size() : 0;
}

loradb_status_t loradb_lease_tensor_at(const loradb_lease_t* lease, size_t index,
                                       loradb_tensor_view_t* view) {
  if (lease == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!LeaseLive(lease)) return LORADB_INVALID_HANDLE;
  if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
  const loradb::TensorSet& set = lease->lease.tensors();
  if (index >= set.size()) return LORADB_OUT_OF_RANGE;
  FillView(set.tensors()[index], view);
  return LORADB_OK;
}

loradb_status_t loradb_lease_tensor_find(const loradb_lease_t* lease, const char* name,
                                         size_t name_len, loradb_tensor_view_t* view) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (lease == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
    if (!LeaseLive(lease)) return LORADB_INVALID_HANDLE;
    if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
    std::string n;
    if (!ToString(name, name_len, &n)) return LORADB_INVALID_ARGUMENT;
    const loradb::TensorView* t = lease->lease.tensors().Find(n);
    if (t == nullptr) return LORADB_NOT_FOUND;
    FillView(*t, view);
    return LORADB_OK;
  });
}

loradb_status_t loradb_release(loradb_lease_t** lease) {
  if (lease == nullptr) return LORADB_INVALID_ARGUMENT;
  if (*lease == nullptr) return LORADB_OK;
  if (!Registry().Remove(*lease)) return LORADB_INVALID_HANDLE;
  loradb_store_t* store = (*lease)->store;
  delete *lease;  // drops the pin
  store->leases.fetch_sub(1);
  *lease = nullptr;
  return LORADB_OK;
}

loradb_status_t loradb_acquire_batch(loradb_store_t* store, const uint64_t* revisions, size_t count,
                                     loradb_batch_lease_t** out, uint32_t* retry_after_ms,
                                     char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (retry_after_ms != nullptr) *retry_after_ms = 0;
    LORADB_C_CHECK_STORE(store);
    if (out == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "out is NULL", errmsg);
    *out = nullptr;
    if (revisions == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "revisions is NULL", errmsg);
    if (count == 0 || count > 65536) {
      return Fail(LORADB_INVALID_ARGUMENT,
                  absl::StrCat("a batch holds 1..65536 revisions, got ", count), errmsg);
    }
    LORADB_C_CHECK_TIERS(store);
    loradb::tiers::DeviceSlots* device = store->tiers->device();
    if (device == nullptr) {
      return Fail(LORADB_UNAVAILABLE,
                  "the store was opened without a device tier (see loradb_options_set_device)",
                  errmsg);
    }
    absl::StatusOr<loradb::tiers::DeviceBatchLease> lease =
        device->AcquireBatch(std::span<const uint64_t>(revisions, count));
    if (!lease.ok()) return ReportResidency(lease.status(), store, retry_after_ms, errmsg);
    auto handle = std::make_unique<loradb_batch_lease_t>();
    handle->store = store;
    handle->lease = *std::move(lease);
    store->leases.fetch_add(1);
    Registry().Add(handle.get());
    *out = handle.release();
    return LORADB_OK;
  });
}

size_t loradb_batch_size(const loradb_batch_lease_t* batch) {
  return BatchLive(batch) ? batch->lease.size() : 0;
}

loradb_status_t loradb_batch_adapter(const loradb_batch_lease_t* batch, size_t index,
                                     loradb_batch_adapter_t* out) {
  if (batch == nullptr || out == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!BatchLive(batch)) return LORADB_INVALID_HANDLE;
  if (out->struct_size != sizeof(loradb_batch_adapter_t)) return LORADB_INVALID_ARGUMENT;
  if (index >= batch->lease.size()) return LORADB_OUT_OF_RANGE;
  const loradb::tiers::DeviceAdapter& a = batch->lease[index];
  ClearKeepingSize(out);
  out->revision = a.revision;
  out->slot = a.slot;
  out->tensor_count = a.tensors.size();
  out->bytes = a.bytes;
  out->pages = a.pages;
  out->device_pointers = batch->store->tiers->device()->backend().is_device() ? 1 : 0;
  return LORADB_OK;
}

loradb_status_t loradb_batch_find(const loradb_batch_lease_t* batch, uint64_t revision,
                                  size_t* index) {
  if (batch == nullptr || index == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!BatchLive(batch)) return LORADB_INVALID_HANDLE;
  for (size_t i = 0; i < batch->lease.size(); ++i) {
    if (batch->lease[i].revision == revision) {
      *index = i;
      return LORADB_OK;
    }
  }
  return LORADB_NOT_FOUND;
}

loradb_status_t loradb_batch_tensor_at(const loradb_batch_lease_t* batch, size_t adapter_index,
                                       size_t tensor_index, loradb_tensor_view_t* view) {
  if (batch == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!BatchLive(batch)) return LORADB_INVALID_HANDLE;
  if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
  if (adapter_index >= batch->lease.size()) return LORADB_OUT_OF_RANGE;
  const loradb::tiers::DeviceAdapter& a = batch->lease[adapter_index];
  if (tensor_index >= a.tensors.size()) return LORADB_OUT_OF_RANGE;
  FillView(a.tensors[tensor_index], view);
  return LORADB_OK;
}

loradb_status_t loradb_batch_tensor_find(const loradb_batch_lease_t* batch, size_t adapter_index,
                                         const char* name, size_t name_len,
                                         loradb_tensor_view_t* view) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (batch == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
    if (!BatchLive(batch)) return LORADB_INVALID_HANDLE;
    if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
    std::string n;
    if (!ToString(name, name_len, &n)) return LORADB_INVALID_ARGUMENT;
    if (adapter_index >= batch->lease.size()) return LORADB_OUT_OF_RANGE;
    const loradb::tiers::DeviceTensor* t = batch->lease[adapter_index].Find(n);
    if (t == nullptr) return LORADB_NOT_FOUND;
    FillView(*t, view);
    return LORADB_OK;
  });
}

loradb_status_t loradb_batch_release(loradb_batch_lease_t** batch) {
  if (batch == nullptr) return LORADB_INVALID_ARGUMENT;
  if (*batch == nullptr) return LORADB_OK;
  if (!Registry().Remove(*batch)) return LORADB_INVALID_HANDLE;
  loradb_store_t* store = (*batch)->store;
  delete *batch;  // drops every pin of the batch
  store->leases.fetch_sub(1);
  *batch = nullptr;
  return LORADB_OK;
}

loradb_status_t loradb_prefetch(loradb_store_t* store, uint64_t revision, uint32_t* retry_after_ms,
                                char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (retry_after_ms != nullptr) *retry_after_ms = 0;
    LORADB_C_CHECK_STORE(store);
    LORADB_C_CHECK_TIERS(store);
    // Refuse unknown or deleted revisions here, so a typo is an error now rather than a
    // failed background load later.
    absl::StatusOr<loradb::RevisionRecord> rev = store->store->GetRevision(revision);
    if (!rev.ok()) return Report(rev.status(), errmsg);
    if (rev->state != loradb::RevisionState::kLive) {
      return Fail(LORADB_NOT_FOUND, absl::StrCat("revision ", revision, " is deleted"), errmsg);
    }
    return ReportResidency(store->tiers->cpu().Prefetch(revision), store, retry_after_ms, errmsg);
  });
}

loradb_status_t loradb_evict(loradb_store_t* store, uint64_t revision, loradb_tier_t tier,
                             char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    const std::optional<Tier> t = FromCEnum(tier, kTiers);
    if (t != Tier::kCpu && t != Tier::kGpu) {
      return Fail(LORADB_INVALID_ARGUMENT, "evict from LORADB_TIER_CPU or LORADB_TIER_GPU", errmsg);
    }
    LORADB_C_CHECK_TIERS(store);
    if (t == Tier::kCpu) return Report(store->tiers->cpu().Evict(revision), errmsg);
    loradb::tiers::DeviceSlots* device = store->tiers->device();
    if (device == nullptr) {
      return Fail(LORADB_UNAVAILABLE, "the store was opened without a device tier", errmsg);
    }
    return Report(device->Evict(revision), errmsg);
  });
}

loradb_status_t loradb_stats(loradb_store_t* store, loradb_stats_t* out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_CHECK_GROWN_STRUCT(out, loradb_stats_t, LORADB_STATS_V1_SIZE);
    loradb_stats_t full{};
    FillStats(store->tiers, &full);
    CopyOut(full, out);
    return LORADB_OK;
  });
}

}  // extern "C"

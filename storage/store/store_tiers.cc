#include "storage/store/store_tiers.h"

#include "absl/strings/str_cat.h"
#include "storage/formats/blob.h"
#include "storage/tiers/tp_shard_load.h"
#include "storage/util/status_macros.h"

namespace loradb::tiers {

absl::StatusOr<std::unique_ptr<StoreTiers>> StoreTiers::Open(Store* store,
                                                             StoreTiersOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("StoreTiers needs a store");
  std::unique_ptr<StoreTiers> t(new StoreTiers());
  t->store_ = store;
  t->tp_ = options.slots.tp;
  t->tp_derived_dir_ = options.tp_derived_dir;
  LORADB_ASSIGN_OR_RETURN(t->loader_, Loader::Create(options.loader));
  StoreTiers* self = t.get();
  LORADB_ASSIGN_OR_RETURN(t->cpu_, CpuCache::Create(options.cpu, [self](uint64_t id) {
                            return self->LoadRevision(id);
                          }));
  std::unique_ptr<DeviceBackend> backend;
  switch (options.device) {
    case DeviceKind::kNone:
      break;
    case DeviceKind::kHost:
      backend = MakeHostBackend();
      break;
    case DeviceKind::kCuda: {
      LORADB_ASSIGN_OR_RETURN(backend, MakeCudaBackend(options.cuda_device));
      break;
    }
    case DeviceKind::kAuto: {
      auto cuda = MakeCudaBackend(options.cuda_device);
      backend = cuda.ok() ? std::move(*cuda) : MakeHostBackend();
      break;
    }
  }
  if (backend != nullptr) {
    LORADB_ASSIGN_OR_RETURN(t->device_,
                            DeviceSlots::Create(options.slots, t->cpu_.get(), std::move(backend)));
  }
  // Derived blobs of revisions deleted or compacted while no tiers with this directory were open.
  LORADB_RETURN_IF_ERROR(t->CollectDerivedShards().status());
  return t;
}

absl::StatusOr<std::shared_ptr<const CachedAdapter>> StoreTiers::LoadRevision(uint64_t id) {
  LORADB_ASSIGN_OR_RETURN(RevisionRecord rev, store_->GetRevision(id));
  if (rev.state != RevisionState::kLive) {
    return absl::NotFoundError(absl::StrCat("revision ", id, " is not live"));
  }
  const std::string path = store_->BlobPath(rev.blob.hash);
  auto adapter = std::make_shared<CachedAdapter>();
  if (tp_derived()) {
    // The rank's derived blob (built from the whole blob, verified, on first use); its metadata
    // names the placement, so the device slots copy it as is.
    LORADB_ASSIGN_OR_RETURN(adapter->tensors,
                            LoadDerivedShard(path, rev.blob.hash, tp_derived_dir_, tp_));
    for (const TensorView& v : adapter->tensors.tensors()) adapter->bytes += v.nbytes;
    // A DeleteRevision that ran while this load built the derived blob found nothing to remove;
    // remove it now (the mapped copy stays readable). What a crash leaves here, Open sweeps.
    (void)ForgetDerivedShards(rev.blob.hash);
  } else {
    LORADB_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buf,
                            loader_->ReadFile(path, rev.blob.hash));
    if (buf->size() != rev.blob.bytes) {
      return absl::DataLossError(absl::StrCat("blob ", path, " has ", buf->size(),
                                              " bytes, the catalog records ", rev.blob.bytes));
    }
    // The whole-file xxh3-128 checked by the loader covers every byte; no per-tensor pass.
    absl::StatusOr<TensorSet> set = ParseBlob(
        buf->bytes(), std::shared_ptr<const void>(buf, buf.get()), /*verify_checksums=*/false);
    if (!set.ok()) {
      return absl::Status(set.status().code(),
                          absl::StrCat("blob ", path, ": ", set.status().message()));
    }
    adapter->tensors = *std::move(set);
    adapter->bytes = buf->capacity();
  }
  auto& md = adapter->tensors.metadata();
  md["lora.r"] = absl::StrCat(rev.lora.r);
  md["lora.alpha"] = absl::StrCat(rev.lora.alpha);
  md["lora.use_rslora"] = rev.lora.use_rslora ? "true" : "false";
  return adapter;
}

absl::StatusOr<CpuLease> StoreTiers::AcquireCpu(uint64_t id, LoadPriority priority) {
  return cpu_->Acquire(id, priority);
}

TierPlace StoreTiers::Where(uint64_t revision) const {
  TierPlace p;
  CpuResidency c = cpu_->Find(revision);
  if (c.state == CpuResidency::State::kResident) {
    p.tier = Tier::kCpu;
    p.cpu_leases = c.leases;
  }
  if (device_ != nullptr) {
    DeviceResidency d = device_->Find(revision);
    if (d.resident) {
      p.tier = Tier::kGpu;
      p.slot = d.slot;
      p.device_leases = d.leases;
      p.device_bytes = d.bytes;
    }
    p.tp = device_->options().tp;
  }
  return p;
}

bool StoreTiers::Drop(uint64_t revision) {
  bool dropped = false;
  if (device_ != nullptr) dropped = device_->Evict(revision).ok();
  if (cpu_->Evict(revision).ok()) dropped = true;
  return dropped;
}

absl::StatusOr<TieredLocated> StoreTiers::Locate(const std::string& policy,
                                                 const std::string& alias) const {
  TieredLocated out;
  LORADB_ASSIGN_OR_RETURN(out.located, store_->Locate(policy, alias));
  TierPlace p = Where(out.located.revision.id);
  out.located.location.tier = p.tier;
  out.located.location.slot = p.slot;
  out.located.location.device_bytes = p.device_bytes;
  out.located.location.tp = p.tp;
  out.slot = p.slot;
  out.device_bytes = p.device_bytes;
  out.tp = p.tp;
  return out;
}

absl::StatusOr<bool> StoreTiers::SourceReferenced(const Hash128& hash) const {
  absl::StatusOr<BlobRecord> blob = store_->catalog().GetBlob(hash);
  if (absl::IsNotFound(blob.status())) return false;
  if (!blob.ok()) return blob.status();
  return blob->refcount > 0;
}

absl::StatusOr<DerivedShardSweep> StoreTiers::CollectDerivedShards() const {
  if (tp_derived_dir_.empty()) return DerivedShardSweep{};
  return tiers::CollectDerivedShards(tp_derived_dir_,
                                     [this](const Hash128& h) { return SourceReferenced(h); });
}

absl::StatusOr<uint64_t> StoreTiers::ForgetDerivedShards(const Hash128& source) const {
  if (tp_derived_dir_.empty()) return 0;
  LORADB_ASSIGN_OR_RETURN(bool referenced, SourceReferenced(source));
  if (referenced) return 0;
  return RemoveDerivedShards(tp_derived_dir_, source);
}

}  // namespace loradb::tiers

// The C API's revisions and checkpoints: publishing (tensors, PEFT directory, safetensors
// file), reading, listing, deleting and exporting revisions, the tensor-set handle, and
// training checkpoints.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "api/c/internal.h"
#include "storage/util/status_macros.h"

using loradb::capi::ClearKeepingSize;
using loradb::capi::Fail;
using loradb::capi::FillView;
using loradb::capi::Guarded;
using loradb::capi::Registry;
using loradb::capi::Report;
using loradb::capi::ToString;

namespace {

using loradb::DType;
using loradb::capi::FromCEnum;
using loradb::capi::kDTypes;

bool ToDType(const loradb_dtype_t& in, loradb::DType* out) {
  std::optional<DType> d = FromCEnum(in, kDTypes);
  if (!d.has_value()) return false;
  *out = *d;
  return true;
}

void FillRevision(const loradb::RevisionRecord& r, loradb_revision_info_t* out) {
  ClearKeepingSize(out);
  out->id = r.id;
  out->policy_id = r.policy_id;
  out->seq = r.seq;
  out->parent = r.parent;
  out->blob_bytes = r.blob.bytes;
  out->tensor_count = r.blob.tensors;
  out->lora_r = r.lora.r;
  out->lora_alpha = r.lora.alpha;
  out->use_rslora = r.lora.use_rslora ? 1 : 0;
  out->deleted = r.state == loradb::RevisionState::kDeleted ? 1 : 0;
  out->packed = r.layout == loradb::Layout::kPacked ? 1 : 0;
  out->trained = r.source.kind == loradb::SourceKind::kTrained ? 1 : 0;
  out->checkpoint_id = r.source.checkpoint_id;
  out->created_us = r.created_us;
  const std::string hex = r.blob.hash.Hex();
  std::memcpy(out->blob_hash, hex.data(), std::min(hex.size(), sizeof(out->blob_hash) - 1));
}

void FillCheckpoint(const loradb::CheckpointRecord& c, loradb_checkpoint_info_t* out) {
  ClearKeepingSize(out);
  out->id = c.id;
  out->policy_id = c.policy_id;
  out->step = c.step;
  out->parent = c.parent;
  out->master_bytes = c.master.bytes;
  out->optimizer_bytes = c.optimizer.bytes;
  out->gradients_bytes = c.gradients.bytes;
  out->scheduler_position = c.scheduler_position;
  out->created_us = c.created_us;
}

// Converts caller tensors to views, checking pointers and that nbytes matches shape x dtype.
absl::Status ToViews(const loradb_tensor_t* tensors, size_t count, const char* what,
                     std::vector<loradb::TensorView>* out) {
  if (tensors == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is NULL with a non-zero count"));
  }
  for (size_t i = 0; i < count; ++i) {
    const loradb_tensor_t& t = tensors[i];
    loradb::TensorView v;
    if (!ToString(t.name, t.name_len, &v.name) || v.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] has no name"));
    }
    if (!ToDType(t.dtype, &v.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] has an unknown dtype"));
    }
    if (t.shape == nullptr && t.ndim > 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] shape is NULL"));
    }
    if (t.ndim > 8) return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] ndim > 8"));
    v.shape.assign(t.shape, t.shape + t.ndim);
    absl::StatusOr<uint64_t> expected = loradb::CheckedNumBytes(v.shape, v.dtype);
    if (!expected.ok()) return expected.status();
    if (*expected != t.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] '", v.name, "': nbytes ",
                                                     t.nbytes, " != ", *expected,
                                                     " implied by shape and dtype"));
    }
    if (t.data == nullptr && t.nbytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] data is NULL"));
    }
    v.data = static_cast<const std::byte*>(t.data);
    v.nbytes = t.nbytes;
    out->push_back(std::move(v));
  }
  return absl::OkStatus();
}

absl::Status ToPublishOptions(const loradb_publish_options_t* in, loradb::PublishOptions* out) {
  if (in == nullptr) return absl::OkStatus();
  if (in->struct_size != sizeof(loradb_publish_options_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options->struct_size is ", in->struct_size,
        ", expected sizeof(loradb_publish_options_t) = ", sizeof(loradb_publish_options_t)));
  }
  if (!ToString(in->alias, in->alias_len, &out->alias)) {
    return absl::InvalidArgumentError("options->alias is NULL with a non-zero length");
  }
  if (in->lora_r < 0) return absl::InvalidArgumentError("options->lora_r is negative");
  if (in->use_rslora != 0 && in->use_rslora != 1) {
    return absl::InvalidArgumentError("options->use_rslora must be 0 or 1");
  }
  out->parent = in->parent;
  out->lora.r = in->lora_r;
  out->lora.alpha = in->lora_alpha;
  out->lora.use_rslora = in->use_rslora == 1;
  return absl::OkStatus();
}

loradb_status_t FinishRevision(const absl::StatusOr<loradb::RevisionRecord>& rec,
                               loradb_revision_info_t* out, char** errmsg) {
  if (!rec.ok()) return Report(rec.status(), errmsg);
  if (out != nullptr) FillRevision(*rec, out);
  return LORADB_OK;
}

// The prologue the three publish calls share, in this order: the store handle, `policy`, the
// source string (`source_what` names it in the error; the tensors call passes none), `out`'s
// struct_size when `out` is given, then `options`. Runs `publish(policy, source, options)` and
// reports its revision into `out`.
template <typename Fn>
loradb_status_t GuardedPublish(loradb_store_t* store, const char* policy, size_t policy_len,
                               const char* source, size_t source_len, const char* source_what,
                               const loradb_publish_options_t* options, loradb_revision_info_t* out,
                               char** errmsg, Fn&& publish) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(src, source, source_len, source_what);
    if (out != nullptr) LORADB_C_CHECK_STRUCT(out, loradb_revision_info_t);
    loradb::PublishOptions opts;
    absl::Status st = ToPublishOptions(options, &opts);
    if (!st.ok()) return Report(st, errmsg);
    return FinishRevision(publish(p, src, opts), out, errmsg);
  });
}

bool TensorsLive(const loradb_tensors_t* t) { return t != nullptr && Registry().Contains(t); }

}  // namespace

extern "C" {

// ---- publishing

loradb_status_t loradb_publish_tensors(loradb_store_t* store, const char* policy, size_t policy_len,
                                       const loradb_tensor_t* tensors, size_t tensor_count,
                                       const loradb_publish_options_t* options,
                                       loradb_revision_info_t* out, char** errmsg) {
  return GuardedPublish(
      store, policy, policy_len, nullptr, 0, "source", options, out, errmsg,
      [&](const std::string& p, const std::string&,
          const loradb::PublishOptions& opts) -> absl::StatusOr<loradb::RevisionRecord> {
        std::vector<loradb::TensorView> views;
        LORADB_RETURN_IF_ERROR(ToViews(tensors, tensor_count, "tensors", &views));
        return store->store->PublishTensors(p, views, opts);
      });
}

loradb_status_t loradb_publish_peft_dir(loradb_store_t* store, const char* policy,
                                        size_t policy_len, const char* dir, size_t dir_len,
                                        const loradb_publish_options_t* options,
                                        loradb_revision_info_t* out, char** errmsg) {
  return GuardedPublish(store, policy, policy_len, dir, dir_len, "dir", options, out, errmsg,
                        [&](const std::string& p, const std::string& d,
                            loradb::PublishOptions opts) -> absl::StatusOr<loradb::RevisionRecord> {
                          // The LoRA settings come from the directory's adapter_config.json.
                          opts.lora = loradb::LoraSettings();
                          return store->store->PublishPeftDir(p, d, opts);
                        });
}

loradb_status_t loradb_publish_safetensors(loradb_store_t* store, const char* policy,
                                           size_t policy_len, const char* path, size_t path_len,
                                           const loradb_publish_options_t* options,
                                           loradb_revision_info_t* out, char** errmsg) {
  return GuardedPublish(
      store, policy, policy_len, path, path_len, "path", options, out, errmsg,
      [&](const std::string& p, const std::string& f,
          const loradb::PublishOptions& opts) -> absl::StatusOr<loradb::RevisionRecord> {
        return store->store->PublishSafetensors(p, f, opts);
      });
}

// ---- revisions

loradb_status_t loradb_revision_get(loradb_store_t* store, uint64_t id, loradb_revision_info_t* out,
                                    char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_CHECK_STRUCT(out, loradb_revision_info_t);
    return FinishRevision(store->store->GetRevision(id), out, errmsg);
  });
}

loradb_status_t loradb_revision_resolve(loradb_store_t* store, const char* ref, size_t ref_len,
                                        loradb_revision_info_t* out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(r, ref, ref_len, "ref");
    LORADB_C_CHECK_STRUCT(out, loradb_revision_info_t);
    return FinishRevision(store->store->Resolve(r), out, errmsg);
  });
}

loradb_status_t loradb_revision_list(loradb_store_t* store, const char* policy, size_t policy_len,
                                     uint64_t after_seq, loradb_revision_info_t* out,
                                     size_t capacity, size_t* count, uint64_t* next_cursor,
                                     char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    if (out == nullptr || count == nullptr) {
      return Fail(LORADB_INVALID_ARGUMENT, "out and count must not be NULL", errmsg);
    }
    *count = 0;
    if (capacity < 1 || capacity > 1000) {
      return Fail(LORADB_INVALID_ARGUMENT, "capacity must be 1..1000", errmsg);
    }
    for (size_t i = 0; i < capacity; ++i) {
      if (out[i].struct_size != sizeof(loradb_revision_info_t)) {
        return Fail(LORADB_INVALID_ARGUMENT,
                    absl::StrCat("out[", i, "].struct_size is ", out[i].struct_size,
                                 ", expected sizeof(loradb_revision_info_t) = ",
                                 sizeof(loradb_revision_info_t)),
                    errmsg);
      }
    }
    absl::StatusOr<loradb::Page<loradb::RevisionRecord>> page =
        store->store->ListRevisions(p, after_seq, capacity);
    if (!page.ok()) return Report(page.status(), errmsg);
    for (size_t i = 0; i < page->items.size() && i < capacity; ++i) {
      FillRevision(page->items[i], &out[i]);
    }
    *count = std::min(page->items.size(), capacity);
    if (next_cursor != nullptr) *next_cursor = page->next_after.value_or(0);
    return LORADB_OK;
  });
}

loradb_status_t loradb_revision_delete(loradb_store_t* store, uint64_t id, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    return Report(store->store->DeleteRevision(id), errmsg);
  });
}

loradb_status_t loradb_revision_read_tensors(loradb_store_t* store, uint64_t id,
                                             loradb_tensors_t** out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    if (out == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "out is NULL", errmsg);
    *out = nullptr;
    absl::StatusOr<loradb::RevisionRecord> rev = store->store->GetRevision(id);
    if (!rev.ok()) return Report(rev.status(), errmsg);
    absl::StatusOr<loradb::TensorSet> set = store->store->ReadTensors(*rev);
    if (!set.ok()) return Report(set.status(), errmsg);
    auto* handle = new loradb_tensors_t{std::move(*set)};
    Registry().Add(handle);
    *out = handle;
    return LORADB_OK;
  });
}

loradb_status_t loradb_revision_export_peft(loradb_store_t* store, uint64_t id, const char* out_dir,
                                            size_t out_dir_len, char** errmsg) {
  return loradb_revision_export_peft_layout(store, id, out_dir, out_dir_len,
                                            LORADB_PEFT_LAYOUT_AS_IMPORTED, errmsg);
}

loradb_status_t loradb_revision_export_peft_layout(loradb_store_t* store, uint64_t id,
                                                   const char* out_dir, size_t out_dir_len,
                                                   loradb_peft_layout_t layout, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(d, out_dir, out_dir_len, "out_dir");
    if (d.empty()) return Fail(LORADB_INVALID_ARGUMENT, "out_dir is empty", errmsg);
    if (layout != LORADB_PEFT_LAYOUT_AS_IMPORTED && layout != LORADB_PEFT_LAYOUT_PER_EXPERT) {
      return Fail(
          LORADB_INVALID_ARGUMENT,
          absl::StrCat("layout ", static_cast<int>(layout), " is not a loradb_peft_layout_t value"),
          errmsg);
    }
    absl::StatusOr<loradb::RevisionRecord> rev = store->store->GetRevision(id);
    if (!rev.ok()) return Report(rev.status(), errmsg);
    return Report(store->store->ExportPeftDir(*rev, d,
                                              layout == LORADB_PEFT_LAYOUT_PER_EXPERT
                                                  ? loradb::Store::PeftExportLayout::kPerExpert
                                                  : loradb::Store::PeftExportLayout::kAsImported),
                  errmsg);
  });
}

// ---- tensors

size_t loradb_tensors_count(const loradb_tensors_t* tensors) {
  return TensorsLive(tensors) ? tensors->set.size() : 0;
}

loradb_status_t loradb_tensors_at(const loradb_tensors_t* tensors, size_t index,
                                  loradb_tensor_view_t* view) {
  if (tensors == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!TensorsLive(tensors)) return LORADB_INVALID_HANDLE;
  if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
  if (index >= tensors->set.size()) return LORADB_OUT_OF_RANGE;
  FillView(tensors->set.tensors()[index], view);
  return LORADB_OK;
}

loradb_status_t loradb_tensors_find(const loradb_tensors_t* tensors, const char* name,
                                    size_t name_len, loradb_tensor_view_t* view) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (tensors == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
    if (!TensorsLive(tensors)) return LORADB_INVALID_HANDLE;
    if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
    std::string n;
    if (!ToString(name, name_len, &n)) return LORADB_INVALID_ARGUMENT;
    const loradb::TensorView* t = tensors->set.Find(n);
    if (t == nullptr) return LORADB_NOT_FOUND;
    FillView(*t, view);
    return LORADB_OK;
  });
}

loradb_status_t loradb_tensors_destroy(loradb_tensors_t** tensors) {
  if (tensors == nullptr) return LORADB_INVALID_ARGUMENT;
  if (*tensors == nullptr) return LORADB_OK;
  if (!Registry().Remove(*tensors)) return LORADB_INVALID_HANDLE;
  delete *tensors;
  *tensors = nullptr;
  return LORADB_OK;
}

// ---- checkpoints

loradb_status_t loradb_checkpoint_put(loradb_store_t* store, const char* policy, size_t policy_len,
                                      uint64_t step, uint64_t parent, const loradb_tensor_t* master,
                                      size_t master_count, const loradb_tensor_t* optimizer,
                                      size_t optimizer_count, const loradb_tensor_t* gradients,
                                      size_t gradients_count, const char* scheduler_name,
                                      size_t scheduler_name_len, int64_t scheduler_position,
                                      const void* rng_state, size_t rng_state_len,
                                      const void* rollout, size_t rollout_len,
                                      loradb_checkpoint_info_t* out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(sched, scheduler_name, scheduler_name_len, "scheduler_name");
    if (out != nullptr) LORADB_C_CHECK_STRUCT(out, loradb_checkpoint_info_t);
    if (master_count == 0) {
      return Fail(LORADB_INVALID_ARGUMENT, "a checkpoint needs master tensors", errmsg);
    }
    if ((rng_state == nullptr && rng_state_len > 0) || (rollout == nullptr && rollout_len > 0)) {
      return Fail(LORADB_INVALID_ARGUMENT, "rng_state/rollout is NULL with a non-zero length",
                  errmsg);
    }
    loradb::CheckpointParts parts;
    absl::Status st = ToViews(master, master_count, "master", &parts.master);
    if (st.ok()) st = ToViews(optimizer, optimizer_count, "optimizer", &parts.optimizer);
    if (st.ok()) st = ToViews(gradients, gradients_count, "gradients", &parts.gradients);
    if (!st.ok()) return Report(st, errmsg);
    parts.scheduler_name = sched;
    parts.scheduler_position = scheduler_position;
    if (rng_state_len > 0)
      parts.rng_state.assign(static_cast<const char*>(rng_state), rng_state_len);
    if (rollout_len > 0) parts.rollout.assign(static_cast<const char*>(rollout), rollout_len);
    absl::StatusOr<loradb::CheckpointRecord> c =
        store->store->PutCheckpoint(p, step, parent, parts);
    if (!c.ok()) return Report(c.status(), errmsg);
    if (out != nullptr) FillCheckpoint(*c, out);
    return LORADB_OK;
  });
}

loradb_status_t loradb_checkpoint_get(loradb_store_t* store, uint64_t id,
                                      loradb_checkpoint_info_t* out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_CHECK_STRUCT(out, loradb_checkpoint_info_t);
    absl::StatusOr<loradb::CheckpointRecord> c = store->store->GetCheckpoint(id);
    if (!c.ok()) return Report(c.status(), errmsg);
    FillCheckpoint(*c, out);
    return LORADB_OK;
  });
}

}  // extern "C"

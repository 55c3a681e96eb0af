// loradb::Store: the facade over the catalog (storage/catalog) and the content-addressed blob
// files. It registers bases, creates policies, publishes adapter revisions (from tensors, a PEFT
// directory or a safetensors file) crash-safely, resolves revisions by id, (policy, seq) or
// (policy, alias), moves and rolls back aliases, stores training checkpoints, answers the four
// questions of Locate(), exports PEFT directories and verifies the whole store.
//
// Thread-safe. One Store per process per directory is the normal use; a second Store over the
// same directory shares the same catalog environment. Opened with StoreOptions::tiers, the Store
// owns the residency tiers (loader, CPU cache, device slots: Store::tiers()) and Locate() reports
// the tier (and device slot) the bytes are in now.
#ifndef LORADB_STORAGE_STORE_STORE_H_
#define LORADB_STORAGE_STORE_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/catalog/catalog.h"
#include "storage/formats/tensor.h"
#include "storage/tiers/tier_options.h"
#include "storage/util/store_lock.h"

namespace loradb::peft {
struct PeftAdapter;
}  // namespace loradb::peft

namespace loradb {

namespace tiers {
class StoreTiers;
}  // namespace tiers

struct StoreOptions {
  // Create the store directory and catalog when missing (otherwise NotFound).
  bool create_if_missing = true;
  // Where blob files live; default `<store>/blobs`. May be shared storage.
  std::string blob_root;
  CatalogOptions catalog;
  // When set, the Store owns residency tiers built with these options (CPU cache budget and
  // eviction policy, loader settings, device backend and arena): Store::tiers() is non-null.
  std::optional<tiers::StoreTiersOptions> tiers;
};

// Where a revision's bytes are: storage always; cpu / gpu when the Store owns tiers and the
// revision is resident there (gpu wins when both).
enum class Tier : uint8_t { kStorage = 0, kCpu = 1, kGpu = 2 };
absl::string_view TierName(Tier tier);

struct Location {
  Tier tier = Tier::kStorage;
  std::string blob_path;  // absolute path of the blob file (always set: storage is the floor)
  Hash128 hash;
  uint64_t bytes = 0;
  std::optional<uint32_t> slot;  // the device slot when tier == kGpu
  // When tier == kGpu: the bytes the slot holds, and the device tier's tensor-parallel placement
  // (degree > 1: the slot holds only rank tp.rank's shard; tiers::DeviceSlotsOptions::tp).
  uint64_t device_bytes = 0;
  tiers::TpShardSpec tp;
};

// Store::Locate's four answers.
struct Located {
  BaseRecord base;                             // which base can run the revision
  std::optional<CheckpointRecord> checkpoint;  // which checkpoint restores its training
  RevisionRecord revision;                     // which revision the alias serves
  Location location;                           // where the bytes are now
};

// How a revision is published. `lora` must be set for PublishTensors (r 0: taken from the
// tensors); PEFT imports take it from adapter_config.json.
struct PublishOptions {
  std::string alias;  // moved to the new revision in the same transaction when set
  // When the policy does not exist and this names a base: create the policy on that base in
  // the publish transaction (nothing is created if the publish fails).
  std::string create_policy_base;
  uint64_t parent = 0;
  RevisionSource source;
  LoraSettings lora;
  bool pack = false;  // packed MoE layout (needs the packed blob format)
  std::map<std::string, float> evals;
  // Free-form string metadata stored in the blob (e.g. the original adapter_config.json).
  std::map<std::string, std::string> metadata;
};

// What Verify found. `problems` empty means the store is consistent.
struct VerifyReport {
  std::vector<std::string> problems;
  // Files under the blob root that no record references, and blob records with refcount 0:
  // safe to delete (compaction), not errors.
  std::vector<std::string> reclaimable;
  uint64_t reclaimable_bytes = 0;
  uint64_t blobs_checked = 0;
  uint64_t bytes_checked = 0;
  CatalogIntegrity catalog;
  bool ok() const { return problems.empty(); }
};

// A checkpoint's parts as tensors/bytes; the Store writes each non-empty part as a blob.
struct CheckpointParts {
  std::vector<TensorView> master;     // master adapter weights (required)
  std::vector<TensorView> optimizer;  // optimizer moments
  std::vector<TensorView> gradients;  // accumulated gradients
  std::string scheduler_name;
  int64_t scheduler_position = 0;
  std::string rng_state;
  std::string rollout;  // rollout records, opaque bytes
};

// The base record a Qwen3-family config describes (architecture and LoraModules() table), named
// `name`, keeping `config_json` as its config text. `config` must come from
// ParseModelConfigJson (or have passed ModelConfig::Validate).
BaseRecord BaseRecordFromConfig(const std::string& name, const ModelConfig& config,
                                std::string config_json);

class Store {
 public:
  // Opens (or creates) the store in `dir`: `<dir>/catalog` (LMDB) and the blob root.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Store>> Open(
      const std::string& dir, const StoreOptions& options = {});

  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& blob_root() const { return blob_root_; }
  Catalog& catalog() const { return *catalog_; }
  // The residency tiers this Store owns; nullptr when opened without StoreOptions::tiers.
  tiers::StoreTiers* tiers() const { return tiers_.get(); }

  // ---- bases
  // Registers a base with an explicit module table. AlreadyExists / InvalidArgument, the latter
  // also when the table or the architecture is outside ModelLimits (model_config.h): every base,
  // from HTTP, the CLI or the C API, is registered here.
  [[nodiscard]] absl::StatusOr<BaseRecord> AddBase(BaseRecord base);
  // Registers a base from a Hugging Face config.json (Qwen3 family); `weights` (optional) is a
  // safetensors file or a model.safetensors.index.json whose tensor bytes are fingerprinted.
  [[nodiscard]] absl::StatusOr<BaseRecord> AddBaseFromConfig(const std::string& name,
                                                             const std::string& config_json_path,
                                                             const std::string& weights = "");
  // Registers a base from a JSON module table: {"modules": [{"name":..,"in":..,"out":..}, ...],
  // optional "architecture": {...}}.
  [[nodiscard]] absl::StatusOr<BaseRecord> AddBaseFromModuleTable(const std::string& name,
                                                                  const std::string& json_text);
  [[nodiscard]] absl::StatusOr<BaseRecord> GetBase(const std::string& name) const;
  [[nodiscard]] absl::StatusOr<std::vector<BaseRecord>> ListBases() const;

  // ---- policies
  [[nodiscard]] absl::StatusOr<PolicyRecord> CreatePolicy(
      const std::string& name, const std::string& base,
      const std::map<std::string, std::string>& labels = {});
  [[nodiscard]] absl::StatusOr<PolicyRecord> GetPolicy(const std::string& name) const;
  [[nodiscard]] absl::StatusOr<std::vector<PolicyRecord>> ListPolicies() const;
  [[nodiscard]] absl::Status ArchivePolicy(const std::string& name, bool archived = true);

  // ---- publishing (crash-safe: blob file durable before the catalog transaction)
  // `tensors` are named as PEFT saves them ("base_model.model.<module>.lora_A.weight", ...).
  // Every tensor's module must exist in the policy base's module table with matching dims
  // (A: [r, in], B: [out, r]); a mismatch is InvalidArgument naming the tensor.
  [[nodiscard]] absl::StatusOr<RevisionRecord> PublishTensors(
      const std::string& policy, const std::vector<TensorView>& tensors,
      const PublishOptions& options);
  // Imports a PEFT directory (adapter_config.json + adapter_model.safetensors): LoRA settings
  // from the config (which is also kept verbatim in the blob for export); source = imported
  // with origin `peft_dir` and the xxh3-128 of the tensor bytes. Every tensor is kept (DoRA
  // magnitudes, modules_to_save weights, ...). An adapter in PEFT's target_parameters layout
  // (LoRA on fused MoE expert parameters) is stored per expert in the packed MoE layout
  // (storage/formats/peft_experts.h); its parameters, expert count and shapes must agree with
  // the base (InvalidArgument naming them, nothing stored).
  [[nodiscard]] absl::StatusOr<RevisionRecord> PublishPeftDir(const std::string& policy,
                                                              const std::string& peft_dir,
                                                              PublishOptions options = {});
  // PublishPeftDir for an adapter in memory (e.g. one a trainer made): the config is kept
  // verbatim for export and `options.lora` is derived from it; `options.source` is used as given.
  [[nodiscard]] absl::StatusOr<RevisionRecord> PublishPeft(const std::string& policy,
                                                           const peft::PeftAdapter& adapter,
                                                           PublishOptions options = {});
  // Imports a safetensors file of PEFT-named LoRA tensors; `options.lora` describes them.
  [[nodiscard]] absl::StatusOr<RevisionRecord> PublishSafetensors(const std::string& policy,
                                                                  const std::string& path,
                                                                  PublishOptions options);

  // ---- reading
  [[nodiscard]] absl::StatusOr<RevisionRecord> GetRevision(uint64_t id) const;
  [[nodiscard]] absl::StatusOr<RevisionRecord> GetRevision(const std::string& policy,
                                                           uint64_t seq) const;
  [[nodiscard]] absl::StatusOr<RevisionRecord> GetRevisionByAlias(const std::string& policy,
                                                                  const std::string& alias) const;
  // Resolves a reference: "123" (revision id), "POLICY:ALIAS" or "POLICY@SEQ".
  [[nodiscard]] absl::StatusOr<RevisionRecord> Resolve(const std::string& ref) const;
  // A policy's live revisions in seq order after `after_seq` (cursor), at most `limit`.
  [[nodiscard]] absl::StatusOr<Page<RevisionRecord>> ListRevisions(const std::string& policy,
                                                                   uint64_t after_seq,
                                                                   size_t limit) const;
  // All live revisions in id order after `after_id`, at most `limit`.
  [[nodiscard]] absl::StatusOr<Page<RevisionRecord>> ListAllRevisions(uint64_t after_id,
                                                                      size_t limit) const;
  // The revision's tensors (PEFT names) from its blob, checksum verified.
  [[nodiscard]] absl::StatusOr<TensorSet> ReadTensors(const RevisionRecord& rev) const;
  // The absolute path of a blob.
  std::string BlobPath(const Hash128& hash) const;

  // ---- aliases and lifecycle
  [[nodiscard]] absl::Status SetAlias(const std::string& policy, const std::string& alias,
                                      uint64_t revision, const std::string& reason = "set");
  // Returns the revision the alias points at after the rollback.
  [[nodiscard]] absl::StatusOr<uint64_t> Rollback(const std::string& policy,
                                                  const std::string& alias);
  [[nodiscard]] absl::StatusOr<std::vector<AliasEntry>> ListAliases(
      const std::string& policy) const;
  // The alias's move log, oldest first.
  [[nodiscard]] absl::StatusOr<std::vector<AliasLogEntry>> AliasLog(const std::string& policy,
                                                                    const std::string& alias) const;
  // Records an eval score (name -> value) on a revision.
  [[nodiscard]] absl::Status SetEvalScore(uint64_t id, const std::string& name, float value);
  // FailedPrecondition while an alias points at it. The blob file stays until compaction. With
  // tiers, unleased copies are evicted at once; leased ones stay until released.
  [[nodiscard]] absl::Status DeleteRevision(uint64_t id);

  // ---- checkpoints
  [[nodiscard]] absl::StatusOr<CheckpointRecord> PutCheckpoint(const std::string& policy,
                                                               uint64_t step, uint64_t parent,
                                                               const CheckpointParts& parts);
  [[nodiscard]] absl::StatusOr<CheckpointRecord> GetCheckpoint(uint64_t id) const;
  // A policy's checkpoints ordered by (step, id).
  [[nodiscard]] absl::StatusOr<std::vector<CheckpointRecord>> ListCheckpoints(
      const std::string& policy) const;
  // Reads one checkpoint blob back (tensors), checksum verified.
  [[nodiscard]] absl::StatusOr<TensorSet> ReadCheckpointTensors(const BlobRef& ref) const;
  // Reads an opaque blob (e.g. rollout records) back, checksum verified.
  [[nodiscard]] absl::StatusOr<std::string> ReadOpaqueBlob(const BlobRef& ref) const;

  // ---- the four questions, and export
  [[nodiscard]] absl::StatusOr<Located> Locate(const std::string& policy,
                                               const std::string& alias) const;

  // Writes the revision as a PEFT directory (adapter_config.json + adapter_model.safetensors)
  // that PyPI peft loads onto the matching base. Tensors are bit-identical to the import; an
  // imported adapter_config.json is written back as it was. `layout` kPerExpert writes an
  // adapter imported in the target_parameters layout as per-expert target_modules LoRA
  // (experts.{e}.gate_proj, ...) with equal delta weights; kAsImported rebuilds PEFT's
  // target_parameters tensors (FailedPrecondition if they cannot be rebuilt exactly). A revision
  // published without a PEFT config (trained by loradb) that holds per-expert LoRA on a
  // qwen3_moe base's experts is written only with kPerExpert (FailedPrecondition otherwise):
  // peft on transformers >= 5 would skip those tensors without an error.
  enum class PeftExportLayout { kAsImported, kPerExpert };
  [[nodiscard]] absl::Status ExportPeftDir(
      const RevisionRecord& rev, const std::string& out_dir,
      PeftExportLayout layout = PeftExportLayout::kAsImported) const;

  // ---- verification
  // Catalog cross-checks plus every blob file present with matching size and xxh3-128; files
  // no record references are reported as reclaimable. Non-OK status only for I/O errors that
  // stop the walk.
  [[nodiscard]] absl::StatusOr<VerifyReport> Verify() const;

 private:
  Store(std::string dir, std::string blob_root, std::shared_ptr<Catalog> catalog);
  // Writes `bytes` as the blob `hash` (temp name, fsync, rename, directory fsyncs) unless a
  // file of that size is already there. Returns the relative path.
  [[nodiscard]] absl::StatusOr<std::string> WriteBlob(const Hash128& hash,
                                                      const std::string& bytes) const;
  [[nodiscard]] absl::StatusOr<TensorSet> ReadBlobTensors(const BlobRef& ref) const;
  // The base of `policy`, or `create_base` when the policy does not exist and it is set.
  [[nodiscard]] absl::StatusOr<BaseRecord> BaseOfPolicy(const std::string& policy,
                                                        const std::string& create_base) const;

  std::string dir_;
  std::string blob_root_;
  std::shared_ptr<Catalog> catalog_;
  // Held shared while the Store lives, so offline maintenance (compact, migrate) cannot start.
  StoreLock lock_;
  // Declared last: destroyed first, while the catalog it reads through is still open.
  std::unique_ptr<tiers::StoreTiers> tiers_;
};

}  // namespace loradb

#endif  // LORADB_STORAGE_STORE_STORE_H_

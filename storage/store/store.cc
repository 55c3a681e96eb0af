#include "storage/store/store.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "storage/formats/model_config.h"
#include "storage/formats/peft.h"
#include "storage/formats/peft_experts.h"
#include "storage/formats/safetensors.h"
#include "storage/store/adapter_blob.h"
#include "storage/store/lora_peft.h"
#include "storage/store/store_tiers.h"
#include "storage/util/file_util.h"
#include "storage/util/hash.h"
#include "storage/util/json.h"
#include "storage/util/status_macros.h"

namespace loradb {

absl::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kStorage:
      return "storage";
    case Tier::kCpu:
      return "cpu";
    case Tier::kGpu:
      return "gpu";
  }
  return "unknown";
}

namespace {

bool FileSize(const std::string& path, uint64_t* size) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  *size = static_cast<uint64_t>(st.st_size);
  return true;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Checks every LoRA A/B tensor against the base's module table (the compatibility rule) and
// returns the rank it implies (the largest A rank). Other PEFT tensors (DoRA magnitudes, lora_B
// biases, modules_to_save weights, ...) are checked against their module's LoRA pair by
// peft::ValidateLoraTensors.
absl::StatusOr<int32_t> CheckCompatible(const BaseRecord& base,
                                        const std::vector<TensorView>& tensors) {
  if (tensors.empty()) return absl::InvalidArgumentError("an adapter needs at least one tensor");
  int32_t max_r = 0;
  for (const TensorView& t : tensors) {
    const peft::PeftTensorInfo info = peft::ClassifyPeftTensor(t.name);
    if (info.kind != peft::PeftTensorKind::kLora) continue;
    if (info.depth > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name,
                       "' is in PEFT's target_parameters layout: import it as a PEFT "
                       "directory whose adapter_config.json names its target_parameters"));
    }
    LORADB_ASSIGN_OR_RETURN(peft::PeftTensorName n, peft::ParsePeftTensorName(t.name));
    const bool side_b = n.side == peft::LoraSide::kB;
    const ModuleShape* m = base.FindModule(n.module);
    if (m == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': module '", n.module,
                                                     "' is not in base '", base.name,
                                                     "''s module table"));
    }
    if (t.shape.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "' has shape ", ShapeString(t.shape), ", expected 2-D"));
    }
    // A: [r, in]; B: [out, r].
    const int64_t dim = side_b ? t.shape[0] : t.shape[1];
    const int64_t want = side_b ? m->out : m->in;
    const int64_t r = side_b ? t.shape[1] : t.shape[0];
    if (dim != want || r <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "' has shape ", ShapeString(t.shape), " but base '",
                       base.name, "' module '", n.module, "' has in ", m->in, ", out ", m->out,
                       " (A must be [r, ", m->in, "], B [", m->out, ", r])"));
    }
    max_r = std::max<int32_t>(max_r, static_cast<int32_t>(r));
  }
  return max_r;
}

// The fused expert parameters of `base`, for adapters in PEFT's target_parameters layout.
absl::StatusOr<peft::ExpertsLayout> ExpertsLayoutFor(const BaseRecord& base) {
  if (base.arch.family != "qwen3_moe" || base.arch.num_experts <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_parameters: base '", base.name, "' (", base.arch.family,
                     ") has no fused expert parameters (only qwen3_moe bases with experts do)"));
  }
  return peft::Qwen3MoeExpertsLayout(base.arch.num_experts, base.arch.hidden_size,
                                     base.arch.intermediate_size);
}

constexpr const char* kPeftConfigKey = peft::kStoredConfigKey;

std::string CommonDType(const std::vector<TensorView>& tensors) {
  std::string d;
  for (const auto& t : tensors) {
    const std::string name(DTypeName(t.dtype));
    if (d.empty()) {
      d = name;
    } else if (d != name) {
      return "mixed";
    }
  }
  return d;
}

// The config a revision's tensors are validated against: the LoRA settings, plus the feature
// fields of the PEFT config kept in the blob metadata (an import's adapter_config.json). A
// target_parameters adapter is stored per expert, so its target_parameters are not carried.
absl::StatusOr<peft::LoraConfig> ValidationConfig(const LoraSettings& lora,
                                                  const std::map<std::string, std::string>& meta);

}  // namespace

peft::LoraConfig ToPeftConfig(const LoraSettings& s) {
  peft::LoraConfig c;
  c.r = s.r;
  c.lora_alpha = s.alpha;
  c.use_rslora = s.use_rslora;
  for (const auto& m : s.modules) {
    if (m.r != 0) c.rank_pattern.emplace_back(m.pattern, m.r);
    if (m.has_alpha) c.alpha_pattern.emplace_back(m.pattern, m.alpha);
  }
  c.target_modules = s.target_modules;
  return c;
}

LoraSettings FromPeftConfig(const peft::LoraConfig& c) {
  LoraSettings s;
  s.r = c.r;
  s.alpha = static_cast<float>(c.lora_alpha);
  s.use_rslora = c.use_rslora;
  for (const auto& [p, r] : c.rank_pattern) s.modules.push_back({p, r, 0, false});
  for (const auto& [p, a] : c.alpha_pattern) {
    s.modules.push_back({p, 0, static_cast<float>(a), true});
  }
  s.target_modules = c.target_modules;
  return s;
}

namespace {

absl::StatusOr<peft::LoraConfig> ValidationConfig(const LoraSettings& lora,
                                                  const std::map<std::string, std::string>& meta) {
  peft::LoraConfig c = ToPeftConfig(lora);
  auto it = meta.find(kPeftConfigKey);
  if (it == meta.end()) return c;
  LORADB_ASSIGN_OR_RETURN(peft::LoraConfig raw, peft::ParseLoraConfig(it->second));
  c.fan_in_fan_out = raw.fan_in_fan_out;
  c.use_dora = raw.use_dora;
  c.lora_bias = raw.lora_bias;
  c.bias = raw.bias;
  c.modules_to_save = raw.modules_to_save;
  c.trainable_token_indices = raw.trainable_token_indices;
  c.config_features = raw.config_features;
  return c;
}

}  // namespace

Store::Store(std::string dir, std::string blob_root, std::shared_ptr<Catalog> catalog)
    : dir_(std::move(dir)), blob_root_(std::move(blob_root)), catalog_(std::move(catalog)) {}

Store::~Store() = default;

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& dir,
                                                   const StoreOptions& options) {
  LORADB_RETURN_IF_ERROR(Catalog::CheckStoreDirectory(dir));
  if (!IsDir(dir) && !options.create_if_missing) {
    return absl::NotFoundError(absl::StrCat("no store at '", dir, "' (run `loradb init`)"));
  }
  CatalogOptions copts = options.catalog;
  copts.create_if_missing = options.create_if_missing;
  if (options.create_if_missing) LORADB_RETURN_IF_ERROR(CreateDirectories(dir));
  // The store lock first: compaction or migration in progress makes this fail (Unavailable).
  LORADB_ASSIGN_OR_RETURN(StoreLock lock, StoreLock::Acquire(dir, StoreLock::Mode::kShared));
  LORADB_ASSIGN_OR_RETURN(std::shared_ptr<Catalog> catalog, Catalog::Open(dir, copts));
  std::string blob_root = options.blob_root.empty() ? catalog->dir() + "/blobs" : options.blob_root;
  LORADB_RETURN_IF_ERROR(CreateDirectories(blob_root));
  std::unique_ptr<Store> store(new Store(catalog->dir(), std::move(blob_root), catalog));
  store->lock_ = std::move(lock);
  if (options.tiers.has_value()) {
    LORADB_ASSIGN_OR_RETURN(store->tiers_, tiers::StoreTiers::Open(store.get(), *options.tiers));
  }
  return store;
}

// ---- bases

namespace {

absl::Status CheckArchitecture(const Architecture& a) {
  using L = ModelLimits;
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"hidden_size", {a.hidden_size, L::kHiddenSize}},
      {"num_layers", {a.num_layers, L::kLayers}},
      {"num_heads", {a.num_heads, L::kHeads}},
      {"num_kv_heads", {a.num_kv_heads, L::kHeads}},
      {"head_dim", {a.head_dim, L::kHeadDim}},
      {"intermediate_size", {a.intermediate_size, L::kIntermediateSize}},
      {"num_experts", {a.num_experts, L::kExperts}},
      {"vocab_size", {a.vocab_size, L::kVocabSize}}};
  for (const auto& [name, value_max] : fields) {
    const auto [value, max] = value_max;
    if (value < 0 || value > max) {
      return absl::InvalidArgumentError(absl::StrCat("architecture: \"", name, "\" is ", value,
                                                     ", outside loradb's bounds [0, ", max, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

BaseRecord BaseRecordFromConfig(const std::string& name, const ModelConfig& config,
                                std::string config_json) {
  BaseRecord b;
  b.name = name;
  b.arch.family = config.model_type;
  b.arch.hidden_size = config.hidden_size;
  b.arch.num_layers = config.num_hidden_layers;
  b.arch.num_heads = config.num_attention_heads;
  b.arch.num_kv_heads = config.num_key_value_heads;
  b.arch.head_dim = config.head_dim;
  b.arch.intermediate_size =
      config.is_moe() ? config.moe_intermediate_size : config.intermediate_size;
  b.arch.num_experts = config.num_experts;
  b.arch.vocab_size = config.vocab_size;
  b.modules = config.LoraModules();
  b.config_json = std::move(config_json);
  return b;
}

absl::StatusOr<BaseRecord> Store::AddBase(BaseRecord base) {
  LORADB_RETURN_IF_ERROR(CheckModuleTable(base.modules));
  LORADB_RETURN_IF_ERROR(CheckArchitecture(base.arch));
  LORADB_RETURN_IF_ERROR(catalog_->PutBase(base));
  return catalog_->GetBase(base.name);
}

absl::StatusOr<BaseRecord> Store::AddBaseFromConfig(const std::string& name,
                                                    const std::string& config_json_path,
                                                    const std::string& weights) {
  const std::string path =
      IsDir(config_json_path) ? config_json_path + "/config.json" : config_json_path;
  LORADB_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  LORADB_ASSIGN_OR_RETURN(ModelConfig cfg, ParseModelConfigJson(text));
  BaseRecord b = BaseRecordFromConfig(name, cfg, std::move(text));
  if (!weights.empty()) {
    // Fingerprint: xxh3-128 over every tensor's bytes in tensor-name order.
    absl::StatusOr<TensorSet> set = absl::EndsWith(weights, ".json")
                                        ? safetensors::ReadSharded(weights)
                                        : safetensors::ReadFile(weights);
    if (!set.ok()) return set.status();
    std::vector<const TensorView*> order;
    for (const auto& t : set->tensors()) order.push_back(&t);
    std::sort(order.begin(), order.end(),
              [](const TensorView* a, const TensorView* c) { return a->name < c->name; });
    Xxh3_128Stream h;
    for (const TensorView* t : order) h.Update(t->data, t->nbytes);
    b.weights_fingerprint = h.Digest().Hex();
  }
  return AddBase(std::move(b));
}

absl::StatusOr<BaseRecord> Store::AddBaseFromModuleTable(const std::string& name,
                                                         const std::string& json_text) {
  LORADB_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(json_text, "module table"));
  if (!j.is_object() || !j.contains("modules") || !j["modules"].is_array()) {
    return absl::InvalidArgumentError(
        "module table must be a JSON object with a \"modules\" array of {name, in, out}");
  }
  BaseRecord b;
  b.name = name;
  b.arch.family = "custom";
  for (const auto& m : j["modules"]) {
    if (!m.is_object() || !m.contains("name") || !m["name"].is_string() || !m.contains("in") ||
        !m["in"].is_number_integer() || !m.contains("out") || !m["out"].is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("module table entry ", m.dump(), " needs string name, integer in/out"));
    }
    b.modules.push_back(
        {m["name"].get<std::string>(), m["in"].get<int64_t>(), m["out"].get<int64_t>()});
  }
  if (j.contains("architecture") && j["architecture"].is_object()) {
    const auto& a = j["architecture"];
    auto get = [&](const char* k) -> int64_t {
      return a.contains(k) && a[k].is_number_integer() ? a[k].get<int64_t>() : 0;
    };
    if (a.contains("family") && a["family"].is_string()) b.arch.family = a["family"];
    b.arch.hidden_size = get("hidden_size");
    b.arch.num_layers = get("num_layers");
    b.arch.num_heads = get("num_heads");
    b.arch.num_kv_heads = get("num_kv_heads");
    b.arch.head_dim = get("head_dim");
    b.arch.intermediate_size = get("intermediate_size");
    b.arch.num_experts = get("num_experts");
    b.arch.vocab_size = get("vocab_size");
  }
  return AddBase(std::move(b));
}

absl::StatusOr<BaseRecord> Store::GetBase(const std::string& name) const {
  return catalog_->GetBase(name);
}

absl::StatusOr<std::vector<BaseRecord>> Store::ListBases() const { return catalog_->ListBases(); }

// ---- policies

absl::StatusOr<PolicyRecord> Store::CreatePolicy(const std::string& name, const std::string& base,
                                                 const std::map<std::string, std::string>& labels) {
  return catalog_->CreatePolicy(name, base, labels);
}

absl::StatusOr<PolicyRecord> Store::GetPolicy(const std::string& name) const {
  return catalog_->GetPolicy(name);
}

absl::StatusOr<std::vector<PolicyRecord>> Store::ListPolicies() const {
  return catalog_->ListPolicies();
}

absl::Status Store::ArchivePolicy(const std::string& name, bool archived) {
  return catalog_->SetPolicyArchived(name, archived);
}

// ---- blobs

std::string Store::BlobPath(const Hash128& hash) const {
  return absl::StrCat(blob_root_, "/", BlobRelPath(hash));
}

absl::StatusOr<std::string> Store::WriteBlob(const Hash128& hash, const std::string& bytes) const {
  const std::string rel = BlobRelPath(hash);
  const std::string path = absl::StrCat(blob_root_, "/", rel);
  uint64_t size = 0;
  if (FileSize(path, &size) && size == bytes.size()) return rel;  // content-addressed: present
  // Fan-out directories: create and make their entries durable before the file's rename.
  const std::string leaf = Dirname(path);
  const std::string mid = Dirname(leaf);
  const bool had_mid = IsDir(mid), had_leaf = IsDir(leaf);
  LORADB_RETURN_IF_ERROR(CreateDirectories(leaf));
  if (!had_mid) LORADB_RETURN_IF_ERROR(FsyncDirectory(blob_root_));
  if (!had_leaf) LORADB_RETURN_IF_ERROR(FsyncDirectory(mid));
  LORADB_RETURN_IF_ERROR(WriteFileAtomic(path, bytes));
  return rel;
}

absl::StatusOr<TensorSet> Store::ReadBlobTensors(const BlobRef& ref) const {
  return ReadAdapterBlob(BlobPath(ref.hash), ref);
}

// ---- publishing

absl::StatusOr<RevisionRecord> Store::PublishTensors(const std::string& policy_name,
                                                     const std::vector<TensorView>& tensors,
                                                     const PublishOptions& options) {
  auto found = catalog_->GetPolicy(policy_name);
  PolicyRecord policy;
  if (found.ok()) {
    policy = std::move(*found);
  } else if (absl::IsNotFound(found.status()) && !options.create_policy_base.empty()) {
    LORADB_RETURN_IF_ERROR(ValidatePolicyName(policy_name));
    policy.name = policy_name;  // id 0: created in the publish transaction
    policy.base = options.create_policy_base;
  } else {
    return found.status();
  }
  if (policy.archived) {
    return absl::FailedPreconditionError(
        absl::StrCat("policy '", policy.name, "' is archived; it accepts no new revisions"));
  }
  LORADB_ASSIGN_OR_RETURN(BaseRecord base, catalog_->GetBase(policy.base));
  LORADB_ASSIGN_OR_RETURN(int32_t r, CheckCompatible(base, tensors));
  if (!options.alias.empty()) LORADB_RETURN_IF_ERROR(ValidateSettableAlias(options.alias));

  LoraSettings lora = options.lora;
  if (lora.r == 0) lora.r = r;
  if (lora.alpha == 0) lora.alpha = static_cast<float>(lora.r);
  // Every module has one A and one B, 2-D, floating point, ranks matching the settings; every
  // other tensor belongs to a feature the config declares.
  LORADB_ASSIGN_OR_RETURN(peft::LoraConfig check, ValidationConfig(lora, options.metadata));
  LORADB_RETURN_IF_ERROR(peft::ValidateLoraTensors(check, tensors));

  LORADB_ASSIGN_OR_RETURN(EncodedBlob blob,
                          EncodeAdapterBlob(tensors, options.metadata, options.pack));
  // 1. The blob file, durable (temp, fsync, rename, dir fsync). 2. The catalog transaction.
  LORADB_ASSIGN_OR_RETURN(std::string rel, WriteBlob(blob.hash, blob.bytes));

  NewRevision nr;
  nr.policy_id = policy.id;
  if (policy.id == 0) {
    nr.create_policy = policy.name;
    nr.create_policy_base = policy.base;
  }
  nr.parent = options.parent;
  nr.source = options.source;
  nr.lora = std::move(lora);
  nr.dtype = CommonDType(tensors);
  nr.layout = blob.layout;
  nr.blob = BlobRef{blob.hash, blob.bytes.size(), static_cast<uint32_t>(tensors.size())};
  nr.evals = options.evals;
  nr.alias = options.alias;
  return catalog_->Publish(nr, rel);
}

absl::StatusOr<BaseRecord> Store::BaseOfPolicy(const std::string& policy,
                                               const std::string& create_base) const {
  auto p = catalog_->GetPolicy(policy);
  if (p.ok()) return catalog_->GetBase(p->base);
  if (absl::IsNotFound(p.status()) && !create_base.empty()) return catalog_->GetBase(create_base);
  return p.status();
}

absl::StatusOr<RevisionRecord> Store::PublishPeftDir(const std::string& policy,
                                                     const std::string& peft_dir,
                                                     PublishOptions options) {
  LORADB_ASSIGN_OR_RETURN(peft::PeftAdapter adapter, peft::ReadPeftDir(peft_dir));
  if (options.source.kind == SourceKind::kImported) {
    if (options.source.origin.empty()) options.source.origin = peft_dir;
    Xxh3_128Stream h;
    for (const auto& t : adapter.tensors.tensors()) h.Update(t.data, t.nbytes);
    options.source.content_hash = h.Digest().Hex();
  }
  absl::StatusOr<RevisionRecord> rev = PublishPeft(policy, adapter, std::move(options));
  if (!rev.ok() && !adapter.config.target_parameters.empty()) {
    return absl::Status(rev.status().code(), absl::StrCat(peft_dir, ": ", rev.status().message()));
  }
  return rev;
}

absl::StatusOr<RevisionRecord> Store::PublishPeft(const std::string& policy,
                                                  const peft::PeftAdapter& adapter,
                                                  PublishOptions options) {
  LORADB_ASSIGN_OR_RETURN(std::string config_json, adapter.config.ToJson());
  options.metadata[kPeftConfigKey] = config_json;
  if (adapter.config.target_parameters.empty()) {
    options.lora = FromPeftConfig(adapter.config);
    return PublishTensors(policy, adapter.tensors.tensors(), options);
  }
  // LoRA on fused expert parameters: stored per expert, packed, served as per-expert LoRA.
  LORADB_ASSIGN_OR_RETURN(BaseRecord base, BaseOfPolicy(policy, options.create_policy_base));
  LORADB_ASSIGN_OR_RETURN(peft::ExpertsLayout layout, ExpertsLayoutFor(base));
  peft::LoraConfig per_expert;
  LORADB_ASSIGN_OR_RETURN(
      TensorSet unfused,
      peft::UnfuseTargetParameters(adapter.config, adapter.tensors, layout, &per_expert));
  options.lora = FromPeftConfig(per_expert);
  options.pack = true;
  return PublishTensors(policy, unfused.tensors(), options);
}

absl::Status Store::ExportPeftDir(const RevisionRecord& rev, const std::string& out_dir,
                                  PeftExportLayout layout) const {
  LORADB_ASSIGN_OR_RETURN(TensorSet tensors, ReadTensors(rev));
  peft::LoraConfig config;
  auto it = tensors.metadata().find(kPeftConfigKey);
  LORADB_ASSIGN_OR_RETURN(PolicyRecord policy, catalog_->GetPolicyById(rev.policy_id));
  LORADB_ASSIGN_OR_RETURN(BaseRecord base, catalog_->GetBase(policy.base));
  if (it != tensors.metadata().end()) {
    LORADB_ASSIGN_OR_RETURN(config, peft::ParseLoraConfig(it->second));
  } else {
    // Published without a PEFT config (trained, or tensors with LoRA settings): peft needs the
    // adapted modules named (with none it falls back to its per-model defaults and skips the
    // other tensors) and the task (a plain PeftModel cannot generate).
    config = ToPeftConfig(rev.lora);
    if (config.target_modules.empty()) {
      std::set<std::string> modules;
      for (const TensorView& t : tensors.tensors()) {
        absl::StatusOr<peft::PeftTensorName> name = peft::ParsePeftTensorName(t.name);
        if (!name.ok()) continue;
        const size_t dot = name->module_key.rfind('.');
        modules.insert(dot == std::string::npos ? name->module_key
                                                : name->module_key.substr(dot + 1));
      }
      config.target_modules.assign(modules.begin(), modules.end());
    }
    if (config.task_type.empty() && absl::StartsWith(base.arch.family, "qwen3")) {
      config.task_type = "CAUSAL_LM";
    }
    // Per-expert LoRA on a qwen3_moe base (trained with gate_proj/up_proj/down_proj as
    // modules): transformers >= 5 holds those experts as fused parameters, and peft there
    // targets the fused parameters and skips every experts.{e}.* tensor without an error, so
    // the adapter would run with its experts unadapted. Written only when asked for by name.
    const absl::StatusOr<peft::ExpertsLayout> fused = ExpertsLayoutFor(base);
    if (layout == PeftExportLayout::kAsImported && fused.ok()) {
      const std::string per_expert = absl::StrCat(".", fused->module, ".");
      for (const TensorView& t : tensors.tensors()) {
        if (t.name.find(per_expert) == std::string::npos) continue;
        return absl::FailedPreconditionError(absl::StrCat(
            "revision ", rev.id, " holds per-expert LoRA on the experts of qwen3_moe base '",
            base.name, "' (", t.name,
            "): peft on transformers >= 5 holds these experts as fused parameters and would "
            "load none of those tensors, silently. Export it with --layout per-expert for a "
            "transformers < 5 model (experts as modules); for transformers >= 5 train with "
            "--target-parameters gate_up_proj,down_proj"));
      }
    }
  }
  if (config.target_parameters.empty()) {
    return peft::WritePeftDir(out_dir, config, tensors.tensors());
  }
  LORADB_ASSIGN_OR_RETURN(peft::ExpertsLayout experts, ExpertsLayoutFor(base));
  if (layout == PeftExportLayout::kPerExpert) {
    LORADB_ASSIGN_OR_RETURN(peft::LoraConfig per_expert,
                            peft::PerExpertConfig(config, tensors.tensors(), experts));
    return peft::WritePeftDir(out_dir, per_expert, tensors.tensors());
  }
  LORADB_ASSIGN_OR_RETURN(TensorSet fused, peft::FuseTargetParameters(config, tensors, experts));
  return peft::WritePeftDir(out_dir, config, fused.tensors());
}

absl::StatusOr<RevisionRecord> Store::PublishSafetensors(const std::string& policy,
                                                         const std::string& path,
                                                         PublishOptions options) {
  LORADB_ASSIGN_OR_RETURN(TensorSet set, safetensors::ReadFile(path));
  if (options.source.origin.empty()) options.source.origin = path;
  return PublishTensors(policy, set.tensors(), options);
}

// ---- reading

absl::StatusOr<RevisionRecord> Store::GetRevision(uint64_t id) const {
  return catalog_->GetRevision(id);
}

// The by-name lookups resolve the policy and read the revision in one read transaction, through
// views (no policy record is decoded); only the revision that is returned is copied out.
absl::StatusOr<RevisionRecord> Store::GetRevision(const std::string& policy, uint64_t seq) const {
  RevisionRecord out;
  LORADB_RETURN_IF_ERROR(catalog_->Read([&](const CatalogReader& r) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(const uint64_t policy_id, r.PolicyId(policy));
    LORADB_ASSIGN_OR_RETURN(const RevisionView v, r.RevisionBySeq(policy_id, seq));
    out = v.ToRecord();
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<RevisionRecord> Store::GetRevisionByAlias(const std::string& policy,
                                                         const std::string& alias) const {
  LORADB_RETURN_IF_ERROR(ValidateAliasName(alias));
  RevisionRecord out;
  LORADB_RETURN_IF_ERROR(catalog_->Read([&](const CatalogReader& r) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(const uint64_t policy_id, r.PolicyId(policy));
    absl::StatusOr<RevisionView> v = r.RevisionByAlias(policy_id, alias);
    if (absl::IsNotFound(v.status())) {
      return absl::NotFoundError(absl::StrCat("policy '", policy, "' has no alias '", alias, "'"));
    }
    LORADB_RETURN_IF_ERROR(v.status());
    out = v->ToRecord();
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<RevisionRecord> Store::Resolve(const std::string& ref) const {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bad revision reference '", ref, "': ", why));
  };
  uint64_t id = 0;
  if (ParseCanonicalId(ref, &id)) return GetRevision(id);
  const size_t colon = ref.rfind(':');
  if (colon != std::string::npos) {
    const std::string policy = ref.substr(0, colon), alias = ref.substr(colon + 1);
    if (absl::Status st = ValidatePolicyName(policy); !st.ok()) return bad(st.message());
    if (absl::Status st = ValidateAliasName(alias); !st.ok()) return bad(st.message());
    return GetRevisionByAlias(policy, alias);
  }
  const size_t at = ref.rfind('@');
  if (at != std::string::npos) {
    const std::string policy = ref.substr(0, at);
    if (absl::Status st = ValidatePolicyName(policy); !st.ok()) return bad(st.message());
    if (!ParseCanonicalId(ref.substr(at + 1), &id)) {
      return bad(
          "the seq after '@' must be a decimal number without sign, spaces or leading zeros");
    }
    return GetRevision(policy, id);
  }
  return bad(
      "expected a revision id (decimal digits without sign, spaces or leading zeros), "
      "POLICY:ALIAS or POLICY@SEQ");
}

absl::StatusOr<Page<RevisionRecord>> Store::ListRevisions(const std::string& policy,
                                                          uint64_t after_seq, size_t limit) const {
  LORADB_ASSIGN_OR_RETURN(PolicyRecord p, catalog_->GetPolicy(policy));
  return catalog_->ListPolicyRevisions(p.id, after_seq, limit);
}

absl::StatusOr<Page<RevisionRecord>> Store::ListAllRevisions(uint64_t after_id,
                                                             size_t limit) const {
  return catalog_->ListRevisions(after_id, limit);
}

absl::StatusOr<TensorSet> Store::ReadTensors(const RevisionRecord& rev) const {
  if (rev.state != RevisionState::kLive) {
    return absl::FailedPreconditionError(absl::StrCat("revision ", rev.id, " is deleted"));
  }
  return ReadBlobTensors(rev.blob);
}

// ---- aliases and lifecycle

absl::Status Store::SetAlias(const std::string& policy, const std::string& alias, uint64_t revision,
                             const std::string& reason) {
  LORADB_ASSIGN_OR_RETURN(PolicyRecord p, catalog_->GetPolicy(policy));
  return catalog_->SetAlias(p.id, alias, revision, reason);
}

absl::StatusOr<uint64_t> Store::Rollback(const std::string& policy, const std::string& alias) {
  LORADB_ASSIGN_OR_RETURN(PolicyRecord p, catalog_->GetPolicy(policy));
  return catalog_->Rollback(p.id, alias);
}

absl::StatusOr<std::vector<AliasEntry>> Store::ListAliases(const std::string& policy) const {
  LORADB_ASSIGN_OR_RETURN(PolicyRecord p, catalog_->GetPolicy(policy));
  return catalog_->ListAliases(p.id);
}

absl::StatusOr<std::vector<AliasLogEntry>> Store::AliasLog(const std::string& policy,
                                                           const std::string& alias) const {
  LORADB_ASSIGN_OR_RETURN(PolicyRecord p, catalog_->GetPolicy(policy));
  return catalog_->AliasLog(p.id, alias);
}

absl::Status Store::SetEvalScore(uint64_t id, const std::string& name, float value) {
  return catalog_->SetEvalScore(id, name, value);
}

absl::Status Store::DeleteRevision(uint64_t id) {
  absl::StatusOr<RevisionRecord> rev = catalog_->GetRevision(id);
  LORADB_RETURN_IF_ERROR(catalog_->DeleteRevision(id));
  // Best effort: a leased copy stays until its leases end (the next load sees the revision is
  // no longer live); NotFound just means it was not resident. The derived TP blobs of a source
  // blob nothing references any more go now (a failure leaves them to the next sweep).
  if (tiers_ != nullptr) {
    tiers_->Drop(id);
    if (rev.ok()) (void)tiers_->ForgetDerivedShards(rev->blob.hash);
  }
  return absl::OkStatus();
}

// ---- checkpoints

absl::StatusOr<CheckpointRecord> Store::PutCheckpoint(const std::string& policy, uint64_t step,
                                                      uint64_t parent,
                                                      const CheckpointParts& parts) {
  LORADB_ASSIGN_OR_RETURN(PolicyRecord p, catalog_->GetPolicy(policy));
  if (parts.master.empty()) {
    return absl::InvalidArgumentError("a checkpoint needs master adapter weights");
  }
  auto write_tensors = [&](const std::vector<TensorView>& t) -> absl::StatusOr<BlobRef> {
    if (t.empty()) return BlobRef{};
    LORADB_ASSIGN_OR_RETURN(EncodedBlob b, EncodeAdapterBlob(t, {{"loradb.kind", "checkpoint"}},
                                                             /*pack=*/false));
    LORADB_RETURN_IF_ERROR(WriteBlob(b.hash, b.bytes).status());
    return BlobRef{b.hash, b.bytes.size(), static_cast<uint32_t>(t.size())};
  };
  NewCheckpoint nc;
  nc.policy_id = p.id;
  nc.step = step;
  nc.parent = parent;
  LORADB_ASSIGN_OR_RETURN(nc.master, write_tensors(parts.master));
  LORADB_ASSIGN_OR_RETURN(nc.optimizer, write_tensors(parts.optimizer));
  LORADB_ASSIGN_OR_RETURN(nc.gradients, write_tensors(parts.gradients));
  if (!parts.rollout.empty()) {
    const Hash128 h = Xxh3_128(parts.rollout.data(), parts.rollout.size());
    LORADB_RETURN_IF_ERROR(WriteBlob(h, parts.rollout).status());
    nc.rollout = BlobRef{h, parts.rollout.size(), 0};
  }
  nc.scheduler_name = parts.scheduler_name;
  nc.scheduler_position = parts.scheduler_position;
  nc.rng_state = parts.rng_state;
  return catalog_->PutCheckpoint(nc);
}

absl::StatusOr<CheckpointRecord> Store::GetCheckpoint(uint64_t id) const {
  return catalog_->GetCheckpoint(id);
}

absl::StatusOr<std::vector<CheckpointRecord>> Store::ListCheckpoints(
    const std::string& policy) const {
  LORADB_ASSIGN_OR_RETURN(PolicyRecord p, catalog_->GetPolicy(policy));
  return catalog_->ListCheckpoints(p.id);
}

absl::StatusOr<TensorSet> Store::ReadCheckpointTensors(const BlobRef& ref) const {
  if (ref.empty()) return TensorSet();
  return ReadBlobTensors(ref);
}

absl::StatusOr<std::string> Store::ReadOpaqueBlob(const BlobRef& ref) const {
  if (ref.empty()) return std::string();
  const std::string path = BlobPath(ref.hash);
  LORADB_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  if (bytes.size() != ref.bytes || !(Xxh3_128(bytes.data(), bytes.size()) == ref.hash)) {
    return absl::DataLossError(absl::StrCat("blob ", path, " does not match its checksum"));
  }
  return bytes;
}

// ---- Locate

absl::StatusOr<Located> Store::Locate(const std::string& policy, const std::string& alias) const {
  Located out;
  LORADB_ASSIGN_OR_RETURN(out.revision, GetRevisionByAlias(policy, alias));
  LORADB_ASSIGN_OR_RETURN(out.base, catalog_->GetBase(out.revision.base));
  if (out.revision.source.kind == SourceKind::kTrained && out.revision.source.checkpoint_id != 0) {
    auto ck = catalog_->GetCheckpoint(out.revision.source.checkpoint_id);
    if (ck.ok()) {
      out.checkpoint = std::move(*ck);
    } else if (!absl::IsNotFound(ck.status())) {
      return ck.status();
    }
  }
  out.location.tier = Tier::kStorage;
  out.location.blob_path = BlobPath(out.revision.blob.hash);
  out.location.hash = out.revision.blob.hash;
  out.location.bytes = out.revision.blob.bytes;
  if (tiers_ != nullptr) {
    const tiers::TierPlace p = tiers_->Where(out.revision.id);
    out.location.tier = p.tier;
    out.location.slot = p.slot;
    out.location.device_bytes = p.device_bytes;
    out.location.tp = p.tp;
  }
  return out;
}

// ---- Verify

absl::StatusOr<VerifyReport> Store::Verify() const {
  VerifyReport rep;
  LORADB_ASSIGN_OR_RETURN(rep.catalog, catalog_->CheckIntegrity());
  rep.problems = rep.catalog.problems;
  std::set<std::string> known;
  for (const BlobRecord& b : rep.catalog.blobs) {
    const std::string path = absl::StrCat(blob_root_, "/", b.relpath);
    known.insert(b.relpath);
    ++rep.blobs_checked;
    if (b.refcount == 0) {
      rep.reclaimable.push_back(path);
      rep.reclaimable_bytes += b.bytes;
    }
    auto map = MappedFile::Open(path);
    if (!map.ok()) {
      // An unreferenced record's file may be gone (compaction); a referenced one must not be.
      if (b.refcount > 0)
        rep.problems.push_back(
            absl::StrCat("blob ", path, ": missing (", map.status().message(), ")"));
      continue;
    }
    rep.bytes_checked += map->size();
    if (map->size() != b.bytes) {
      rep.problems.push_back(
          absl::StrCat("blob ", path, ": ", map->size(), " bytes, recorded ", b.bytes));
      continue;
    }
    if (!(Xxh3_128(map->data(), map->size()) == b.hash)) {
      rep.problems.push_back(absl::StrCat("blob ", path, ": xxh3-128 does not match its name"));
    }
  }
  // Files nobody references (a publish that died before its catalog commit, temp files).
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(blob_root_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const std::string full = it->path().string();
    const std::string rel = full.substr(blob_root_.size() + 1);
    if (known.count(rel)) continue;
    rep.reclaimable.push_back(full);
    rep.reclaimable_bytes += it->file_size();
  }
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("walk ", blob_root_));
  return rep;
}

}  // namespace loradb

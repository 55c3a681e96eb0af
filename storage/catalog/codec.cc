#include "storage/catalog/codec.h"

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "schema/catalog_generated.h"
#include "storage/catalog/codec_tables.h"

namespace loradb::catalog_codec {
namespace {
using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

// Empty strings are left out of the record (absent reads back as "").
Offset<flatbuffers::String> Str(FlatBufferBuilder& b, const std::string& s) {
  return s.empty() ? Offset<flatbuffers::String>() : b.CreateString(s);
}

std::string Str(const flatbuffers::String* s) { return s == nullptr ? std::string() : s->str(); }

std::string Finish(FlatBufferBuilder& b) {
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

Offset<fb::BlobRef> EncodeBlobRef(FlatBufferBuilder& b, const BlobRef& r) {
  if (r.empty()) return {};
  fb::Hash128 h(r.hash.high, r.hash.low);
  return fb::CreateBlobRef(b, &h, r.bytes, r.tensors);
}

// A verified root table. When the record's bytes were not 8-byte aligned (LMDB values are only
// 2-byte aligned), `root` points into an aligned heap copy that lives as long as this object:
// FlatBuffers reads its scalars in place, and a misaligned load is undefined behaviour (UBSan).
template <typename T>
struct VerifiedRoot {
  const T* root = nullptr;
  std::unique_ptr<uint64_t[]> aligned_copy;
  const T* operator->() const { return root; }
};

// A revision's rank/alpha patterns and eval scores (absent when empty), in either layout.
Offset<flatbuffers::Vector<Offset<fb::ModuleLora>>> ModuleLoras(
    FlatBufferBuilder& b, const std::vector<ModuleLora>& modules) {
  if (modules.empty()) return {};
  std::vector<Offset<fb::ModuleLora>> v;
  for (const auto& m : modules) {
    v.push_back(fb::CreateModuleLoraDirect(b, m.pattern.c_str(), m.r, m.alpha, m.has_alpha));
  }
  return b.CreateVector(v);
}

Offset<flatbuffers::Vector<Offset<fb::EvalScore>>> EvalScores(
    FlatBufferBuilder& b, const std::map<std::string, float>& evals) {
  if (evals.empty()) return {};
  std::vector<Offset<fb::EvalScore>> v;
  for (const auto& [name, value] : evals) {
    v.push_back(fb::CreateEvalScoreDirect(b, name.c_str(), value));
  }
  return b.CreateVector(v);
}

// `b` itself when it is 8-byte aligned, else a copy in `*copy` (which must outlive the result).
Bytes AlignedBytes(Bytes b, std::unique_ptr<uint64_t[]>* copy) {
  if (reinterpret_cast<uintptr_t>(b.data()) % alignof(uint64_t) == 0) return b;
  *copy = std::make_unique<uint64_t[]>((b.size() + 7) / 8);
  std::memcpy(copy->get(), b.data(), b.size());
  return Bytes(reinterpret_cast<const uint8_t*>(copy->get()), b.size());
}

// Verifies `b` as a T (through an aligned copy when `b` is not 8-byte aligned).
template <typename T>
absl::StatusOr<VerifiedRoot<T>> Root(Bytes b, const char* what) {
  VerifiedRoot<T> out;
  b = AlignedBytes(b, &out.aligned_copy);
  auto root = VerifyTable<T>(b, what);
  if (!root.ok()) return root.status();
  out.root = *root;
  return out;
}

}  // namespace

BlobRef BlobRefFromTable(const fb::BlobRef* r) {
  BlobRef out;
  if (r == nullptr) return out;
  if (r->hash() != nullptr) out.hash = Hash128{r->hash()->high(), r->hash()->low()};
  out.bytes = r->bytes();
  out.tensors = r->tensors();
  return out;
}

std::string EncodeBase(const BaseRecord& r) {
  FlatBufferBuilder b(512);
  auto name = Str(b, r.name);
  auto arch = fb::CreateArchitectureDirect(
      b, r.arch.family.empty() ? nullptr : r.arch.family.c_str(), r.arch.hidden_size,
      r.arch.num_layers, r.arch.num_heads, r.arch.num_kv_heads, r.arch.head_dim,
      r.arch.intermediate_size, r.arch.num_experts, r.arch.vocab_size);
  std::vector<Offset<fb::ModuleShape>> mods;
  mods.reserve(r.modules.size());
  for (const auto& m : r.modules) {
    mods.push_back(fb::CreateModuleShapeDirect(b, m.name.c_str(), m.in, m.out));
  }
  auto mods_vec = b.CreateVector(mods);
  auto fp = Str(b, r.weights_fingerprint);
  auto cfg = Str(b, r.config_json);
  b.Finish(fb::CreateBase(b, 1, name, arch, mods_vec, fp, cfg, r.created_us));
  return Finish(b);
}

absl::StatusOr<BaseRecord> DecodeBase(Bytes bytes) {
  auto root = Root<fb::Base>(bytes, "base");
  if (!root.ok()) return root.status();
  const fb::Base* b = root->root;
  BaseRecord r;
  r.name = Str(b->name());
  if (const auto* a = b->arch()) {
    r.arch.family = Str(a->family());
    r.arch.hidden_size = a->hidden_size();
    r.arch.num_layers = a->num_layers();
    r.arch.num_heads = a->num_heads();
    r.arch.num_kv_heads = a->num_kv_heads();
    r.arch.head_dim = a->head_dim();
    r.arch.intermediate_size = a->intermediate_size();
    r.arch.num_experts = a->num_experts();
    r.arch.vocab_size = a->vocab_size();
  }
  if (b->modules() != nullptr) {
    r.modules.reserve(b->modules()->size());
    for (const auto* m : *b->modules()) {
      r.modules.push_back({Str(m->name()), m->in_features(), m->out_features()});
    }
  }
  r.weights_fingerprint = Str(b->weights_fingerprint());
  r.config_json = Str(b->config_json());
  r.created_us = b->created_us();
  return r;
}

namespace {

// `with_id`: schema v1-v6 stored the id; v7 leaves it to the key (0 is left out of the record).
std::string EncodePolicy(const PolicyRecord& r, bool with_id) {
  FlatBufferBuilder b(256);
  auto name = Str(b, r.name);
  auto base = Str(b, r.base);
  Offset<flatbuffers::Vector<Offset<fb::Label>>> labels;
  if (!r.labels.empty()) {
    std::vector<Offset<fb::Label>> v;
    for (const auto& [k, val] : r.labels) {
      v.push_back(fb::CreateLabelDirect(b, k.c_str(), val.c_str()));
    }
    labels = b.CreateVector(v);
  }
  b.Finish(fb::CreatePolicy(b, 1, with_id ? r.id : 0, name, base, labels, r.created_us, r.archived,
                            r.next_seq));
  return Finish(b);
}

}  // namespace

std::string EncodePolicy(const PolicyRecord& r) { return EncodePolicy(r, false); }

std::string EncodePolicyWithId(const PolicyRecord& r) { return EncodePolicy(r, true); }

PolicyRecord PolicyFromTable(const fb::Policy& table, uint64_t id) {
  const fb::Policy* p = &table;
  PolicyRecord r;
  r.id = id;
  r.name = Str(p->name());
  r.base = Str(p->base());
  if (p->labels() != nullptr) {
    for (const auto* l : *p->labels()) r.labels[Str(l->key())] = Str(l->value());
  }
  r.created_us = p->created_us();
  r.archived = p->archived();
  r.next_seq = p->next_seq();
  return r;
}

absl::StatusOr<PolicyRecord> DecodePolicy(Bytes bytes, uint64_t key_id) {
  auto root = Root<fb::Policy>(bytes, "policy");
  if (!root.ok()) return root.status();
  return PolicyFromTable(*root->root, key_id);
}

std::string EncodeRevision(const RevisionRecord& r, absl::string_view policy_base) {
  FlatBufferBuilder b(256);
  BuildRevision(b, r, policy_base);
  return Finish(b);
}

namespace {

// The dtypes layout 3 stores as a code (safetensors spellings): code = index + 1. Append only (a
// code's meaning never changes), and a reader refuses a code past the end of its table.
constexpr const char* kRevisionDtypes[] = {"F32", "BF16", "F16", "F64", "F8_E4M3", "F8_E5M2",
                                           "I8",  "U8",   "I16", "I32", "I64",     "BOOL"};
constexpr uint8_t kDtypeCodes = sizeof(kRevisionDtypes) / sizeof(kRevisionDtypes[0]);

// The target modules layout 3 stores as bits of target_mask: bit = index. Append only.
constexpr const char* kRevisionTargets[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                            "gate_proj", "up_proj", "down_proj"};
constexpr int kTargetBits = sizeof(kRevisionTargets) / sizeof(kRevisionTargets[0]);
constexpr uint32_t kKnownTargetBits = (uint32_t{1} << kTargetBits) - 1;

// 0 for an empty dtype or one outside the table (stored as its string).
uint8_t DtypeCode(const std::string& dtype) {
  for (uint8_t i = 0; i < kDtypeCodes; ++i) {
    if (dtype == kRevisionDtypes[i]) return static_cast<uint8_t>(i + 1);
  }
  return 0;
}

// The bits of `targets` when they give back exactly this list (every name in the table, in table
// order, none twice); 0 otherwise, and for an empty list (then stored as strings, or absent).
uint32_t TargetMask(const std::vector<std::string>& targets) {
  uint32_t mask = 0;
  int next = 0;  // the first table index the next name may take
  for (const std::string& t : targets) {
    int i = next;
    while (i < kTargetBits && t != kRevisionTargets[i]) ++i;
    if (i == kTargetBits) return 0;
    mask |= uint32_t{1} << i;
    next = i + 1;
  }
  return mask;
}

std::vector<std::string> TargetsOfMask(uint32_t mask) {
  std::vector<std::string> out;
  for (int i = 0; i < kTargetBits; ++i) {
    if (mask & (uint32_t{1} << i)) out.emplace_back(kRevisionTargets[i]);
  }
  return out;
}

}  // namespace

namespace {

// Layouts 3 and 4 (`layout`): the same table. Layout 4 leaves the base out when it equals
// `policy_base` and otherwise stores it even when empty; layout 3 stores it unless it is empty.
void BuildRevisionV3(FlatBufferBuilder& b, const RevisionRecord& r, uint16_t layout,
                     absl::string_view policy_base) {
  b.Clear();
  const uint8_t dtype_code = DtypeCode(r.dtype);
  const uint32_t target_mask = TargetMask(r.lora.target_modules);
  Offset<flatbuffers::String> base;
  if (layout == 3) {
    base = Str(b, r.base);
  } else if (r.base != policy_base) {
    base = b.CreateString(r.base);
  }
  auto dtype = dtype_code != 0 ? Offset<flatbuffers::String>() : Str(b, r.dtype);
  Offset<flatbuffers::Vector<Offset<flatbuffers::String>>> targets;
  if (target_mask == 0 && !r.lora.target_modules.empty()) {
    targets = b.CreateVectorOfStrings(r.lora.target_modules);
  }
  auto mods = ModuleLoras(b, r.lora.modules);
  auto origin = Str(b, r.source.origin);
  auto content_hash = Str(b, r.source.content_hash);
  auto evals = EvalScores(b, r.evals);
  const fb::RevisionFixed3 fixed(
      r.policy_id, r.seq, r.parent, r.created_us, r.source.checkpoint_id, r.source.step,
      r.blob.bytes, fb::Hash128(r.blob.hash.high, r.blob.hash.low), r.blob.tensors, r.lora.r,
      r.lora.alpha, target_mask, static_cast<fb::SourceKind>(r.source.kind),
      static_cast<fb::Layout>(r.layout), static_cast<fb::RevisionState>(r.state), r.lora.use_rslora,
      dtype_code);
  b.Finish(fb::CreateRevisionV3(b, layout, &fixed, base, dtype, targets, mods, origin, content_hash,
                                evals));
}

}  // namespace

void BuildRevision(FlatBufferBuilder& b, const RevisionRecord& r, absl::string_view policy_base) {
  BuildRevisionV3(b, r, kRevisionLayoutVersion, policy_base);
}

std::string EncodeRevisionLayout3(const RevisionRecord& r) {
  FlatBufferBuilder b(256);
  BuildRevisionV3(b, r, 3, {});
  return Finish(b);
}

std::string EncodeRevisionLayout2(const RevisionRecord& r) {
  FlatBufferBuilder b(256);
  auto base = Str(b, r.base);
  auto dtype = Str(b, r.dtype);
  Offset<flatbuffers::Vector<Offset<flatbuffers::String>>> targets;
  if (!r.lora.target_modules.empty()) targets = b.CreateVectorOfStrings(r.lora.target_modules);
  auto mods = ModuleLoras(b, r.lora.modules);
  auto origin = Str(b, r.source.origin);
  auto content_hash = Str(b, r.source.content_hash);
  auto evals = EvalScores(b, r.evals);
  const fb::RevisionFixed fixed(
      r.policy_id, r.seq, r.parent, r.created_us, r.source.checkpoint_id, r.source.step,
      r.blob.bytes, fb::Hash128(r.blob.hash.high, r.blob.hash.low), r.blob.tensors, r.lora.r,
      r.lora.alpha, static_cast<fb::SourceKind>(r.source.kind), static_cast<fb::Layout>(r.layout),
      static_cast<fb::RevisionState>(r.state), r.lora.use_rslora);
  b.Finish(
      fb::CreateRevisionV2(b, 2, &fixed, base, dtype, targets, mods, origin, content_hash, evals));
  return Finish(b);
}

std::string EncodeRevisionLayout1(const RevisionRecord& r) {
  FlatBufferBuilder b(384);
  auto base = Str(b, r.base);
  auto origin = Str(b, r.source.origin);
  auto content_hash = Str(b, r.source.content_hash);
  auto source = fb::CreateSource(b, static_cast<fb::SourceKind>(r.source.kind),
                                 r.source.checkpoint_id, r.source.step, origin, content_hash);
  auto mods = ModuleLoras(b, r.lora.modules);
  Offset<flatbuffers::Vector<Offset<flatbuffers::String>>> targets;
  if (!r.lora.target_modules.empty()) targets = b.CreateVectorOfStrings(r.lora.target_modules);
  auto lora = fb::CreateLoraConfig(b, r.lora.r, r.lora.alpha, r.lora.use_rslora, mods, targets);
  auto dtype = Str(b, r.dtype);
  auto blob = EncodeBlobRef(b, r.blob);
  auto evals = EvalScores(b, r.evals);
  b.Finish(fb::CreateRevision(b, 1, r.id, r.policy_id, r.seq, base, r.parent, source, lora, dtype,
                              static_cast<fb::Layout>(r.layout), blob, r.created_us,
                              static_cast<fb::RevisionState>(r.state), evals));
  return Finish(b);
}

namespace {

RevisionRecord RevisionFromLayout1(const fb::Revision& table) {
  const fb::Revision* v = &table;
  RevisionRecord r;
  r.id = v->id();
  r.policy_id = v->policy_id();
  r.seq = v->seq();
  r.base = Str(v->base());
  r.parent = v->parent();
  if (const auto* s = v->source()) {
    r.source.kind = static_cast<SourceKind>(s->kind());
    r.source.checkpoint_id = s->checkpoint_id();
    r.source.step = s->step();
    r.source.origin = Str(s->origin());
    r.source.content_hash = Str(s->content_hash());
  }
  if (const auto* l = v->lora()) {
    r.lora.r = l->r();
    r.lora.alpha = l->alpha();
    r.lora.use_rslora = l->use_rslora();
    if (l->modules() != nullptr) {
      for (const auto* m : *l->modules()) {
        r.lora.modules.push_back({Str(m->pattern()), m->r(), m->alpha(), m->has_alpha()});
      }
    }
    if (l->target_modules() != nullptr) {
      for (const auto* t : *l->target_modules()) r.lora.target_modules.push_back(t->str());
    }
  }
  r.dtype = Str(v->dtype());
  r.layout = static_cast<Layout>(v->layout());
  r.blob = BlobRefFromTable(v->blob());
  r.created_us = v->created_us();
  r.state = static_cast<RevisionState>(v->state());
  if (v->evals() != nullptr) {
    for (const auto* e : *v->evals()) r.evals[Str(e->name())] = e->value();
  }
  return r;
}

// Layouts 2 and 3: the same fixed fields under the same names; layout 3 may hold the dtype as a
// code and the target modules as bits.
template <typename Table>
RevisionRecord RevisionFromFixedLayout(const Table& v, uint64_t id) {
  constexpr bool kLayout3 = std::is_same_v<Table, fb::RevisionV3>;
  const auto& f = *v.fixed();
  RevisionRecord r;
  r.id = id;
  r.policy_id = f.policy_id();
  r.seq = f.seq();
  r.base = Str(v.base());
  r.parent = f.parent();
  r.source.kind = static_cast<SourceKind>(f.source_kind());
  r.source.checkpoint_id = f.checkpoint_id();
  r.source.step = f.step();
  r.source.origin = Str(v.origin());
  r.source.content_hash = Str(v.content_hash());
  r.lora.r = f.lora_r();
  r.lora.alpha = f.lora_alpha();
  r.lora.use_rslora = f.use_rslora();
  if (v.modules() != nullptr) {
    for (const auto* m : *v.modules()) {
      r.lora.modules.push_back({Str(m->pattern()), m->r(), m->alpha(), m->has_alpha()});
    }
  }
  if constexpr (kLayout3) {
    if (f.target_mask() != 0) r.lora.target_modules = TargetsOfMask(f.target_mask());
    r.dtype = std::string(RevisionDtype(v));
  } else {
    r.dtype = Str(v.dtype());
  }
  if (v.target_modules() != nullptr) {
    for (const auto* t : *v.target_modules()) r.lora.target_modules.push_back(t->str());
  }
  r.layout = static_cast<Layout>(f.layout());
  r.blob.hash = Hash128{f.blob_hash().high(), f.blob_hash().low()};
  r.blob.bytes = f.blob_bytes();
  r.blob.tensors = f.blob_tensors();
  r.created_us = f.created_us();
  r.state = static_cast<RevisionState>(f.state());
  if (v.evals() != nullptr) {
    for (const auto* e : *v.evals()) r.evals[Str(e->name())] = e->value();
  }
  return r;
}

// FlatBuffers' verifier for a layout-2 or -3 record with every helper it calls inlined into this
// one function (`flatten`): the same checks, about half the time of the out-of-line calls, on the
// path every revision lookup takes.
template <typename T>
[[gnu::flatten]] bool VerifyRevisionBuffer(std::span<const uint8_t> b) {
  flatbuffers::Verifier v(b.data(), b.size());
  return v.VerifyBuffer<T>(nullptr);
}

// The checks of a verified layout-3 record the FlatBuffers verifier does not make; an empty
// string when it passes them.
const char* Layout3Problem(const fb::RevisionV3& t) {
  if (t.fixed() == nullptr) return "layout 3 without its fixed fields";
  const fb::RevisionFixed3& f = *t.fixed();
  if (f.dtype_code() > kDtypeCodes) return "a dtype code this build does not know";
  if ((f.target_mask() & ~kKnownTargetBits) != 0) {
    return "target-module bits this build does not know";
  }
  if (f.dtype_code() != 0 && t.dtype() != nullptr) return "its dtype stored both ways";
  if (f.target_mask() != 0 && t.target_modules() != nullptr) {
    return "its target modules stored both ways";
  }
  return "";
}

}  // namespace

absl::StatusOr<RevisionTables> VerifyRevision(std::span<const uint8_t> b) {
  RevisionTables t;
  // A v7 catalog holds layout 4 only (migration rewrites older records), which is the layout-3
  // table, so that is tried first: one verification. Every layout stores its version where the
  // others do (the root table's first field; layout 1 leaves it out, reading 1), so a record cannot
  // pass as another layout even where its bytes happen to verify as one.
  if (VerifyRevisionBuffer<fb::RevisionV3>(b)) {
    const fb::RevisionV3* root = flatbuffers::GetRoot<fb::RevisionV3>(b.data());
    if (root->version() == 3 || root->version() == kRevisionLayoutVersion) {
      const absl::string_view problem = Layout3Problem(*root);
      if (!problem.empty()) {
        return absl::DataLossError(
            absl::StrCat("catalog: corrupt revision record (", problem, ")"));
      }
      t.v3 = root;
      return t;
    }
  }
  {
    if (VerifyRevisionBuffer<fb::RevisionV2>(b)) {
      const fb::RevisionV2* root = flatbuffers::GetRoot<fb::RevisionV2>(b.data());
      if (root->version() == 2) {
        if (root->fixed() == nullptr) {
          return absl::DataLossError(
              "catalog: corrupt revision record (layout 2 without its fixed fields)");
        }
        t.v2 = root;
        return t;
      }
    }
  }
  auto head = VerifyTable<fb::RecordVersion>(b, "revision", kRevisionLayoutVersion);
  if (!head.ok()) return head.status();
  if ((*head)->version() >= 2) {  // a layout this build reads that failed verification above
    return absl::DataLossError(absl::StrCat("catalog: corrupt revision record (", b.size(),
                                            " bytes fail FlatBuffers verification)"));
  }
  auto v1 = VerifyTable<fb::Revision>(b, "revision", kRevisionLayoutVersion);
  if (!v1.ok()) return v1.status();
  t.v1 = *v1;
  return t;
}

absl::string_view RevisionDtype(const fb::RevisionV3& t) {
  const uint8_t code = t.fixed()->dtype_code();
  if (code != 0) return kRevisionDtypes[code - 1];
  const flatbuffers::String* s = t.dtype();
  return s == nullptr ? absl::string_view() : absl::string_view(s->data(), s->size());
}

RevisionRecord RevisionFromTables(const RevisionTables& t, uint64_t id) {
  if (t.v3 != nullptr) return RevisionFromFixedLayout(*t.v3, id);
  return t.v2 != nullptr ? RevisionFromFixedLayout(*t.v2, id) : RevisionFromLayout1(*t.v1);
}

absl::StatusOr<RevisionRecord> DecodeRevision(Bytes bytes, uint64_t key_id,
                                              PolicyBaseFn policy_base) {
  std::unique_ptr<uint64_t[]> aligned;
  auto t = VerifyRevision(AlignedBytes(bytes, &aligned));
  if (!t.ok()) return t.status();
  RevisionRecord r = RevisionFromTables(*t, key_id);
  if (BaseFromPolicy(*t)) {
    auto base = policy_base(r.policy_id);
    if (!base.ok()) return base.status();
    r.base = std::move(*base);
  }
  return r;
}

absl::StatusOr<RevisionRecord> DecodeRevision(Bytes bytes, uint64_t key_id) {
  return DecodeRevision(bytes, key_id, [](uint64_t policy_id) -> absl::StatusOr<std::string> {
    return absl::FailedPreconditionError(
        absl::StrCat("catalog: revision record leaves its base to policy id ", policy_id,
                     ", and no policy base was given to read it"));
  });
}

absl::StatusOr<RevisionState> DecodeRevisionState(Bytes bytes) {
  std::unique_ptr<uint64_t[]> aligned;
  auto t = VerifyRevision(AlignedBytes(bytes, &aligned));
  if (!t.ok()) return t.status();
  if (t->v3 != nullptr) return static_cast<RevisionState>(t->v3->fixed()->state());
  return static_cast<RevisionState>(t->v2 != nullptr ? t->v2->fixed()->state() : t->v1->state());
}

namespace {

// The catalog's own alias-move reasons, by their reason_kind.
constexpr std::pair<fb::AliasReason, const char*> kAliasReasons[] = {
    {fb::AliasReason::Publish, "publish"},
    {fb::AliasReason::Set, "set"},
    {fb::AliasReason::Rollback, "rollback"},
};

std::string EncodeAliasLogEntry(const AliasLogEntry& r, bool reason_kinds) {
  fb::AliasReason kind = fb::AliasReason::Other;
  if (reason_kinds) {
    for (const auto& [k, name] : kAliasReasons) {
      if (r.reason == name) kind = k;
    }
  }
  FlatBufferBuilder b(128);
  auto reason = kind == fb::AliasReason::Other ? Str(b, r.reason) : Offset<flatbuffers::String>();
  b.Finish(fb::CreateAliasLogEntry(b, 1, r.time_us, r.from_revision, r.to_revision, reason, kind));
  return Finish(b);
}

}  // namespace

std::string EncodeAliasLogEntry(const AliasLogEntry& r) { return EncodeAliasLogEntry(r, true); }

std::string EncodeAliasLogEntryLayout1(const AliasLogEntry& r) {
  return EncodeAliasLogEntry(r, false);
}

absl::StatusOr<AliasLogEntry> DecodeAliasLogEntry(Bytes bytes) {
  auto root = Root<fb::AliasLogEntry>(bytes, "alias log");
  if (!root.ok()) return root.status();
  AliasLogEntry r;
  r.time_us = (*root)->time_us();
  r.from_revision = (*root)->from_revision();
  r.to_revision = (*root)->to_revision();
  r.reason = Str((*root)->reason());
  for (const auto& [kind, name] : kAliasReasons) {
    if ((*root)->reason_kind() == kind) r.reason = name;
  }
  return r;
}

std::string EncodeCheckpoint(const CheckpointRecord& r) {
  FlatBufferBuilder b(384);
  auto master = EncodeBlobRef(b, r.master);
  auto optimizer = EncodeBlobRef(b, r.optimizer);
  auto gradients = EncodeBlobRef(b, r.gradients);
  auto sched = Str(b, r.scheduler_name);
  Offset<flatbuffers::Vector<uint8_t>> rng;
  if (!r.rng_state.empty()) {
    rng = b.CreateVector(reinterpret_cast<const uint8_t*>(r.rng_state.data()), r.rng_state.size());
  }
  auto rollout = EncodeBlobRef(b, r.rollout);
  b.Finish(fb::CreateCheckpoint(b, 1, r.id, r.policy_id, r.step, r.parent, master, optimizer,
                                gradients, sched, r.scheduler_position, rng, rollout,
                                r.created_us));
  return Finish(b);
}

absl::StatusOr<CheckpointRecord> DecodeCheckpoint(Bytes bytes) {
  auto root = Root<fb::Checkpoint>(bytes, "checkpoint");
  if (!root.ok()) return root.status();
  const fb::Checkpoint* c = root->root;
  CheckpointRecord r;
  r.id = c->id();
  r.policy_id = c->policy_id();
  r.step = c->step();
  r.parent = c->parent();
  r.master = BlobRefFromTable(c->master());
  r.optimizer = BlobRefFromTable(c->optimizer());
  r.gradients = BlobRefFromTable(c->gradients());
  r.scheduler_name = Str(c->scheduler_name());
  r.scheduler_position = c->scheduler_position();
  if (c->rng_state() != nullptr) {
    r.rng_state.assign(reinterpret_cast<const char*>(c->rng_state()->data()),
                       c->rng_state()->size());
  }
  r.rollout = BlobRefFromTable(c->rollout());
  r.created_us = c->created_us();
  return r;
}

std::string EncodeBlob(const BlobRecord& r) {
  FlatBufferBuilder b(128);
  auto path = Str(b, r.relpath);
  b.Finish(fb::CreateBlob(b, 1, path, r.bytes, r.refcount, static_cast<fb::BlobKind>(r.kind)));
  return Finish(b);
}

absl::StatusOr<BlobRecord> DecodeBlob(Bytes bytes) {
  auto root = Root<fb::Blob>(bytes, "blob");
  if (!root.ok()) return root.status();
  BlobRecord r;
  r.relpath = Str((*root)->relpath());
  r.bytes = (*root)->bytes();
  r.refcount = (*root)->refcount();
  r.kind = static_cast<BlobKind>((*root)->kind());
  return r;
}

}  // namespace loradb::catalog_codec

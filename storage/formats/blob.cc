#include "storage/formats/blob.h"

#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "schema/blob_generated.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"

namespace loradb {
namespace {

constexpr int kNumDTypes = 15;
// Most members a member_template may name (bounds the work a hostile header can ask for).
constexpr int64_t kMaxTemplateMembers = 1 << 20;

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("blob: ", what));
}

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

uint64_t AlignmentFor(uint64_t length) {
  return length >= kBlobLargeTensorBytes ? kBlobLargeAlign : kBlobMinAlign;
}

uint32_t LoadU32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

uint64_t LoadU64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

void StoreU32(uint32_t v, char* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

void StoreU64(uint64_t v, char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// "...layers.{L}.mlp.experts.{E}.{gate_proj|up_proj|down_proj}.lora_{A|B}.weight" -> group key
// parts. Returns false for any other name.
struct ExpertName {
  absl::string_view mlp_prefix;  // "...layers.{L}.mlp"
  uint64_t expert = 0;
  absl::string_view proj;
  char side = 'A';
};

bool ParseExpertName(absl::string_view name, ExpertName* out) {
  if (absl::EndsWith(name, ".lora_A.weight")) {
    out->side = 'A';
  } else if (absl::EndsWith(name, ".lora_B.weight")) {
    out->side = 'B';
  } else {
    return false;
  }
  name.remove_suffix(sizeof(".lora_A.weight") - 1);
  bool found = false;
  for (absl::string_view proj : {"gate_proj", "up_proj", "down_proj"}) {
    if (name.size() > proj.size() && absl::EndsWith(name, proj) &&
        name[name.size() - proj.size() - 1] == '.') {
      out->proj = proj;
      name.remove_suffix(proj.size() + 1);
      found = true;
      break;
    }
  }
  if (!found) return false;
  size_t dot = name.rfind('.');
  if (dot == absl::string_view::npos) return false;
  absl::string_view digits = name.substr(dot + 1);
  if (digits.empty() || digits.size() > 9) return false;
  uint64_t e = 0;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
    e = e * 10 + static_cast<uint64_t>(c - '0');
  }
  out->expert = e;
  name = name.substr(0, dot);
  if (!absl::EndsWith(name, ".mlp.experts")) return false;
  name.remove_suffix(sizeof(".experts") - 1);
  out->mlp_prefix = name;
  // Require "layers.{L}" right before ".mlp".
  absl::string_view layer = name.substr(0, name.size() - 4);
  size_t ldot = layer.rfind('.');
  if (ldot == absl::string_view::npos || ldot + 1 == layer.size()) return false;
  for (char c : layer.substr(ldot + 1)) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  layer = layer.substr(0, ldot);
  return layer == "layers" || absl::EndsWith(layer, ".layers");
}

// Member `i`'s name from a template with exactly one "{}".
std::string ExpandTemplate(absl::string_view tmpl, size_t i) {
  size_t at = tmpl.find("{}");
  return absl::StrCat(tmpl.substr(0, at), i, tmpl.substr(at + 2));
}

// The member template of a planned MoE group when every member's name is exactly what the
// template gives (canonical decimal expert numbers, no other "{}"); empty otherwise.
std::string MemberTemplate(const std::vector<const TensorView*>& parts) {
  ExpertName en;
  if (parts.empty() || !ParseExpertName(parts[0]->name, &en)) return "";
  std::string tmpl = absl::StrCat(en.mlp_prefix, ".experts.{}.", en.proj, ".lora_",
                                  std::string(1, en.side), ".weight");
  if (tmpl.find("{}") != tmpl.rfind("{}")) return "";
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i]->name != ExpandTemplate(tmpl, i)) return "";
  }
  return tmpl;
}

absl::Status ValidateViews(const std::vector<TensorView>& tensors) {
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(tensors.size());
  for (const TensorView& t : tensors) {
    if (t.name.empty()) return Invalid("tensor with an empty name");
    if (!names.insert(t.name).second) {
      return Invalid(absl::StrCat("duplicate tensor name \"", t.name, "\""));
    }
    if (!simdjson::validate_utf8(t.name.data(), t.name.size())) {
      return Invalid("a tensor name is not valid UTF-8");
    }
    auto nbytes = CheckedNumBytes(t.shape, t.dtype);
    if (!nbytes.ok()) {
      return Invalid(absl::StrCat("tensor \"", t.name, "\": ", nbytes.status().message()));
    }
    if (*nbytes != t.nbytes) {
      return Invalid(absl::StrCat("tensor \"", t.name, "\": ", t.nbytes, " bytes given but ",
                                  DTypeName(t.dtype), " ", ShapeString(t.shape), " needs ",
                                  *nbytes));
    }
    if (t.nbytes > 0 && t.data == nullptr) {
      return Invalid(absl::StrCat("tensor \"", t.name, "\": null data"));
    }
  }
  return absl::OkStatus();
}

// A tensor to store: one input view, or a stack of several.
struct StoredPlan {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<const TensorView*> parts;
  bool packed = false;
  std::string member_template;  // packed only; empty: member names written out
  uint64_t length = 0;
  uint64_t offset = 0;
  uint64_t xxh3 = 0;
};

// Builds the FlatBuffers header for `stored` (sorted) with their current offsets and hashes.
flatbuffers::DetachedBuffer BuildHeader(const std::vector<StoredPlan>& stored,
                                        const std::map<std::string, std::string>& metadata,
                                        uint64_t file_size) {
  flatbuffers::FlatBufferBuilder b(1024 + stored.size() * 128);
  b.ForceDefaults(true);  // header size must not depend on offset / hash values
  std::vector<flatbuffers::Offset<blob::fb::StoredTensor>> tensors;
  std::vector<flatbuffers::Offset<blob::fb::PackedGroup>> groups;
  tensors.reserve(stored.size());
  for (size_t i = 0; i < stored.size(); ++i) {
    const StoredPlan& s = stored[i];
    auto name = b.CreateString(s.name);
    auto shape = b.CreateVector(s.shape);
    tensors.push_back(blob::fb::CreateStoredTensor(b, name, static_cast<blob::fb::DType>(s.dtype),
                                                   shape, s.offset, s.length, s.xxh3));
    if (s.packed) {
      if (!s.member_template.empty()) {
        groups.push_back(blob::fb::CreatePackedGroup(b, static_cast<uint32_t>(i), 0, 0,
                                                     b.CreateString(s.member_template)));
      } else {
        std::vector<flatbuffers::Offset<flatbuffers::String>> members;
        members.reserve(s.parts.size());
        for (const TensorView* p : s.parts) members.push_back(b.CreateString(p->name));
        groups.push_back(
            blob::fb::CreatePackedGroup(b, static_cast<uint32_t>(i), 0, b.CreateVector(members)));
      }
    }
  }
  std::vector<flatbuffers::Offset<blob::fb::KeyValue>> kvs;
  for (const auto& [k, v] : metadata) {
    auto key = b.CreateString(k);
    auto value = b.CreateString(v);
    kvs.push_back(blob::fb::CreateKeyValue(b, key, value));
  }
  auto tv = b.CreateVector(tensors);
  auto gv = b.CreateVector(groups);
  auto mv = b.CreateVector(kvs);
  blob::fb::FinishBlobHeaderBuffer(b, blob::fb::CreateBlobHeader(b, tv, gv, mv, file_size));
  return b.Release();
}

// The stored tensors of a validated layout as views into `base`.
bool IsUtf8(const flatbuffers::String* s) { return simdjson::validate_utf8(s->c_str(), s->size()); }

absl::Status VerifyChecksums(const BlobLayout& layout, const std::byte* base) {
  for (const BlobStoredTensor& s : layout.stored) {
    uint64_t got = Xxh3_64(base + s.offset, s.length);
    if (got != s.xxh3) {
      return absl::DataLossError(absl::StrCat("blob: tensor \"", s.name,
                                              "\": checksum mismatch (header says ",
                                              absl::Hex(s.xxh3, absl::kZeroPad16), ", data is ",
                                              absl::Hex(got, absl::kZeroPad16), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

size_t BlobLayout::original_count() const {
  size_t n = stored.size();
  for (const auto& g : groups) n += g.members.size() - 1;
  return n;
}

std::vector<MoePackPlan> PlanMoePacking(const std::vector<TensorView>& tensors) {
  struct Group {
    std::string packed_name;
    std::vector<std::pair<uint64_t, size_t>> experts;  // (expert, input index)
  };
  std::map<std::string, Group> groups;  // ordered: deterministic plans
  for (size_t i = 0; i < tensors.size(); ++i) {
    ExpertName en;
    if (!ParseExpertName(tensors[i].name, &en)) continue;
    std::string packed = absl::StrCat(en.mlp_prefix, ".experts.", en.proj, ".lora_",
                                      std::string(1, en.side), ".weight");
    Group& g = groups[packed];
    g.packed_name = packed;
    g.experts.emplace_back(en.expert, i);
  }
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(tensors.size());
  for (const TensorView& t : tensors) names.insert(t.name);
  std::vector<MoePackPlan> plans;
  for (auto& [packed, g] : groups) {
    if (g.experts.size() < 2 || names.contains(packed)) continue;
    std::sort(g.experts.begin(), g.experts.end());
    bool ok = true;
    const TensorView& first = tensors[g.experts[0].second];
    for (size_t e = 0; e < g.experts.size() && ok; ++e) {
      const TensorView& t = tensors[g.experts[e].second];
      ok = g.experts[e].first == e && t.dtype == first.dtype && t.shape == first.shape;
    }
    if (!ok) continue;
    MoePackPlan plan;
    plan.packed_name = packed;
    for (const auto& [e, idx] : g.experts) plan.member_indices.push_back(idx);
    plans.push_back(std::move(plan));
  }
  return plans;
}

absl::StatusOr<std::string> SerializeBlob(const std::vector<TensorView>& tensors,
                                          const std::map<std::string, std::string>& metadata,
                                          const BlobOptions& options) {
  LORADB_RETURN_IF_ERROR(ValidateViews(tensors));
  for (const auto& [k, v] : metadata) {
    if (!simdjson::validate_utf8(k.data(), k.size()) ||
        !simdjson::validate_utf8(v.data(), v.size())) {
      return Invalid("a metadata key or value is not valid UTF-8");
    }
  }
  std::vector<StoredPlan> stored;
  std::vector<bool> in_group(tensors.size(), false);
  if (options.pack_moe) {
    for (MoePackPlan& plan : PlanMoePacking(tensors)) {
      StoredPlan s;
      s.name = std::move(plan.packed_name);
      const TensorView& first = tensors[plan.member_indices[0]];
      s.dtype = first.dtype;
      s.shape.push_back(static_cast<int64_t>(plan.member_indices.size()));
      s.shape.insert(s.shape.end(), first.shape.begin(), first.shape.end());
      s.packed = true;
      for (size_t idx : plan.member_indices) {
        s.parts.push_back(&tensors[idx]);
        s.length += tensors[idx].nbytes;
        in_group[idx] = true;
      }
      s.member_template = MemberTemplate(s.parts);
      stored.push_back(std::move(s));
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (in_group[i]) continue;
    StoredPlan s;
    s.name = tensors[i].name;
    s.dtype = tensors[i].dtype;
    s.shape = tensors[i].shape;
    s.parts.push_back(&tensors[i]);
    s.length = tensors[i].nbytes;
    stored.push_back(std::move(s));
  }
  std::sort(stored.begin(), stored.end(),
            [](const StoredPlan& a, const StoredPlan& b) { return a.name < b.name; });
  {
    absl::flat_hash_set<absl::string_view> stored_names;
    for (const StoredPlan& s : stored) {
      if (!stored_names.insert(s.name).second) {
        return Invalid(absl::StrCat("stored name \"", s.name, "\" is not unique"));
      }
    }
  }

  // Pass 1 fixes the header size; offsets follow it.
  const size_t header_len = BuildHeader(stored, metadata, 0).size();
  if (header_len > kBlobMaxHeaderBytes) {
    return Invalid(absl::StrCat("header would be ", header_len, " bytes, over the limit"));
  }
  const uint64_t header_end = kBlobPrefixBytes + header_len + 8;
  uint64_t cursor = header_end;
  for (StoredPlan& s : stored) {
    cursor = AlignUp(cursor, AlignmentFor(s.length));
    s.offset = cursor;
    cursor += s.length;
  }
  const uint64_t file_size = cursor;

  std::string out(file_size, '\0');
  for (StoredPlan& s : stored) {
    char* dst = out.data() + s.offset;
    for (const TensorView* p : s.parts) {
      if (p->nbytes > 0) std::memcpy(dst, p->data, p->nbytes);
      dst += p->nbytes;
    }
    s.xxh3 = Xxh3_64(out.data() + s.offset, s.length);
  }
  flatbuffers::DetachedBuffer header = BuildHeader(stored, metadata, file_size);
  if (header.size() != header_len) {
    return absl::InternalError("blob: header size changed between passes");
  }
  std::memcpy(out.data(), kBlobMagic, sizeof(kBlobMagic));
  StoreU32(kBlobVersion, out.data() + 8);
  StoreU32(0, out.data() + 12);
  StoreU64(header_len, out.data() + 16);
  std::memcpy(out.data() + kBlobPrefixBytes, header.data(), header_len);
  StoreU64(Xxh3_64(out.data(), kBlobPrefixBytes + header_len),
           out.data() + kBlobPrefixBytes + header_len);
  return out;
}

absl::StatusOr<BlobFileInfo> WriteBlobFile(const std::string& path,
                                           const std::vector<TensorView>& tensors,
                                           const std::map<std::string, std::string>& metadata,
                                           const BlobOptions& options) {
  LORADB_ASSIGN_OR_RETURN(std::string bytes, SerializeBlob(tensors, metadata, options));
  BlobFileInfo info;
  info.bytes = bytes.size();
  info.content_hash = Xxh3_128(bytes.data(), bytes.size());
  LORADB_RETURN_IF_ERROR(WriteFileAtomic(path, bytes));
  return info;
}

absl::StatusOr<uint64_t> BlobHeaderEnd(std::span<const std::byte> prefix) {
  if (prefix.size() < kBlobPrefixBytes) {
    return Invalid(absl::StrCat("truncated: ", prefix.size(), " bytes, shorter than the ",
                                kBlobPrefixBytes, "-byte blob prefix"));
  }
  if (std::memcmp(prefix.data(), kBlobMagic, sizeof(kBlobMagic)) != 0) {
    return Invalid("bad magic: not a loradb blob (expected \"LORABLOB\")");
  }
  uint32_t version = LoadU32(prefix.data() + 8);
  if (version != kBlobVersion) {
    return Invalid(absl::StrCat("unsupported blob version ", version, " (this build reads ",
                                kBlobVersion, ")"));
  }
  uint32_t flags = LoadU32(prefix.data() + 12);
  if (flags != 0) return Invalid(absl::StrCat("unsupported blob flags 0x", absl::Hex(flags)));
  uint64_t header_len = LoadU64(prefix.data() + 16);
  if (header_len > kBlobMaxHeaderBytes) {
    return Invalid(
        absl::StrCat("header length ", header_len, " exceeds the limit of ", kBlobMaxHeaderBytes));
  }
  return kBlobPrefixBytes + header_len + 8;
}

namespace {

// ParseBlobLayout; `check_member_names` = false leaves the uniqueness of original names
// (ungrouped stored tensors + members) to the caller, which ParseBlob gets from its TensorSet's
// index without hashing every name twice.
absl::StatusOr<BlobLayout> ParseLayout(std::span<const std::byte> head, uint64_t file_size,
                                       bool check_member_names) {
  LORADB_ASSIGN_OR_RETURN(uint64_t header_end, BlobHeaderEnd(head));
  if (header_end > file_size) {
    return Invalid(absl::StrCat("truncated: the header needs ", header_end,
                                " bytes but the file has ", file_size));
  }
  if (header_end > head.size()) {
    return Invalid(
        absl::StrCat("ParseBlobLayout needs the first ", header_end, " bytes, got ", head.size()));
  }
  const uint64_t header_len = header_end - kBlobPrefixBytes - 8;
  uint64_t want_sum = LoadU64(head.data() + kBlobPrefixBytes + header_len);
  uint64_t got_sum = Xxh3_64(head.data(), kBlobPrefixBytes + header_len);
  if (want_sum != got_sum) {
    return Invalid(absl::StrCat("header checksum mismatch (stored ",
                                absl::Hex(want_sum, absl::kZeroPad16), ", computed ",
                                absl::Hex(got_sum, absl::kZeroPad16), ")"));
  }
  // FlatBuffers needs its buffer 8-aligned; copy when the caller's memory is not.
  const uint8_t* fb = reinterpret_cast<const uint8_t*>(head.data() + kBlobPrefixBytes);
  std::vector<uint64_t> aligned;
  if (reinterpret_cast<uintptr_t>(fb) % 8 != 0) {
    aligned.resize((header_len + 7) / 8);
    std::memcpy(aligned.data(), fb, header_len);
    fb = reinterpret_cast<const uint8_t*>(aligned.data());
  }
  flatbuffers::Verifier verifier(fb, header_len, /*_max_depth=*/16, /*_max_tables=*/100'000'000);
  if (!blob::fb::VerifyBlobHeaderBuffer(verifier)) {
    return Invalid("header is not a valid FlatBuffers BlobHeader");
  }
  const blob::fb::BlobHeader* h = blob::fb::GetBlobHeader(fb);
  if (h->file_size() != file_size) {
    return Invalid(absl::StrCat("the header says the file is ", h->file_size(), " bytes but it is ",
                                file_size,
                                file_size < h->file_size() ? " (truncated)" : " (trailing bytes)"));
  }

  BlobLayout layout;
  layout.header_end = header_end;
  layout.file_size = file_size;
  layout.stored.reserve(h->tensors()->size());
  absl::flat_hash_set<absl::string_view> stored_names;
  for (const blob::fb::StoredTensor* t : *h->tensors()) {
    BlobStoredTensor s;
    s.name = t->name()->str();
    if (s.name.empty()) return Invalid("stored tensor with an empty name");
    if (!IsUtf8(t->name())) return Invalid("a stored tensor name is not valid UTF-8");
    auto dtype_index = static_cast<int>(t->dtype());
    if (dtype_index < 0 || dtype_index >= kNumDTypes) {
      return Invalid(absl::StrCat("tensor \"", s.name, "\": unknown dtype code ", dtype_index));
    }
    s.dtype = static_cast<DType>(dtype_index);
    if (t->shape() != nullptr) {
      // FlatBuffers 2.0.8's verifier checks a vector's 4-byte length alignment, not its
      // elements': an int64 shape may sit at a 4 (mod 8) address. Copy bytes, never load
      // through a misaligned pointer (found by fuzz_blob_header under UBSan).
      static_assert(FLATBUFFERS_LITTLEENDIAN, "blob headers are little-endian");
      s.shape.resize(t->shape()->size());
      if (!s.shape.empty()) {
        std::memcpy(s.shape.data(), t->shape()->Data(), s.shape.size() * sizeof(int64_t));
      }
    }
    s.offset = t->offset();
    s.length = t->length();
    s.xxh3 = t->xxh3();
    auto nbytes = CheckedNumBytes(s.shape, s.dtype);
    if (!nbytes.ok()) {
      return Invalid(absl::StrCat("tensor \"", s.name, "\": ", nbytes.status().message()));
    }
    if (*nbytes != s.length) {
      return Invalid(absl::StrCat("tensor \"", s.name, "\": length ", s.length, " but ",
                                  DTypeName(s.dtype), " ", ShapeString(s.shape), " needs ",
                                  *nbytes));
    }
    if (s.offset < header_end || s.offset > file_size || s.length > file_size - s.offset) {
      return Invalid(absl::StrCat("tensor \"", s.name, "\": bytes [", s.offset, ", +", s.length,
                                  ") lie outside the data region [", header_end, ", ", file_size,
                                  ")"));
    }
    if (s.offset % AlignmentFor(s.length) != 0) {
      return Invalid(absl::StrCat("tensor \"", s.name, "\": offset ", s.offset,
                                  " is not aligned to ", AlignmentFor(s.length)));
    }
    layout.stored.push_back(std::move(s));
  }
  for (const BlobStoredTensor& s : layout.stored) {
    if (!stored_names.insert(s.name).second) {
      return Invalid(absl::StrCat("duplicate stored tensor \"", s.name, "\""));
    }
  }
  std::vector<size_t> order(layout.stored.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return layout.stored[a].offset < layout.stored[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const BlobStoredTensor& prev = layout.stored[order[i - 1]];
    const BlobStoredTensor& cur = layout.stored[order[i]];
    if (prev.offset + prev.length > cur.offset) {
      return Invalid(absl::StrCat("tensors \"", prev.name, "\" and \"", cur.name, "\" overlap"));
    }
  }

  std::vector<bool> grouped(layout.stored.size(), false);
  if (h->groups() != nullptr) {
    for (const blob::fb::PackedGroup* g : *h->groups()) {
      BlobPackedGroup group;
      group.stored_index = g->tensor();
      group.axis = g->axis();
      if (group.stored_index >= layout.stored.size()) {
        return Invalid(absl::StrCat("packed group refers to tensor #", group.stored_index, " of ",
                                    layout.stored.size()));
      }
      const BlobStoredTensor& s = layout.stored[group.stored_index];
      if (grouped[group.stored_index]) {
        return Invalid(absl::StrCat("tensor \"", s.name, "\" is in two packed groups"));
      }
      grouped[group.stored_index] = true;
      if (group.axis != 0) {
        return Invalid(absl::StrCat("packed group \"", s.name, "\": stacking axis ", group.axis,
                                    " is not supported (only 0)"));
      }
      const bool explicit_members = g->members() != nullptr && g->members()->size() > 0;
      if (explicit_members == (g->member_template() != nullptr)) {
        return Invalid(absl::StrCat("packed group \"", s.name,
                                    "\": needs exactly one of members and member_template"));
      }
      if (explicit_members) {
        for (const flatbuffers::String* m : *g->members()) {
          if (!IsUtf8(m)) {
            return Invalid(
                absl::StrCat("packed group \"", s.name, "\": a member name is not valid UTF-8"));
          }
          group.members.push_back(m->str());
        }
      } else {
        const flatbuffers::String* t = g->member_template();
        absl::string_view tmpl(t->c_str(), t->size());
        if (!IsUtf8(t) || tmpl.find("{}") == absl::string_view::npos ||
            tmpl.find("{}") != tmpl.rfind("{}")) {
          return Invalid(absl::StrCat("packed group \"", s.name,
                                      "\": member_template must be UTF-8 with exactly one \"{}\""));
        }
        if (s.shape.empty() || s.shape[0] <= 0 || s.shape[0] > kMaxTemplateMembers) {
          return Invalid(absl::StrCat("packed group \"", s.name, "\": shape ", ShapeString(s.shape),
                                      " does not allow 1..", kMaxTemplateMembers,
                                      " template members"));
        }
        group.members.reserve(static_cast<size_t>(s.shape[0]));
        for (int64_t i = 0; i < s.shape[0]; ++i) {
          group.members.push_back(ExpandTemplate(tmpl, static_cast<size_t>(i)));
        }
      }
      if (s.shape.empty() || group.members.empty() ||
          static_cast<uint64_t>(s.shape[0]) != group.members.size()) {
        return Invalid(absl::StrCat("packed group \"", s.name, "\": ", group.members.size(),
                                    " members for shape ", ShapeString(s.shape)));
      }
      layout.groups.push_back(std::move(group));
    }
  }
  // Original names (ungrouped stored tensors + members) must be unique.
  if (check_member_names) {
    absl::flat_hash_set<absl::string_view> originals;
    for (size_t i = 0; i < layout.stored.size(); ++i) {
      if (grouped[i]) continue;
      originals.insert(layout.stored[i].name);
    }
    for (const BlobPackedGroup& g : layout.groups) {
      for (const std::string& m : g.members) {
        if (m.empty() || !originals.insert(m).second) {
          return Invalid(absl::StrCat("packed group \"", layout.stored[g.stored_index].name,
                                      "\": member name \"", m, "\" is empty or repeats"));
        }
      }
    }
  }
  if (h->metadata() != nullptr) {
    for (const blob::fb::KeyValue* kv : *h->metadata()) {
      if (!IsUtf8(kv->key()) || !IsUtf8(kv->value())) {
        return Invalid("a metadata key or value is not valid UTF-8");
      }
      if (!layout.metadata.emplace(kv->key()->str(), kv->value()->str()).second) {
        return Invalid(absl::StrCat("duplicate metadata key \"", kv->key()->str(), "\""));
      }
    }
  }
  return layout;
}

}  // namespace

absl::StatusOr<BlobLayout> ParseBlobLayout(std::span<const std::byte> head, uint64_t file_size) {
  return ParseLayout(head, file_size, /*check_member_names=*/true);
}

absl::StatusOr<TensorSet> ParseBlobStored(std::span<const std::byte> bytes,
                                          std::shared_ptr<const void> backing,
                                          bool verify_checksums, BlobLayout* layout_out) {
  LORADB_ASSIGN_OR_RETURN(BlobLayout layout, ParseBlobLayout(bytes, bytes.size()));
  if (verify_checksums) LORADB_RETURN_IF_ERROR(VerifyChecksums(layout, bytes.data()));
  TensorSet set(std::move(backing));
  set.Reserve(layout.stored.size());
  set.metadata() = layout.metadata;
  for (BlobStoredTensor& s : layout.stored) {
    TensorView v{{}, s.dtype, {}, bytes.data() + s.offset, static_cast<size_t>(s.length)};
    if (layout_out != nullptr) {  // the caller gets the layout too: copy
      v.name = s.name;
      v.shape = s.shape;
    } else {
      v.name = std::move(s.name);
      v.shape = std::move(s.shape);
    }
    LORADB_RETURN_IF_ERROR(set.Add(std::move(v)));
  }
  if (layout_out != nullptr) *layout_out = std::move(layout);
  return set;
}

absl::StatusOr<TensorSet> ParseBlob(std::span<const std::byte> bytes,
                                    std::shared_ptr<const void> backing, bool verify_checksums) {
  LORADB_ASSIGN_OR_RETURN(BlobLayout layout,
                          ParseLayout(bytes, bytes.size(), /*check_member_names=*/false));
  if (verify_checksums) LORADB_RETURN_IF_ERROR(VerifyChecksums(layout, bytes.data()));
  std::vector<BlobPackedGroup*> group_of(layout.stored.size(), nullptr);
  size_t views = layout.stored.size();
  for (BlobPackedGroup& g : layout.groups) {
    group_of[g.stored_index] = &g;
    views += g.members.size() - 1;
  }
  TensorSet set(std::move(backing));
  set.Reserve(views);
  set.metadata() = std::move(layout.metadata);
  for (size_t i = 0; i < layout.stored.size(); ++i) {
    BlobStoredTensor& s = layout.stored[i];
    const std::byte* data = bytes.data() + s.offset;
    if (group_of[i] == nullptr) {
      // Stored names are unique (checked by the layout): a clash is with a member name.
      absl::Status added =
          set.Add({std::move(s.name), s.dtype, std::move(s.shape), data, s.length});
      if (!added.ok()) {
        absl::string_view quoted = added.message();
        absl::ConsumePrefix(&quoted, "duplicate tensor name ");
        return Invalid(absl::StrCat("member name ", quoted, " repeats a stored tensor's name"));
      }
      continue;
    }
    BlobPackedGroup& g = *group_of[i];
    std::vector<int64_t> member_shape(s.shape.begin() + 1, s.shape.end());
    const size_t member_bytes = s.length / g.members.size();
    for (size_t m = 0; m < g.members.size(); ++m) {
      if (g.members[m].empty()) {
        return Invalid(absl::StrCat("packed group \"", s.name, "\": member name \"\" is empty"));
      }
      // The name moves into the set; on a duplicate, the set's message quotes it.
      absl::Status added = set.Add(
          {std::move(g.members[m]), s.dtype, member_shape, data + m * member_bytes, member_bytes});
      if (!added.ok()) {
        absl::string_view quoted = added.message();
        absl::ConsumePrefix(&quoted, "duplicate tensor name ");
        return Invalid(
            absl::StrCat("packed group \"", s.name, "\": member name ", quoted, " repeats"));
      }
    }
  }
  return set;
}

absl::StatusOr<TensorSet> ReadBlobFile(const std::string& path, bool verify) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  auto holder = std::make_shared<MappedFile>(std::move(*mapped));
  auto set = ParseBlob(holder->bytes(), holder, verify);
  if (!set.ok()) {
    return absl::Status(set.status().code(), absl::StrCat(path, ": ", set.status().message()));
  }
  return set;
}

}  // namespace loradb

#include "storage/formats/safetensors.h"

#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "storage/util/file_util.h"
#include "storage/util/json.h"
#include "storage/util/status_macros.h"

namespace loradb::safetensors {
namespace {

constexpr size_t kLengthPrefix = 8;

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", what));
}

// Prefixes a status message with the file it came from.
absl::Status WithPath(const absl::Status& status, const std::string& path) {
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

absl::string_view SimdjsonError(simdjson::error_code err) { return simdjson::error_message(err); }

// The data_offsets of one header entry, checked after all entries are read.
struct Offsets {
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Order the reference writer uses: dtype "rank" as in the reference's Dtype enum, descending.
int DTypeSortRank(DType d) {
  switch (d) {
    case DType::kBool:
      return 0;
    case DType::kU8:
      return 4;
    case DType::kI8:
      return 5;
    case DType::kF8E5M2:
      return 6;
    case DType::kF8E4M3:
      return 7;
    case DType::kI16:
      return 9;
    case DType::kU16:
      return 10;
    case DType::kF16:
      return 11;
    case DType::kBF16:
      return 12;
    case DType::kI32:
      return 13;
    case DType::kU32:
      return 14;
    case DType::kF32:
      return 15;
    case DType::kF64:
      return 17;
    case DType::kI64:
      return 18;
    case DType::kU64:
      return 19;
  }
  return -1;
}

std::string Quoted(std::string_view s) {
  std::string out;
  AppendJsonString(absl::string_view(s.data(), s.size()), &out);
  return out;
}

absl::StatusOr<uint64_t> GetUnsigned(simdjson::dom::element e, absl::string_view what,
                                     std::string_view tensor) {
  uint64_t v = 0;
  if (e.get_uint64().get(v) != simdjson::SUCCESS) {
    return Invalid(absl::StrCat("tensor ", Quoted(tensor), ": ", what,
                                " must be a non-negative integer, got ", simdjson::to_string(e)));
  }
  return v;
}

// Reads one header entry into `view` (name, dtype, shape; no data yet) and `offsets`.
absl::Status ParseTensorInfo(std::string_view name, simdjson::dom::element value, TensorView* view,
                             Offsets* offsets) {
  simdjson::dom::object info;
  if (value.get_object().get(info) != simdjson::SUCCESS) {
    return Invalid(
        absl::StrCat("tensor ", Quoted(name), ": expected an object {dtype, shape, data_offsets}"));
  }
  bool have_dtype = false, have_shape = false, have_offsets = false;
  for (auto field : info) {
    std::string_view key = field.key;
    bool* seen = nullptr;
    if (key == "dtype") {
      seen = &have_dtype;
    } else if (key == "shape") {
      seen = &have_shape;
    } else if (key == "data_offsets") {
      seen = &have_offsets;
    } else {
      continue;  // The reference ignores unknown fields.
    }
    if (*seen) {
      return Invalid(absl::StrCat("tensor ", Quoted(name), ": duplicate field \"",
                                  absl::string_view(key.data(), key.size()), "\""));
    }
    *seen = true;
    if (seen == &have_dtype) {
      std::string_view dtype;
      if (field.value.get_string().get(dtype) != simdjson::SUCCESS) {
        return Invalid(absl::StrCat("tensor ", Quoted(name), ": dtype must be a string"));
      }
      auto parsed = ParseDType(absl::string_view(dtype.data(), dtype.size()));
      if (!parsed.ok()) {
        return Invalid(absl::StrCat("tensor ", Quoted(name), ": ", parsed.status().message()));
      }
      view->dtype = *parsed;
    } else if (seen == &have_shape) {
      simdjson::dom::array dims;
      if (field.value.get_array().get(dims) != simdjson::SUCCESS) {
        return Invalid(absl::StrCat("tensor ", Quoted(name), ": shape must be an array"));
      }
      view->shape.reserve(dims.size());
      for (simdjson::dom::element d : dims) {
        LORADB_ASSIGN_OR_RETURN(uint64_t dim, GetUnsigned(d, "shape dimension", name));
        if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Invalid(
              absl::StrCat("tensor ", Quoted(name), ": shape dimension ", dim, " overflows"));
        }
        view->shape.push_back(static_cast<int64_t>(dim));
      }
    } else {
      simdjson::dom::array pair;
      if (field.value.get_array().get(pair) != simdjson::SUCCESS || pair.size() != 2) {
        return Invalid(absl::StrCat("tensor ", Quoted(name),
                                    ": data_offsets must be an array of two integers"));
      }
      auto it = pair.begin();
      LORADB_ASSIGN_OR_RETURN(offsets->begin, GetUnsigned(*it, "data_offsets[0]", name));
      ++it;
      LORADB_ASSIGN_OR_RETURN(offsets->end, GetUnsigned(*it, "data_offsets[1]", name));
    }
  }
  if (!have_dtype || !have_shape || !have_offsets) {
    const char* missing = !have_dtype ? "dtype" : (!have_shape ? "shape" : "data_offsets");
    return Invalid(absl::StrCat("tensor ", Quoted(name), ": missing field \"", missing, "\""));
  }
  view->name.assign(name.data(), name.size());
  return absl::OkStatus();
}

absl::Status ParseMetadata(simdjson::dom::element value,
                           std::map<std::string, std::string>* metadata) {
  if (value.is_null()) return absl::OkStatus();  // The reference accepts null.
  simdjson::dom::object obj;
  if (value.get_object().get(obj) != simdjson::SUCCESS) {
    return Invalid("__metadata__ must be an object of strings");
  }
  for (auto field : obj) {
    std::string_view v;
    if (field.value.get_string().get(v) != simdjson::SUCCESS) {
      return Invalid(absl::StrCat("__metadata__ value of ", Quoted(field.key),
                                  " must be a string, got ", simdjson::to_string(field.value)));
    }
    auto [it, inserted] = metadata->emplace(std::string(field.key), std::string(v));
    if (!inserted) {
      return Invalid(absl::StrCat("duplicate __metadata__ key ", Quoted(field.key)));
    }
  }
  return absl::OkStatus();
}

// simdjson reads the integer "-0" as 0; the reference (serde) rejects it as a shape dimension or
// offset. nlohmann keeps the sign apart ("-0" is number_integer, "0" number_unsigned), so when
// the header text contains "-0" at all (rare outside names) the numbers are checked again.
absl::Status CheckNoNegativeZero(const char* header, size_t len) {
  if (std::string_view(header, len).find("-0") == std::string_view::npos) {
    return absl::OkStatus();
  }
  absl::StatusOr<nlohmann::json> parsed = ParseJson(absl::string_view(header, len), "header");
  if (!parsed.ok() || !parsed->is_object()) return Invalid("header is not valid JSON");
  const nlohmann::json& j = *parsed;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__" || !it.value().is_object()) continue;
    for (const char* field : {"shape", "data_offsets"}) {
      auto f = it.value().find(field);
      if (f == it.value().end() || !f->is_array()) continue;
      for (const auto& v : *f) {
        if (!v.is_number_unsigned()) {
          return Invalid(absl::StrCat("tensor ", Quoted(it.key()), ": ", field,
                                      " must hold non-negative integers, got ", v.dump()));
        }
      }
    }
  }
  return absl::OkStatus();
}

// Parser reused per thread: allocation dominates parsing time for small headers.
simdjson::dom::parser& ThreadParser() {
  thread_local simdjson::dom::parser parser;
  return parser;
}

}  // namespace

void AppendJsonString(absl::string_view s, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (u < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[u >> 4]);
          out->push_back(kHex[u & 0xf]);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

absl::StatusOr<TensorSet> Parse(std::span<const std::byte> bytes,
                                std::shared_ptr<const void> backing) {
  if (bytes.size() < kLengthPrefix) {
    return Invalid(
        absl::StrCat("file is ", bytes.size(), " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  }
  if (header_len > kMaxHeaderBytes) {
    return Invalid(absl::StrCat("header length ", header_len, " exceeds the limit of ",
                                kMaxHeaderBytes, " bytes"));
  }
  if (header_len > bytes.size() - kLengthPrefix) {
    return Invalid(absl::StrCat("header length ", header_len, " runs past the end of the file (",
                                bytes.size(), " bytes)"));
  }
  const char* header = reinterpret_cast<const char*>(bytes.data() + kLengthPrefix);
  if (!simdjson::validate_utf8(header, header_len)) {
    return Invalid("header is not valid UTF-8");
  }
  // simdjson reads up to SIMDJSON_PADDING bytes past the JSON text: when the data section
  // provides them (any file with tensors of 64+ bytes) the header is parsed in place, else
  // from a padded copy.
  simdjson::padded_string padded;
  simdjson::dom::element doc;
  const bool in_place = bytes.size() - kLengthPrefix - header_len >= simdjson::SIMDJSON_PADDING;
  if (!in_place) padded = simdjson::padded_string(header, header_len);
  auto parsed = in_place ? ThreadParser().parse(header, header_len, /*realloc_if_needed=*/false)
                         : ThreadParser().parse(padded);
  if (auto err = parsed.get(doc); err != simdjson::SUCCESS) {
    return Invalid(absl::StrCat("header is not valid JSON: ", SimdjsonError(err)));
  }
  simdjson::dom::object root;
  if (doc.get_object().get(root) != simdjson::SUCCESS) {
    return Invalid("header must be a JSON object");
  }
  LORADB_RETURN_IF_ERROR(CheckNoNegativeZero(header, header_len));

  // One pass over the header: each entry becomes a view (its name is the only allocation
  // besides the shape), duplicate names are caught by the set's index (one hash per name), and
  // the offsets are checked afterwards in offset order.
  const size_t fields = root.size();
  std::vector<TensorView> views;
  std::vector<Offsets> offsets;
  views.reserve(fields);
  offsets.reserve(fields);
  TensorSet set(std::move(backing));
  bool have_metadata = false;
  for (auto field : root) {
    std::string_view key = field.key;
    if (key == "__metadata__") {
      if (have_metadata) return Invalid("duplicate __metadata__ entry");
      have_metadata = true;
      LORADB_RETURN_IF_ERROR(ParseMetadata(field.value, &set.metadata()));
      continue;
    }
    LORADB_RETURN_IF_ERROR(
        ParseTensorInfo(key, field.value, &views.emplace_back(), &offsets.emplace_back()));
  }

  // Index every entry in header order (a duplicate name is reported before any offset
  // problem). Views point at their data only once the offsets below have been checked.
  const uint64_t data_size = bytes.size() - kLengthPrefix - header_len;
  const std::byte* data = bytes.data() + kLengthPrefix + header_len;
  set.Reserve(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    const Offsets& o = offsets[i];
    if (o.begin <= o.end && o.end <= data_size) {
      views[i].data = data + o.begin;
      views[i].nbytes = static_cast<size_t>(o.end - o.begin);
    }
    if (absl::Status added = set.Add(std::move(views[i])); !added.ok()) {
      return Invalid(added.message());
    }
  }

  // As the reference: order by offsets, then require contiguity from 0 and exact sizes. Files
  // written by the reference (and by Serialize) list entries in offset order already.
  std::vector<uint32_t> order;  // empty: header order is offset order
  auto before = [&](size_t a, size_t b) {
    return std::tie(offsets[a].begin, offsets[a].end) < std::tie(offsets[b].begin, offsets[b].end);
  };
  for (size_t i = 1; i < offsets.size(); ++i) {
    if (before(i, i - 1)) {
      order.resize(offsets.size());
      for (size_t j = 0; j < order.size(); ++j) order[j] = static_cast<uint32_t>(j);
      std::stable_sort(order.begin(), order.end(), before);
      break;
    }
  }
  uint64_t expected_begin = 0;
  for (size_t k = 0; k < offsets.size(); ++k) {
    const size_t i = order.empty() ? k : order[k];
    const TensorView& v = set.tensors()[i];
    const Offsets& o = offsets[i];
    if (o.begin != expected_begin || o.end < o.begin) {
      return Invalid(absl::StrCat("tensor ", Quoted(v.name), ": data_offsets [", o.begin, ", ",
                                  o.end, "] are not contiguous (expected to start at ",
                                  expected_begin, ")"));
    }
    auto nbytes = CheckedNumBytes(v.shape, v.dtype);
    if (!nbytes.ok()) {
      return Invalid(absl::StrCat("tensor ", Quoted(v.name), ": ", nbytes.status().message()));
    }
    if (o.end - o.begin != *nbytes) {
      return Invalid(absl::StrCat("tensor ", Quoted(v.name), ": data_offsets span ",
                                  o.end - o.begin, " bytes but ", DTypeName(v.dtype), " ",
                                  ShapeString(v.shape), " needs ", *nbytes));
    }
    if (o.end > data_size) {
      return Invalid(absl::StrCat("tensor ", Quoted(v.name), ": data_offsets end ", o.end,
                                  " is past the data section (", data_size, " bytes)"));
    }
    expected_begin = o.end;
  }
  if (expected_begin != data_size) {
    return Invalid(absl::StrCat("data section is ", data_size, " bytes but tensors cover ",
                                expected_begin, " (file not covered exactly)"));
  }
  if (order.empty()) return set;
  // Rare: a header out of offset order. The set lists tensors in offset order, as always.
  TensorSet sorted(set.backing());
  sorted.Reserve(order.size());
  sorted.metadata() = std::move(set.metadata());
  for (uint32_t i : order) LORADB_RETURN_IF_ERROR(sorted.Add(set.tensors()[i]));
  return sorted;
}

absl::StatusOr<TensorSet> ReadFile(const std::string& path) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  auto holder = std::make_shared<MappedFile>(std::move(*mapped));
  std::span<const std::byte> bytes = holder->bytes();
  auto set = Parse(bytes, holder);
  if (!set.ok()) return WithPath(set.status(), path);
  return set;
}

absl::StatusOr<TensorSet> ReadSharded(const std::string& index_json_path) {
  LORADB_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_json_path));
  absl::StatusOr<nlohmann::ordered_json> parsed =
      ParseJson<nlohmann::ordered_json>(text, index_json_path);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::ordered_json& index = *parsed;
  if (!index.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_json_path, ": sharded index is not a JSON object"));
  }
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_json_path, ": sharded index has no \"weight_map\" object"));
  }
  const std::filesystem::path parent = std::filesystem::path(index_json_path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();

  // Load each distinct shard once, in first-mention order.
  std::vector<std::string> shard_order;
  absl::flat_hash_map<std::string, TensorSet> shards;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(index_json_path, ": weight_map entry ",
                                                     Quoted(it.key()), " is not a file name"));
    }
    std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      return absl::InvalidArgumentError(absl::StrCat(index_json_path, ": shard file name ",
                                                     Quoted(shard), " must be a plain file name"));
    }
    if (shards.contains(shard)) continue;
    LORADB_ASSIGN_OR_RETURN(TensorSet set, ReadFile(dir + "/" + shard));
    shard_order.push_back(shard);
    shards.emplace(shard, std::move(set));
  }

  auto backings = std::make_shared<std::vector<std::shared_ptr<const void>>>();
  for (const auto& s : shard_order) backings->push_back(shards.at(s).backing());
  TensorSet out(backings);
  absl::flat_hash_map<std::string, size_t> claimed;  // shard -> tensors the index assigns to it
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    std::string shard = it.value().get<std::string>();
    const TensorView* v = shards.at(shard).Find(it.key());
    if (v == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_json_path, ": tensor ", Quoted(it.key()), " is not in shard ", shard));
    }
    absl::Status st = out.Add(*v);
    if (!st.ok())
      return absl::InvalidArgumentError(absl::StrCat(index_json_path, ": ", st.message()));
    ++claimed[shard];
  }
  for (const auto& s : shard_order) {
    if (claimed[s] != shards.at(s).size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_json_path, ": shard ", s, " holds ", shards.at(s).size(),
                       " tensors but the weight_map lists ", claimed[s], " for it"));
    }
  }
  auto meta = index.find("metadata");
  if (meta != index.end() && meta->is_object()) {
    for (auto it = meta->begin(); it != meta->end(); ++it) {
      out.metadata()[it.key()] =
          it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    }
  }
  return out;
}

absl::StatusOr<std::string> Serialize(const std::vector<TensorView>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorView*> order;
  order.reserve(tensors.size());
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(tensors.size());
  for (const TensorView& t : tensors) {
    if (t.name == "__metadata__") return Invalid("tensor name \"__metadata__\" is reserved");
    if (!names.insert(t.name).second) {
      return Invalid(absl::StrCat("duplicate tensor name ", Quoted(t.name)));
    }
    auto nbytes = CheckedNumBytes(t.shape, t.dtype);
    if (!nbytes.ok()) {
      return Invalid(absl::StrCat("tensor ", Quoted(t.name), ": ", nbytes.status().message()));
    }
    if (*nbytes != t.nbytes) {
      return Invalid(absl::StrCat("tensor ", Quoted(t.name), ": ", t.nbytes, " bytes given but ",
                                  DTypeName(t.dtype), " ", ShapeString(t.shape), " needs ",
                                  *nbytes));
    }
    if (t.nbytes > 0 && t.data == nullptr) {
      return Invalid(absl::StrCat("tensor ", Quoted(t.name), ": null data"));
    }
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const TensorView* a, const TensorView* b) {
    int ra = DTypeSortRank(a->dtype), rb = DTypeSortRank(b->dtype);
    if (ra != rb) return ra > rb;
    return a->name < b->name;
  });

  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header.append("\"__metadata__\":{");
    for (const auto& [k, v] : metadata) {
      if (!first) header.push_back(',');
      first = false;
      AppendJsonString(k, &header);
      header.push_back(':');
      AppendJsonString(v, &header);
    }
    header.push_back('}');
    first = false;
  }
  uint64_t offset = 0;
  for (const TensorView* t : order) {
    if (!first) header.push_back(',');
    first = false;
    AppendJsonString(t->name, &header);
    absl::StrAppend(&header, ":{\"dtype\":\"", DTypeName(t->dtype), "\",\"shape\":[");
    for (size_t i = 0; i < t->shape.size(); ++i) {
      absl::StrAppend(&header, i == 0 ? "" : ",", t->shape[i]);
    }
    absl::StrAppend(&header, "],\"data_offsets\":[", offset, ",", offset + t->nbytes, "]}");
    offset += t->nbytes;
  }
  header.push_back('}');
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxHeaderBytes) {
    return Invalid(absl::StrCat("header would be ", header.size(), " bytes, over the limit of ",
                                kMaxHeaderBytes));
  }

  std::string out;
  out.reserve(kLengthPrefix + header.size() + offset);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(header);
  for (const TensorView* t : order) {
    if (t->nbytes > 0) out.append(reinterpret_cast<const char*>(t->data), t->nbytes);
  }
  return out;
}

absl::Status WriteFile(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  LORADB_ASSIGN_OR_RETURN(std::string bytes, Serialize(tensors, metadata));
  return WriteFileAtomic(path, bytes);
}

}  // namespace loradb::safetensors

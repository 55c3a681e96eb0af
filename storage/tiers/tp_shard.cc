#include "storage/tiers/tp_shard.h"

#include <cstring>
#include <initializer_list>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "storage/formats/peft.h"
#include "storage/tiers/host_buffer.h"
#include "storage/util/status_macros.h"

namespace loradb::tiers {
namespace {

constexpr uint64_t kSliceAlign = 64;

bool EndsWithAny(const std::string& s, std::initializer_list<const char*> suffixes) {
  for (const char* suffix : suffixes) {
    if (absl::EndsWith(s, suffix)) return true;
  }
  return false;
}

// The projection of a module key ("...self_attn.q_proj", "...mlp.experts.3.up_proj").
bool IsColumnParallel(const std::string& module) {
  return EndsWithAny(module, {".q_proj", ".k_proj", ".v_proj", ".gate_proj", ".up_proj"});
}
bool IsRowParallel(const std::string& module) {
  return EndsWithAny(module, {".o_proj", ".down_proj"});
}

// Bytes per element of `view` times the product of dims after `dim`, the number of blocks
// before it, and the dim itself.
struct SplitGeometry {
  uint64_t outer = 1;  // product of dims before the split dim
  int64_t dim = 0;     // the split dim's size
  uint64_t inner = 0;  // bytes of one index of the split dim
};

SplitGeometry Geometry(const std::vector<int64_t>& shape, DType dtype, int split) {
  SplitGeometry g;
  g.inner = DTypeSize(dtype);
  for (size_t i = 0; i < shape.size(); ++i) {
    const auto d = static_cast<uint64_t>(shape[i]);
    if (static_cast<int>(i) < split) {
      g.outer *= d;
    } else if (static_cast<int>(i) > split) {
      g.inner *= d;
    }
  }
  g.dim = shape[static_cast<size_t>(split)];
  return g;
}

// An owned aligned buffer holding `sizes` back to back (each 64-byte aligned); returns the
// buffer and the offset of each.
absl::StatusOr<std::shared_ptr<HostBuffer>> AllocateFor(const std::vector<uint64_t>& sizes,
                                                        std::vector<uint64_t>* offsets) {
  uint64_t total = 0;
  offsets->clear();
  for (uint64_t n : sizes) {
    offsets->push_back(total);
    total = AlignUp(total + n, kSliceAlign);
  }
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> buf,
                          HostBuffer::Allocate(total == 0 ? kSliceAlign : total,
                                               /*pin=*/false));
  return std::shared_ptr<HostBuffer>(std::move(buf));
}

}  // namespace

absl::Status ValidateTpShard(const TpShardSpec& spec) {
  if (spec.degree < 1) {
    return absl::InvalidArgumentError(absl::StrCat("TP degree ", spec.degree, " must be >= 1"));
  }
  if (spec.rank < 0 || spec.rank >= spec.degree) {
    return absl::InvalidArgumentError(
        absl::StrCat("TP rank ", spec.rank, " is outside [0, ", spec.degree, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> TpLocalConfig(const ModelConfig& config, int degree) {
  LORADB_RETURN_IF_ERROR(ValidateTpShard({0, degree}));
  ModelConfig local = config;
  auto divide = [&](const char* field, int64_t* value) -> absl::Status {
    if (*value % degree != 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, " = ", *value,
                                                     " is not divisible by the TP degree ", degree,
                                                     ": ranks must hold whole heads"));
    }
    *value /= degree;
    return absl::OkStatus();
  };
  LORADB_RETURN_IF_ERROR(divide("num_attention_heads", &local.num_attention_heads));
  LORADB_RETURN_IF_ERROR(divide("num_key_value_heads", &local.num_key_value_heads));
  LORADB_RETURN_IF_ERROR(divide("intermediate_size", &local.intermediate_size));
  if (config.is_moe()) {
    LORADB_RETURN_IF_ERROR(divide("moe_intermediate_size", &local.moe_intermediate_size));
  }
  return local;
}

const char* TpAxisName(TpAxis axis) {
  switch (axis) {
    case TpAxis::kReplicated:
      return "replicated";
    case TpAxis::kOut:
      return "out";
    case TpAxis::kIn:
      return "in";
    case TpAxis::kFirstRankOnly:
      return "first-rank-only";
  }
  return "?";
}

TpAxis BaseTensorAxis(const std::string& name) {
  if (!absl::StartsWith(name, "model.layers.")) return TpAxis::kReplicated;
  std::string module;
  bool bias = false;
  if (absl::EndsWith(name, ".weight")) {
    module = name.substr(0, name.size() - 7);
  } else if (absl::EndsWith(name, ".bias")) {
    module = name.substr(0, name.size() - 5);
    bias = true;
  } else {
    return TpAxis::kReplicated;
  }
  if (IsColumnParallel(module)) return TpAxis::kOut;
  if (IsRowParallel(module)) return bias ? TpAxis::kFirstRankOnly : TpAxis::kIn;
  return TpAxis::kReplicated;
}

TpAxis AdapterTensorAxis(const std::string& name) {
  absl::StatusOr<peft::PeftTensorName> parsed = peft::ParsePeftTensorName(name);
  if (!parsed.ok() || parsed->embedding) return TpAxis::kReplicated;
  if (parsed->side == peft::LoraSide::kB && IsColumnParallel(parsed->module_key)) {
    return TpAxis::kOut;
  }
  if (parsed->side == peft::LoraSide::kA && IsRowParallel(parsed->module_key)) {
    return TpAxis::kIn;
  }
  return TpAxis::kReplicated;
}

absl::StatusOr<int> TpSplitDim(TpAxis axis, size_t ndim, const std::string& name) {
  if (axis == TpAxis::kReplicated || axis == TpAxis::kFirstRankOnly) return -1;
  if (ndim == 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" is a scalar; cannot ",
                                                   "split it along ", TpAxisName(axis)));
  }
  if (axis == TpAxis::kIn) {
    if (ndim < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\" is 1-D; an input-dimension split needs a matrix"));
    }
    return static_cast<int>(ndim) - 1;
  }
  return ndim == 1 ? 0 : static_cast<int>(ndim) - 2;
}

absl::StatusOr<TensorSet> SliceTensors(const TensorSet& whole,
                                       const std::function<TpAxis(const std::string&)>& axis_of,
                                       const TpShardSpec& spec) {
  LORADB_RETURN_IF_ERROR(ValidateTpShard(spec));
  struct Plan {
    const TensorView* src;
    TpAxis axis;
    int split;
    SplitGeometry g;
    uint64_t bytes;
  };
  std::vector<Plan> plans;
  std::vector<uint64_t> sizes;
  for (const TensorView& v : whole.tensors()) {
    Plan p{&v, axis_of(v.name), -1, {}, v.nbytes};
    LORADB_ASSIGN_OR_RETURN(p.split, TpSplitDim(p.axis, v.shape.size(), v.name));
    if (p.split >= 0) {
      p.g = Geometry(v.shape, v.dtype, p.split);
      if (p.g.dim % spec.degree != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", v.name, "\" (shape ", ShapeString(v.shape), ") has dimension ", p.split,
            " = ", p.g.dim, ", not divisible by the TP degree ", spec.degree));
      }
      p.bytes = v.nbytes / static_cast<uint64_t>(spec.degree);
    }
    plans.push_back(p);
    sizes.push_back(p.bytes);
  }
  std::vector<uint64_t> offsets;
  LORADB_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buf, AllocateFor(sizes, &offsets));
  TensorSet out(buf);
  out.metadata() = whole.metadata();
  for (size_t i = 0; i < plans.size(); ++i) {
    const Plan& p = plans[i];
    std::byte* dst = buf->data() + offsets[i];
    TensorView view{p.src->name, p.src->dtype, p.src->shape, dst, p.bytes};
    if (p.split < 0) {
      if (p.axis == TpAxis::kFirstRankOnly && spec.rank != 0) {
        std::memset(dst, 0, p.bytes);
      } else if (p.bytes > 0) {
        std::memcpy(dst, p.src->data, p.bytes);
      }
    } else {
      const int64_t local = p.g.dim / spec.degree;
      const uint64_t chunk = static_cast<uint64_t>(local) * p.g.inner;
      const uint64_t stride = static_cast<uint64_t>(p.g.dim) * p.g.inner;
      const uint64_t start = static_cast<uint64_t>(spec.rank) * chunk;
      for (uint64_t o = 0; o < p.g.outer; ++o) {
        std::memcpy(dst + o * chunk, p.src->data + o * stride + start, chunk);
      }
      view.shape[static_cast<size_t>(p.split)] = local;
    }
    LORADB_RETURN_IF_ERROR(out.Add(std::move(view)));
  }
  return out;
}

absl::StatusOr<TensorSet> ShardBaseCheckpoint(const ModelConfig& config, const TensorSet& whole,
                                              const TpShardSpec& spec) {
  LORADB_RETURN_IF_ERROR(ValidateTpShard(spec));
  LORADB_RETURN_IF_ERROR(TpLocalConfig(config, spec.degree).status());
  return SliceTensors(whole, BaseTensorAxis, spec);
}

absl::StatusOr<TensorSet> ShardAdapter(const ModelConfig& config, const TensorSet& whole,
                                       const TpShardSpec& spec) {
  LORADB_RETURN_IF_ERROR(ValidateTpShard(spec));
  LORADB_RETURN_IF_ERROR(TpLocalConfig(config, spec.degree).status());
  return SliceTensors(whole, AdapterTensorAxis, spec);
}

absl::StatusOr<const TensorSet*> AdapterShardFor(const TensorSet& host, const TpShardSpec& spec,
                                                 TensorSet* scratch) {
  LORADB_RETURN_IF_ERROR(ValidateTpShard(spec));
  auto degree = host.metadata().find(kTpDegreeKey);
  if (degree != host.metadata().end()) {
    auto rank = host.metadata().find(kTpRankKey);
    const std::string have_rank = rank == host.metadata().end() ? "?" : rank->second;
    if (degree->second != absl::StrCat(spec.degree) || have_rank != absl::StrCat(spec.rank)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the adapter is already the shard of TP rank ", have_rank, " of ",
                       degree->second, ", not of rank ", spec.rank, " of ", spec.degree));
    }
    return &host;
  }
  if (spec.degree == 1) return &host;
  LORADB_ASSIGN_OR_RETURN(*scratch, SliceTensors(host, AdapterTensorAxis, spec));
  return scratch;
}

absl::StatusOr<TensorSet> GatherAdapterShards(const std::vector<const TensorSet*>& shards) {
  if (shards.empty()) return absl::InvalidArgumentError("no shards to gather");
  const int degree = static_cast<int>(shards.size());
  for (int r = 0; r < degree; ++r) {
    if (shards[static_cast<size_t>(r)] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", r, " is null"));
    }
  }
  const TensorSet& first = *shards[0];
  for (int r = 1; r < degree; ++r) {
    if (shards[static_cast<size_t>(r)]->size() != first.size()) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", r, " has ",
                                                     shards[static_cast<size_t>(r)]->size(),
                                                     " tensors, shard 0 has ", first.size()));
    }
  }
  struct Plan {
    std::vector<const TensorView*> parts;  // per rank
    int split;
    std::vector<int64_t> shape;  // whole
    uint64_t bytes;
  };
  std::vector<Plan> plans;
  std::vector<uint64_t> sizes;
  for (const TensorView& v : first.tensors()) {
    Plan p{{&v}, -1, v.shape, v.nbytes};
    const TpAxis axis = AdapterTensorAxis(v.name);
    LORADB_ASSIGN_OR_RETURN(p.split, TpSplitDim(axis, v.shape.size(), v.name));
    for (int r = 1; r < degree; ++r) {
      const TensorView* o = shards[static_cast<size_t>(r)]->Find(v.name);
      if (o == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("shard ", r, " lacks tensor \"", v.name, "\""));
      }
      if (o->dtype != v.dtype || o->shape != v.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", v.name, "\": shard ", r, " is ", DTypeName(o->dtype), " ",
            ShapeString(o->shape), ", shard 0 is ", DTypeName(v.dtype), " ", ShapeString(v.shape)));
      }
      if (p.split < 0 && std::memcmp(o->data, v.data, v.nbytes) != 0) {
        return absl::InvalidArgumentError(absl::StrCat("replicated tensor \"", v.name,
                                                       "\" differs between shard 0 and shard ", r));
      }
      p.parts.push_back(o);
    }
    if (p.split >= 0) {
      p.shape[static_cast<size_t>(p.split)] *= degree;
      p.bytes = v.nbytes * static_cast<uint64_t>(degree);
    }
    plans.push_back(std::move(p));
    sizes.push_back(plans.back().bytes);
  }
  std::vector<uint64_t> offsets;
  LORADB_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buf, AllocateFor(sizes, &offsets));
  TensorSet out(buf);
  out.metadata() = first.metadata();
  for (size_t i = 0; i < plans.size(); ++i) {
    const Plan& p = plans[i];
    const TensorView& v0 = *p.parts[0];
    std::byte* dst = buf->data() + offsets[i];
    if (p.split < 0) {
      if (p.bytes > 0) std::memcpy(dst, v0.data, p.bytes);
    } else {
      const SplitGeometry g = Geometry(v0.shape, v0.dtype, p.split);
      const uint64_t chunk = static_cast<uint64_t>(g.dim) * g.inner;
      for (uint64_t o = 0; o < g.outer; ++o) {
        for (int r = 0; r < degree; ++r) {
          std::memcpy(dst + (o * static_cast<uint64_t>(degree) + static_cast<uint64_t>(r)) * chunk,
                      p.parts[static_cast<size_t>(r)]->data + o * chunk, chunk);
        }
      }
    }
    LORADB_RETURN_IF_ERROR(out.Add(TensorView{v0.name, v0.dtype, p.shape, dst, p.bytes}));
  }
  return out;
}

}  // namespace loradb::tiers

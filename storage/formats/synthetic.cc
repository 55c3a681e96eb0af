#include "storage/formats/synthetic.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace loradb {
namespace {

struct Planned {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;
  size_t nbytes = 0;
};

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A value in (-0.05, 0.05) as the bits of `dtype`.
void StoreValue(DType dtype, float v, std::byte* p) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (dtype == DType::kF32) {
    std::memcpy(p, &bits, 4);
  } else if (dtype == DType::kBF16) {
    uint16_t h = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
    std::memcpy(p, &h, 2);
  } else {  // F16, values are normal and small: no overflow or subnormal handling needed
    uint32_t sign = (bits >> 16) & 0x8000;
    int32_t exp = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
    uint32_t mant = (bits >> 13) & 0x3ff;
    uint16_t h = exp <= 0 ? static_cast<uint16_t>(sign)
                          : static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | mant);
    std::memcpy(p, &h, 2);
  }
}

}  // namespace

uint64_t SyntheticMoeSpec::tensor_count() const {
  return 2ull * static_cast<uint64_t>(layers) * (4ull + 3ull * static_cast<uint64_t>(experts));
}

absl::StatusOr<TensorSet> MakeSyntheticMoeAdapter(const SyntheticMoeSpec& s) {
  if (s.layers <= 0 || s.experts < 0 || s.rank <= 0 || s.hidden <= 0 || s.moe_intermediate <= 0 ||
      s.q_heads <= 0 || s.kv_heads <= 0 || s.head_dim <= 0) {
    return absl::InvalidArgumentError("synthetic adapter: sizes must be positive");
  }
  if (s.dtype != DType::kBF16 && s.dtype != DType::kF16 && s.dtype != DType::kF32) {
    return absl::InvalidArgumentError("synthetic adapter: dtype must be BF16, F16 or F32");
  }
  const size_t esize = DTypeSize(s.dtype);
  std::vector<Planned> plan;
  plan.reserve(s.tensor_count());
  size_t total = 0;
  auto add = [&](std::string base, int64_t in, int64_t out) {
    for (int side = 0; side < 2; ++side) {
      Planned p;
      p.name = absl::StrCat(base, side == 0 ? ".lora_A.weight" : ".lora_B.weight");
      p.shape = side == 0 ? std::vector<int64_t>{s.rank, in} : std::vector<int64_t>{out, s.rank};
      p.nbytes = static_cast<size_t>(s.rank * (side == 0 ? in : out)) * esize;
      p.offset = total;
      total += p.nbytes;
      plan.push_back(std::move(p));
    }
  };
  const int64_t q_out = s.q_heads * s.head_dim, kv_out = s.kv_heads * s.head_dim;
  for (int l = 0; l < s.layers; ++l) {
    std::string layer = absl::StrCat("base_model.model.model.layers.", l);
    add(absl::StrCat(layer, ".self_attn.q_proj"), s.hidden, q_out);
    add(absl::StrCat(layer, ".self_attn.k_proj"), s.hidden, kv_out);
    add(absl::StrCat(layer, ".self_attn.v_proj"), s.hidden, kv_out);
    add(absl::StrCat(layer, ".self_attn.o_proj"), q_out, s.hidden);
    for (int e = 0; e < s.experts; ++e) {
      std::string expert = absl::StrCat(layer, ".mlp.experts.", e);
      add(absl::StrCat(expert, ".gate_proj"), s.hidden, s.moe_intermediate);
      add(absl::StrCat(expert, ".up_proj"), s.hidden, s.moe_intermediate);
      add(absl::StrCat(expert, ".down_proj"), s.moe_intermediate, s.hidden);
    }
  }
  auto buffer = std::make_shared<std::vector<std::byte>>(total);
  uint64_t state = s.seed;
  for (size_t i = 0; i < total / esize; ++i) {
    float v = static_cast<float>(static_cast<int64_t>(SplitMix(&state) >> 40) - (1 << 23)) *
              (0.05f / static_cast<float>(1 << 23));
    StoreValue(s.dtype, v, buffer->data() + i * esize);
  }
  TensorSet set(buffer);
  for (Planned& p : plan) {
    absl::Status st = set.Add(
        {std::move(p.name), s.dtype, std::move(p.shape), buffer->data() + p.offset, p.nbytes});
    if (!st.ok()) return st;
  }
  return set;
}

TensorSet MakeTinyQProjAdapter(uint64_t seed) {
  constexpr size_t kA = 4 * 16, kB = 32 * 4;
  auto buffer = std::make_shared<std::vector<float>>(kA + kB);
  float* a = buffer->data();
  float* b = a + kA;
  for (size_t i = 0; i < kA; ++i) a[i] = static_cast<float>(seed) + 0.5f * i;
  for (size_t i = 0; i < kB; ++i) b[i] = static_cast<float>(seed) - 0.25f * i;
  const std::string module = "base_model.model.model.layers.0.self_attn.q_proj";
  TensorSet set(buffer);
  // Two distinct names into an empty set: Add cannot fail.
  set.Add({module + ".lora_A.weight",
           DType::kF32,
           {4, 16},
           reinterpret_cast<const std::byte*>(a),
           kA * sizeof(float)})
      .IgnoreError();
  set.Add({module + ".lora_B.weight",
           DType::kF32,
           {32, 4},
           reinterpret_cast<const std::byte*>(b),
           kB * sizeof(float)})
      .IgnoreError();
  return set;
}

}  // namespace loradb

// Scalar conversions between fp32 and bf16/fp16 bit patterns (round to nearest even), shared by
// the reference, the fast path and the tests. The functions are `static inline` on purpose: the
// fast path compiles some files for AVX-512/AVX2, and internal linkage keeps an ISA-specific
// copy from being merged into code that runs on CPUs without those instructions.
#ifndef LORADB_KERNELS_CPU_CONVERT_H_
#define LORADB_KERNELS_CPU_CONVERT_H_

#include <cstdint>
#include <cstring>

#include "kernels/lora_kernels.h"

namespace loradb::kernels {

static inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

static inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

static inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

static inline float F16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  // Shifting exponent+mantissa into place and scaling by 2^(127-15) is exact for normals and
  // subnormals; infinities and NaNs get the all-ones exponent.
  float mag = BitsToFloat(em << 13) * 0x1p112f;
  uint32_t bits = FloatToBits(mag);
  if (em >= 0x7c00u) bits = 0x7f800000u | (em & 0x3ffu) << 13;
  return BitsToFloat(bits | sign);
}

static inline uint16_t FloatToF16(float f) {
  uint32_t u = FloatToBits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Result is subnormal (or zero): scale so the fp16 subnormal step (2^-24) becomes 1.0 and
    // let the fp32 adder round to nearest even.
    float scaled = BitsToFloat(a) * 0x1p24f;
    // scaled < 2^10, so adding 2^23 rounds it to an integer held in the low mantissa bits
    // (2^10 itself becomes the smallest normal, which is the right encoding).
    uint32_t m = FloatToBits(scaled + 0x1p23f) - FloatToBits(0x1p23f);
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t r = a - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

// Element `i` of an array of `dtype`, as fp32.
static inline float LoadAsFloat(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}

// Stores fp32 `v` as element `i` of an array of `dtype` (rounded to nearest even).
static inline void StoreFromFloat(void* p, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = FloatToBf16(v);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = FloatToF16(v);
      return;
  }
}

}  // namespace loradb::kernels

#endif  // LORADB_KERNELS_CPU_CONVERT_H_

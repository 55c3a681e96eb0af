#include "compute/trainer/rng.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace loradb::trainer {
namespace {

uint64_t SplitMix64(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& w : s_) w = SplitMix64(&x);
}

uint64_t Rng::NextU64() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

uint64_t Rng::Below(uint64_t n) {
  // Rejection sampling keeps the result exactly uniform.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t v;
  do {
    v = NextU64();
  } while (v >= limit);
  return v % n;
}

double Rng::Normal() {
  double u1 = Uniform();
  while (u1 <= 0.0) u1 = Uniform();
  const double u2 = Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

std::string Rng::Serialize() const {
  std::string out;
  char buf[17];
  for (uint64_t w : s_) {
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(w));
    out += buf;
  }
  return out;
}

absl::StatusOr<Rng> Rng::Restore(const std::string& text) {
  if (text.size() != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("RNG state must be 64 hex digits, got ", text.size(), " characters"));
  }
  Rng rng;
  bool any = false;
  for (int i = 0; i < 4; ++i) {
    uint64_t w = 0;
    for (int j = 0; j < 16; ++j) {
      const char c = text[i * 16 + j];
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("RNG state has a non-hex character '", std::string(1, c), "'"));
      }
      w = (w << 4) | static_cast<uint64_t>(d);
    }
    rng.s_[i] = w;
    any = any || w != 0;
  }
  if (!any) return absl::InvalidArgumentError("RNG state is all zero (not a valid state)");
  return rng;
}

}  // namespace loradb::trainer

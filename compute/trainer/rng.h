// A small, fully specified pseudo-random generator (xoshiro256**, seeded through splitmix64)
// whose whole state is four words, so a trainer can save it in a checkpoint and resume the
// exact same stream on any machine. Used for data order, LoRA initialisation and sampling.
#ifndef LORADB_COMPUTE_TRAINER_RNG_H_
#define LORADB_COMPUTE_TRAINER_RNG_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace loradb::trainer {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0);

  uint64_t NextU64();
  // Uniform in [0, 1) with 53 random bits.
  double Uniform();
  // Uniform integer in [0, n); n must be > 0.
  uint64_t Below(uint64_t n);
  // Standard normal (Box-Muller; no cached second value, so the state is just the words).
  double Normal();

  // The state as 64 hex characters; Restore(Serialize()) continues the same stream.
  std::string Serialize() const;
  // InvalidArgument unless `text` is what Serialize produced (64 hex digits, not all zero).
  [[nodiscard]] static absl::StatusOr<Rng> Restore(const std::string& text);

  bool operator==(const Rng&) const = default;

 private:
  std::array<uint64_t, 4> s_{};
};

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_RNG_H_

// Eviction policies for the CPU cache (and the trace benchmark, which replays request traces
// against them). A policy tracks resident keys with their sizes and picks victims; it never
// owns data. Keys it must not evict (leased entries) are excluded by the caller's predicate.
//
// - LRU: least recently used first.
// - S3-FIFO (Yang et al., SOSP'23): a small FIFO (10% of the bytes) filters one-hit wonders,
//   survivors move to a main FIFO with 2-bit frequency and reinsertion, a ghost FIFO of
//   recently evicted keys sends returning keys straight to main.
// - W-TinyLFU (Einziger et al., 2017): a 1% LRU window, then a segmented-LRU main area
//   (probation 20%, protected 80%); a window victim enters main only if a count-min sketch
//   (8-bit counters, conservative update, halved every 320x-entries samples) says it is more
//   frequent than main's victim. Main's victim is the least frequent of the 64 coldest
//   probation entries, a count being halved per 64x-entries requests the entry has been idle.
//   A shift detector (a jump in misses on recently re-requested keys) clears the sketch and
//   puts protected entries back on probation when the popular keys change wholesale. The
//   default: see docs/bench/notes/measurements.md, section tiers/traces.
#ifndef LORADB_STORAGE_TIERS_EVICTION_H_
#define LORADB_STORAGE_TIERS_EVICTION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb::tiers {

enum class EvictionPolicyKind { kLru, kS3Fifo, kWTinyLfu };

// "lru", "s3fifo", "wtinylfu".
const char* EvictionPolicyName(EvictionPolicyKind kind);
[[nodiscard]] absl::StatusOr<EvictionPolicyKind> ParseEvictionPolicy(absl::string_view name);

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  // A key was requested (hit or miss). Frequency-based policies count it.
  virtual void RecordAccess(uint64_t key) = 0;
  // `key` (absent) became resident with `bytes`.
  virtual void Insert(uint64_t key, uint64_t bytes) = 0;
  // A resident key was hit.
  virtual void Touch(uint64_t key) = 0;
  // A resident key was removed by the caller (explicit evict); no-op if absent.
  virtual void Erase(uint64_t key) = 0;
  // Picks a resident key for which `can_evict` is true, forgets it and returns it; nullopt
  // when no resident key may be evicted.
  virtual std::optional<uint64_t> EvictOne(const std::function<bool(uint64_t)>& can_evict) = 0;
  // Popularity shifts the policy detected and reacted to (W-TinyLFU; 0 for the others).
  virtual uint64_t detected_shifts() const { return 0; }
};

// A policy for a cache of `capacity_bytes`; `expected_entries` sizes frequency sketches.
std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(EvictionPolicyKind kind, uint64_t capacity_bytes,
                                                   uint64_t expected_entries);

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_EVICTION_H_

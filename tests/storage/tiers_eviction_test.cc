#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "storage/tiers/eviction.h"

namespace loradb::tiers {
namespace {

const auto kAny = [](uint64_t) { return true; };

// Replays `keys` against a policy holding `capacity` unit-size entries; returns the misses.
int Replay(EvictionPolicy& p, const std::vector<uint64_t>& keys, size_t capacity,
           std::set<uint64_t>* resident) {
  int misses = 0;
  for (uint64_t k : keys) {
    p.RecordAccess(k);
    if (resident->contains(k)) {
      p.Touch(k);
      continue;
    }
    ++misses;
    p.Insert(k, 1);
    resident->insert(k);
    while (resident->size() > capacity) {
      auto v = p.EvictOne(kAny);
      EXPECT_TRUE(v.has_value());
      EXPECT_TRUE(resident->erase(*v) == 1) << "policy evicted a key that is not resident";
    }
  }
  return misses;
}

TEST(EvictionTest, ParseNames) {
  for (auto k :
       {EvictionPolicyKind::kLru, EvictionPolicyKind::kS3Fifo, EvictionPolicyKind::kWTinyLfu}) {
    EXPECT_EQ(*ParseEvictionPolicy(EvictionPolicyName(k)), k);
  }
  EXPECT_FALSE(ParseEvictionPolicy("clock").ok());
}

TEST(EvictionTest, LruEvictsLeastRecentlyUsed) {
  auto p = MakeEvictionPolicy(EvictionPolicyKind::kLru, 3, 3);
  p->Insert(1, 1);
  p->Insert(2, 1);
  p->Insert(3, 1);
  p->Touch(1);
  EXPECT_EQ(p->EvictOne(kAny), 2u);
  EXPECT_EQ(p->EvictOne([](uint64_t k) { return k != 3; }), 1u);  // 3 is leased
  EXPECT_EQ(p->EvictOne([](uint64_t) { return false; }), std::nullopt);
  p->Erase(3);
  EXPECT_EQ(p->EvictOne(kAny), std::nullopt);
}

class ScanResistanceTest : public ::testing::TestWithParam<EvictionPolicyKind> {};

// A hot set of 20 keys reused constantly, polluted by a long scan of one-time keys: a
// scan-resistant policy keeps (most of) the hot set, LRU loses it.
TEST_P(ScanResistanceTest, HotSetSurvivesAScan) {
  auto p = MakeEvictionPolicy(GetParam(), 40, 40);
  std::vector<uint64_t> keys;
  for (int round = 0; round < 20; ++round)
    for (uint64_t k = 0; k < 20; ++k) keys.push_back(k);
  for (uint64_t k = 1000; k < 1200; ++k) keys.push_back(k);  // the scan
  std::set<uint64_t> resident;
  Replay(*p, keys, 40, &resident);
  int hot_left = 0;
  for (uint64_t k = 0; k < 20; ++k) hot_left += resident.contains(k);
  if (GetParam() == EvictionPolicyKind::kLru) {
    EXPECT_EQ(hot_left, 0);
  } else {
    EXPECT_GE(hot_left, 18) << EvictionPolicyName(GetParam());
  }
}

TEST_P(ScanResistanceTest, NeverEvictsWhatTheCallerForbids) {
  auto p = MakeEvictionPolicy(GetParam(), 10, 10);
  for (uint64_t k = 0; k < 10; ++k) p->Insert(k, 1);
  for (uint64_t k = 0; k < 10; k += 2) p->Touch(k);
  std::set<uint64_t> evicted;
  while (auto v = p->EvictOne([](uint64_t k) { return k % 3 != 0; })) {
    EXPECT_NE(*v % 3, 0u);
    EXPECT_TRUE(evicted.insert(*v).second);
  }
  EXPECT_EQ(evicted.size(), 6u);  // 1 2 4 5 7 8
}

// Requests drawn from `hot` (90%, rank k with weight 1/(k+1)) and from fresh one-time ids
// (10%), `n` of them.
void AppendSkewed(const std::vector<uint64_t>& hot, int n, std::mt19937_64& rng,
                  uint64_t* next_fresh, std::vector<uint64_t>* keys) {
  std::vector<double> cdf;
  double sum = 0;
  for (size_t k = 0; k < hot.size(); ++k) cdf.push_back(sum += 1.0 / static_cast<double>(k + 1));
  std::uniform_real_distribution<double> u(0, 1);
  for (int i = 0; i < n; ++i) {
    if (u(rng) < 0.1) {
      keys->push_back((*next_fresh)++);
      continue;
    }
    size_t k = std::lower_bound(cdf.begin(), cdf.end(), u(rng) * sum) - cdf.begin();
    keys->push_back(hot[std::min(k, hot.size() - 1)]);
  }
}

// The popular keys change wholesale: W-TinyLFU detects the shift once, and the new hot keys
// take over the cache quickly (before the fix they waited for their old rivals' counts to
// decay, tens of thousands of requests).
TEST(WTinyLfuShiftTest, DetectsAShiftAndAdmitsTheNewHotSet) {
  const size_t kCapacity = 64;
  auto p = MakeEvictionPolicy(EvictionPolicyKind::kWTinyLfu, kCapacity, kCapacity);
  std::mt19937_64 rng(7);
  uint64_t fresh = 1'000'000;
  std::vector<uint64_t> a, b, keys;
  for (uint64_t k = 0; k < 128; ++k) a.push_back(k);
  for (uint64_t k = 500; k < 628; ++k) b.push_back(k);
  AppendSkewed(a, 20'000, rng, &fresh, &keys);
  std::set<uint64_t> resident;
  Replay(*p, keys, kCapacity, &resident);
  EXPECT_EQ(p->detected_shifts(), 0u) << "a stationary workload is not a shift";
  keys.clear();
  AppendSkewed(b, 1'000, rng, &fresh, &keys);
  Replay(*p, keys, kCapacity, &resident);
  EXPECT_EQ(p->detected_shifts(), 1u);
  int new_hot = 0;
  for (uint64_t k = 500; k < 532; ++k) new_hot += resident.contains(k);
  EXPECT_GE(new_hot, 28) << "of the 32 most popular new keys, 1,000 requests after the shift";
}

// Scans of one-time keys between stretches of a stationary hot set are not shifts: the
// detector stays quiet and the hot set survives every scan.
TEST(WTinyLfuShiftTest, ScansAreNotShifts) {
  const size_t kCapacity = 64;
  auto p = MakeEvictionPolicy(EvictionPolicyKind::kWTinyLfu, kCapacity, kCapacity);
  std::mt19937_64 rng(8);
  uint64_t fresh = 1'000'000;
  std::vector<uint64_t> hot;
  for (uint64_t k = 0; k < 128; ++k) hot.push_back(k);
  std::set<uint64_t> resident;
  for (int round = 0; round < 10; ++round) {
    std::vector<uint64_t> keys;
    AppendSkewed(hot, 5'000, rng, &fresh, &keys);
    for (int i = 0; i < 500; ++i) keys.push_back(fresh++);  // the scan
    Replay(*p, keys, kCapacity, &resident);
    int top = 0;
    for (uint64_t k = 0; k < 16; ++k) top += resident.contains(k);
    EXPECT_GE(top, 15) << "round " << round;
  }
  EXPECT_EQ(p->detected_shifts(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Policies, ScanResistanceTest,
                         ::testing::Values(EvictionPolicyKind::kLru, EvictionPolicyKind::kS3Fifo,
                                           EvictionPolicyKind::kWTinyLfu),
                         [](const auto& info) { return EvictionPolicyName(info.param); });

}  // namespace
}  // namespace loradb::tiers

#include <gtest/gtest.h>

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

INSTANTIATE_TEST_SUITE_P(Policies, ScanResistanceTest,
                         ::testing::Values(EvictionPolicyKind::kLru, EvictionPolicyKind::kS3Fifo,
                                           EvictionPolicyKind::kWTinyLfu),
                         [](const auto& info) { return EvictionPolicyName(info.param); });

}  // namespace
}  // namespace loradb::tiers

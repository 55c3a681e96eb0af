// The alias log's order is the commit order of the moves (entry numbers taken inside the write
// transaction), not the wall clock: concurrent moves of one alias and a clock that steps
// backwards both leave a log that `loradb verify` (VerifyStore) accepts.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "storage/maintenance/maintenance.h"
#include "storage/store/store.h"
#include "tests/storage/maint_test_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::loradb::testing::TempDir;
using maint_test::kModuleTable;
using maint_test::Publish;
using maint_test::VerifyProblems;

std::unique_ptr<Store> OpenWithClock(const std::string& dir, std::function<int64_t()> clock) {
  StoreOptions o;
  o.catalog.clock = std::move(clock);
  auto s = Store::Open(dir, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// Eight threads move one alias 40 times each. The clock is a counter, so a time read inside the
// write transaction (where LMDB admits one writer at a time) grows with the entry number; a time
// read before the transaction would not, as threads reach the writer lock in another order.
TEST(AliasLogOrder, ConcurrentMovesOfOneAliasFollowCommitOrderAndVerify) {
  TempDir t;
  const std::string dir = t.file("store");
  auto ticks = std::make_shared<std::atomic<int64_t>>(1'000'000);
  {
    auto s = OpenWithClock(dir, [ticks] { return ticks->fetch_add(1); });
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->AddBaseFromModuleTable("tiny", kModuleTable).ok());
    ASSERT_TRUE(s->CreatePolicy("acme/support", "tiny").ok());
    std::vector<uint64_t> revs;
    for (int i = 0; i < 4; ++i) {
      revs.push_back(Publish(*s, "acme/support", static_cast<float>(i), i == 0 ? "serving" : ""));
    }
    constexpr int kThreads = 8, kMoves = 40;
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th) {
      threads.emplace_back([&, th] {
        for (int m = 0; m < kMoves; ++m) {
          const uint64_t to = revs[static_cast<size_t>(th + m) % revs.size()];
          if (!s->SetAlias("acme/support", "serving", to, "race").ok()) ++failures;
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);

    auto log = s->AliasLog("acme/support", "serving");
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_GT(log->size(), 1u);
    for (size_t i = 0; i < log->size(); ++i) {
      EXPECT_EQ((*log)[i].seq, i + 1);
      if (i > 0) {
        EXPECT_GT((*log)[i].time_us, (*log)[i - 1].time_us) << "entry " << i + 1;
        EXPECT_EQ((*log)[i].from_revision, (*log)[i - 1].to_revision) << "entry " << i + 1;
      }
    }
    EXPECT_EQ(log->back().to_revision, s->GetRevisionByAlias("acme/support", "serving")->id);
    auto rep = VerifyOpenStore(*s);
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_TRUE(rep->problems.empty()) << rep->problems[0];
    EXPECT_EQ(rep->alias_log_entries, log->size());
  }
  EXPECT_EQ(VerifyProblems(dir), "");
}

// A clock that steps backwards on every read: times in the log go down, numbers go up, verify
// passes, and rollback still follows the numbers.
TEST(AliasLogOrder, ClockSteppingBackwardsDoesNotFailVerify) {
  TempDir t;
  const std::string dir = t.file("store");
  auto now = std::make_shared<std::atomic<int64_t>>(1'800'000'000'000'000);
  {
    auto s = OpenWithClock(dir, [now] { return now->fetch_sub(3'600'000'000); });  // -1 h
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->AddBaseFromModuleTable("tiny", kModuleTable).ok());
    ASSERT_TRUE(s->CreatePolicy("acme/support", "tiny").ok());
    const uint64_t r1 = Publish(*s, "acme/support", 1.0f, "serving");
    const uint64_t r2 = Publish(*s, "acme/support", 2.0f, "serving");
    const uint64_t r3 = Publish(*s, "acme/support", 3.0f);
    ASSERT_TRUE(s->SetAlias("acme/support", "serving", r3).ok());
    auto back = s->Rollback("acme/support", "serving");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, r2);

    auto log = s->AliasLog("acme/support", "serving");
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_EQ(log->size(), 4u);
    const uint64_t want_to[] = {r1, r2, r3, r2};
    for (size_t i = 0; i < log->size(); ++i) {
      EXPECT_EQ((*log)[i].seq, i + 1);
      EXPECT_EQ((*log)[i].to_revision, want_to[i]);
      if (i > 0) {
        EXPECT_LT((*log)[i].time_us, (*log)[i - 1].time_us) << "the clock was not used";
      }
    }
    EXPECT_EQ(log->back().reason, "rollback");
    auto rev = s->GetRevision(r3);
    ASSERT_TRUE(rev.ok());
    EXPECT_LT(rev->created_us, s->GetRevision(r1)->created_us);
  }
  EXPECT_EQ(VerifyProblems(dir), "");
  // Compaction keeps the log (and verifies its new generation with the same checks).
  auto rep = CompactStore(dir, {});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(VerifyProblems(dir), "");
}

// Retention's alias-history window follows entry order: once an entry of an alias is inside the
// window, every later entry protects its revisions too, even when a stepped-back clock gave
// later entries older times.
TEST(AliasLogOrder, RetentionWindowFollowsEntryOrderNotTimes) {
  TempDir t;
  const std::string dir = t.file("store");
  // The wall clock, except for two moves the clock puts ten days in the past.
  auto skew = std::make_shared<std::atomic<int64_t>>(0);
  auto clock = [skew] {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
               .count() -
           skew->load();
  };
  uint64_t r[7] = {};
  {
    auto s = OpenWithClock(dir, clock);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->AddBaseFromModuleTable("tiny", kModuleTable).ok());
    ASSERT_TRUE(s->CreatePolicy("acme/support", "tiny").ok());
    for (int i = 1; i <= 6; ++i) {
      r[i] = Publish(*s, "acme/support", static_cast<float>(i), i == 1 ? "serving" : "");
    }
    ASSERT_TRUE(s->SetAlias("acme/support", "serving", r[2]).ok());  // entry 2, inside
    skew->store(int64_t{10} * 24 * 3600 * 1'000'000);
    ASSERT_TRUE(s->SetAlias("acme/support", "serving", r[3]).ok());  // entry 3, "ten days ago"
    ASSERT_TRUE(s->SetAlias("acme/support", "serving", r[4]).ok());  // entry 4, likewise
    skew->store(0);
    ASSERT_TRUE(s->SetAlias("acme/support", "serving", r[2]).ok());  // entry 5, inside
  }
  CompactOptions o;
  o.retention.keep_last = 1;
  o.retention.alias_history_window_us = int64_t{24} * 3600 * 1'000'000;  // one day
  auto rep = CompactStore(dir, o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->dropped_retention, 1u);  // r5: no alias, no log entry, not the newest
  auto s = maint_test::OpenStore(dir);
  ASSERT_NE(s, nullptr);
  // r3 appears only in entries 3 and 4, whose times are old but which follow entry 2.
  EXPECT_TRUE(s->GetRevision(r[3]).ok()) << "retention dropped a revision the recent log names";
  EXPECT_FALSE(s->GetRevision(r[5]).ok());
  s.reset();
  EXPECT_EQ(VerifyProblems(dir), "");
}

}  // namespace
}  // namespace loradb

// The shortened end-to-end demo: every phase runs and leaves the store consistent.
#include "compute/demo/demo.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "storage/store/store.h"
#include "tests/test_util.h"

namespace loradb::demo {
namespace {

TEST(DemoTest, QuickDemoRunsEveryPhase) {
  testing::TempDir tmp;
  DemoOptions o;
  o.dir = tmp.file("demo");
  o.quick = true;
  bool http_called = false;
  o.http_phase = [&](Store* store) -> absl::StatusOr<std::string> {
    http_called = true;
    auto policies = store->ListPolicies();
    if (!policies.ok()) return policies.status();
    return std::string("http: ") + std::to_string(policies->size()) + " policies";
  };
  auto r = RunDemo(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(http_called);
  ASSERT_EQ(r->policies.size(), 4u);
  for (const auto& p : r->policies) {
    EXPECT_GT(p.steps, 0) << p.policy;
    // An early revision and the final one were promoted; both have a checkpoint behind them.
    EXPECT_GE(p.revisions, 2) << p.policy;
    EXPECT_EQ(p.checkpoints, p.revisions) << p.policy;
    EXPECT_NE(p.serving_revision, 0u) << p.policy;
    EXPECT_GE(p.served_score, 0.0);
    EXPECT_LE(p.served_score, 1.0);
    if (p.loss == "grpo") {
      // GRPO's own contribution, measured on 800 rollouts before and after its steps (quick
      // run, seed 0: 0.067 -> 0.304).
      EXPECT_GE(p.sampled_reward_end, p.sampled_reward_warm + 0.1) << p.policy;
    } else {
      EXPECT_EQ(p.sampled_reward_warm, -1) << p.policy;
    }
  }
  // The rollback moved `serving` back to the early revision of the first policy.
  EXPECT_NE(r->rollback_to, r->rollback_from);
  EXPECT_NE(r->rollback_to, 0u);
  EXPECT_GT(r->served_requests, 0);
  EXPECT_GT(r->adapter_loads, 0);
  EXPECT_NE(r->Summary().find("acme/lookup-a"), std::string::npos);

  // The store the demo leaves behind is consistent and says what the demo reported.
  auto store = Store::Open(r->store_dir + "/store");
  ASSERT_TRUE(store.ok()) << store.status();
  auto report = (*store)->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->problems.front();
  auto serving = (*store)->GetRevisionByAlias("acme/lookup-a", "serving");
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_EQ(serving->id, r->rollback_to);
}

TEST(DemoTest, RefusesADirectoryThatIsNotADemo) {
  testing::TempDir tmp;
  std::ofstream(tmp.file("precious.txt")) << "user data";
  DemoOptions o;
  o.dir = tmp.path();
  auto r = RunDemo(o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_TRUE(std::filesystem::exists(tmp.file("precious.txt")));
}

}  // namespace
}  // namespace loradb::demo

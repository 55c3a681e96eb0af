// compute/trainer/reward_program.h with small shell programs: rewards come back in order across
// batches; a program that dies, writes garbage, writes too much or stays silent gives one clear
// error naming it, and every later call fails the same way.
#include "compute/trainer/reward_program.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loradb::trainer {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Lines(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("{\"i\": " + std::to_string(i) + "}");
  return out;
}

std::string ErrorOf(const std::string& command, int n, double timeout_s = 10) {
  auto p = RewardProgram::Start(command, timeout_s);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return "";
  absl::StatusOr<std::vector<double>> r = (*p)->Score(Lines(n));
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  // A failed program stays failed.
  absl::StatusOr<std::vector<double>> again = (*p)->Score(Lines(1));
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(again.status().message(), r.status().message());
  return std::string(r.status().message());
}

TEST(RewardProgram, RewardsComeBackInOrderAcrossBatches) {
  // Reward = the rollout's "i" field + 0.5, read with sed from each JSON line.
  auto p = RewardProgram::Start(
      "while read -r line; do echo \"$line\" | sed -e 's/[^0-9]//g' -e 's/$/.5/'; done", 10);
  ASSERT_TRUE(p.ok()) << p.status();
  for (int batch = 0; batch < 3; ++batch) {
    absl::StatusOr<std::vector<double>> r = (*p)->Score(Lines(20 + batch));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->size(), static_cast<size_t>(20 + batch));
    for (int i = 0; i < 20 + batch; ++i) EXPECT_EQ((*r)[i], i + 0.5);
  }
}

TEST(RewardProgram, ALargeBatchDoesNotDeadlock) {
  // 20000 rollouts (~0.3 MB each way) exceed the socket buffers: writing and reading interleave.
  auto p = RewardProgram::Start("while read -r line; do echo 1; done", 60);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<std::vector<double>> r = (*p)->Score(Lines(20000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), 20000u);
}

TEST(RewardProgram, GarbageIsAnError) {
  EXPECT_THAT(ErrorOf("read -r a; echo 1; read -r b; echo 'great job'; cat >/dev/null", 3),
              HasSubstr("wrote \"great job\" for rollout 2 of 3: expected one finite number"));
  EXPECT_THAT(ErrorOf("while read -r l; do echo nan; done", 2), HasSubstr("wrote \"nan\""));
  EXPECT_THAT(ErrorOf("while read -r l; do echo; done", 2), HasSubstr("wrote \"\" for rollout 1"));
}

TEST(RewardProgram, ADyingProgramIsAnError) {
  const std::string msg = ErrorOf("read -r a; echo 0.25; exit 3", 4);
  EXPECT_THAT(msg, HasSubstr("reward program 'read -r a; echo 0.25; exit 3'"));
  EXPECT_THAT(msg, HasSubstr("exited with status 3"));
  EXPECT_THAT(msg, HasSubstr("1 of 4"));
  EXPECT_THAT(ErrorOf("/nonexistent/reward-program", 1), HasSubstr("exited with status 127"));
  EXPECT_THAT(ErrorOf("kill -9 $$", 1), HasSubstr("killed by signal 9"));
}

TEST(RewardProgram, TooManyLinesIsAnError) {
  // Four rewards in one write after the first rollout: one line more than the three rollouts.
  EXPECT_THAT(ErrorOf("read -r l; printf '1\\n2\\n3\\n4\\n'; cat >/dev/null", 3),
              HasSubstr("wrote more lines than the 3 rollouts it was sent (\"4\")"));
}

TEST(RewardProgram, SilenceTimesOut) {
  EXPECT_THAT(ErrorOf("cat >/dev/null", 2, 0.3),
              HasSubstr("wrote no reward for 0.3 s (waiting for rollout 1 of 2)"));
}

TEST(RewardProgram, BadArguments) {
  EXPECT_FALSE(RewardProgram::Start("", 1).ok());
  EXPECT_FALSE(RewardProgram::Start("true", 0).ok());
}

}  // namespace
}  // namespace loradb::trainer

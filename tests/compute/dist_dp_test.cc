// torch.distributed plumbing (compute/distributed/process_group, launcher) and data-parallel
// LoRA training (`loradb dist-train`), on CPU with Gloo over loopback. Ranks are separate
// processes: the built `loradb` binary launches copies of itself.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_paths.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "compute/distributed/dp_sync.h"
#include "compute/distributed/launcher.h"
#include "compute/distributed/process_group.h"
#include "compute/model/checkpoint.h"
#include "gtest/gtest.h"
#include "storage/formats/model_config.h"
#include "tests/compute/cli_test_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using loradb::testing::CliRun;
using loradb::testing::Slurp;
using loradb::testing::TempDir;

// One intra-op thread per rank: the ranks share the machine's cores (and stay fast on a loaded
// one).
CliRun CliOneThread(const TempDir& dir, const std::string& store, const std::string& args) {
  return testing::Cli(dir, store, args, "OMP_NUM_THREADS=1");
}

TEST(ProcessGroupTest, RejectsBadOptionsWithClearErrors) {
  SKIP_WITHOUT_C10D();
  TempDir dir;
  dist::GroupOptions o;
  o.rendezvous = absl::StrCat("file:", dir.file("rdv"));
  o.world_size = 2;
  o.rank = 2;
  EXPECT_EQ(dist::ProcessGroup::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  o.world_size = 0;
  EXPECT_EQ(dist::ProcessGroup::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.world_size = 1;
  o.rendezvous = "udp:nowhere";
  EXPECT_EQ(dist::ProcessGroup::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.rendezvous = "tcp:127.0.0.1:notaport";
  EXPECT_EQ(dist::ProcessGroup::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dist::ParseBackend("mpi").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ProcessGroupTest, SingleRankGroupRunsEveryCollective) {
  SKIP_WITHOUT_C10D();
  TempDir dir;
  dist::GroupOptions o;
  o.rendezvous = absl::StrCat("file:", dir.file("rdv"));
  auto pg = dist::ProcessGroup::Create(o);
  ASSERT_TRUE(pg.ok()) << pg.status();
  at::Tensor t = at::arange(10, at::kFloat);
  ASSERT_TRUE((*pg)->AllReduce(t, dist::ReduceOp::kAverage).ok());
  EXPECT_TRUE(at::equal(t, at::arange(10, at::kFloat)));
  at::Tensor strided = at::zeros({4, 4}).t();
  EXPECT_EQ((*pg)->AllReduce(strided).code(), absl::StatusCode::kInvalidArgument);
  at::Tensor ints = at::ones({2}, at::kLong);
  EXPECT_EQ((*pg)->AllReduce(ints, dist::ReduceOp::kAverage).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*pg)->Broadcast(t, 1).code(), absl::StatusCode::kInvalidArgument);
  std::string bytes("a\0b", 3);
  ASSERT_TRUE((*pg)->BroadcastBytes(&bytes).ok());
  EXPECT_EQ(bytes, std::string("a\0b", 3));
  auto g = (*pg)->AllGather(at::ones({3}));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->size(), 1u);
  EXPECT_TRUE((*pg)->Barrier().ok());
}

TEST(ProcessGroupTest, SnapshotBytesRoundTripAndRejectCorruption) {
  trainer::PolicySnapshot s;
  s.master["a"] = at::randn({3, 4});
  s.optimizer["adamw.step"] = at::full({1}, 7L, at::kLong);
  s.micro_steps = 2;
  s.scheduler_name = "cosine";
  s.scheduler_position = 9;
  s.rng_state = "0123";
  const std::string bytes = dist::EncodeSnapshot(s);
  auto back = dist::DecodeSnapshot(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(at::equal(back->master.at("a"), s.master.at("a")));
  EXPECT_EQ(back->optimizer.at("adamw.step").item<int64_t>(), 7);
  EXPECT_EQ(back->micro_steps, 2);
  EXPECT_EQ(back->scheduler_name, "cosine");
  EXPECT_EQ(back->scheduler_position, 9);
  EXPECT_EQ(back->rng_state, "0123");
  EXPECT_EQ(dist::DecodeSnapshot(bytes.substr(0, bytes.size() - 1)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(dist::DecodeSnapshot(bytes + "x").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(dist::DecodeSnapshot("garbage").status().code(), absl::StatusCode::kDataLoss);
}

TEST(LauncherTest, ReportsTheFailedRankAndStopsTheOthers) {
  dist::LaunchOptions o;
  o.argv = {"/bin/sh", "-c", "if [ \"$LORADB_RANK\" = 1 ]; then exit 3; fi; sleep 30"};
  o.world_size = 3;
  auto r = dist::LaunchRanks(o);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(r.status().message().find("rank 1 exited with status 3"), std::string::npos)
      << r.status();
  o.argv = {"/bin/sh", "-c", "test -n \"$LORADB_RENDEZVOUS\" && test \"$LORADB_WORLD_SIZE\" = 2"};
  o.world_size = 2;
  r = dist::LaunchRanks(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), 2u);
  o.argv.clear();
  EXPECT_EQ(dist::LaunchRanks(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DistCliTest, CollectiveSelfCheckOnTwoAndThreeGlooRanks) {
  SKIP_WITHOUT_C10D();
  TempDir dir;
  for (int world : {2, 3}) {
    CliRun r = CliOneThread(dir, dir.file("store"), absl::StrCat("dist-check --world ", world));
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find(absl::StrCat("rank 0/", world, " gloo on cpu: ok")), std::string::npos)
        << r.out;
  }
}

// A loopback port that was free a moment ago (0 when none could be had).
int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

TEST(DistCliTest, TcpStoreRendezvousOnLoopback) {
  SKIP_WITHOUT_C10D();
  TempDir dir;
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  CliRun r = CliOneThread(dir, dir.file("store"),
                          absl::StrCat("dist-check --world 2 --rendezvous tcp:127.0.0.1:", port));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("rank 0/2 gloo on cpu: ok"), std::string::npos) << r.out;
}

TEST(DistCliTest, ARankThatDiesAbortsTheRunWithAClearError) {
  SKIP_WITHOUT_C10D();
  TempDir dir;
  CliRun r =
      CliOneThread(dir, dir.file("store"), "dist-check --world 2 --die-rank 1 --timeout-ms 20000");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("distributed run aborted"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 was killed by signal 9"), std::string::npos) << r.err;
}

class DpTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!dist::C10dAvailable(&why)) GTEST_SKIP() << why;
    auto config =
        ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/tiny-dense.json");
    ASSERT_TRUE(config.ok()) << config.status();
    config->num_hidden_layers = 2;
    model_ = dir_.file("tiny");
    ASSERT_TRUE(model::WriteRandomCheckpoint(*config, model_, 7, at::kFloat).ok());
  }

  // `loradb dist-train` of policy p on the mapping task; the parsed JSON report (null on
  // failure, which fails the test unless `run` is given to inspect it).
  nlohmann::json Train(const std::string& store, int world, int steps, int batch,
                       const std::string& extra, CliRun* run = nullptr,
                       const std::string& task = "mapping") {
    CliRun r = CliOneThread(dir_, store,
                            absl::StrCat("dist-train --json --world ", world, " --model '", model_,
                                         "' --policy p --task ", task, " --steps ", steps,
                                         " --batch ", batch, " --lr 1e-2 ", extra));
    if (run != nullptr) *run = r;
    if (r.rc != 0) {
      if (run != nullptr) return nlohmann::json();
      ADD_FAILURE() << "dist-train --world " << world << " failed: " << r.err;
      return nlohmann::json();
    }
    return nlohmann::json::parse(r.out);
  }

  TempDir dir_;
  std::string model_;
};

TEST_F(DpTrainTest, TwoRanksMatchOneRankWithTheSameGlobalBatch) {
  const nlohmann::json one = Train(dir_.file("store1"), 1, 6, 8, "");
  const nlohmann::json two = Train(dir_.file("store2"), 2, 6, 8, "");
  ASSERT_TRUE(one.is_object() && two.is_object());
  EXPECT_EQ(two["world_size"], 2);
  const auto l1 = one["losses"].get<std::vector<double>>();
  const auto l2 = two["losses"].get<std::vector<double>>();
  ASSERT_EQ(l1.size(), 6u);
  ASSERT_EQ(l2.size(), 6u);
  for (size_t i = 0; i < l1.size(); ++i) {
    EXPECT_NEAR(l2[i], l1[i], 1e-4 * std::max(1.0, std::abs(l1[i]))) << "step " << i + 1;
  }
  EXPECT_LT(l1.back(), l1.front());  // it trains
  const double w1 = one["weights_l1"], w2 = two["weights_l1"];
  EXPECT_NEAR(w2, w1, 1e-4 * w1);
  // One gradient all-reduce (one bucket) per step.
  EXPECT_EQ(two["gradient_allreduces"], 6);
  EXPECT_EQ(one["gradient_allreduces"], 0);
  // Every collective of the run: 6 gradient buckets, 2 for the initial state broadcast (size,
  // bytes) and 4 one-flag agreements (model load, store open, checkpoint, publish).
  EXPECT_EQ(two["collective_calls"], 6 + 2 + 4);
  // Rank 0 alone wrote: one checkpoint and one revision in the store.
  CliRun ls = CliOneThread(dir_, dir_.file("store2"), "ls --json");
  ASSERT_EQ(ls.rc, 0) << ls.err;
  EXPECT_EQ(nlohmann::json::parse(ls.out).size(), 1u) << ls.out;
  EXPECT_NE(two["revision"], 0);
  EXPECT_NE(two["checkpoint"], 0);
}

TEST_F(DpTrainTest, TwoRanksMatchOneRankForDpoPairs) {
  // DPO averages over pairs (each rank's loss weight is its number of pairs).
  const nlohmann::json one = Train(dir_.file("store1"), 1, 3, 4, "", nullptr, "preference");
  const nlohmann::json two = Train(dir_.file("store2"), 2, 3, 4, "", nullptr, "preference");
  ASSERT_TRUE(one.is_object() && two.is_object());
  const auto l1 = one["losses"].get<std::vector<double>>();
  const auto l2 = two["losses"].get<std::vector<double>>();
  ASSERT_EQ(l1.size(), 3u);
  ASSERT_EQ(l2.size(), 3u);
  for (size_t i = 0; i < l1.size(); ++i) {
    EXPECT_NEAR(l2[i], l1[i], 1e-4 * std::max(1.0, std::abs(l1[i]))) << "step " << i + 1;
  }
  const double w1 = one["weights_l1"], w2 = two["weights_l1"];
  EXPECT_NEAR(w2, w1, 1e-4 * w1);
}

TEST_F(DpTrainTest, ResumesOnTwoRanksFromRankZerosCheckpoint) {
  const std::string store = dir_.file("store");
  const nlohmann::json first = Train(store, 2, 3, 8, "--no-publish");
  ASSERT_TRUE(first.is_object());
  EXPECT_EQ(first["end_step"], 3);
  const nlohmann::json second = Train(store, 2, 6, 8, "");
  ASSERT_TRUE(second.is_object());
  EXPECT_EQ(second["start_step"], 3);
  EXPECT_EQ(second["end_step"], 6);
  EXPECT_EQ(second["losses"].size(), 3u);
}

// The pid of `parent`'s child process whose environment has LORADB_RANK=`rank` (0: none).
pid_t FindRank(pid_t parent, int rank) {
  DIR* d = opendir("/proc");
  if (d == nullptr) return 0;
  pid_t found = 0;
  while (dirent* e = readdir(d)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    const std::string stat = Slurp(absl::StrCat("/proc/", pid, "/stat"));
    // "pid (comm) state ppid ...": the fields after the last ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
    int ppid = 0;
    if (f.size() < 2 || !absl::SimpleAtoi(f[1], &ppid) || ppid != parent) continue;
    const std::string env = Slurp(absl::StrCat("/proc/", pid, "/environ"));
    for (absl::string_view var : absl::StrSplit(env, '\0')) {
      if (var == absl::StrCat("LORADB_RANK=", rank)) found = pid;
    }
  }
  closedir(d);
  return found;
}

TEST_F(DpTrainTest, KilledRankAbortsTheRunAndARerunResumesFromTheLastCheckpoint) {
  const std::string store = dir_.file("store"), err = dir_.file("kill.err");
  const std::string cmd = absl::StrCat("OMP_NUM_THREADS=1 exec '", LORADB_CLI_PATH, "' --store '",
                                       store, "' dist-train --world 2 --model '", model_,
                                       "' --policy p --task mapping --steps 100000 --batch 8 --lr "
                                       "1e-2 --checkpoint-every 2 >/dev/null 2>'",
                                       err, "'");
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait for rank 0's first checkpoint, then SIGKILL rank 1 mid-training. (The loop bound is
  // a safety net against a hang, not a speed assertion.)
  pid_t rank1 = 0;
  for (int i = 0; i < 6000 && rank1 == 0; ++i) {
    if (Slurp(err).find("checkpoint ") != std::string::npos) rank1 = FindRank(launcher, 1);
    if (rank1 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (rank1 == 0) kill(launcher, SIGKILL);
  int st = 0;
  if (rank1 != 0) {
    ASSERT_EQ(kill(rank1, SIGKILL), 0);
  }
  ASSERT_EQ(waitpid(launcher, &st, 0), launcher);
  ASSERT_NE(rank1, 0) << "no checkpoint line within 300 s: " << Slurp(err);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << st;
  const std::string text = Slurp(err);
  EXPECT_NE(text.find("distributed run aborted: rank 1 was killed by signal 9"), std::string::npos)
      << text;
  // The last checkpoint rank 0 reported ("checkpoint ID at step S"): a rerun resumes there (or
  // at the next one, when rank 0 committed it but was stopped before printing the line).
  int64_t last_step = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<std::string> w = absl::StrSplit(line, ' ');
    if (w.size() == 5 && w[0] == "checkpoint" && w[2] == "at") {
      ASSERT_TRUE(absl::SimpleAtoi(w[4], &last_step)) << line;
    }
  }
  ASSERT_GE(last_step, 2);
  const nlohmann::json resumed = Train(store, 2, static_cast<int>(last_step) + 4, 8, "");
  ASSERT_TRUE(resumed.is_object());
  const int64_t start = resumed["start_step"];
  EXPECT_TRUE(start == last_step || start == last_step + 2) << start << " vs " << last_step;
  EXPECT_EQ(resumed["end_step"], last_step + 4);
}

TEST_F(DpTrainTest, BadInputFailsOnEveryRankAndLeavesTheStoreAlone) {
  const std::string store = dir_.file("store");
  CliRun r;
  Train(store, 2, 6, 7, "", &r);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("must be a positive multiple of the 2 ranks"), std::string::npos) << r.err;
  r = CliOneThread(dir_, store,
                   absl::StrCat("dist-train --world 2 --model '", model_,
                                "' --policy p --task arithmetic --steps 1 --batch 2"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("data-parallel GRPO"), std::string::npos) << r.err;
  CliRun ls = CliOneThread(dir_, store, "ls --json");
  if (ls.rc == 0) {
    EXPECT_EQ(nlohmann::json::parse(ls.out).size(), 0u) << ls.out;
  }
}

}  // namespace
}  // namespace loradb

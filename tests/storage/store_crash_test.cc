// Crash safety of publishing: a child process publishes revisions in a loop and is SIGKILLed at
// random moments. After each kill the store opens, Verify() passes, every revision whose publish
// returned OK (acknowledged over a pipe) is there and readable, and no partial revision exists.
//
// The child is this test binary re-executed with LORADB_CRASH_CHILD_STORE set: a static
// initializer below runs the publish loop and never returns to gtest.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "storage/formats/synthetic.h"
#include "storage/store/store.h"
#include "tests/storage/child_process_test_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

constexpr char kChildStoreEnv[] = "LORADB_CRASH_CHILD_STORE";
constexpr char kChildAckFdEnv[] = "LORADB_CRASH_CHILD_ACK_FD";
constexpr char kPolicy[] = "crash/p";

// The child: publish until killed, acknowledging each OK publish with "id\n" on the ack fd.
[[noreturn]] void ChildPublishLoop(const char* store_dir, int ack_fd) {
  auto store = Store::Open(store_dir);
  if (!store.ok()) {
    fprintf(stderr, "crash child: %s\n", std::string(store.status().message()).c_str());
    _exit(3);
  }
  for (uint64_t i = 0;; ++i) {
    PublishOptions o;
    if (i % 3 == 0) o.alias = "serving";
    const uint64_t seed = static_cast<uint64_t>(getpid()) * 100000 + i;
    auto r = (*store)->PublishTensors(kPolicy, MakeTinyQProjAdapter(seed).tensors(), o);
    if (!r.ok()) {
      fprintf(stderr, "crash child: %s\n", std::string(r.status().message()).c_str());
      _exit(4);
    }
    const std::string line = absl::StrCat(r->id, "\n");
    if (write(ack_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(5);
  }
}

[[maybe_unused]] const bool kChildHook = [] {
  const char* dir = std::getenv(kChildStoreEnv);
  const char* fd = std::getenv(kChildAckFdEnv);
  if (dir != nullptr && fd != nullptr) ChildPublishLoop(dir, std::atoi(fd));
  return true;
}();

// Spawns the child, lets it run for `run_ms`, SIGKILLs it; appends acknowledged ids.
// With `wait_for_ack`, the delay starts only after the child acknowledged its first publish, so
// every such round kills a child in the middle of its publish loop whatever the machine's speed.
void RunAndKill(const std::string& dir, int run_ms, bool wait_for_ack,
                std::vector<uint64_t>* acked) {
  const testing::AckChild child =
      testing::SpawnSelfWithAckPipe({{kChildStoreEnv, dir}}, kChildAckFdEnv);
  ASSERT_NE(child.pid, 0);
  const pid_t pid = child.pid;
  const int ack_fd = child.fd;

  std::string buf;
  char chunk[4096];
  auto drain = [&](int timeout_ms) {
    pollfd p{ack_fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    ssize_t n = read(ack_fd, chunk, sizeof(chunk));
    if (n <= 0) return false;
    buf.append(chunk, static_cast<size_t>(n));
    return true;
  };
  bool eof = false;
  if (wait_for_ack) {
    // Generous safety limit only; the child normally acknowledges within milliseconds.
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (buf.find('\n') == std::string::npos && std::chrono::steady_clock::now() < limit) {
      if (!drain(1000)) {
        pollfd p{ack_fd, POLLIN, 0};
        if (poll(&p, 1, 0) > 0 && (p.revents & POLLHUP)) {
          eof = true;
          break;
        }
      }
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(run_ms);
  while (!eof) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) break;
    if (!drain(static_cast<int>(left)) && std::chrono::steady_clock::now() < deadline) {
      // EOF before the deadline: the child died on its own.
      break;
    }
  }
  kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  while (drain(1000)) {
  }
  close(ack_fd);
  if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
    FAIL() << "crash child exited on its own with status " << status;
  }
  // Only whole lines are acknowledgements.
  const size_t end = buf.rfind('\n');
  if (end == std::string::npos) return;
  for (absl::string_view line : absl::StrSplit(buf.substr(0, end), '\n')) {
    uint64_t id = 0;
    ASSERT_TRUE(absl::SimpleAtoi(line, &id)) << line;
    acked->push_back(id);
  }
}

void CrashLoop(int kills) {
  testing::TempDir tmp;
  const std::string dir = tmp.file("store");
  {
    auto store = Store::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE(testing::AddQProjBaseAndPolicy(**store, kPolicy).ok());
  }
  std::mt19937 rng(12345);
  std::vector<uint64_t> acked;
  uint64_t reclaimable_seen = 0;
  for (int k = 0; k < kills; ++k) {
    // The parent holds no handle while the child runs; it reopens after each kill.
    // Odd rounds may kill the child anywhere, even while it starts or opens the store; even
    // rounds kill it at a random point after its first acknowledged publish.
    const int run_ms = static_cast<int>(rng() % 80);
    RunAndKill(dir, run_ms, /*wait_for_ack=*/k % 2 == 0, &acked);
    if (::testing::Test::HasFatalFailure()) return;
    auto store = Store::Open(dir);
    ASSERT_TRUE(store.ok()) << "kill " << k << ": " << store.status();
    auto rep = (*store)->Verify();
    ASSERT_TRUE(rep.ok()) << rep.status();
    ASSERT_TRUE(rep->ok()) << "kill " << k << ": " << rep->problems.front();
    reclaimable_seen += rep->reclaimable.size();
    // Every acknowledged revision is there, live, readable and in its policy's index.
    auto policy = (*store)->GetPolicy(kPolicy);
    ASSERT_TRUE(policy.ok());
    for (uint64_t id : acked) {
      auto r = (*store)->GetRevision(id);
      ASSERT_TRUE(r.ok()) << "kill " << k << ": acknowledged revision " << id << " lost";
      EXPECT_EQ(r->state, RevisionState::kLive);
      auto by_seq = (*store)->GetRevision(kPolicy, r->seq);
      ASSERT_TRUE(by_seq.ok());
      EXPECT_EQ(by_seq->id, id);
    }
    // No partial revision: every revision the catalog has reads back whole (checked blobs).
    auto page = (*store)->ListAllRevisions(0, 0);
    ASSERT_TRUE(page.ok());
    EXPECT_GE(page->items.size(), acked.size());
    EXPECT_EQ(page->items.size(), policy->next_seq - 1);
    if (!page->items.empty()) {
      auto t = (*store)->ReadTensors(page->items.back());
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ(t->size(), 2u);
    }
  }
  EXPECT_GE(acked.size(), static_cast<size_t>(kills / 2));  // the children did real work
  ::testing::Test::RecordProperty("acknowledged", static_cast<int>(acked.size()));
  ::testing::Test::RecordProperty("reclaimable_seen", static_cast<int>(reclaimable_seen));
}

TEST(StoreCrash, PublishSurvivesSigkill50) { CrashLoop(50); }

TEST(StoreCrash, PublishSurvivesSigkill500Slow) {
  LORADB_SLOW_TEST();
  CrashLoop(500);
}

}  // namespace
}  // namespace loradb

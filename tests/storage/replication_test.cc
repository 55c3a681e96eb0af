// Catalog replication (storage/replication): generations published by the one writer, followed
// by read-only replicas. The multi-process tests run a writer child (this binary re-executed
// with LORADB_REPL_WRITER_STORE set: a static initializer runs the writer loop) and three engine
// processes (`loradb replicate follow`), and check every generation an engine served against
// what the writer acknowledged for that generation. No assertion depends on speed: the bound is
// in generations (an engine serves generation g only with every write acknowledged at g), and
// the lag in time is measured by bench/replicate_bench.cc.
#include "tests/test_paths.h"
#include "storage/replication/replication.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "storage/formats/synthetic.h"
#include "storage/store/store.h"
#include "storage/util/file_util.h"
#include "tests/storage/child_process_test_util.h"
#include "tests/test_util.h"

extern char** environ;

namespace loradb {
namespace {

constexpr char kWriterStoreEnv[] = "LORADB_REPL_WRITER_STORE";
constexpr char kWriterAckFdEnv[] = "LORADB_REPL_WRITER_ACK_FD";
constexpr char kWriterOpsEnv[] = "LORADB_REPL_WRITER_OPS";
constexpr char kPolicy[] = "repl/p";

[[noreturn]] void Die(int code, const absl::Status& st) {
  fprintf(stderr, "writer child: %s\n", std::string(st.message()).c_str());
  _exit(code);
}

// The writer: `ops` operations (0: until killed). Odd ops publish a revision and move `prod` to
// it; even ops move `canary` to the previous prod. After each op one generation is published
// and "generation prod canary\n" is written to the ack fd: acknowledged.
[[noreturn]] void WriterLoop(const char* dir, int ack_fd, uint64_t ops) {
  auto store = Store::Open(dir);
  if (!store.ok()) Die(3, store.status());
  if (!(*store)->GetPolicy(kPolicy).ok()) {
    absl::Status st = testing::AddQProjBaseAndPolicy(**store, kPolicy);
    if (!st.ok()) Die(3, st);
  }
  auto catalog = Catalog::Open((*store)->dir());
  if (!catalog.ok()) Die(3, catalog.status());
  auto pub = ReplicaPublisher::Open(*catalog, ReplicaRootFor((*store)->dir()));
  if (!pub.ok()) Die(3, pub.status());
  uint64_t prod = 0, canary = 0, prev_prod = 0;
  if (auto r = (*store)->GetRevisionByAlias(kPolicy, "prod"); r.ok()) prod = r->id;
  if (auto r = (*store)->GetRevisionByAlias(kPolicy, "canary"); r.ok()) canary = r->id;
  for (uint64_t i = 1; ops == 0 || i <= ops; ++i) {
    if (i % 2 == 1 || prev_prod == 0) {
      PublishOptions o;
      o.alias = "prod";
      auto r = (*store)->PublishTensors(
          kPolicy, MakeTinyQProjAdapter(static_cast<uint64_t>(getpid()) * 1000 + i).tensors(), o);
      if (!r.ok()) Die(4, r.status());
      prev_prod = prod;
      prod = r->id;
    } else {
      auto st = (*store)->SetAlias(kPolicy, "canary", prev_prod);
      if (!st.ok()) Die(4, st);
      canary = prev_prod;
    }
    auto m = (*pub)->Publish();
    if (!m.ok()) Die(5, m.status());
    const std::string line = absl::StrCat(m->generation, " ", prod, " ", canary, "\n");
    if (write(ack_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(6);
  }
  _exit(0);
}

[[maybe_unused]] const bool kWriterHook = [] {
  const char* dir = std::getenv(kWriterStoreEnv);
  const char* fd = std::getenv(kWriterAckFdEnv);
  const char* ops = std::getenv(kWriterOpsEnv);
  if (dir != nullptr && fd != nullptr && ops != nullptr) {
    WriterLoop(dir, std::atoi(fd), std::strtoull(ops, nullptr, 10));
  }
  return true;
}();

struct Ack {
  uint64_t generation = 0, prod = 0, canary = 0;
};

// A spawned writer child with its ack pipe.
struct Writer {
  pid_t pid = 0;
  int fd = -1;
  std::string buf;
};

Writer SpawnWriter(const std::string& dir, uint64_t ops) {
  const testing::AckChild child = testing::SpawnSelfWithAckPipe(
      {{kWriterStoreEnv, dir}, {kWriterOpsEnv, absl::StrCat(ops)}}, kWriterAckFdEnv);
  Writer w;
  w.pid = child.pid;
  w.fd = child.fd;
  return w;
}

// Reads acks until `want` are complete or the pipe closes (the writer exited or died).
void ReadAcks(Writer* w, size_t want, std::vector<Ack>* acks) {
  char chunk[4096];
  for (;;) {
    // Take at most `want` acks: one read may return several lines (a loaded machine lets the
    // writer run ahead); the rest stay buffered for the next call.
    size_t nl;
    while (acks->size() < want && (nl = w->buf.find('\n')) != std::string::npos) {
      std::vector<std::string> parts = absl::StrSplit(w->buf.substr(0, nl), ' ');
      w->buf.erase(0, nl + 1);
      Ack a;
      if (parts.size() == 3 && absl::SimpleAtoi(parts[0], &a.generation) &&
          absl::SimpleAtoi(parts[1], &a.prod) && absl::SimpleAtoi(parts[2], &a.canary)) {
        acks->push_back(a);
      }
    }
    if (acks->size() >= want) return;
    const ssize_t n = read(w->fd, chunk, sizeof(chunk));
    if (n <= 0) return;
    w->buf.append(chunk, static_cast<size_t>(n));
  }
}

int Reap(pid_t pid) {
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

// `loradb --store DIR replicate follow --until-gen G --interval-ms 2`, stdout to `out`.
pid_t SpawnEngine(const std::string& dir, const std::string& blob_root, uint64_t until_gen,
                  const std::string& out) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::vector<std::string> args = {LORADB_CLI_PATH,
                                   "--store",
                                   dir,
                                   "replicate",
                                   "follow",
                                   "--blob-root",
                                   blob_root,
                                   "--until-gen",
                                   absl::StrCat(until_gen),
                                   "--interval-ms",
                                   "2"};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, LORADB_CLI_PATH, &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

std::vector<nlohmann::json> ReadLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

// Every line an engine printed: generations strictly increase, and the state served at
// generation g is exactly what the writer acknowledged for g (prod, canary, every published
// revision live, each alias's blob loaded from the shared root).
void CheckEngineLines(const std::vector<nlohmann::json>& lines,
                      const std::map<uint64_t, Ack>& by_gen,
                      const std::map<uint64_t, std::set<uint64_t>>& live_by_gen,
                      uint64_t final_gen) {
  ASSERT_FALSE(lines.empty());
  uint64_t prev = 0;
  for (const auto& l : lines) {
    const uint64_t g = l.at("generation").get<uint64_t>();
    EXPECT_GT(g, prev);
    prev = g;
    auto it = by_gen.find(g);
    if (it == by_gen.end()) continue;  // a generation of the setup, before the first ack
    const auto& p = l.at("state").at("policies").at(kPolicy);
    EXPECT_EQ(p.at("aliases").at("prod").get<uint64_t>(), it->second.prod) << "generation " << g;
    if (it->second.canary != 0) {
      EXPECT_EQ(p.at("aliases").at("canary").get<uint64_t>(), it->second.canary)
          << "generation " << g;
    } else {
      EXPECT_FALSE(p.at("aliases").contains("canary"));
    }
    std::set<uint64_t> live;
    for (const auto& id : p.at("live")) live.insert(id.get<uint64_t>());
    EXPECT_EQ(live, live_by_gen.at(g)) << "generation " << g;
    EXPECT_EQ(l.at("state").at("loaded").get<uint64_t>(), p.at("aliases").size());
  }
  EXPECT_EQ(prev, final_gen);
}

std::map<uint64_t, std::set<uint64_t>> LiveByGen(const std::vector<Ack>& acks) {
  std::map<uint64_t, std::set<uint64_t>> out;
  std::set<uint64_t> live;
  for (const auto& a : acks) {
    live.insert(a.prod);
    out[a.generation] = live;
  }
  return out;
}

TEST(ReplicationTest, PublishFollowRefreshAndReadOnly) {
  testing::TempDir tmp;
  const std::string dir = tmp.file("store");
  {
    auto store = Store::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE(testing::AddQProjBaseAndPolicy(**store, kPolicy).ok());
    auto catalog = Catalog::Open(dir);
    ASSERT_TRUE(catalog.ok());
    const std::string root = ReplicaRootFor(dir);
    EXPECT_TRUE(absl::IsNotFound(ReplicaFollower::Open(root).status()));
    EXPECT_TRUE(absl::IsInvalidArgument(
        ReplicaPublisher::Open(*catalog, root, PublisherOptions{.keep = 1}).status()));
    PublisherOptions po;
    po.keep = 2;
    auto pub = ReplicaPublisher::Open(*catalog, root, po);
    ASSERT_TRUE(pub.ok()) << pub.status();
    // A second publisher on the same root is refused (one writer).
    EXPECT_TRUE(absl::IsFailedPrecondition(ReplicaPublisher::Open(*catalog, root).status()));
    auto m1 = (*pub)->PublishIfChanged();
    ASSERT_TRUE(m1.ok() && m1->has_value());
    auto nothing = (*pub)->PublishIfChanged();
    ASSERT_TRUE(nothing.ok());
    EXPECT_FALSE(nothing->has_value());

    auto f = ReplicaFollower::Open(root);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->manifest().generation, 1u);
    std::shared_ptr<Store> held = (*f)->store();
    EXPECT_TRUE(absl::IsFailedPrecondition(held->CreatePolicy("x", "b").status()));
    EXPECT_TRUE(absl::IsNotFound(held->GetRevisionByAlias(kPolicy, "prod").status()));

    PublishOptions o;
    o.alias = "prod";
    auto rev = (*store)->PublishTensors(kPolicy, MakeTinyQProjAdapter(7).tensors(), o);
    ASSERT_TRUE(rev.ok()) << rev.status();
    auto unchanged = (*f)->Refresh();
    ASSERT_TRUE(unchanged.ok());
    EXPECT_FALSE(*unchanged);
    auto m2 = (*pub)->PublishIfChanged();
    ASSERT_TRUE(m2.ok() && m2->has_value());
    EXPECT_GT((*m2)->txnid, (*m1)->txnid);
    auto swapped = (*f)->Refresh();
    ASSERT_TRUE(swapped.ok()) << swapped.status();
    EXPECT_TRUE(*swapped);
    auto served = (*f)->store()->GetRevisionByAlias(kPolicy, "prod");
    ASSERT_TRUE(served.ok()) << served.status();
    EXPECT_EQ(served->id, rev->id);
    EXPECT_TRUE((*f)->store()->ReadTensors(*served).ok());
    // The generation held before the swap still answers (as it was).
    EXPECT_TRUE(absl::IsNotFound(held->GetRevisionByAlias(kPolicy, "prod").status()));

    // keep = 2: generation 1 is pruned after generation 3.
    ASSERT_TRUE((*pub)->Publish().ok());
    EXPECT_FALSE(std::filesystem::exists(root + "/" + GenerationDirName(1)));
    EXPECT_TRUE(std::filesystem::exists(root + "/" + GenerationDirName(2)));

    // A corrupted newest generation is refused; the follower keeps serving the one it holds.
    ASSERT_TRUE((*f)->Refresh().ok());
    ASSERT_EQ((*f)->manifest().generation, 3u);
    auto m4 = (*pub)->Publish();
    ASSERT_TRUE(m4.ok());
    {
      std::fstream data(root + "/" + GenerationDirName(4) + "/catalog/data.mdb",
                        std::ios::in | std::ios::out | std::ios::binary);
      data.seekp(100);
      data.put('\x5a');
    }
    auto bad = (*f)->Refresh();
    EXPECT_TRUE(absl::IsDataLoss(bad.status())) << bad.status();
    EXPECT_EQ((*f)->manifest().generation, 3u);
    EXPECT_TRUE((*f)->store()->GetRevisionByAlias(kPolicy, "prod").ok());
  }
  // A publisher that died mid-publish leaves a tmp- directory: never read, removed on reopen,
  // and numbering continues after the newest generation.
  const std::string root = ReplicaRootFor(dir);
  ASSERT_TRUE(CreateDirectories(root + "/tmp-" + GenerationDirName(5) + "/catalog").ok());
  auto catalog = Catalog::Open(dir);
  ASSERT_TRUE(catalog.ok());
  auto pub = ReplicaPublisher::Open(*catalog, root);
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_FALSE(std::filesystem::exists(root + "/tmp-" + GenerationDirName(5)));
  EXPECT_EQ((*pub)->last_generation(), 4u);
  auto m5 = (*pub)->Publish();
  ASSERT_TRUE(m5.ok());
  EXPECT_EQ(m5->generation, 5u);
}

// Three engines follow a writer that publishes and moves aliases; engine 0 is SIGKILLed after
// its first generation and restarted. Every engine ends on the final generation and every
// generation any engine served matches the writer's acknowledgement for it.
TEST(ReplicationTest, ThreeEnginesFollowWriterAndSurviveEngineKill) {
  testing::TempDir tmp;
  const std::string dir = tmp.file("store");
  const std::string blobs = dir + "/blobs";
  constexpr uint64_t kOps = 24;
  Writer w = SpawnWriter(dir, kOps);
  std::vector<Ack> acks;
  ReadAcks(&w, 1, &acks);  // the first generation exists before engines start
  ASSERT_EQ(acks.size(), 1u);
  const uint64_t final_gen = acks[0].generation + kOps - 1;
  std::vector<std::string> outs;
  std::vector<pid_t> engines;
  for (int e = 0; e < 3; ++e) {
    outs.push_back(tmp.file(absl::StrCat("engine", e, ".jsonl")));
    engines.push_back(SpawnEngine(dir, blobs, final_gen, outs.back()));
  }
  // Kill engine 0 once it served something, then restart it.
  std::string restarted_out = tmp.file("engine0-restarted.jsonl");
  while (ReadLines(outs[0]).empty()) {
    int status = 0;
    if (waitpid(engines[0], &status, WNOHANG) == engines[0]) break;  // reached the end already
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  kill(engines[0], SIGKILL);
  Reap(engines[0]);
  engines[0] = SpawnEngine(dir, blobs, final_gen, restarted_out);

  ReadAcks(&w, kOps, &acks);
  ASSERT_EQ(acks.size(), kOps);
  const int ws = Reap(w.pid);
  close(w.fd);
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << ws;
  EXPECT_EQ(acks.back().generation, final_gen);
  for (pid_t pid : engines) {
    const int st = Reap(pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  }
  std::map<uint64_t, Ack> by_gen;
  for (const auto& a : acks) by_gen[a.generation] = a;
  const auto live = LiveByGen(acks);
  CheckEngineLines(ReadLines(restarted_out), by_gen, live, final_gen);
  for (int e = 1; e < 3; ++e) CheckEngineLines(ReadLines(outs[e]), by_gen, live, final_gen);
}

// Waits until the last line `path` holds names generation `gen` (or newer). A hang guard of
// 300 s turns a follower that never catches up into a failure instead of a stuck test run; it
// is not a speed check (the lag is measured by bench/replicate_bench.cc).
bool WaitForGeneration(const std::string& path, uint64_t gen) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < give_up) {
    const auto lines = ReadLines(path);
    if (!lines.empty() && lines.back().at("generation").get<uint64_t>() >= gen) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// Three engines follow throughout while the writer is SIGKILLed mid-stream (possibly
// mid-publish) and a new writer continues. The engines end with every acknowledged revision and
// the last acknowledged alias moves; the generations they served never go backwards.
TEST(ReplicationTest, WriterKillLosesNothingAcknowledged) {
  testing::TempDir tmp;
  const std::string dir = tmp.file("store");
  const std::string blobs = dir + "/blobs";
  Writer w = SpawnWriter(dir, 0);
  std::vector<Ack> acks;
  ReadAcks(&w, 1, &acks);
  ASSERT_EQ(acks.size(), 1u);
  std::vector<std::string> outs;
  std::vector<pid_t> engines;
  for (int e = 0; e < 3; ++e) {
    outs.push_back(tmp.file(absl::StrCat("engine", e, ".jsonl")));
    engines.push_back(SpawnEngine(dir, blobs, 0, outs.back()));
  }
  ReadAcks(&w, 8, &acks);
  ASSERT_EQ(acks.size(), 8u);
  kill(w.pid, SIGKILL);
  ReadAcks(&w, 1000000, &acks);  // whatever it acknowledged before dying
  Reap(w.pid);
  close(w.fd);
  const Ack last_before_kill = acks.back();
  std::set<uint64_t> acked_revisions;
  for (const auto& a : acks) acked_revisions.insert(a.prod);

  constexpr uint64_t kMoreOps = 4;
  Writer w2 = SpawnWriter(dir, kMoreOps);
  std::vector<Ack> acks2;
  ReadAcks(&w2, kMoreOps, &acks2);
  ASSERT_EQ(acks2.size(), kMoreOps);
  const int ws = Reap(w2.pid);
  close(w2.fd);
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << ws;
  EXPECT_GT(acks2.front().generation, last_before_kill.generation);
  const uint64_t final_gen = acks2.back().generation;
  for (const auto& a : acks2) acked_revisions.insert(a.prod);
  for (size_t e = 0; e < engines.size(); ++e) {
    EXPECT_TRUE(WaitForGeneration(outs[e], final_gen)) << "engine " << e;
    kill(engines[e], SIGKILL);
    Reap(engines[e]);
  }
  for (const auto& out : outs) {
    const auto lines = ReadLines(out);
    ASSERT_FALSE(lines.empty());
    uint64_t prev = 0;
    for (const auto& l : lines) {
      EXPECT_GT(l.at("generation").get<uint64_t>(), prev);
      prev = l.at("generation").get<uint64_t>();
    }
    const auto& l = lines.back();
    EXPECT_EQ(l.at("generation").get<uint64_t>(), final_gen);
    const auto& p = l.at("state").at("policies").at(kPolicy);
    std::set<uint64_t> live;
    for (const auto& id : p.at("live")) live.insert(id.get<uint64_t>());
    for (uint64_t id : acked_revisions) EXPECT_TRUE(live.count(id)) << "lost revision " << id;
    EXPECT_EQ(p.at("aliases").at("prod").get<uint64_t>(), acks2.back().prod);
    EXPECT_EQ(p.at("aliases").at("canary").get<uint64_t>(), acks2.back().canary);
    EXPECT_EQ(l.at("state").at("loaded").get<uint64_t>(), 2u);
  }
}

}  // namespace
}  // namespace loradb

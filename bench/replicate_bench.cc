// loradb-bench replicate [--revisions N] [--ops K] [--followers F] [--interval-ms MS] [--dir D]
// Catalog replication lag under a publish storm (docs/distributed.md). A store is preloaded
// with N revisions; then a writer thread publishes K revisions back to back (each moving
// `prod`), a publisher thread ships a generation whenever the catalog changed (polling every
// MS), and F follower threads poll CURRENT every MS and swap. The lag of a write, per follower,
// is the time from its commit returning to that follower serving a generation whose txnid
// (a lower bound of what it holds) covers the write. Commits are not fsynced (no_sync) so the
// storm is as dense as the catalog allows; generations are fsynced as always.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "storage/formats/synthetic.h"
#include "storage/replication/replication.h"
#include "storage/store/store.h"
#include "storage/util/status_macros.h"

namespace loradb::bench {
namespace {

// The documented staleness bound at the default 20 ms intervals (docs/distributed.md).
constexpr double kBoundMs = 250.0;

struct Args {
  uint64_t revisions = 1000;
  uint64_t ops = 300;
  int followers = 3;
  int interval_ms = 20;
  std::string dir;
};

absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& args) {
  Args a;
  CLI::App app("replicate: staleness of read-only replicas following a writer", "replicate");
  app.add_option("--revisions", a.revisions, "revisions published before the run");
  app.add_option("--ops", a.ops, "catalog operations during the run")->check(CLI::PositiveNumber);
  app.add_option("--followers", a.followers, "replica followers (1-64)")->check(CLI::Range(1, 64));
  app.add_option("--interval-ms", a.interval_ms, "publish and poll interval")
      ->check(CLI::PositiveNumber);
  app.add_option("--dir", a.dir, "work directory (default: a temporary one)");
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  return a;
}

absl::Status Run(const Args& args, const std::string& dir) {
  StoreOptions so;
  so.catalog.no_sync = true;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(dir, so));
  LORADB_RETURN_IF_ERROR(store->AddBaseFromModuleTable("b", kTinyQProjModuleTable).status());
  LORADB_RETURN_IF_ERROR(store->CreatePolicy("bench/p", "b").status());
  Progress(absl::StrCat("replicate: preloading ", args.revisions, " revisions"));
  for (uint64_t i = 0; i < args.revisions; ++i) {
    LORADB_RETURN_IF_ERROR(
        store->PublishTensors("bench/p", MakeTinyQProjAdapter(i % 16).tensors(), PublishOptions{})
            .status());
  }
  LORADB_ASSIGN_OR_RETURN(std::shared_ptr<Catalog> catalog, Catalog::Open(store->dir()));
  const std::string root = ReplicaRootFor(store->dir());
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<ReplicaPublisher> pub,
                          ReplicaPublisher::Open(catalog, root));
  LORADB_ASSIGN_OR_RETURN(GenerationManifest first, pub->Publish());

  // (txnid covered, time served) per follower, appended by its thread.
  struct Served {
    uint64_t txnid;
    double t;
  };
  std::vector<std::vector<Served>> served(args.followers);
  std::vector<std::unique_ptr<ReplicaFollower>> followers;
  for (int f = 0; f < args.followers; ++f) {
    LORADB_ASSIGN_OR_RETURN(std::unique_ptr<ReplicaFollower> fl,
                            ReplicaFollower::Open(root, FollowerOptions{store->blob_root()}));
    followers.push_back(std::move(fl));
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> target_txnid{UINT64_MAX};
  std::mutex err_mu;
  absl::Status err;
  auto fail = [&](absl::Status st) {
    std::lock_guard<std::mutex> lock(err_mu);
    if (err.ok()) err = std::move(st);
    stop = true;
  };
  std::vector<double> copy_ms;
  std::vector<uint64_t> gen_bytes;
  std::thread publisher([&] {
    while (!stop) {
      const double t0 = NowSeconds();
      auto m = pub->PublishIfChanged();
      if (!m.ok()) return fail(m.status());
      if (m->has_value()) {
        copy_ms.push_back((NowSeconds() - t0) * 1e3);
        gen_bytes.push_back((*m)->data_bytes);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(args.interval_ms));
    }
  });
  std::vector<std::thread> threads;
  for (int f = 0; f < args.followers; ++f) {
    threads.emplace_back([&, f] {
      for (;;) {
        auto swapped = followers[f]->Refresh();
        if (!swapped.ok()) return fail(swapped.status());
        const GenerationManifest m = followers[f]->manifest();
        if (*swapped) served[f].push_back({m.txnid, NowSeconds()});
        if (m.txnid >= target_txnid.load() || stop) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(args.interval_ms));
      }
    });
  }
  // The storm: K publishes back to back, each moving `prod`.
  std::vector<std::pair<uint64_t, double>> writes;  // (txnid, commit time)
  const double storm_t0 = NowSeconds();
  for (uint64_t i = 0; i < args.ops && !stop; ++i) {
    PublishOptions o;
    o.alias = "prod";
    auto r = store->PublishTensors("bench/p", MakeTinyQProjAdapter(1000 + i).tensors(), o);
    if (!r.ok()) {
      fail(r.status());
      break;
    }
    const double t = NowSeconds();
    auto txn = catalog->LastTxnId();
    if (!txn.ok()) {
      fail(txn.status());
      break;
    }
    writes.push_back({*txn, t});
  }
  const double storm_s = NowSeconds() - storm_t0;
  if (!writes.empty()) target_txnid = writes.back().first;
  for (auto& t : threads) t.join();
  stop = true;
  publisher.join();
  LORADB_RETURN_IF_ERROR(err);

  std::vector<double> lags_ms;
  for (int f = 0; f < args.followers; ++f) {
    size_t j = 0;
    for (const auto& [txnid, t] : writes) {
      while (j < served[f].size() && served[f][j].txnid < txnid) ++j;
      if (j == served[f].size()) {
        return absl::InternalError(absl::StrCat("follower ", f, " never served txn ", txnid));
      }
      lags_ms.push_back((served[f][j].t - t) * 1e3);
    }
  }
  const double p50 = Quantile(lags_ms, 0.5), p99 = Quantile(lags_ms, 0.99);
  const double max_lag = lags_ms.empty() ? 0 : *std::max_element(lags_ms.begin(), lags_ms.end());
  Emit({{"bench", "replicate"},
        {"case", "publish_storm"},
        {"revisions", args.revisions},
        {"ops", writes.size()},
        {"followers", args.followers},
        {"interval_ms", args.interval_ms},
        {"writes_per_s", writes.size() / std::max(storm_s, 1e-9)},
        {"generations", pub->last_generation() - first.generation},
        {"generation_bytes", gen_bytes.empty() ? 0 : gen_bytes.back()},
        {"publish_p50_ms", Quantile(copy_ms, 0.5)},
        {"lag_p50_ms", p50},
        {"lag_p99_ms", p99},
        {"lag_max_ms", max_lag}});
  EmitGoal("replicate", "lag_p99_ms", p99, absl::StrCat("<= ", kBoundMs), p99 <= kBoundMs);
  return absl::OkStatus();
}

absl::Status RunReplicateBench(const std::vector<std::string>& argv) {
  LORADB_ASSIGN_OR_RETURN(Args args, ParseArgs(argv));
  std::string dir = args.dir;
  const bool temp = dir.empty();
  if (temp) {
    dir = (std::filesystem::temp_directory_path() /
           absl::StrCat("loradb-replicate-bench-", ::getpid()))
              .string();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  absl::Status st = Run(args, dir);
  if (temp) std::filesystem::remove_all(dir, ec);
  return st;
}

LORADB_REGISTER_SCENARIO({"replicate",
                          "catalog replication lag p50/p99 under a publish storm (--revisions N "
                          "--ops K --followers F --interval-ms MS)",
                          RunReplicateBench,
                          {"--revisions", "1000", "--ops", "300"}});

}  // namespace
}  // namespace loradb::bench

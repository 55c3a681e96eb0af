// `loradb replicate publish|follow|status`: catalog replication by shipping generations
// (storage/replication, docs/distributed.md). `publish` runs beside the catalog's one writer;
// `follow` is what an engine runs: a read-only replica with the shared blob root.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "storage/catalog/catalog.h"
#include "storage/replication/replication.h"
#include "tools/loradb/command.h"
#include "tools/loradb/store_cli.h"

namespace loradb::cli {
namespace {

nlohmann::json ManifestJson(const GenerationManifest& m) {
  return {{"generation", m.generation}, {"txnid", m.txnid},
          {"store_id", m.store_id},     {"published_us", m.published_us},
          {"data_bytes", m.data_bytes}, {"data_xxh3_128", m.data_hash.Hex()},
          {"writer_epoch", m.epoch}};
}

int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What an engine serves from a generation: per policy, its aliases (resolved, with the
// revision's blob read back and checksum-verified from the blob root) and live revision ids.
absl::StatusOr<nlohmann::json> ServedState(const Store& store) {
  nlohmann::json policies = nlohmann::json::object();
  auto list = store.ListPolicies();
  if (!list.ok()) return list.status();
  uint64_t loaded = 0;
  for (const auto& p : *list) {
    nlohmann::json aliases = nlohmann::json::object();
    auto entries = store.ListAliases(p.name);
    if (!entries.ok()) return entries.status();
    for (const auto& a : *entries) {
      auto rev = store.GetRevision(a.revision);
      if (!rev.ok()) return rev.status();
      auto tensors = store.ReadTensors(*rev);
      if (!tensors.ok()) {
        return absl::Status(tensors.status().code(),
                            absl::StrCat("loading ", p.name, ":", a.alias, " (revision ",
                                         a.revision, "): ", tensors.status().message()));
      }
      ++loaded;
      aliases[a.alias] = a.revision;
    }
    std::vector<uint64_t> live;
    auto page = store.ListRevisions(p.name, 0, 0);
    if (!page.ok()) return page.status();
    for (const auto& r : page->items) live.push_back(r.id);
    policies[p.name] = {{"aliases", aliases}, {"live", live}};
  }
  return nlohmann::json{{"policies", policies}, {"loaded", loaded}};
}

void SetupPublish(CLI::App* sub, Invocation* inv) {
  auto once = std::make_shared<bool>(false);
  auto interval_ms = std::make_shared<int>(20);
  auto keep = std::make_shared<uint64_t>(8);
  auto take_over = std::make_shared<bool>(false);
  sub->add_flag("--once", *once, "publish one generation and exit");
  sub->add_flag("--take-over", *take_over,
                "do not take the LOCK flock (a shared file system, or a writer believed dead): "
                "the new writer epoch fences any earlier publisher");
  sub->add_option("--interval-ms", *interval_ms,
                  "poll the catalog for new commits this often (default 20)")
      ->check(CLI::Range(1, 60000));
  sub->add_option("--keep", *keep, "generations kept on disk (default 8, at least 2)");
  sub->callback([inv, once, interval_ms, keep, take_over] {
    inv->run = [inv, once, interval_ms, keep, take_over]() -> absl::Status {
      auto store = OpenExistingStore(inv->global.store);
      if (!store.ok()) return store.status();
      auto catalog = Catalog::Open((*store)->dir());
      if (!catalog.ok()) return catalog.status();
      PublisherOptions po;
      po.keep = *keep;
      po.use_flock = !*take_over;
      auto pub = ReplicaPublisher::Open(*catalog, ReplicaRootFor((*store)->dir()), po);
      if (!pub.ok()) return pub.status();
      if (*once) {
        auto m = (*pub)->Publish();
        if (!m.ok()) return m.status();
        PrintJson(ManifestJson(*m));
        return absl::OkStatus();
      }
      // Until killed: a generation whenever the catalog committed something new.
      for (;;) {
        auto m = (*pub)->PublishIfChanged();
        if (!m.ok()) return m.status();
        if (m->has_value()) {
          PrintJson(ManifestJson(**m));
          std::fflush(stdout);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(*interval_ms));
      }
    };
  });
}

void SetupFollow(CLI::App* sub, Invocation* inv) {
  auto blob_root = std::make_shared<std::string>();
  auto interval_ms = std::make_shared<int>(20);
  auto until_gen = std::make_shared<uint64_t>(0);
  sub->add_option("--blob-root", *blob_root,
                  "the shared blob root (default: the writer store's blobs/)");
  sub->add_option("--interval-ms", *interval_ms, "poll CURRENT this often (default 20)")
      ->check(CLI::Range(1, 60000));
  sub->add_option("--until-gen", *until_gen,
                  "exit once this generation (or a newer one) is served (default: follow forever)");
  sub->callback([inv, blob_root, interval_ms, until_gen] {
    inv->run = [inv, blob_root, interval_ms, until_gen]() -> absl::Status {
      const std::string root = ReplicaRootFor(inv->global.store);
      FollowerOptions fo;
      fo.blob_root = *blob_root;
      std::unique_ptr<ReplicaFollower> follower;
      // Before the first generation exists, wait for it.
      for (;;) {
        auto f = ReplicaFollower::Open(root, fo);
        if (f.ok()) {
          follower = std::move(*f);
          break;
        }
        if (!absl::IsNotFound(f.status())) return f.status();
        std::this_thread::sleep_for(std::chrono::milliseconds(*interval_ms));
      }
      // One JSON line per generation served: its manifest, when it was adopted and the state.
      bool print = true;
      for (;;) {
        if (print) {
          const GenerationManifest m = follower->manifest();
          auto state = ServedState(*follower->store());
          if (!state.ok()) return state.status();
          nlohmann::json line = ManifestJson(m);
          line["adopted_us"] = WallMicros();
          line["pid"] = static_cast<int64_t>(getpid());
          line["state"] = std::move(*state);
          PrintJson(line);
          std::fflush(stdout);
          if (*until_gen != 0 && m.generation >= *until_gen) return absl::OkStatus();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(*interval_ms));
        auto swapped = follower->Refresh();
        if (!swapped.ok()) {
          // The held generation stays in use; say why and try again next round.
          std::fprintf(stderr, "replicate follow: %s\n",
                       std::string(swapped.status().message()).c_str());
          print = false;
          continue;
        }
        print = *swapped;
      }
    };
  });
}

void SetupStatus(CLI::App* sub, Invocation* inv) {
  sub->callback([inv] {
    inv->run = [inv]() -> absl::Status {
      const std::string root = ReplicaRootFor(inv->global.store);
      auto gen = ReadCurrentGeneration(root);
      if (!gen.ok()) return gen.status();
      auto m = ReadManifest(root, *gen);
      if (!m.ok()) return m.status();
      PrintJson(ManifestJson(*m));
      return absl::OkStatus();
    };
  });
}

void SetupReplicate(CLI::App* sub, Invocation* inv) {
  sub->require_subcommand(1);
  SetupPublish(sub->add_subcommand("publish",
                                   "publish catalog generations into <store>/replica (the one "
                                   "writer); --once for one, otherwise whenever the catalog "
                                   "changes, until killed"),
               inv);
  SetupFollow(sub->add_subcommand("follow",
                                  "serve a read-only replica of <store>/replica, swapping to "
                                  "each newer generation; prints one JSON line per generation"),
              inv);
  SetupStatus(sub->add_subcommand("status", "print the manifest of the current generation"), inv);
}

LORADB_REGISTER_COMMAND("replicate",
                        "catalog replication: publish generations (writer) or follow them "
                        "(engines)",
                        SetupReplicate);

}  // namespace
}  // namespace loradb::cli

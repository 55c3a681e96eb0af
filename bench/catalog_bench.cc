// loradb-bench catalog [--revisions N[,N...]] [--policies P] [--batch B] [--dir DIR]
// Synthetic revisions over P policies (round-robin) with a handful of small shared blobs, so the
// catalog and not the disk is measured. Per N: durable bulk publish rate, point lookups by id
// (zero-copy views, owning records, and raw LMDB mdb_get side by side) and by (policy, alias),
// full ordered scan, one policy's listing, open time, bytes per revision and where they go.
// After the last N: the cost growth over the sizes run, one line per size and a table on stderr.
// Disk: the catalog of the largest N (about 260 bytes per revision: 2.6 GB at 10^7) under
// --dir (default: the system temp directory), removed after each size.
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "storage/catalog/catalog.h"
#include "storage/catalog/raw_probe.h"
#include "storage/util/hash.h"
#include "storage/util/status_macros.h"

namespace loradb::bench {
namespace {

struct CatalogBenchArgs {
  std::vector<uint64_t> sizes = {1000, 10000, 100000, 1000000};
  uint64_t policies = 1000;
  uint64_t batch = 0;  // 0: BatchFor(n)
  std::string dir;
};

absl::StatusOr<CatalogBenchArgs> ParseArgs(const std::vector<std::string>& args) {
  CatalogBenchArgs a;
  CLI::App app("catalog: publish, lookup, scan, open and size at several catalog sizes", "catalog");
  app.add_option("--revisions", a.sizes, "catalog sizes (revisions), comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--policies", a.policies, "policies the revisions are spread over")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", a.batch,
                 "revisions per write transaction (default: 10000, or N/100 from 10^6 on)")
      ->check(CLI::PositiveNumber);
  app.add_option("--dir", a.dir, "work directory (default: a temporary one)");
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  return a;
}

NewRevision SyntheticRevision(uint64_t policy_id, uint64_t i) {
  NewRevision r;
  r.policy_id = policy_id;
  r.lora.r = 16;
  r.lora.alpha = 32;
  r.lora.target_modules = {"q_proj", "v_proj"};
  r.dtype = "BF16";
  r.source.kind = SourceKind::kTrained;
  r.source.checkpoint_id = i + 1;
  r.source.step = (i + 1) * 10;
  const uint64_t b = i % 16;  // 16 small shared blobs
  r.blob.hash = Hash128{0x1000 + b, 0x2000 + b};
  r.blob.bytes = 4096 + b;
  r.blob.tensors = 112;
  return r;
}

struct Lat {
  double p50_us, p99_us, ops_s;
};

// The figures of one size that the growth table compares.
struct SizeFigures {
  uint64_t revisions = 0;
  double publish_us_per_revision = 0;
  double bytes_per_revision = 0;
  double open_ms = 0;
  double lookup_id_p99_us = 0;
  double lookup_alias_p99_us = 0;
  double raw_lmdb_p99_us = 0;
  double scan_ns_per_record = 0;
};

// Revisions per durable commit by default: 10000, and from 10^6 on N/100 (a bulk load in 100
// commits). Each commit rewrites the last page of every policy's index touched (up to 1000
// here, round robin), a cost per commit that larger commits spread over more revisions.
uint64_t BatchFor(uint64_t n) { return std::max<uint64_t>(10000, n / 100); }

// Goal targets: the 10^7 goals from 10^7 revisions on, the earlier ones below.
bool Large(uint64_t n) { return n >= 10000000; }

template <typename Fn>
absl::StatusOr<Lat> MeasureLookups(size_t n, Fn&& fn) {
  std::vector<double> samples;
  samples.reserve(n);
  const double t0 = NowSeconds();
  for (size_t i = 0; i < n; ++i) {
    const double s = NowSeconds();
    LORADB_RETURN_IF_ERROR(fn(i));
    samples.push_back((NowSeconds() - s) * 1e6);
  }
  const double total = NowSeconds() - t0;
  return Lat{Quantile(samples, 0.5), Quantile(samples, 0.99), static_cast<double>(n) / total};
}

absl::Status RunOne(const CatalogBenchArgs& args, uint64_t n, const std::string& root,
                    SizeFigures* fig) {
  fig->revisions = n;
  const std::string dir = absl::StrCat(root, "/catalog-", n);
  std::filesystem::remove_all(dir);
  const uint64_t policies = std::min(args.policies, n);
  std::vector<uint64_t> policy_ids;
  {
    LORADB_ASSIGN_OR_RETURN(std::shared_ptr<Catalog> cat, Catalog::Open(dir));
    BaseRecord base;
    base.name = "qwen3-4b";
    base.arch.family = "qwen3";
    base.modules = {{"layers.0.self_attn.q_proj", 2560, 4096}};
    LORADB_RETURN_IF_ERROR(cat->PutBase(base));
    for (uint64_t p = 0; p < policies; ++p) {
      LORADB_ASSIGN_OR_RETURN(PolicyRecord rec,
                              cat->CreatePolicy(absl::StrCat("tenant", p, "/support"), base.name));
      policy_ids.push_back(rec.id);
    }

    // Bulk publish: durable commits of `batch` revisions; the first revision of every policy
    // also sets its `serving` alias (in the same transaction).
    Progress(absl::StrCat("catalog: publishing ", n, " revisions over ", policies, " policies"));
    const uint64_t batch_size = args.batch > 0 ? args.batch : BatchFor(n);
    const double t0 = NowSeconds();
    std::vector<NewRevision> batch;
    for (uint64_t i = 0; i < n;) {
      batch.clear();
      for (uint64_t j = 0; j < batch_size && i < n; ++j, ++i) {
        batch.push_back(SyntheticRevision(policy_ids[i % policies], i));
        if (i < policies) batch.back().alias = "serving";
      }
      LORADB_RETURN_IF_ERROR(cat->PublishBatch(batch, {}).status());
    }
    const double publish_s = NowSeconds() - t0;
    const double publish_rate = static_cast<double>(n) / publish_s;
    Emit({{"bench", "catalog"},
          {"case", "publish"},
          {"revisions", n},
          {"policies", policies},
          {"batch", batch_size},
          {"commits", (n + batch_size - 1) / batch_size},
          {"seconds", publish_s},
          {"revisions_per_s", publish_rate}});
    fig->publish_us_per_revision = publish_s * 1e6 / static_cast<double>(n);
    if (n == 10000000) {
      EmitGoal("catalog", "publish_1e7_seconds", publish_s, "< 60", publish_s < 60);
    } else if (n == 1000000) {
      EmitGoal("catalog", "publish_1e6_seconds", publish_s, "< 20", publish_s < 20);
    } else {
      // Projected from this run's rate.
      const double projected = 1e6 / publish_rate;
      EmitGoal("catalog", absl::StrCat("publish_1e6_seconds_projected_from_", n), projected, "< 20",
               projected < 20);
    }

    LORADB_ASSIGN_OR_RETURN(uint64_t data_bytes, cat->DataBytes());
    struct stat st;
    const std::string data_file = dir + "/catalog/data.mdb";
    const uint64_t file_bytes = ::stat(data_file.c_str(), &st) == 0 ? st.st_size : 0;
    const double per_rev = static_cast<double>(data_bytes) / static_cast<double>(n);
    Emit({{"bench", "catalog"},
          {"case", "size"},
          {"revisions", n},
          {"used_bytes", data_bytes},
          {"file_bytes", file_bytes},
          {"bytes_per_revision", per_rev}});
    fig->bytes_per_revision = per_rev;
    const double max_per_rev = Large(n) ? 300 : 512;
    EmitGoal("catalog", absl::StrCat("bytes_per_revision_", n), per_rev,
             absl::StrCat("<= ", max_per_rev), per_rev <= max_per_rev);
    // Where the bytes go: one line per named database with pages, plus the free list.
    LORADB_ASSIGN_OR_RETURN(CatalogSpace space, cat->Space());
    for (const CatalogDbSpace& db : space.dbs) {
      if (db.pages() == 0) continue;
      Emit({{"bench", "catalog"},
            {"case", "space_db"},
            {"revisions", n},
            {"db", db.name},
            {"entries", db.entries},
            {"depth", db.depth},
            {"branch_pages", db.branch_pages},
            {"leaf_pages", db.leaf_pages},
            {"overflow_pages", db.overflow_pages},
            {"key_value_bytes", db.key_value_bytes},
            {"fill", static_cast<double>(db.key_value_bytes) /
                         static_cast<double>(db.pages() * space.page_size)}});
    }
    Emit({{"bench", "catalog"},
          {"case", "space"},
          {"revisions", n},
          {"page_size", space.page_size},
          {"used_pages", space.used_pages},
          {"meta_pages", space.meta_pages},
          {"main_pages", space.main.pages()},
          {"freelist_pages", space.freelist_pages},
          {"free_pages", space.free_pages},
          {"unaccounted_pages", space.unaccounted_pages}});
  }

  // Open time: the environment was closed above (the last handle died).
  std::vector<double> opens;
  std::shared_ptr<Catalog> cat;
  for (int i = 0; i < 5; ++i) {
    cat.reset();
    const double t0 = NowSeconds();
    LORADB_ASSIGN_OR_RETURN(cat, Catalog::Open(dir));
    opens.push_back((NowSeconds() - t0) * 1e3);
  }
  const double open_ms = Quantile(opens, 0.5);
  const double open_max_ms = *std::max_element(opens.begin(), opens.end());
  Emit({{"bench", "catalog"},
        {"case", "open"},
        {"revisions", n},
        {"p50_ms", open_ms},
        {"max_ms", open_max_ms}});
  EmitGoal("catalog", absl::StrCat("open_ms_", n), open_max_ms, "< 5", open_max_ms < 5);
  fig->open_ms = open_max_ms;

  // Lookups by id, three ways on the same catalog in one run: a zero-copy view (verified in
  // place; the caller reads the fields it needs), raw LMDB (renew, mdb_get, reset: no
  // verification, no decoding) and the owning record (decoded into RevisionRecord). Raw and view
  // alternate lookup by lookup, each on its own random ids (the same distribution), and which
  // goes first alternates too, so both see the same cache and machine state.
  const double p99_goal_us = Large(n) ? 3 : 5;
  std::mt19937_64 rng(42);
  const size_t lookups = 200000;
  std::vector<uint64_t> ids(lookups), raw_ids(lookups);
  for (auto& id : ids) id = 1 + rng() % n;
  for (auto& id : raw_ids) id = 1 + rng() % n;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<RawRevisionProbe> raw, RawRevisionProbe::Create(cat));
  std::vector<double> view_us, raw_us;
  view_us.reserve(lookups);
  raw_us.reserve(lookups);
  uint64_t sink = 0;
  auto view_lookup = [&](uint64_t id) -> absl::Status {
    return cat->Read([&](const CatalogReader& r) -> absl::Status {
      LORADB_ASSIGN_OR_RETURN(RevisionView v, r.Revision(id));
      sink += v.blob().bytes + static_cast<uint64_t>(v.state());  // what serving reads
      return absl::OkStatus();
    });
  };
  auto raw_lookup = [&](uint64_t id) -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(size_t bytes, raw->ValueSize(id));
    sink += bytes;
    return absl::OkStatus();
  };
  // Two passes over the same ids: the first right after open, when most lookups touch a page of
  // the map for the first time (a page fault each, for both paths), reported as first-touch
  // figures; the second on the mapped catalog, the steady state of a process that serves from
  // it, which the goals judge.
  double first_touch_view_p99 = 0, first_touch_raw_p99 = 0, lookups_s = 0;
  for (int pass = 0; pass < 2; ++pass) {
    view_us.clear();
    raw_us.clear();
    const double lookups_t0 = NowSeconds();
    for (size_t i = 0; i < lookups; ++i) {
      for (int side = 0; side < 2; ++side) {
        const bool do_raw = (side == 0) == (i % 2 == 0);
        const double t = NowSeconds();
        LORADB_RETURN_IF_ERROR(do_raw ? raw_lookup(raw_ids[i]) : view_lookup(ids[i]));
        (do_raw ? raw_us : view_us).push_back((NowSeconds() - t) * 1e6);
      }
    }
    lookups_s = NowSeconds() - lookups_t0;
    if (pass == 0) {
      first_touch_view_p99 = Quantile(view_us, 0.99);
      first_touch_raw_p99 = Quantile(raw_us, 0.99);
    }
  }
  raw.reset();
  LORADB_ASSIGN_OR_RETURN(Lat owning, MeasureLookups(lookups, [&](size_t i) {
                            return cat->GetRevision(ids[i]).status();
                          }));
  const Lat by_id{Quantile(view_us, 0.5), Quantile(view_us, 0.99), 0};
  const Lat raw_lat{Quantile(raw_us, 0.5), Quantile(raw_us, 0.99), 0};
  Emit({{"bench", "catalog"},
        {"case", "lookup_id"},
        {"revisions", n},
        {"path", "view"},
        {"p50_us", by_id.p50_us},
        {"p99_us", by_id.p99_us},
        {"raw_lmdb_p50_us", raw_lat.p50_us},
        {"raw_lmdb_p99_us", raw_lat.p99_us},
        {"p99_vs_raw_lmdb", by_id.p99_us / raw_lat.p99_us},
        {"first_touch_p99_us", first_touch_view_p99},
        {"first_touch_raw_lmdb_p99_us", first_touch_raw_p99},
        {"owning_p50_us", owning.p50_us},
        {"owning_p99_us", owning.p99_us},
        {"owning_ops_per_s", owning.ops_s},
        {"interleaved_pairs_per_s", static_cast<double>(lookups) / lookups_s},
        {"checksum", sink & 0xffff}});
  EmitGoal("catalog", absl::StrCat("lookup_id_p99_us_", n), by_id.p99_us,
           absl::StrCat("< ", p99_goal_us), by_id.p99_us < p99_goal_us);
  EmitGoal("catalog", absl::StrCat("lookup_id_p99_vs_raw_lmdb_", n), by_id.p99_us / raw_lat.p99_us,
           "<= 1.5 (view lookup p99 / raw mdb_get p99, interleaved in this run)",
           by_id.p99_us / raw_lat.p99_us <= 1.5);
  fig->lookup_id_p99_us = by_id.p99_us;
  fig->raw_lmdb_p99_us = raw_lat.p99_us;

  // Policy ids are 1..policies (created in order in a fresh store).
  std::vector<uint64_t> pids(lookups);
  for (auto& p : pids) p = 1 + rng() % policies;
  const std::string serving = "serving";
  LORADB_ASSIGN_OR_RETURN(Lat by_alias, MeasureLookups(lookups, [&](size_t i) {
                            return cat->Read([&](const CatalogReader& r) -> absl::Status {
                              LORADB_ASSIGN_OR_RETURN(RevisionView v,
                                                      r.RevisionByAlias(pids[i], serving));
                              sink += v.id();
                              return absl::OkStatus();
                            });
                          }));
  Emit({{"bench", "catalog"},
        {"case", "lookup_alias"},
        {"revisions", n},
        {"path", "view"},
        {"p50_us", by_alias.p50_us},
        {"p99_us", by_alias.p99_us},
        {"ops_per_s", by_alias.ops_s}});
  EmitGoal("catalog", absl::StrCat("lookup_alias_p99_us_", n), by_alias.p99_us,
           absl::StrCat("< ", p99_goal_us), by_alias.p99_us < p99_goal_us);
  fig->lookup_alias_p99_us = by_alias.p99_us;

  // Full ordered scan, hashing each record (as the raw LMDB calibration probe did).
  uint64_t scanned = 0, h = 0;
  double t0 = NowSeconds();
  LORADB_RETURN_IF_ERROR(cat->ScanRevisionsRaw([&](uint64_t, std::span<const uint8_t> rec) {
    h ^= Xxh3_64(rec.data(), rec.size());
    ++scanned;
  }));
  const double scan_s = NowSeconds() - t0;
  const double scan_rate = static_cast<double>(scanned) / scan_s;
  Emit({{"bench", "catalog"},
        {"case", "scan_all"},
        {"revisions", n},
        {"records", scanned},
        {"seconds", scan_s},
        {"records_per_s", scan_rate},
        {"checksum", h & 0xffff}});
  if (scanned != n) return absl::InternalError("scan saw a different count");
  const double min_scan = Large(n) ? 5e6 : 3e6;
  EmitGoal("catalog", absl::StrCat("scan_records_per_s_", n), scan_rate,
           Large(n) ? ">= 5e6" : ">= 3e6", scan_rate >= min_scan);
  fig->scan_ns_per_record = scan_s * 1e9 / static_cast<double>(scanned);

  // Decoded scan through the paginated API (what `loradb ls` uses).
  t0 = NowSeconds();
  uint64_t decoded = 0;
  std::optional<uint64_t> after = 0;
  while (after) {
    LORADB_ASSIGN_OR_RETURN(auto page, cat->ListRevisions(*after, 10000));
    decoded += page.items.size();
    after = page.next_after;
  }
  const double dec_s = NowSeconds() - t0;
  Emit({{"bench", "catalog"},
        {"case", "list_all_decoded"},
        {"revisions", n},
        {"records", decoded},
        {"records_per_s", static_cast<double>(decoded) / dec_s}});

  // One policy: its full listing (index + records) and its index walk alone, against walking
  // the index of every policy. Listing one policy touches only its own duplicates, so one
  // policy's walk times the number of policies stays close to the walk over all of them.
  const uint64_t pid = 1 + policies / 2;
  t0 = NowSeconds();
  LORADB_ASSIGN_OR_RETURN(auto one, cat->ListPolicyRevisions(pid, 0, 0));
  const double one_s = NowSeconds() - t0;
  const int reps = 50;
  t0 = NowSeconds();
  uint64_t idx_count = 0;
  for (int i = 0; i < reps; ++i) {
    LORADB_ASSIGN_OR_RETURN(uint64_t c, cat->CountPolicyRevisions(pid));
    idx_count = c;
  }
  const double one_idx_s = (NowSeconds() - t0) / reps;
  t0 = NowSeconds();
  uint64_t all_idx = 0;
  for (uint64_t p = 1; p <= policies; ++p) {
    LORADB_ASSIGN_OR_RETURN(uint64_t c, cat->CountPolicyRevisions(p));
    all_idx += c;
  }
  const double all_idx_s = NowSeconds() - t0;
  if (all_idx != n || idx_count != one.items.size()) {
    return absl::InternalError("policy index counts do not add up");
  }
  const double isolation = one_idx_s * static_cast<double>(policies) / all_idx_s;
  Emit({{"bench", "catalog"},
        {"case", "scan_policy"},
        {"revisions", n},
        {"policy_revisions", one.items.size()},
        {"list_ms", one_s * 1e3},
        {"records_per_s", static_cast<double>(one.items.size()) / one_s},
        {"index_walk_us", one_idx_s * 1e6},
        {"all_policies_index_walk_ms", all_idx_s * 1e3}});
  EmitGoal("catalog", absl::StrCat("policy_list_isolated_", n), isolation,
           "<= 2 (one policy's index walk x policies / walk of all policies)", isolation <= 2);
  cat.reset();
  std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

// Cost growth over the sizes run: one line per size with each figure and its ratio to the
// smallest size's, and the same as a table on stderr. Shows the scaling; asserts nothing.
void EmitGrowth(const std::vector<SizeFigures>& figs) {
  if (figs.empty()) return;
  const SizeFigures& a = figs.front();
  auto ratio = [](double v, double base) { return base > 0 ? v / base : 0.0; };
  std::string table = absl::StrCat(
      "catalog cost growth (x: ratio to ", a.revisions, " revisions)\n",
      "  revisions | publish us/rev | bytes/rev | open ms | id p99 us (raw) | alias p99 us | "
      "scan ns/rec\n");
  for (const SizeFigures& f : figs) {
    Emit({{"bench", "catalog"},
          {"case", "growth"},
          {"revisions", f.revisions},
          {"publish_us_per_revision", f.publish_us_per_revision},
          {"bytes_per_revision", f.bytes_per_revision},
          {"open_ms", f.open_ms},
          {"lookup_id_p99_us", f.lookup_id_p99_us},
          {"raw_lmdb_p99_us", f.raw_lmdb_p99_us},
          {"lookup_alias_p99_us", f.lookup_alias_p99_us},
          {"scan_ns_per_record", f.scan_ns_per_record},
          {"publish_x", ratio(f.publish_us_per_revision, a.publish_us_per_revision)},
          {"bytes_x", ratio(f.bytes_per_revision, a.bytes_per_revision)},
          {"lookup_id_p99_x", ratio(f.lookup_id_p99_us, a.lookup_id_p99_us)},
          {"lookup_alias_p99_x", ratio(f.lookup_alias_p99_us, a.lookup_alias_p99_us)},
          {"scan_x", ratio(f.scan_ns_per_record, a.scan_ns_per_record)}});
    absl::StrAppend(
        &table,
        absl::StrFormat("  %9d | %6.2f (%4.2fx) | %5.0f (%4.2fx) | %7.2f | %5.2f (%5.2f) "
                        "%4.2fx | %5.2f %4.2fx | %5.0f %4.2fx\n",
                        f.revisions, f.publish_us_per_revision,
                        ratio(f.publish_us_per_revision, a.publish_us_per_revision),
                        f.bytes_per_revision, ratio(f.bytes_per_revision, a.bytes_per_revision),
                        f.open_ms, f.lookup_id_p99_us, f.raw_lmdb_p99_us,
                        ratio(f.lookup_id_p99_us, a.lookup_id_p99_us), f.lookup_alias_p99_us,
                        ratio(f.lookup_alias_p99_us, a.lookup_alias_p99_us), f.scan_ns_per_record,
                        ratio(f.scan_ns_per_record, a.scan_ns_per_record)));
  }
  Progress(table);
}

absl::Status RunCatalogBench(const std::vector<std::string>& argv) {
  LORADB_ASSIGN_OR_RETURN(CatalogBenchArgs args, ParseArgs(argv));
  std::string root = args.dir;
  if (root.empty()) {
    root = (std::filesystem::temp_directory_path() / "loradb-catalog-bench").string();
  }
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", root, ": ", ec.message()));
  std::vector<SizeFigures> figures;
  for (uint64_t n : args.sizes) {
    figures.emplace_back();
    LORADB_RETURN_IF_ERROR(RunOne(args, n, root, &figures.back()));
  }
  std::filesystem::remove_all(root, ec);
  EmitGrowth(figures);
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO({"catalog",
                          "catalog publish/lookup/scan/open/size at --revisions N[,N...]",
                          RunCatalogBench,
                          {"--revisions", "1000,10000,100000,1000000,10000000"}});

}  // namespace
}  // namespace loradb::bench

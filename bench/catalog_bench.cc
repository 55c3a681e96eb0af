// loradb-bench catalog [--revisions N[,N...]] [--policies P] [--batch B] [--dir DIR]
// Synthetic revisions over P policies (round-robin) with a handful of small shared blobs, so the
// catalog and not the disk is measured. Per N: durable bulk publish rate, point lookups by id
// and by (policy, alias), full ordered scan, one policy's listing, open time, bytes per revision.
#include <sys/stat.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "storage/catalog/catalog.h"
#include "storage/util/hash.h"
#include "storage/util/status_macros.h"

namespace loradb::bench {
namespace {

struct CatalogBenchArgs {
  std::vector<uint64_t> sizes = {1000, 10000, 100000, 1000000};
  uint64_t policies = 1000;
  uint64_t batch = 10000;
  std::string dir;
};

absl::StatusOr<CatalogBenchArgs> ParseArgs(const std::vector<std::string>& args) {
  CatalogBenchArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& f = args[i];
    if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("missing value: ", f));
    const std::string& v = args[++i];
    if (f == "--revisions") {
      a.sizes.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        uint64_t n = 0;
        if (!absl::SimpleAtoi(s, &n) || n == 0) {
          return absl::InvalidArgumentError(absl::StrCat("bad --revisions value '", s, "'"));
        }
        a.sizes.push_back(n);
      }
    } else if (f == "--policies") {
      if (!absl::SimpleAtoi(v, &a.policies) || a.policies == 0) {
        return absl::InvalidArgumentError("bad --policies");
      }
    } else if (f == "--batch") {
      if (!absl::SimpleAtoi(v, &a.batch) || a.batch == 0) {
        return absl::InvalidArgumentError("bad --batch");
      }
    } else if (f == "--dir") {
      a.dir = v;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", f));
    }
  }
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

absl::Status RunOne(const CatalogBenchArgs& args, uint64_t n, const std::string& root) {
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
    const double t0 = NowSeconds();
    std::vector<NewRevision> batch;
    for (uint64_t i = 0; i < n;) {
      batch.clear();
      for (uint64_t j = 0; j < args.batch && i < n; ++j, ++i) {
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
          {"batch", args.batch},
          {"seconds", publish_s},
          {"revisions_per_s", publish_rate}});
    if (n == 1000000) {
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
    EmitGoal("catalog", absl::StrCat("bytes_per_revision_", n), per_rev, "<= 512", per_rev <= 512);
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

  std::mt19937_64 rng(42);
  const size_t lookups = 200000;
  std::vector<uint64_t> ids(lookups);
  for (auto& id : ids) id = 1 + rng() % n;
  LORADB_ASSIGN_OR_RETURN(Lat by_id, MeasureLookups(lookups, [&](size_t i) {
                            return cat->GetRevision(ids[i]).status();
                          }));
  Emit({{"bench", "catalog"},
        {"case", "lookup_id"},
        {"revisions", n},
        {"p50_us", by_id.p50_us},
        {"p99_us", by_id.p99_us},
        {"ops_per_s", by_id.ops_s}});
  EmitGoal("catalog", absl::StrCat("lookup_id_p99_us_", n), by_id.p99_us, "< 5", by_id.p99_us < 5);

  // Policy ids are 1..policies (created in order in a fresh store).
  std::vector<uint64_t> pids(lookups);
  for (auto& p : pids) p = 1 + rng() % policies;
  const std::string serving = "serving";
  LORADB_ASSIGN_OR_RETURN(Lat by_alias, MeasureLookups(lookups, [&](size_t i) {
                            return cat->GetRevisionByAlias(pids[i], serving).status();
                          }));
  Emit({{"bench", "catalog"},
        {"case", "lookup_alias"},
        {"revisions", n},
        {"p50_us", by_alias.p50_us},
        {"p99_us", by_alias.p99_us},
        {"ops_per_s", by_alias.ops_s}});
  EmitGoal("catalog", absl::StrCat("lookup_alias_p99_us_", n), by_alias.p99_us, "< 5",
           by_alias.p99_us < 5);

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
  EmitGoal("catalog", absl::StrCat("scan_records_per_s_", n), scan_rate, ">= 3e6",
           scan_rate >= 3e6);

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

absl::Status RunCatalogBench(const std::vector<std::string>& argv) {
  LORADB_ASSIGN_OR_RETURN(CatalogBenchArgs args, ParseArgs(argv));
  std::string root = args.dir;
  if (root.empty()) {
    root = (std::filesystem::temp_directory_path() / "loradb-catalog-bench").string();
  }
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", root, ": ", ec.message()));
  for (uint64_t n : args.sizes) LORADB_RETURN_IF_ERROR(RunOne(args, n, root));
  std::filesystem::remove_all(root, ec);
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO({"catalog",
                          "catalog publish/lookup/scan/open/size at --revisions N[,N...]",
                          RunCatalogBench,
                          {"--revisions", "1000,10000,100000,1000000"}});

}  // namespace
}  // namespace loradb::bench

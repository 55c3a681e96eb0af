// `loradb compact` and `loradb migrate`: offline maintenance of a store
// (storage/maintenance/maintenance.h, docs/operations.md). `loradb verify` (cmd_store.cc) runs
// VerifyStore.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "storage/maintenance/maintenance.h"
#include "tools/loradb/command.h"

namespace loradb::cli {
namespace {

// A progress bar on stderr, drawn only when stderr is a terminal.
MaintenanceProgress TerminalProgress() {
  if (!::isatty(STDERR_FILENO)) return nullptr;
  return [](absl::string_view phase, uint64_t done, uint64_t total) {
    constexpr int kWidth = 30;
    const double frac = total == 0 ? 0.0 : static_cast<double>(done) / static_cast<double>(total);
    const int fill = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(fill), '=');
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r%-6s [%s] %3d%% %llu/%llu", std::string(phase).c_str(), bar.c_str(),
                 static_cast<int>(frac * 100), static_cast<unsigned long long>(done),
                 static_cast<unsigned long long>(total));
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

// "90d", "12h", "30m", "45s" or a plain number of seconds -> microseconds.
absl::StatusOr<int64_t> ParseWindow(const std::string& text) {
  if (text == "all") return -1;
  absl::Duration d;
  if (absl::ParseDuration(text, &d)) return absl::ToInt64Microseconds(d);
  int64_t n = 0;
  std::string digits = text;
  int64_t unit = 1000000;
  if (!digits.empty() && digits.back() == 'd') {
    unit *= 86400;
    digits.pop_back();
  }
  if (!absl::SimpleAtoi(digits, &n) || n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad --keep-alias-history '", text, "': use a duration such as 30d, 12h, 90m or 'all'"));
  }
  return n * unit;
}

void SetupCompact(CLI::App* sub, Invocation* inv) {
  struct Args {
    bool json = false;
    bool dry_run = false;
    bool drop_previous = false;
    bool keep_files = false;
    uint64_t keep_last = 0;
    std::string window = "all";
    std::string blob_root;
  };
  auto args = std::make_shared<Args>();
  AddJsonFlag(sub, &args->json);
  sub->add_flag("--dry-run", args->dry_run, "report what would be dropped; change nothing");
  sub->add_option("--keep-last", args->keep_last,
                  "keep the newest N live revisions of each policy (default: keep all)");
  sub->add_option("--keep-alias-history", args->window,
                  "with --keep-last: also keep revisions an alias log entry within this window "
                  "points at (e.g. 30d; default 'all')");
  sub->add_flag("--drop-previous", args->drop_previous,
                "delete the previous catalog generation and the blobs only it needed");
  sub->add_flag("--keep-blob-files", args->keep_files,
                "do not delete unreferenced blob files (blob root shared with other catalogs)");
  sub->add_option("--blob-root", args->blob_root, "blob directory (default STORE/blobs)");
  sub->callback([inv, args] {
    inv->run = [inv, args]() -> absl::Status {
      CompactOptions o;
      o.blob_root = args->blob_root;
      o.dry_run = args->dry_run;
      o.drop_previous = args->drop_previous;
      o.collect_blob_files = !args->keep_files;
      o.retention.keep_last = args->keep_last;
      auto window = ParseWindow(args->window);
      if (!window.ok()) return window.status();
      o.retention.alias_history_window_us = *window;
      if (!args->json) o.progress = TerminalProgress();
      auto rep = CompactStore(inv->global.store, o);
      if (!rep.ok()) return rep.status();
      if (args->json) {
        PrintJson({{"dry_run", rep->dry_run},
                   {"catalog_bytes_before", rep->catalog_bytes_before},
                   {"catalog_bytes_after", rep->catalog_bytes_after},
                   {"revisions_before", rep->revisions_before},
                   {"revisions_kept", rep->revisions_kept},
                   {"live_revisions_kept", rep->live_revisions_kept},
                   {"dropped_deleted", rep->dropped_deleted},
                   {"dropped_retention", rep->dropped_retention},
                   {"blob_records_before", rep->blob_records_before},
                   {"blob_records_kept", rep->blob_records_kept},
                   {"blob_files_deleted", rep->blob_files_deleted},
                   {"blob_bytes_deleted", rep->blob_bytes_deleted},
                   {"blob_files_kept_for_previous", rep->blob_files_kept_for_previous},
                   {"previous_generation", rep->previous_generation},
                   {"seconds", rep->seconds}});
        return absl::OkStatus();
      }
      std::cout << (rep->dry_run ? "compact (dry run): " : "compact: ") << "revisions "
                << rep->revisions_before << " -> " << rep->revisions_kept << " ("
                << rep->dropped_deleted << " deleted and " << rep->dropped_retention
                << " by retention dropped), blob records " << rep->blob_records_before << " -> "
                << rep->blob_records_kept << "\n";
      if (!rep->dry_run) {
        std::cout << "catalog bytes " << rep->catalog_bytes_before << " -> "
                  << rep->catalog_bytes_after << "; blob files deleted " << rep->blob_files_deleted
                  << " (" << rep->blob_bytes_deleted << " bytes)";
        if (rep->blob_files_kept_for_previous > 0) {
          std::cout << ", " << rep->blob_files_kept_for_previous
                    << " kept for the previous generation";
        }
        std::cout << "\n";
        if (!rep->previous_generation.empty()) {
          std::cout << "previous generation kept at " << rep->previous_generation
                    << " (removed by the next compaction or --drop-previous)\n";
        }
      }
      return absl::OkStatus();
    };
  });
}

void SetupMigrate(CLI::App* sub, Invocation* inv) {
  struct Args {
    bool json = false;
    bool dry_run = false;
    bool drop_previous = false;
    bool repack = false;
    bool unpack = false;
    std::string blob_root;
  };
  auto args = std::make_shared<Args>();
  AddJsonFlag(sub, &args->json);
  sub->add_flag("--dry-run", args->dry_run, "report what would change; change nothing");
  sub->add_flag("--drop-previous", args->drop_previous, "do not keep the old catalog file");
  auto* repack = sub->add_flag("--repack", args->repack,
                               "rewrite plain-layout MoE revisions to the packed layout (same ids "
                               "and tensors, new blobs)");
  sub->add_flag("--unpack", args->unpack, "rewrite packed revisions back to the plain layout")
      ->excludes(repack);
  sub->add_option("--blob-root", args->blob_root, "blob directory (default STORE/blobs)");
  sub->callback([inv, args] {
    inv->run = [inv, args]() -> absl::Status {
      MigrateOptions o;
      o.blob_root = args->blob_root;
      o.dry_run = args->dry_run;
      o.drop_previous = args->drop_previous;
      o.repack = args->repack ? Repack::kPack : args->unpack ? Repack::kUnpack : Repack::kNone;
      if (!args->json) o.progress = TerminalProgress();
      auto rep = MigrateStore(inv->global.store, o);
      if (!rep.ok()) return rep.status();
      if (args->json) {
        PrintJson({{"dry_run", rep->dry_run},
                   {"from_version", rep->from_version},
                   {"to_version", rep->to_version},
                   {"changes", rep->changes},
                   {"revisions", rep->revisions},
                   {"index_entries", rep->index_entries},
                   {"revisions_rewritten", rep->revisions_rewritten},
                   {"blobs_written", rep->blobs_written},
                   {"catalog_bytes_before", rep->catalog_bytes_before},
                   {"catalog_bytes_after", rep->catalog_bytes_after},
                   {"previous_generation", rep->previous_generation},
                   {"seconds", rep->seconds}});
        return absl::OkStatus();
      }
      if (rep->changes.empty()) {
        std::cout << "migrate: store is at schema version " << rep->to_version
                  << "; nothing to do\n";
        return absl::OkStatus();
      }
      std::cout << (rep->dry_run ? "migrate (dry run) would: " : "migrate: ") << "schema "
                << rep->from_version << " -> " << rep->to_version << "\n";
      for (const auto& c : rep->changes) std::cout << "  " << c << "\n";
      return absl::OkStatus();
    };
  });
}

}  // namespace

LORADB_REGISTER_COMMAND("compact",
                        "offline: apply retention, drop deleted revisions, collect unreferenced "
                        "blobs, rebuild the catalog compactly",
                        SetupCompact);
LORADB_REGISTER_COMMAND("migrate", "offline: move the store to this build's schema version",
                        SetupMigrate);

}  // namespace loradb::cli

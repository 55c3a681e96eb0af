// `loradb tp-decode`: a tensor-parallel greedy decode of a mixed-adapter batch
// over --tp K ranks on this machine (compute/distributed/tp_decode.h). Run
// without LORADB_RANK in the environment it is the launcher: it starts K copies
// of itself (compute/distributed/launcher.h) that meet in a Gloo (or NCCL)
// group, each loading its slice of the base and acquiring its shard of every
// revision through its rank-placed device tier (storage/tiers). Rank
// 0 prints the summary and writes --out (logits and tokens as JSON) for
// comparisons.
#ifdef LORADB_COMPUTE_AVAILABLE

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "compute/distributed/launcher.h"
#include "compute/distributed/tp_c10d.h"
#include "compute/distributed/tp_decode.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"
#include "tools/loradb/command.h"

namespace loradb::cli {
namespace {

struct TpArgs {
  distributed::TpDecodeOptions run;
  int tp = 2;
  int timeout_ms = 120000;
  std::string revisions;
  std::string backend = "gloo";
  std::string out;
  bool json = false;
};

absl::Status LaunchTpRanks(int world, int timeout_ms) {
  absl::StatusOr<std::vector<std::string>> argv = dist::SelfCommandLine();
  if (!argv.ok()) return argv.status();
  dist::LaunchOptions lo;
  lo.argv = *argv;
  lo.world_size = world;
  lo.collective_timeout = std::chrono::milliseconds(timeout_ms);
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    lo.env.push_back(absl::StrCat("OMP_NUM_THREADS=", std::max(1, cores / world)));
  }
  absl::StatusOr<std::vector<dist::RankExit>> exits = dist::LaunchRanks(lo);
  if (!exits.ok()) {
    return absl::Status(exits.status().code(),
                        absl::StrCat("tensor-parallel run aborted: ", exits.status().message()));
  }
  return absl::OkStatus();
}

absl::Status Report(const TpArgs& a, const distributed::TpDecodeResult& r, int rank, int degree) {
  if (rank != 0) return absl::OkStatus();
  const double tok_s =
      r.decode_ms > 0 ? 1000.0 * static_cast<double>(r.decode_tokens) / r.decode_ms : 0;
  nlohmann::json summary = {{"tp", degree},
                            {"sequences", a.run.sequences},
                            {"steps", a.run.steps},
                            {"local_heads", r.local_heads},
                            {"load_ms", r.load_ms},
                            {"prefill_ms", r.prefill_ms},
                            {"decode_ms", r.decode_ms},
                            {"decode_tokens", r.decode_tokens},
                            {"decode_tokens_per_s", tok_s},
                            {"adapter_slot_bytes", r.adapter_slot_bytes},
                            {"adapter_whole_bytes", r.adapter_whole_bytes}};
  if (!a.out.empty()) {
    nlohmann::json doc = summary;
    doc["tokens"] = r.tokens;
    doc["logits"] = r.logits;
    LORADB_RETURN_IF_ERROR(WriteFileAtomic(a.out, doc.dump()));
  }
  if (a.json) {
    PrintJson(summary);
  } else {
    std::printf(
        "tp %d: %lld decode tokens in %.1f ms (%.1f tokens/s), prefill "
        "%.1f ms, load %.1f ms; rank 0 adapter slots %llu bytes (whole revisions %llu)\n",
        degree, static_cast<long long>(r.decode_tokens), r.decode_ms, tok_s, r.prefill_ms,
        r.load_ms, static_cast<unsigned long long>(r.adapter_slot_bytes),
        static_cast<unsigned long long>(r.adapter_whole_bytes));
  }
  return absl::OkStatus();
}

void SetupTpDecode(CLI::App* sub, Invocation* inv) {
  auto a = std::make_shared<TpArgs>();
  sub->add_option("--tp", a->tp, "tensor-parallel degree = number of ranks (default 2)");
  sub->add_option("--model", a->run.model_dir, "base checkpoint directory (whole)")->required();
  sub->add_option("--revisions", a->revisions, "comma-separated revision ids in --store");
  sub->add_option("--sequences", a->run.sequences, "sequences in the batch (default 8)");
  sub->add_option("--prompt-len", a->run.prompt_len, "prompt tokens per sequence (default 8)");
  sub->add_option("--steps", a->run.steps, "decode steps after the prefill (default 8)");
  sub->add_option("--seed", a->run.seed, "prompt seed (default 1)");
  sub->add_option("--derived-dir", a->run.derived_dir,
                  "each rank's CPU tier holds pre-sliced derived blobs built under this directory "
                  "(default: whole revisions, sliced into the device slots)");
  sub->add_option("--backend", a->backend,
                  "gloo (CPU) | nccl (CUDA; the model on the rank's GPU); default gloo");
  sub->add_option("--timeout-ms", a->timeout_ms, "collective timeout (default 120000)");
  sub->add_option("--out", a->out, "rank 0 writes logits and tokens here (JSON)");
  AddJsonFlag(sub, &a->json);
  sub->callback([inv, a] {
    inv->run = [inv, a]() -> absl::Status {
      if (a->tp < 1) return absl::InvalidArgumentError("--tp must be >= 1");
      const bool is_rank = std::getenv("LORADB_RANK") != nullptr;
      if (!is_rank && a->tp > 1) return LaunchTpRanks(a->tp, a->timeout_ms);
      a->run.store_dir = inv->global.store;
      a->run.revisions.clear();
      for (absl::string_view part : absl::StrSplit(a->revisions, ',', absl::SkipEmpty())) {
        uint64_t id = 0;
        if (!absl::SimpleAtoi(part, &id) || id == 0) {
          return absl::InvalidArgumentError(absl::StrCat("bad revision id \"", part, "\""));
        }
        a->run.revisions.push_back(id);
      }
      absl::StatusOr<dist::Backend> backend = dist::ParseBackend(a->backend);
      if (!backend.ok()) return backend.status();
      if (*backend == dist::Backend::kNccl) a->run.device = at::Device(at::kCUDA);
      a->run.record_logits = !a->out.empty();
      if (!is_rank) {
        absl::StatusOr<distributed::TpDecodeResult> r =
            distributed::RunTpDecode(a->run, {0, 1}, nullptr);
        if (!r.ok()) return r.status();
        return Report(*a, *r, 0, 1);
      }
      int rank = 0, degree = 1;
      absl::StatusOr<distributed::TpDecodeResult> r =
          distributed::RunTpDecodeRank(a->run, *backend, &rank, &degree);
      if (!r.ok()) return r.status();
      return Report(*a, *r, rank, degree);
    };
  });
}

LORADB_REGISTER_COMMAND("tp-decode",
                        "tensor-parallel decode of a mixed-adapter batch over K local ranks",
                        SetupTpDecode);

}  // namespace
}  // namespace loradb::cli

#endif  // LORADB_COMPUTE_AVAILABLE

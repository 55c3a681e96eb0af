// `loradb dist-check` and `loradb dist-train`: torch.distributed (c10d) jobs of K ranks on this
// machine. Run without LORADB_RANK in the environment, the command is the launcher: it starts
// --world copies of itself (compute/distributed/launcher.h) and waits; each copy sees
// LORADB_RANK and runs one rank. Built only when compute/ is (LibTorch found); the ranks need
// c10d (dist::C10dAvailable).
#ifdef LORADB_COMPUTE_AVAILABLE

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compute/distributed/dp_train.h"
#include "compute/distributed/launcher.h"
#include "compute/distributed/process_group_selfcheck.h"
#include "tools/loradb/command.h"

namespace loradb::cli {
namespace {

bool IsRank() { return std::getenv("LORADB_RANK") != nullptr; }

// Re-runs this command line as `world` ranks; prints how it ended.
absl::Status LaunchSelf(int world, int timeout_ms, const std::string& rendezvous = "") {
  if (world < 1) return absl::InvalidArgumentError("--world must be >= 1");
  absl::StatusOr<std::vector<std::string>> argv = dist::SelfCommandLine();
  if (!argv.ok()) return argv.status();
  dist::LaunchOptions lo;
  lo.argv = *argv;
  lo.world_size = world;
  lo.rendezvous = rendezvous;
  lo.collective_timeout = std::chrono::milliseconds(timeout_ms);
  // Share the cores between the ranks (like torchrun) unless the user chose.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    lo.env.push_back(absl::StrCat("OMP_NUM_THREADS=", std::max(1, cores / world)));
  }
  absl::StatusOr<std::vector<dist::RankExit>> exits = dist::LaunchRanks(lo);
  if (!exits.ok()) {
    return absl::Status(exits.status().code(),
                        absl::StrCat("distributed run aborted: ", exits.status().message()));
  }
  return absl::OkStatus();
}

struct CheckArgs {
  dist::SelfCheckOptions check;
  int world = 2;
  int timeout_ms = 60000;
  std::string rendezvous;
};

void SetupDistCheck(CLI::App* sub, Invocation* inv) {
  auto a = std::make_shared<CheckArgs>();
  sub->add_option("--world", a->world, "number of ranks (default 2)");
  sub->add_option("--backend", a->check.backend, "gloo | nccl (default gloo)");
  sub->add_option("--device", a->check.device, "cpu | cuda (default cpu)");
  sub->add_option("--elements", a->check.elements, "all-reduce size (default 65536)");
  sub->add_option("--timeout-ms", a->timeout_ms, "collective timeout (default 60000)");
  sub->add_option("--die-rank", a->check.die_rank, "test hook: this rank kills itself");
  sub->add_option("--rendezvous", a->rendezvous,
                  "file:PATH or tcp:HOST:PORT (default: a FileStore in a temp dir)");
  sub->callback([inv, a] {
    inv->run = [a]() -> absl::Status {
      if (!IsRank()) return LaunchSelf(a->world, a->timeout_ms, a->rendezvous);
      absl::StatusOr<dist::SelfCheckResult> r = dist::RunSelfCheck(a->check);
      if (!r.ok()) return r.status();
      std::printf("rank %d/%d %s on %s: ok, %lld collectives, all-reduce of %lld floats %.3f ms\n",
                  r->rank, r->world_size, a->check.backend.c_str(), a->check.device.c_str(),
                  static_cast<long long>(r->collectives), static_cast<long long>(a->check.elements),
                  r->allreduce_ms);
      return absl::OkStatus();
    };
  });
}

LORADB_REGISTER_COMMAND("dist-check",
                        "run a collective self-check over K local ranks (torch.distributed)",
                        SetupDistCheck);

struct TrainArgs {
  trainer::TrainRunOptions run;
  int world = 2;
  int timeout_ms = 120000;
  bool fresh = false;
  bool no_publish = false;
  bool json = false;
};

void SetupDistTrain(CLI::App* sub, Invocation* inv) {
  auto a = std::make_shared<TrainArgs>();
  trainer::TrainRunOptions& r = a->run;
  sub->add_option("--world", a->world, "number of data-parallel ranks (default 2)");
  sub->add_option("--timeout-ms", a->timeout_ms, "collective timeout (default 120000)");
  sub->add_option("--model", r.model_dir, "base checkpoint directory (config.json + weights)")
      ->required();
  sub->add_option("--policy", r.policy, "policy name (created on the base if missing)")->required();
  sub->add_option("--task", r.task, "mapping (SFT) | preference (DPO)")->required();
  sub->add_option("--steps", r.steps, "train until this optimizer step")->required();
  sub->add_option("--base", r.base_name, "base name in the store (default: model dir name)");
  sub->add_option("--rank", r.rank, "LoRA rank (default 8)");
  sub->add_option("--alpha", r.alpha, "LoRA alpha (default 16)");
  sub->add_option("--lr", r.lr, "peak learning rate (default 5e-3)");
  sub->add_option("--schedule", r.schedule, "constant | cosine (default constant)");
  sub->add_option("--warmup", r.warmup_steps, "linear warmup steps (cosine)");
  sub->add_option("--seed", r.seed, "seed of initialisation and data (default 0)");
  sub->add_option("--batch", r.batch_size,
                  "GLOBAL batch: SFT sequences / DPO pairs per step, split over the ranks "
                  "(default 32)");
  sub->add_option("--checkpoint-every", r.checkpoint_every, "checkpoint every N steps");
  sub->add_option("--alias", r.alias, "alias moved to the published revision (default latest)");
  sub->add_flag("--fresh", a->fresh, "ignore existing checkpoints");
  sub->add_flag("--no-publish", a->no_publish, "do not publish a revision");
  AddJsonFlag(sub, &a->json);
  sub->callback([inv, a] {
    inv->run = [inv, a]() -> absl::Status {
      if (!IsRank() && a->world > 1) return LaunchSelf(a->world, a->timeout_ms);
      a->run.store_dir = inv->global.store;
      a->run.resume = !a->fresh;
      a->run.publish = !a->no_publish;
      a->run.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
      absl::StatusOr<dist::DpTrainResult> res = dist::RunDpTraining(a->run);
      if (!res.ok()) {
        return absl::Status(
            res.status().code(),
            absl::StrCat("rank ",
                         std::getenv("LORADB_RANK") != nullptr ? std::getenv("LORADB_RANK") : "0",
                         ": ", res.status().message()));
      }
      if (res->rank != 0) return absl::OkStatus();
      const double sps = res->train_seconds > 0 ? res->samples / res->train_seconds : 0;
      if (a->json) {
        PrintJson({{"policy", a->run.policy},
                   {"task", a->run.task},
                   {"world_size", res->world_size},
                   {"start_step", res->run.start_step},
                   {"end_step", res->run.end_step},
                   {"start_score", res->run.start_score},
                   {"end_score", res->run.end_score},
                   {"losses", res->losses},
                   {"weights_l1", res->weights_l1},
                   {"train_seconds", res->train_seconds},
                   {"samples", res->samples},
                   {"samples_per_s", sps},
                   {"gradient_allreduces", res->gradient_allreduces},
                   {"collective_calls", res->collective_calls},
                   {"checkpoint", res->run.checkpoint_id},
                   {"revision", res->run.revision_id}});
      } else {
        std::printf(
            "%s: %d ranks, steps %lld -> %lld, score %.4f -> %.4f, %.1f samples/s, checkpoint "
            "%llu, revision %llu\n",
            a->run.policy.c_str(), res->world_size, static_cast<long long>(res->run.start_step),
            static_cast<long long>(res->run.end_step), res->run.start_score, res->run.end_score,
            sps, static_cast<unsigned long long>(res->run.checkpoint_id),
            static_cast<unsigned long long>(res->run.revision_id));
      }
      return absl::OkStatus();
    };
  });
}

LORADB_REGISTER_COMMAND("dist-train",
                        "data-parallel LoRA training over K local ranks (torch.distributed)",
                        SetupDistTrain);

}  // namespace
}  // namespace loradb::cli

#endif  // LORADB_COMPUTE_AVAILABLE

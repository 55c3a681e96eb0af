// `loradb train`: trains a policy's LoRA adapter on a toy task over a base checkpoint, with
// checkpoints in the store (resuming from the latest), and publishes the result as a revision.
// Built only when compute/ is (LibTorch found).
#ifdef LORADB_COMPUTE_AVAILABLE

#include <cstdio>
#include <memory>
#include <string>

#include "compute/trainer/train_tools.h"
#include "tools/loradb/command.h"

namespace loradb::cli {
namespace {

struct TrainArgs {
  trainer::TrainRunOptions run;
  bool fresh = false;
  bool no_publish = false;
  bool json = false;
};

void SetupTrain(CLI::App* sub, Invocation* inv) {
  auto a = std::make_shared<TrainArgs>();
  trainer::TrainRunOptions& r = a->run;
  sub->add_option("--model", r.model_dir, "base checkpoint directory (config.json + weights)")
      ->required();
  sub->add_option("--policy", r.policy, "policy name (created on the base if missing)")->required();
  sub->add_option("--task", r.task, "mapping (SFT) | preference (DPO) | arithmetic (GRPO)")
      ->required();
  sub->add_option("--steps", r.steps, "train until this optimizer step")->required();
  sub->add_option("--base", r.base_name, "base name in the store (default: model dir name)");
  sub->add_option("--rank", r.rank, "LoRA rank (default 8)");
  sub->add_option("--alpha", r.alpha, "LoRA alpha (default 16)");
  sub->add_flag("--rslora", r.rslora, "scale by alpha/sqrt(r)");
  sub->add_option("--lr", r.lr, "peak learning rate (default 5e-3)");
  sub->add_option("--schedule", r.schedule, "constant | cosine (default constant)");
  sub->add_option("--warmup", r.warmup_steps, "linear warmup steps (cosine)");
  sub->add_option("--seed", r.seed, "seed of initialisation, data and sampling (default 0)");
  sub->add_option("--batch", r.batch_size, "SFT sequences / DPO pairs per step (default 32)");
  sub->add_option("--micro-batches", r.micro_batches, "gradient accumulation (default 1)");
  sub->add_option("--grpo-prompts", r.grpo_prompts, "GRPO prompts per step (default 8)");
  sub->add_option("--grpo-group", r.grpo_group, "GRPO samples per prompt (default 8)");
  sub->add_option("--temperature", r.temperature, "GRPO sampling temperature (default 1)");
  sub->add_option("--warm-start", r.warm_start_steps, "GRPO: SFT steps first (default 0)");
  sub->add_option("--checkpoint-every", r.checkpoint_every, "checkpoint every N steps");
  sub->add_option("--alias", r.alias, "alias moved to the published revision (default latest)");
  sub->add_option(
      "--reference", r.reference,
      "DPO/GRPO reference revision (ID, POLICY:ALIAS or POLICY@SEQ; default: the base)");
  sub->add_option("--threads", r.threads,
                  "LibTorch intra-op threads (default 0 = one per hardware core)");
  sub->add_flag("--fresh", a->fresh, "ignore existing checkpoints");
  sub->add_flag("--no-publish", a->no_publish, "do not publish a revision");
  AddJsonFlag(sub, &a->json);
  sub->callback([inv, a] {
    inv->run = [inv, a]() -> absl::Status {
      a->run.store_dir = inv->global.store;
      a->run.resume = !a->fresh;
      a->run.publish = !a->no_publish;
      a->run.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
      absl::StatusOr<trainer::TrainRunResult> res = trainer::RunTraining(a->run);
      if (!res.ok()) return res.status();
      if (a->json) {
        PrintJson({{"policy", a->run.policy},
                   {"task", a->run.task},
                   {"start_step", res->start_step},
                   {"end_step", res->end_step},
                   {"start_score", res->start_score},
                   {"end_score", res->end_score},
                   {"last_loss", res->last_loss},
                   {"checkpoint", res->checkpoint_id},
                   {"revision", res->revision_id}});
      } else {
        std::printf("%s: steps %lld -> %lld, score %.4f -> %.4f, checkpoint %llu, revision %llu\n",
                    a->run.policy.c_str(), static_cast<long long>(res->start_step),
                    static_cast<long long>(res->end_step), res->start_score, res->end_score,
                    static_cast<unsigned long long>(res->checkpoint_id),
                    static_cast<unsigned long long>(res->revision_id));
      }
      return absl::OkStatus();
    };
  });
}

LORADB_REGISTER_COMMAND("train", "train a policy's LoRA adapter (SFT, DPO, GRPO toy tasks)",
                        SetupTrain);

}  // namespace
}  // namespace loradb::cli

#endif  // LORADB_COMPUTE_AVAILABLE

#include "compute/trainer/train_tools.h"

#include <ATen/Parallel.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compute/model/cpu_block_cache.h"
#include "compute/model/qwen3_model.h"
#include "compute/trainer/checkpoint.h"
#include "compute/trainer/tasks.h"
#include "storage/util/status_macros.h"

namespace loradb::trainer {

absl::StatusOr<TrainRunResult> RunTraining(const TrainRunOptions& o) {
  return RunTaskTraining(o, [&](const model::Qwen3Model& model) {
    return MakeTask(o.task, model.config().vocab_size, o.seed);
  });
}

absl::StatusOr<TrainRunResult> RunTaskTraining(const TrainRunOptions& o,
                                               const TaskFactory& make_task) {
  if (o.policy.empty()) return absl::InvalidArgumentError("--policy is required");
  if (o.steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  if (o.threads < 0) return absl::InvalidArgumentError("--threads must be >= 0");
  auto say = [&](const std::string& line) {
    if (o.progress) o.progress(line);
  };
  const int64_t threads =
      o.threads > 0
          ? o.threads
          : std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  at::set_num_threads(static_cast<int>(threads));
  model::EnableCpuBlockCache(model::DefaultCpuBlockCacheBytes());
  say(absl::StrCat("LibTorch intra-op threads: ", at::get_num_threads(),
                   o.threads > 0 ? " (--threads)" : " (one per hardware core; --threads N)"));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<model::Qwen3Model> model,
                          model::Qwen3Model::Load(o.model_dir));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Task> task, make_task(*model));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(o.store_dir));
  const std::string base =
      o.base_name.empty()
          ? std::filesystem::path(o.model_dir).lexically_normal().filename().string()
          : o.base_name;
  LORADB_RETURN_IF_ERROR(
      EnsurePolicy(store.get(), base.empty() ? "base" : base, o.model_dir, o.policy));

  PolicyOptions po;
  po.name = o.policy;
  po.seed = o.seed;
  po.lora.rank = o.rank;
  po.lora.alpha = o.alpha;
  po.lora.use_rslora = o.rslora;
  po.lora.target_parameters = o.target_parameters;
  if (!o.target_modules.empty()) {
    po.lora.target_modules = o.target_modules;
  } else if (!o.target_parameters.empty()) {
    po.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  }
  LORADB_ASSIGN_OR_RETURN(po.schedule.kind, ParseScheduleKind(o.schedule));
  po.schedule.lr = o.lr;
  po.schedule.warmup_steps = o.warmup_steps;
  po.schedule.total_steps = o.steps;
  Trainer trainer(model.get());
  LORADB_ASSIGN_OR_RETURN(int p, trainer.AddPolicy(po));

  TrainRunResult result;
  uint64_t parent = 0;
  if (o.resume) {
    auto latest = LatestCheckpoint(*store, o.policy);
    if (latest.ok()) {
      LORADB_RETURN_IF_ERROR(LoadCheckpoint(*store, &trainer, p, latest->id));
      parent = latest->id;
      say(absl::StrCat("resumed from checkpoint ", latest->id, " at step ", trainer.step(p)));
    } else if (latest.status().code() != absl::StatusCode::kNotFound) {
      return latest.status();
    }
  }
  if (!o.reference.empty()) {
    LORADB_RETURN_IF_ERROR(SetReferenceFromRevision(*store, &trainer, p, o.reference));
    say(absl::StrCat("reference: revision ", o.reference));
  }
  if (trainer.options(p).lora.alpha != o.alpha || trainer.options(p).lora.use_rslora != o.rslora) {
    say(absl::StrFormat("LoRA scaling from the checkpoint: alpha %g%s",
                        trainer.options(p).lora.alpha,
                        trainer.options(p).lora.use_rslora ? " (rsLoRA)" : ""));
  }
  result.start_step = trainer.step(p);
  LORADB_ASSIGN_OR_RETURN(TaskScore before, task->Evaluate(&trainer, p));
  result.start_score = before.score;
  result.start_loss = before.loss;
  say(absl::StrFormat("task %s: score %.4f at step %d", task->name(), before.score,
                      result.start_step));

  StepConfig sc;
  sc.batch_size = o.batch_size;
  sc.micro_batches = o.micro_batches;
  sc.grpo_prompts = o.grpo_prompts;
  sc.grpo_group = o.grpo_group;
  sc.temperature = o.temperature;
  std::string rollouts;
  using Clock = std::chrono::steady_clock;
  while (trainer.step(p) < o.steps) {
    sc.force_sft = task->loss() == LossKind::kGrpo && trainer.step(p) < o.warm_start_steps;
    task->BeginStep(trainer.step(p));
    const auto t0 = Clock::now();
    LORADB_ASSIGN_OR_RETURN(std::vector<StepReport> r, TrainStep(&trainer, {{p, task.get()}}, sc));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const StepReport& s = r[0];
    result.last_loss = s.loss;
    result.tokens += s.tokens;
    result.train_seconds += seconds;
    rollouts = s.rollouts;
    if (o.on_step) {
      StepProgress sp;
      sp.step = s.step;
      sp.first_step = result.start_step;
      sp.last_step = o.steps;
      sp.loss_kind = sc.force_sft ? "sft" : LossKindName(task->loss());
      sp.loss = s.loss;
      sp.lr = s.lr;
      sp.grad_norm = s.grad_norm;
      if (!sc.force_sft && task->loss() == LossKind::kGrpo) {
        sp.metric_name = "reward";
        sp.metric = s.mean_reward;
      } else if (task->loss() == LossKind::kDpo) {
        sp.metric_name = "margin";
        sp.metric = s.metric;
      } else {
        sp.metric_name = "acc";
        sp.metric = s.accuracy;
      }
      sp.tokens = s.tokens;
      sp.seconds = seconds;
      o.on_step(sp);
    }
    std::string line = absl::StrFormat("step %d/%d %s loss %.5f lr %.2e grad_norm %.3f", s.step,
                                       o.steps, sc.force_sft ? "sft" : LossKindName(task->loss()),
                                       s.loss, s.lr, s.grad_norm);
    if (!sc.force_sft && task->loss() == LossKind::kGrpo) {
      absl::StrAppend(&line, absl::StrFormat(" reward %.4f", s.mean_reward));
    } else if (task->loss() == LossKind::kDpo) {
      absl::StrAppend(&line, absl::StrFormat(" margin %.4f", s.metric));
    } else {
      absl::StrAppend(&line, absl::StrFormat(" acc %.3f", s.accuracy));
    }
    if (!o.on_step) say(line);
    if (o.checkpoint_every > 0 && s.step % o.checkpoint_every == 0 && s.step < o.steps) {
      LORADB_ASSIGN_OR_RETURN(CheckpointRecord ck,
                              SaveCheckpoint(store.get(), trainer, p, parent, rollouts));
      parent = ck.id;
      say(absl::StrCat("checkpoint ", ck.id, " at step ", ck.step));
    }
  }
  result.end_step = trainer.step(p);
  LORADB_ASSIGN_OR_RETURN(CheckpointRecord ck,
                          SaveCheckpoint(store.get(), trainer, p, parent, rollouts));
  result.checkpoint_id = ck.id;
  say(absl::StrCat("checkpoint ", ck.id, " at step ", ck.step));
  LORADB_ASSIGN_OR_RETURN(TaskScore after, task->Evaluate(&trainer, p));
  result.end_score = after.score;
  result.end_loss = after.loss;
  say(absl::StrFormat("task %s: score %.4f at step %d", task->name(), after.score,
                      result.end_step));
  if (o.publish) {
    LORADB_ASSIGN_OR_RETURN(RevisionRecord rev,
                            PublishForSampling(store.get(), trainer, p, ck.id, o.alias));
    result.revision_id = rev.id;
    say(absl::StrCat("published revision ", rev.id, " (", o.policy, "@", rev.seq, "), ", o.alias,
                     " -> ", rev.id));
  }
  return result;
}

}  // namespace loradb::trainer

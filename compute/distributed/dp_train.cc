#include "compute/distributed/dp_train.h"

#include <chrono>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compute/distributed/dp_sync.h"
#include "compute/distributed/process_group.h"
#include "compute/model/qwen3_model.h"
#include "compute/trainer/checkpoint.h"
#include "compute/trainer/tasks.h"
#include "storage/util/status_macros.h"

namespace loradb::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Every rank learns whether any rank failed a local phase (one tiny all-reduce). A rank whose
// own phase failed returns its error; the others return Aborted naming the phase.
absl::Status Agree(ProcessGroup* pg, const absl::Status& local, const std::string& phase) {
  if (pg == nullptr) return local;
  at::Tensor flag = at::full({1}, local.ok() ? 0L : 1L, at::kLong);
  LORADB_RETURN_IF_ERROR(pg->AllReduce(flag, ReduceOp::kMax));
  if (!local.ok()) return local;
  if (flag[0].item<int64_t>() != 0) {
    return absl::AbortedError(absl::StrCat("another rank failed ", phase, " (see its error)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DpTrainResult> RunDpTraining(const trainer::TrainRunOptions& o) {
  if (o.policy.empty()) return absl::InvalidArgumentError("--policy is required");
  if (o.steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  if (o.micro_batches != 1) {
    return absl::InvalidArgumentError("data-parallel training takes --micro-batches 1");
  }
  std::unique_ptr<ProcessGroup> pg;
  absl::StatusOr<GroupOptions> go = GroupOptionsFromEnvironment();
  if (go.ok()) {
    LORADB_ASSIGN_OR_RETURN(pg, ProcessGroup::Create(*go));
  } else if (go.status().code() != absl::StatusCode::kNotFound) {
    return go.status();
  }
  DpTrainResult result;
  result.rank = pg ? pg->rank() : 0;
  result.world_size = pg ? pg->world_size() : 1;
  const bool leader = result.rank == 0;
  const int k = result.world_size;
  if (o.batch_size < k || o.batch_size % k != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the global batch (", o.batch_size, ") must be a positive multiple of the ", k, " ranks"));
  }
  auto say = [&](const std::string& line) {
    if (leader && o.progress) o.progress(line);
  };

  // Every rank: the base, the task, the trainer with the fresh policy.
  std::unique_ptr<model::Qwen3Model> model;
  std::unique_ptr<trainer::Task> task;
  std::unique_ptr<trainer::Trainer> tr;
  int p = 0;
  absl::Status local = [&]() -> absl::Status {
    LORADB_ASSIGN_OR_RETURN(model, model::Qwen3Model::Load(o.model_dir));
    LORADB_ASSIGN_OR_RETURN(task, trainer::MakeTask(o.task, model->config().vocab_size, o.seed));
    if (task->loss() == trainer::LossKind::kGrpo) {
      return absl::UnimplementedError(
          "data-parallel GRPO (rollouts split across ranks) is not built; use loradb train");
    }
    trainer::PolicyOptions po;
    po.name = o.policy;
    po.seed = o.seed;
    po.lora.rank = o.rank;
    po.lora.alpha = o.alpha;
    po.lora.use_rslora = o.rslora;
    LORADB_ASSIGN_OR_RETURN(po.schedule.kind, trainer::ParseScheduleKind(o.schedule));
    po.schedule.lr = o.lr;
    po.schedule.warmup_steps = o.warmup_steps;
    po.schedule.total_steps = o.steps;
    tr = std::make_unique<trainer::Trainer>(model.get());
    LORADB_ASSIGN_OR_RETURN(p, tr->AddPolicy(po));
    return absl::OkStatus();
  }();
  LORADB_RETURN_IF_ERROR(Agree(pg.get(), local, "loading the model"));

  // Rank 0 alone: the store, the policy, the latest checkpoint.
  std::unique_ptr<Store> store;
  uint64_t parent = 0;
  local = absl::OkStatus();
  if (leader) {
    local = [&]() -> absl::Status {
      LORADB_ASSIGN_OR_RETURN(store, Store::Open(o.store_dir));
      const std::string base =
          o.base_name.empty()
              ? std::filesystem::path(o.model_dir).lexically_normal().filename().string()
              : o.base_name;
      LORADB_RETURN_IF_ERROR(
          trainer::EnsurePolicy(store.get(), base.empty() ? "base" : base, o.model_dir, o.policy));
      if (!o.resume) return absl::OkStatus();
      absl::StatusOr<CheckpointRecord> latest = trainer::LatestCheckpoint(*store, o.policy);
      if (latest.ok()) {
        LORADB_RETURN_IF_ERROR(trainer::LoadCheckpoint(*store, tr.get(), p, latest->id));
        parent = latest->id;
        say(absl::StrCat("resumed from checkpoint ", latest->id, " at step ", tr->step(p)));
      } else if (latest.status().code() != absl::StatusCode::kNotFound) {
        return latest.status();
      }
      return absl::OkStatus();
    }();
  }
  LORADB_RETURN_IF_ERROR(Agree(pg.get(), local, "opening the store"));
  if (pg) LORADB_RETURN_IF_ERROR(BroadcastPolicy(pg.get(), tr.get(), p, 0));

  result.run.start_step = tr->step(p);
  LORADB_ASSIGN_OR_RETURN(trainer::TaskScore before, task->Evaluate(tr.get(), p));
  result.run.start_score = before.score;
  say(absl::StrFormat("task %s: score %.4f at step %d (%d ranks, global batch %d)", task->name(),
                      before.score, result.run.start_step, k, o.batch_size));

  const bool dpo = task->loss() == trainer::LossKind::kDpo;
  const int64_t per_rank = o.batch_size / k;
  auto save_checkpoint = [&]() -> absl::StatusOr<uint64_t> {
    uint64_t id = 0;
    absl::Status s = absl::OkStatus();
    if (leader) {
      absl::StatusOr<CheckpointRecord> ck = trainer::SaveCheckpoint(store.get(), *tr, p, parent);
      if (ck.ok()) {
        id = ck->id;
        parent = ck->id;
        say(absl::StrCat("checkpoint ", ck->id, " at step ", ck->step));
      } else {
        s = ck.status();
      }
    }
    LORADB_RETURN_IF_ERROR(Agree(pg.get(), s, "writing a checkpoint"));
    return id;
  };

  while (tr->step(p) < o.steps) {
    const Clock::time_point t0 = Clock::now();
    // The same global batch on every rank (the policy's RNG is identical); this rank's slice.
    std::vector<trainer::Datum> global = task->TrainBatch(&tr->rng(p), o.batch_size);
    const int64_t unit = dpo ? 2 : 1;
    trainer::PolicyBatch batch;
    batch.policy = p;
    batch.loss = task->loss();
    batch.data.assign(global.begin() + result.rank * per_rank * unit,
                      global.begin() + (result.rank + 1) * per_rank * unit);
    LORADB_ASSIGN_OR_RETURN(std::vector<trainer::LossReport> fb, tr->ForwardBackward({batch}));
    double loss = fb[0].loss, accuracy = fb[0].accuracy;
    if (pg) {
      // The trainer's losses are weighted means: over weighted tokens (SFT), over pairs (DPO).
      const double weight = dpo ? static_cast<double>(per_rank) : static_cast<double>(fb[0].tokens);
      LORADB_ASSIGN_OR_RETURN(ReducedStep red,
                              AllReduceGradients(pg.get(), tr.get(), p, weight, loss, accuracy));
      loss = red.loss;
      accuracy = red.accuracy;
      ++result.gradient_allreduces;
    }
    LORADB_ASSIGN_OR_RETURN(trainer::StepStats st, tr->OptimStep(p));
    result.train_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    result.samples += o.batch_size;
    result.losses.push_back(loss);
    result.run.last_loss = loss;
    say(absl::StrFormat("step %d/%d %s loss %.6f lr %.2e grad_norm %.4f %s %.3f", tr->step(p),
                        o.steps, trainer::LossKindName(task->loss()), loss, st.lr, st.grad_norm,
                        dpo ? "pref" : "acc", accuracy));
    if (o.checkpoint_every > 0 && tr->step(p) % o.checkpoint_every == 0 && tr->step(p) < o.steps) {
      LORADB_RETURN_IF_ERROR(save_checkpoint().status());
    }
  }
  result.run.end_step = tr->step(p);
  LORADB_ASSIGN_OR_RETURN(result.run.checkpoint_id, save_checkpoint());
  LORADB_ASSIGN_OR_RETURN(trainer::TaskScore after, task->Evaluate(tr.get(), p));
  result.run.end_score = after.score;
  say(absl::StrFormat("task %s: score %.4f at step %d", task->name(), after.score,
                      result.run.end_step));
  if (o.publish) {
    absl::Status s = absl::OkStatus();
    if (leader) {
      absl::StatusOr<RevisionRecord> rev =
          trainer::PublishForSampling(store.get(), *tr, p, result.run.checkpoint_id, o.alias);
      if (rev.ok()) {
        result.run.revision_id = rev->id;
        say(absl::StrCat("published revision ", rev->id, " (", o.policy, "@", rev->seq, "), ",
                         o.alias, " -> ", rev->id));
      } else {
        s = rev.status();
      }
    }
    LORADB_RETURN_IF_ERROR(Agree(pg.get(), s, "publishing the revision"));
  }
  for (const auto& [name, t] : tr->parameters(p).named()) {
    result.weights_l1 += t.detach().abs().sum().item<double>();
  }
  result.collective_calls = pg ? pg->collective_calls() : 0;
  return result;
}

}  // namespace loradb::dist

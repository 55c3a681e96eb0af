#include "compute/trainer/data_training.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compute/model/qwen3_model.h"
#include "compute/trainer/reward_program.h"
#include "compute/trainer/tasks.h"
#include "storage/util/status_macros.h"

namespace loradb::trainer {
namespace {

using dataset::Example;
using dataset::Kind;

// Examples per optimizer step: SFT sequences, DPO pairs or GRPO prompts.
int64_t PerStep(const TrainRunOptions& run, Kind kind) {
  return kind == Kind::kGrpo ? run.grpo_prompts : run.batch_size;
}

// A dataset as a Task: TrainBatch / Prompts walk the examples epoch by epoch from the step that
// BeginStep gives, Rewards asks the reward program, Evaluate scores the first examples.
class DatasetTask final : public Task {
 public:
  DatasetTask(const TrainRunOptions& run, const DataRunOptions& options, RewardProgram* reward)
      : run_(run), o_(options), data_(*options.data), reward_(reward) {}

  std::string name() const override { return "data"; }
  LossKind loss() const override {
    switch (data_.kind) {
      case Kind::kSft:
        return LossKind::kCrossEntropy;
      case Kind::kDpo:
        return LossKind::kDpo;
      case Kind::kGrpo:
        return LossKind::kGrpo;
    }
    return LossKind::kCrossEntropy;
  }
  void BeginStep(int64_t step) override {
    cursor_ = static_cast<uint64_t>(step) * static_cast<uint64_t>(PerStep(run_, data_.kind));
  }
  std::vector<Datum> TrainBatch(Rng* /*rng*/, int64_t size) const override {
    std::vector<Datum> out;
    for (int64_t i = 0; i < size; ++i) AppendData(Next(), &out);
    return out;
  }
  std::vector<std::vector<int64_t>> Prompts(Rng* /*rng*/, int64_t n) const override {
    prompt_examples_.clear();
    std::vector<std::vector<int64_t>> out;
    for (int64_t i = 0; i < n; ++i) {
      prompt_examples_.push_back(&Next());
      out.push_back(prompt_examples_.back()->prompt);
    }
    return out;
  }
  int64_t completion_tokens() const override { return o_.max_tokens; }
  std::vector<int64_t> stop_tokens() const override { return o_.stop_tokens; }

  absl::StatusOr<std::vector<float>> Rewards(const std::vector<Rollout>& rollouts) const override {
    std::vector<std::string> lines;
    for (const Rollout& r : rollouts) {
      const Example& ex = *prompt_examples_.at(static_cast<size_t>(r.prompt_index));
      nlohmann::json j;
      j["line"] = ex.line;
      j["prompt_ids"] = *r.prompt;
      j["completion_ids"] = *r.completion;
      if (o_.decode) {
        // null where an id has no token: a base's vocabulary may be larger than its tokenizer's.
        for (const auto& [key, ids] :
             {std::pair{"prompt", r.prompt}, {"completion", r.completion}}) {
          absl::StatusOr<std::string> text = o_.decode(*ids);
          j[key] = text.ok() ? nlohmann::json(*text) : nlohmann::json(nullptr);
        }
      }
      std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      line.pop_back();  // the closing brace: the example goes last, as written in the file
      absl::StrAppend(&line, ",\"example\":", ex.source, "}");
      lines.push_back(std::move(line));
    }
    LORADB_ASSIGN_OR_RETURN(std::vector<double> rewards, reward_->Score(lines));
    return std::vector<float>(rewards.begin(), rewards.end());
  }

  absl::StatusOr<TaskScore> Evaluate(Trainer* trainer, int policy) const override {
    if (policy < 0 || policy >= trainer->num_policies()) {
      return absl::InvalidArgumentError("a dataset is evaluated on a trained policy");
    }
    const size_t n = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(o_.eval_examples, 1)),
                                      data_.examples.size());
    if (data_.kind == Kind::kGrpo) return EvaluateRewards(trainer, policy, n);
    // Losses over chunks of a step's size, averaged over target weight (SFT) or pairs (DPO).
    const size_t chunk = static_cast<size_t>(std::max<int64_t>(run_.batch_size, 1));
    double loss_sum = 0, score = 0, margin = 0, total = 0;
    for (size_t lo = 0; lo < n; lo += chunk) {
      PolicyBatch b;
      b.policy = policy;
      b.loss = loss();
      const size_t hi = std::min(n, lo + chunk);
      for (size_t i = lo; i < hi; ++i) AppendData(data_.examples[i], &b.data);
      double w = static_cast<double>(hi - lo);
      if (data_.kind == Kind::kSft) {
        w = 0;
        for (const Datum& d : b.data) w += std::accumulate(d.weights.begin(), d.weights.end(), 0.0);
      }
      LORADB_ASSIGN_OR_RETURN(std::vector<LossReport> r, trainer->Evaluate({b}));
      loss_sum += r[0].loss * w;
      score += r[0].accuracy * w;
      margin += r[0].metric * w;
      total += w;
    }
    TaskScore s;
    s.loss = loss_sum / total;
    s.score = score / total;
    if (data_.kind == Kind::kDpo) s.margin = margin / total;
    return s;
  }

 private:
  // The example at the cursor (then advanced): epoch e = cursor / N visits every example once in
  // the order of a shuffle seeded by (seed, e).
  const Example& Next() const {
    const uint64_t n = data_.examples.size();
    const uint64_t epoch = cursor_ / n;
    if (epoch != order_epoch_ || order_.empty()) {
      order_.resize(n);
      std::iota(order_.begin(), order_.end(), 0);
      Rng rng(run_.seed ^ (0xda7a5e7ULL + epoch * 0x9e3779b97f4a7c15ULL));
      for (uint64_t i = n - 1; i > 0; --i) std::swap(order_[i], order_[rng.Below(i + 1)]);
      order_epoch_ = epoch;
    }
    return data_.examples[order_[cursor_++ % n]];
  }

  // SFT: one datum; DPO: the chosen, then the rejected datum.
  static void AppendData(const Example& ex, std::vector<Datum>* out) {
    if (ex.kind == Kind::kSft) {
      Datum d;
      d.tokens = ex.tokens;
      d.weights.assign(ex.weights.begin() + 1, ex.weights.end());
      out->push_back(std::move(d));
      return;
    }
    for (const std::vector<int64_t>* completion : {&ex.chosen, &ex.rejected}) {
      Datum d;
      d.tokens = ex.prompt;
      d.tokens.insert(d.tokens.end(), completion->begin(), completion->end());
      d.weights.assign(d.tokens.size() - 1, 0.0f);
      std::fill(d.weights.begin() + static_cast<int64_t>(ex.prompt.size()) - 1, d.weights.end(),
                1.0f);
      out->push_back(std::move(d));
    }
  }

  // The mean reward of `group` rollouts per prompt of the first `n` prompts at the run's
  // temperature, drawn from a fixed seed (the policy's own stream is left as it was).
  absl::StatusOr<TaskScore> EvaluateRewards(Trainer* trainer, int policy, size_t n) const {
    prompt_examples_.clear();
    std::vector<SampleRequest> requests;
    std::vector<int64_t> prompt_of;
    for (size_t i = 0; i < n; ++i) {
      prompt_examples_.push_back(&data_.examples[i]);
      for (int64_t g = 0; g < run_.grpo_group; ++g) {
        SampleRequest r;
        r.policy = policy;
        r.prompt = data_.examples[i].prompt;
        r.max_tokens = o_.max_tokens;
        r.stop_tokens = o_.stop_tokens;
        r.temperature = run_.temperature;
        requests.push_back(std::move(r));
        prompt_of.push_back(static_cast<int64_t>(i));
      }
    }
    const Rng saved = trainer->rng(policy);
    trainer->rng(policy) = Rng(run_.seed ^ 0xe7a1e7a1ULL);
    absl::StatusOr<std::vector<SampleResult>> out = trainer->Sample(requests);
    trainer->rng(policy) = saved;
    if (!out.ok()) return out.status();
    std::vector<Rollout> rollouts;
    for (size_t i = 0; i < out->size(); ++i) {
      rollouts.push_back(Rollout{prompt_of[i], &requests[i].prompt, &(*out)[i].tokens});
    }
    LORADB_ASSIGN_OR_RETURN(std::vector<float> rewards, Rewards(rollouts));
    TaskScore s;
    s.score =
        std::accumulate(rewards.begin(), rewards.end(), 0.0) / static_cast<double>(rewards.size());
    return s;
  }

  const TrainRunOptions& run_;
  const DataRunOptions& o_;
  const dataset::Dataset& data_;
  RewardProgram* reward_;  // GRPO only
  // The data walk (TrainBatch / Prompts are const in the Task interface).
  mutable uint64_t cursor_ = 0;
  mutable uint64_t order_epoch_ = 0;
  mutable std::vector<size_t> order_;
  // The examples of the latest Prompts() call (Rewards reads their lines).
  mutable std::vector<const Example*> prompt_examples_;
};

}  // namespace

int64_t DataRunSteps(const TrainRunOptions& run, const DataRunOptions& data) {
  if (run.steps > 0 || data.data == nullptr) return run.steps;
  const int64_t n = static_cast<int64_t>(data.data->examples.size());
  const int64_t per = std::max<int64_t>(PerStep(run, data.data->kind), 1);
  return data.epochs * ((n + per - 1) / per);
}

absl::StatusOr<TrainRunResult> RunDataTraining(const TrainRunOptions& run,
                                               const DataRunOptions& data) {
  if (data.data == nullptr || data.data->examples.empty()) {
    return absl::InvalidArgumentError("no training data");
  }
  const Kind kind = data.data->kind;
  if (kind == Kind::kGrpo && data.reward_cmd.empty()) {
    return absl::InvalidArgumentError(
        "the data are GRPO prompts (lines with only 'prompt'): --reward-cmd is required");
  }
  if (kind != Kind::kGrpo && !data.reward_cmd.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--reward-cmd is for GRPO prompt data; these data are ", dataset::KindName(kind)));
  }
  if (run.warm_start_steps > 0) {
    return absl::InvalidArgumentError("--warm-start is for the built-in tasks, not --data");
  }
  if (data.epochs < 1) return absl::InvalidArgumentError("--epochs must be >= 1");
  if (data.eval_examples < 1) return absl::InvalidArgumentError("--eval must be >= 1");
  if (kind == Kind::kGrpo && data.max_tokens < 1) {
    return absl::InvalidArgumentError("--max-tokens must be >= 1");
  }
  TrainRunOptions o = run;
  o.steps = DataRunSteps(run, data);
  std::unique_ptr<RewardProgram> reward;
  if (kind == Kind::kGrpo) {
    LORADB_ASSIGN_OR_RETURN(reward, RewardProgram::Start(data.reward_cmd, data.reward_timeout_s));
  }
  return RunTaskTraining(o, [&](const model::Qwen3Model&) -> absl::StatusOr<std::unique_ptr<Task>> {
    return std::unique_ptr<Task>(new DatasetTask(o, data, reward.get()));
  });
}

}  // namespace loradb::trainer

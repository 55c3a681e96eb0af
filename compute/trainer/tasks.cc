#include "compute/trainer/tasks.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/util/status_macros.h"

namespace loradb::trainer {
namespace {

constexpr int64_t kBos = 1, kSep = 2;

Datum Completion(const std::vector<int64_t>& prompt, const std::vector<int64_t>& completion) {
  Datum d;
  d.tokens = prompt;
  d.tokens.insert(d.tokens.end(), completion.begin(), completion.end());
  d.weights.assign(d.tokens.size() - 1, 0.0f);
  for (size_t i = prompt.size() - 1; i < d.weights.size(); ++i) d.weights[i] = 1.0f;
  return d;
}

// Greedy completions of `prompts` by `policy`, scored by `score`.
absl::StatusOr<double> GreedyMean(
    Trainer* trainer, int policy, const std::vector<std::vector<int64_t>>& prompts, int64_t tokens,
    const std::function<double(const std::vector<int64_t>&, const std::vector<int64_t>&)>& score) {
  std::vector<SampleRequest> reqs;
  for (const auto& p : prompts) {
    SampleRequest r;
    r.policy = policy;
    r.prompt = p;
    r.max_tokens = tokens;
    r.temperature = 0;
    reqs.push_back(std::move(r));
  }
  LORADB_ASSIGN_OR_RETURN(std::vector<SampleResult> out, trainer->Sample(reqs));
  double sum = 0;
  for (size_t i = 0; i < out.size(); ++i) sum += score(prompts[i], out[i].tokens);
  return sum / static_cast<double>(prompts.size());
}

class MappingTask final : public Task {
 public:
  static constexpr int64_t kKeys = 32, kKeyBase = 100, kValueBase = 200;
  explicit MappingTask(uint64_t seed) : perm_(kKeys) {
    std::iota(perm_.begin(), perm_.end(), 0);
    Rng rng(seed);
    for (int64_t i = kKeys - 1; i > 0; --i) {
      std::swap(perm_[i], perm_[rng.Below(static_cast<uint64_t>(i + 1))]);
    }
  }
  std::string name() const override { return "mapping"; }
  LossKind loss() const override { return LossKind::kCrossEntropy; }
  std::vector<Datum> TrainBatch(Rng* rng, int64_t size) const override {
    std::vector<Datum> out;
    for (int64_t i = 0; i < size; ++i) {
      const int64_t k = static_cast<int64_t>(rng->Below(kKeys));
      out.push_back(Completion({kBos, kKeyBase + k, kSep}, {kValueBase + perm_[k]}));
    }
    return out;
  }
  absl::StatusOr<TaskScore> Evaluate(Trainer* trainer, int policy) const override {
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t k = 0; k < kKeys; ++k) prompts.push_back({kBos, kKeyBase + k, kSep});
    TaskScore s;
    LORADB_ASSIGN_OR_RETURN(
        s.score, GreedyMean(trainer, policy, prompts, 1, [&](const auto& p, const auto& c) {
          const int64_t k = p[1] - kKeyBase;
          return c[0] == kValueBase + perm_[k] ? 1.0 : 0.0;
        }));
    return s;
  }

 private:
  std::vector<int64_t> perm_;
};

class PreferenceTask final : public Task {
 public:
  static constexpr int64_t kPromptBase = 300, kTrainPrompts = 48, kHeldOutPrompts = 16;
  static constexpr int64_t kGoodBase = 400, kBadBase = 432, kSetSize = 32;
  std::string name() const override { return "preference"; }
  LossKind loss() const override { return LossKind::kDpo; }
  std::vector<Datum> TrainBatch(Rng* rng, int64_t size) const override {
    std::vector<Datum> out;
    for (int64_t i = 0; i < size; ++i) {
      const int64_t p = kPromptBase + static_cast<int64_t>(rng->Below(kTrainPrompts));
      AddPair(p, kGoodBase + static_cast<int64_t>(rng->Below(kSetSize)),
              kBadBase + static_cast<int64_t>(rng->Below(kSetSize)), &out);
    }
    return out;
  }
  absl::StatusOr<TaskScore> Evaluate(Trainer* trainer, int policy) const override {
    // Held-out prompts, every good token against a bad token.
    std::vector<Datum> data;
    for (int64_t p = 0; p < kHeldOutPrompts; ++p) {
      for (int64_t g = 0; g < kSetSize; ++g) {
        AddPair(kPromptBase + kTrainPrompts + p, kGoodBase + g, kBadBase + (g * 7 + p) % kSetSize,
                &data);
      }
    }
    TaskScore s;
    if (policy < 0) return s;  // the reference itself: margin 0
    LORADB_ASSIGN_OR_RETURN(auto pol, trainer->Logprobs(policy, data));
    LORADB_ASSIGN_OR_RETURN(auto ref, trainer->Logprobs(-1, data));
    const double beta = trainer->options(policy).dpo_beta;
    double margin = 0, preferred = 0;
    const size_t pairs = data.size() / 2;
    for (size_t i = 0; i < pairs; ++i) {
      // The completion is the last target of each sequence.
      const double m = beta * ((pol[2 * i].back() - ref[2 * i].back()) -
                               (pol[2 * i + 1].back() - ref[2 * i + 1].back()));
      margin += m;
      preferred += m > 0 ? 1 : 0;
    }
    s.margin = margin / static_cast<double>(pairs);
    s.score = preferred / static_cast<double>(pairs);
    return s;
  }

 private:
  static void AddPair(int64_t prompt, int64_t good, int64_t bad, std::vector<Datum>* out) {
    out->push_back(Completion({kBos, prompt, kSep}, {good}));
    out->push_back(Completion({kBos, prompt, kSep}, {bad}));
  }
};

class ArithmeticTask final : public Task {
 public:
  static constexpr int64_t kDigit = 10, kPlus = 20, kEq = 21;
  std::string name() const override { return "arithmetic"; }
  LossKind loss() const override { return LossKind::kGrpo; }
  std::vector<Datum> TrainBatch(Rng* rng, int64_t size) const override {
    std::vector<Datum> out;
    for (const auto& p : Prompts(rng, size)) out.push_back(Completion(p, Answer(p)));
    return out;
  }
  std::vector<std::vector<int64_t>> Prompts(Rng* rng, int64_t n) const override {
    std::vector<std::vector<int64_t>> out;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t a = static_cast<int64_t>(rng->Below(10));
      const int64_t b = static_cast<int64_t>(rng->Below(10));
      out.push_back({kBos, kDigit + a, kPlus, kDigit + b, kEq});
    }
    return out;
  }
  int64_t completion_tokens() const override { return 2; }
  float Reward(const std::vector<int64_t>& prompt,
               const std::vector<int64_t>& completion) const override {
    const std::vector<int64_t> want = Answer(prompt);
    float r = 0;
    for (size_t i = 0; i < want.size() && i < completion.size(); ++i) {
      if (completion[i] == want[i]) r += 0.5f;
    }
    return r;
  }
  absl::StatusOr<TaskScore> Evaluate(Trainer* trainer, int policy) const override {
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t a = 0; a < 10; ++a) {
      for (int64_t b = 0; b < 10; ++b)
        prompts.push_back({kBos, kDigit + a, kPlus, kDigit + b, kEq});
    }
    TaskScore s;
    LORADB_ASSIGN_OR_RETURN(
        s.score, GreedyMean(trainer, policy, prompts, 2, [&](const auto& p, const auto& c) {
          return static_cast<double>(Reward(p, c));
        }));
    return s;
  }

 private:
  static std::vector<int64_t> Answer(const std::vector<int64_t>& prompt) {
    const int64_t sum = (prompt[1] - kDigit) + (prompt[3] - kDigit);
    return {kDigit + sum / 10, kDigit + sum % 10};
  }
};

}  // namespace

std::vector<std::vector<int64_t>> Task::Prompts(Rng* rng, int64_t n) const {
  std::vector<std::vector<int64_t>> out;
  for (Datum& d : TrainBatch(rng, n)) {
    // The prompt is everything before the first weighted target.
    size_t cut = 0;
    while (cut < d.weights.size() && d.weights[cut] == 0) ++cut;
    out.emplace_back(d.tokens.begin(), d.tokens.begin() + static_cast<int64_t>(cut) + 1);
  }
  return out;
}

float Task::Reward(const std::vector<int64_t>&, const std::vector<int64_t>&) const { return 0; }

absl::StatusOr<std::vector<float>> Task::Rewards(const std::vector<Rollout>& rollouts) const {
  std::vector<float> out;
  out.reserve(rollouts.size());
  for (const Rollout& r : rollouts) out.push_back(Reward(*r.prompt, *r.completion));
  return out;
}

absl::StatusOr<std::unique_ptr<Task>> MakeTask(const std::string& name, int64_t vocab_size,
                                               uint64_t seed) {
  if (vocab_size < 512) {
    return absl::InvalidArgumentError(absl::StrCat(
        "toy tasks need a vocabulary of at least 512 tokens, the base has ", vocab_size));
  }
  if (name == "mapping") return std::make_unique<MappingTask>(seed);
  if (name == "preference") return std::make_unique<PreferenceTask>();
  if (name == "arithmetic") return std::make_unique<ArithmeticTask>();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown task '", name, "' (mapping | preference | arithmetic)"));
}

absl::StatusOr<double> SampledMeanReward(Trainer* trainer, const Task& task, int policy,
                                         double temperature, int64_t prompts, int64_t samples,
                                         uint64_t seed) {
  if (policy < 0 || policy >= trainer->num_policies()) {
    return absl::InvalidArgumentError(absl::StrCat("no policy index ", policy));
  }
  if (prompts < 1 || samples < 1 || !(temperature > 0)) {
    return absl::InvalidArgumentError("prompts, samples and temperature must be > 0");
  }
  Rng prompt_rng(seed);
  std::vector<SampleRequest> reqs;
  std::vector<int64_t> prompt_of;
  const auto ps = task.Prompts(&prompt_rng, prompts);
  for (size_t pi = 0; pi < ps.size(); ++pi) {
    const auto& p = ps[pi];
    for (int64_t i = 0; i < samples; ++i) {
      prompt_of.push_back(static_cast<int64_t>(pi));
      SampleRequest r;
      r.policy = policy;
      r.prompt = p;
      r.max_tokens = task.completion_tokens();
      r.temperature = temperature;
      reqs.push_back(std::move(r));
    }
  }
  const Rng saved = trainer->rng(policy);
  trainer->rng(policy) = Rng(seed ^ 0x9e3779b97f4a7c15ULL);
  absl::StatusOr<std::vector<SampleResult>> out = trainer->Sample(reqs);
  trainer->rng(policy) = saved;
  if (!out.ok()) return out.status();
  std::vector<Rollout> rollouts;
  for (size_t i = 0; i < out->size(); ++i) {
    rollouts.push_back(Rollout{prompt_of[i], &reqs[i].prompt, &(*out)[i].tokens});
  }
  LORADB_ASSIGN_OR_RETURN(std::vector<float> rewards, task.Rewards(rollouts));
  double sum = 0;
  for (float r : rewards) sum += r;
  return sum / static_cast<double>(out->size());
}

absl::StatusOr<std::vector<StepReport>> TrainStep(
    Trainer* trainer, const std::vector<std::pair<int, const Task*>>& work,
    const StepConfig& config) {
  if (work.empty()) return absl::InvalidArgumentError("nothing to train");
  if (config.batch_size < 1 || config.micro_batches < 1 || config.grpo_prompts < 1 ||
      config.grpo_group < 1) {
    return absl::InvalidArgumentError("step sizes must be >= 1");
  }
  if (!(config.temperature > 0)) {
    return absl::InvalidArgumentError("GRPO sampling temperature must be > 0");
  }
  for (const auto& [policy, task] : work) {
    if (policy < 0 || policy >= trainer->num_policies() || task == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("bad work item for policy ", policy));
    }
  }
  const size_t k = work.size();
  std::vector<StepReport> reports(k);
  std::vector<std::vector<Datum>> data(k);
  std::vector<LossKind> kinds(k);

  // Rollouts of every GRPO policy in one shared sampling call.
  std::vector<SampleRequest> requests;
  std::vector<std::vector<std::vector<int64_t>>> prompts(k);
  for (size_t i = 0; i < k; ++i) {
    const auto [policy, task] = work[i];
    reports[i].policy = policy;
    kinds[i] = config.force_sft ? LossKind::kCrossEntropy : task->loss();
    if (kinds[i] != LossKind::kGrpo) {
      data[i] = task->TrainBatch(&trainer->rng(policy), config.batch_size);
      continue;
    }
    prompts[i] = task->Prompts(&trainer->rng(policy), config.grpo_prompts);
    for (const auto& p : prompts[i]) {
      for (int64_t g = 0; g < config.grpo_group; ++g) {
        SampleRequest r;
        r.policy = policy;
        r.prompt = p;
        r.max_tokens = task->completion_tokens();
        r.temperature = config.temperature;
        r.stop_tokens = task->stop_tokens();
        requests.push_back(std::move(r));
      }
    }
  }
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  double sample_s = 0, fb_s = 0, optim_s = 0;
  if (!requests.empty()) {
    const auto t0 = Clock::now();
    LORADB_ASSIGN_OR_RETURN(std::vector<SampleResult> samples, trainer->Sample(requests));
    sample_s = since(t0);
    size_t next = 0;
    for (size_t i = 0; i < k; ++i) {
      if (kinds[i] != LossKind::kGrpo) continue;
      std::vector<const SampleResult*> mine;
      std::vector<const std::vector<int64_t>*> their_prompt;
      std::vector<Rollout> rollouts;
      for (size_t pi = 0; pi < prompts[i].size(); ++pi) {
        const auto& p = prompts[i][pi];
        for (int64_t g = 0; g < config.grpo_group; ++g) {
          const SampleResult& s = samples[next++];
          rollouts.push_back(Rollout{static_cast<int64_t>(pi), &p, &s.tokens});
          mine.push_back(&s);
          their_prompt.push_back(&p);
        }
      }
      LORADB_ASSIGN_OR_RETURN(std::vector<float> rewards, work[i].second->Rewards(rollouts));
      if (rewards.size() != rollouts.size()) {
        return absl::InternalError("the task returned a reward count unlike its rollouts'");
      }
      for (size_t j = 0; j < rollouts.size(); ++j) {
        absl::StrAppend(&reports[i].rollouts, absl::StrJoin(*rollouts[j].prompt, ","), "|",
                        absl::StrJoin(*rollouts[j].completion, ","), "|", rewards[j], "\n");
      }
      double mean = 0;
      for (float r : rewards) mean += r;
      reports[i].mean_reward = mean / static_cast<double>(rewards.size());
      LORADB_ASSIGN_OR_RETURN(std::vector<float> adv,
                              GroupAdvantages(rewards, config.grpo_group, true));
      const size_t group = static_cast<size_t>(config.grpo_group);
      std::vector<bool> keep(mine.size(), true);
      for (size_t start = 0; start < rewards.size(); start += group) {
        const bool flat = std::all_of(rewards.begin() + static_cast<int64_t>(start),
                                      rewards.begin() + static_cast<int64_t>(start + group),
                                      [&](float r) { return r == rewards[start]; });
        if (!flat) continue;
        ++reports[i].skipped_groups;
        std::fill(keep.begin() + static_cast<int64_t>(start),
                  keep.begin() + static_cast<int64_t>(start + group), false);
      }
      const int64_t kept = static_cast<int64_t>(std::count(keep.begin(), keep.end(), true));
      if (kept < config.micro_batches) {
        // Every advantage is 0 (a zero-gradient step), or too few rows for the micro-batches:
        // train on all rollouts, as without skipping.
        keep.assign(keep.size(), true);
        reports[i].skipped_groups = 0;
      }
      for (size_t j = 0; j < mine.size(); ++j) {
        if (!keep[j]) continue;
        Datum d = Completion(*their_prompt[j], mine[j]->tokens);
        d.sampling_logprobs.assign(d.weights.size(), 0.0f);
        const size_t start = their_prompt[j]->size() - 1;
        for (size_t t = 0; t < mine[j]->logprobs.size(); ++t) {
          d.sampling_logprobs[start + t] = mine[j]->logprobs[t];
        }
        d.advantage = adv[j];
        d.temperature = static_cast<float>(config.temperature);
        data[i].push_back(std::move(d));
      }
    }
  }

  // Micro-batches: chunk m of every policy's data goes into one shared forward/backward.
  for (int64_t m = 0; m < config.micro_batches; ++m) {
    std::vector<PolicyBatch> batches;
    for (size_t i = 0; i < k; ++i) {
      const int64_t unit = kinds[i] == LossKind::kDpo ? 2 : 1;
      const int64_t units = static_cast<int64_t>(data[i].size()) / unit;
      const int64_t lo = units * m / config.micro_batches * unit;
      const int64_t hi = units * (m + 1) / config.micro_batches * unit;
      if (hi <= lo) {
        return absl::InvalidArgumentError("more micro-batches than data in a step");
      }
      PolicyBatch b;
      b.policy = work[i].first;
      b.loss = kinds[i];
      b.data.assign(data[i].begin() + lo, data[i].begin() + hi);
      for (const Datum& d : b.data) reports[i].tokens += static_cast<int64_t>(d.tokens.size());
      batches.push_back(std::move(b));
    }
    const auto t0 = Clock::now();
    LORADB_ASSIGN_OR_RETURN(std::vector<LossReport> losses, trainer->ForwardBackward(batches));
    fb_s += since(t0);
    for (size_t i = 0; i < k; ++i) {
      const double inv = 1.0 / static_cast<double>(config.micro_batches);
      reports[i].loss += losses[i].loss * inv;
      reports[i].accuracy += losses[i].accuracy * inv;
      reports[i].metric += losses[i].metric * inv;
    }
  }
  const auto t_optim = Clock::now();
  for (size_t i = 0; i < k; ++i) {
    LORADB_ASSIGN_OR_RETURN(StepStats st, trainer->OptimStep(work[i].first));
    reports[i].grad_norm = st.grad_norm;
    reports[i].lr = st.lr;
    reports[i].step = trainer->step(work[i].first);
  }
  optim_s = since(t_optim);
  for (StepReport& r : reports) {
    r.sample_s = sample_s;
    r.forward_backward_s = fb_s;
    r.optim_s = optim_s;
  }
  return reports;
}

}  // namespace loradb::trainer

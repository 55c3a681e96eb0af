// The Tinker-facing training service (compute/training/training_service.h) end to end on a tiny
// random Qwen3 base: a supervised loop, save/load bit-exactness (also across a restart of the
// service on the same store), an importance_sampling loop on a verifiable reward, two runs
// trained at once, and refused inputs.
#include "compute/training/training_service.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "compute/model/checkpoint.h"
#include "storage/formats/model_config.h"
#include "storage/store/store.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace loradb::training {
namespace {

constexpr int64_t kVocab = 1024;

// The tiny dense config with two layers, fp32, output layer of unit-variance logits (a policy on
// it can become confident), written once per test binary.
const std::string& ModelDir() {
  static loradb::testing::TempDir* dir = [] {
    auto* d = new loradb::testing::TempDir();
    at::set_num_threads(1);
    auto config =
        ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/tiny-dense.json");
    EXPECT_TRUE(config.ok()) << config.status();
    config->num_hidden_layers = 2;
    absl::Status s = model::WriteRandomCheckpoint(*config, d->path(), 7, at::kFloat, 0.02,
                                                  1.0 / std::sqrt(128.0));
    EXPECT_TRUE(s.ok()) << s;
    return d;
  }();
  static std::string path = dir->path();
  return path;
}

class TrainingServiceTest : public ::testing::Test {
 protected:
  // Two runs whose calls are queued together learn independently; their forward/backward calls
  // run one after another (the default) or as one shared batch (`shared`, the service's option).
  void CheckTwoRuns(bool shared);

  void SetUp() override {
    auto store = Store::Open(store_dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(store).value();
    StartService();
  }

  void StartService(bool shared_batches = false) {
    TrainingServiceOptions options;
    options.model_dir = ModelDir();
    options.shared_batches = shared_batches;
    options.base_name = "tiny/base";
    auto service = TrainingService::Create(store_.get(), options);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(service).value();
    auto session = service_->CreateSession({}, {});
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *session;
  }

  // Waits for a submitted call; the future must succeed.
  FutureValue Await(const absl::StatusOr<Submitted>& submitted) {
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    if (!submitted.ok()) return UnloadResult{};
    FutureStatus f = AwaitStatus(submitted->request_id);
    EXPECT_EQ(f.state, FutureState::kDone) << f.error;
    return f.value.value_or(FutureValue(UnloadResult{}));
  }

  FutureStatus AwaitStatus(const std::string& id) {
    while (true) {
      auto f = service_->Retrieve(id, absl::Seconds(60));
      EXPECT_TRUE(f.ok()) << f.status();
      if (!f.ok() || f->state != FutureState::kPending) return f.value_or(FutureStatus{});
    }
  }

  std::string NewRun(int64_t model_seq_id, int64_t rank = 8, uint64_t seed = 1) {
    CreateRunRequest req;
    req.session_id = session_;
    req.model_seq_id = model_seq_id;
    req.base_model = "tiny/base";
    req.lora.rank = rank;
    req.lora.seed = seed;
    FutureValue v = Await(service_->CreateRun(req));
    return std::get<CreateRunResult>(v).run_id;
  }

  ForwardBackwardResult RunForwardBackward(const std::string& run, int64_t seq,
                                           const std::string& loss,
                                           const std::vector<DatumInput>& data,
                                           bool forward_only = false) {
    ForwardBackwardRequest req{run, seq, loss, {}, data, forward_only};
    return std::get<ForwardBackwardResult>(Await(service_->ForwardBackward(req)));
  }

  OptimStepResult Step(const std::string& run, int64_t seq, double lr) {
    AdamParams adam;
    adam.learning_rate = lr;
    return std::get<OptimStepResult>(Await(service_->OptimStep(run, seq, adam)));
  }

  loradb::testing::TempDir store_dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<TrainingService> service_;
  std::string session_;
};

TensorInput Ints(std::vector<int64_t> v) {
  TensorInput t;
  t.dtype = TensorInput::DType::kInt64;
  t.shape = {static_cast<int64_t>(v.size())};
  t.ints = std::move(v);
  return t;
}

TensorInput Floats(std::vector<float> v) {
  TensorInput t;
  t.dtype = TensorInput::DType::kFloat32;
  t.shape = {static_cast<int64_t>(v.size())};
  t.floats = std::move(v);
  return t;
}

// A sequence that follows `next` from `start`, as a cross_entropy datum (every target weighted
// 1/`scale`): model_input = seq[:-1], target_tokens = seq[1:].
DatumInput ChainDatum(const std::vector<int64_t>& next, int64_t start, int64_t len, float scale) {
  std::vector<int64_t> seq = {start};
  while (static_cast<int64_t>(seq.size()) < len) seq.push_back(next[seq.back()]);
  DatumInput d;
  d.model_input.assign(seq.begin(), seq.end() - 1);
  d.loss_fn_inputs["target_tokens"] = Ints(std::vector<int64_t>(seq.begin() + 1, seq.end()));
  d.loss_fn_inputs["weights"] = Floats(std::vector<float>(len - 1, 1.0f / scale));
  return d;
}

// A random successor for each of the first `n` token ids (a permutation among them).
std::vector<int64_t> RandomChain(uint64_t seed, int64_t n) {
  std::vector<int64_t> perm(kVocab);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.begin() + n, rng);
  return perm;
}

std::vector<DatumInput> ChainData(const std::vector<int64_t>& next, int64_t n) {
  std::vector<DatumInput> data;
  for (int64_t s = 0; s < 8; ++s) data.push_back(ChainDatum(next, (s * 5) % n, 12, 88.0f));
  return data;
}

TEST_F(TrainingServiceTest, SupervisedLoopHalvesTheLoss) {
  const std::string run = NewRun(0);
  const std::vector<DatumInput> data = ChainData(RandomChain(11, 40), 40);
  std::vector<double> losses;
  int64_t seq = 1;
  for (int step = 0; step < 30; ++step) {
    ForwardBackwardResult r = RunForwardBackward(run, seq++, "cross_entropy", data);
    ASSERT_EQ(r.outputs.size(), data.size());
    ASSERT_EQ(r.outputs[0].logprobs.size(), data[0].model_input.size());
    losses.push_back(r.metrics.at("loss:sum"));
    // The loss is the plain sum of -w * logp.
    double sum = 0;
    for (size_t i = 0; i < data.size(); ++i) {
      for (size_t j = 0; j < r.outputs[i].logprobs.size(); ++j) {
        sum += -r.outputs[i].logprobs[j] / 88.0;
        EXPECT_FLOAT_EQ(r.outputs[i].elementwise_loss[j], -r.outputs[i].logprobs[j] / 88.0f);
      }
    }
    EXPECT_NEAR(losses.back(), sum, 1e-4 * std::abs(sum));
    OptimStepResult o = Step(run, seq++, 2e-2);
    EXPECT_EQ(o.metrics.at("step"), step + 1);
  }
  EXPECT_LE(losses.back(), 0.5 * losses.front())
      << "first " << losses.front() << " last " << losses.back();

  // forward computes the same loss without accumulating a gradient: a step after it fails.
  ForwardBackwardResult f = RunForwardBackward(run, seq++, "cross_entropy", data, true);
  ForwardBackwardResult fb = RunForwardBackward(run, seq++, "cross_entropy", data);
  EXPECT_NEAR(f.metrics.at("loss:sum"), fb.metrics.at("loss:sum"),
              1e-5 * std::abs(fb.metrics.at("loss:sum")));
  for (size_t j = 0; j < fb.outputs[3].logprobs.size(); ++j) {
    EXPECT_NEAR(f.outputs[3].logprobs[j], fb.outputs[3].logprobs[j], 1e-4) << j;
  }
  Step(run, seq++, 2e-2);
  ForwardBackwardRequest fwd{run, seq++, "cross_entropy", {}, data, true};
  Await(service_->ForwardBackward(fwd));
  AdamParams adam;
  adam.learning_rate = 1e-2;
  auto lone = service_->OptimStep(run, seq++, adam);
  ASSERT_TRUE(lone.ok());
  FutureStatus failed = AwaitStatus(lone->request_id);
  EXPECT_EQ(failed.state, FutureState::kFailed);
  EXPECT_EQ(failed.error.code(), absl::StatusCode::kFailedPrecondition) << failed.error;
  EXPECT_TRUE(failed.user_error);
}

TEST_F(TrainingServiceTest, ImportanceSamplingAndPpoFollowTheirFormulas) {
  const std::string run = NewRun(0);
  std::vector<DatumInput> data = ChainData(RandomChain(4, 30), 30);
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (DatumInput& d : data) {
    const size_t n = d.model_input.size();
    std::vector<float> q(n), adv(n);
    // Sampler log-probs around the learner's (log 1/1024 ~ -6.93) so ratios fall on both sides
    // of the clip range.
    for (size_t j = 0; j < n; ++j) {
      q[j] = -6.93f + 0.3f * u(rng);
      adv[j] = u(rng);
    }
    d.loss_fn_inputs.erase("weights");
    d.loss_fn_inputs["logprobs"] = Floats(q);
    d.loss_fn_inputs["advantages"] = Floats(adv);
  }
  ForwardBackwardRequest is{run, 1, "importance_sampling", {}, data, true};
  auto r_is = std::get<ForwardBackwardResult>(Await(service_->ForwardBackward(is)));
  ForwardBackwardRequest ppo{
      run, 2, "ppo", {{"clip_low_threshold", 0.9}, {"clip_high_threshold", 1.1}}, data, true};
  auto r_ppo = std::get<ForwardBackwardResult>(Await(service_->ForwardBackward(ppo)));
  double sum_is = 0, sum_ppo = 0;
  int clipped = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    const auto& q = data[i].loss_fn_inputs.at("logprobs").floats;
    const auto& a = data[i].loss_fn_inputs.at("advantages").floats;
    for (size_t j = 0; j < q.size(); ++j) {
      const double lp = r_is.outputs[i].logprobs[j];
      EXPECT_EQ(lp, r_ppo.outputs[i].logprobs[j]);
      const double ratio = std::exp(lp - q[j]);
      const double want_is = -ratio * a[j];
      const double clip = std::min(std::max(ratio, 0.9), 1.1);
      const double want_ppo = -std::min(ratio * a[j], clip * a[j]);
      clipped += want_ppo != -ratio * a[j];
      EXPECT_NEAR(r_is.outputs[i].elementwise_loss[j], want_is, 1e-4 * (1 + std::abs(want_is)));
      EXPECT_NEAR(r_ppo.outputs[i].elementwise_loss[j], want_ppo, 1e-4 * (1 + std::abs(want_ppo)));
      sum_is += want_is;
      sum_ppo += want_ppo;
    }
  }
  EXPECT_GT(clipped, 0);
  EXPECT_NEAR(r_is.metrics.at("loss:sum"), sum_is, 1e-3 * (1 + std::abs(sum_is)));
  EXPECT_NEAR(r_ppo.metrics.at("loss:sum"), sum_ppo, 1e-3 * (1 + std::abs(sum_ppo)));
  // cross_entropy takes any finite weight, negative included (the SDK's forward_backward_custom
  // sends weights = -dLoss/dlogp): the loss stays -sum(w * logp).
  std::vector<DatumInput> signed_data = ChainData(RandomChain(4, 30), 30);
  double want_ce = 0;
  for (size_t i = 0; i < signed_data.size(); ++i) {
    auto& w = signed_data[i].loss_fn_inputs["weights"].floats;
    for (size_t j = 0; j < w.size(); ++j) {
      w[j] = j % 2 == 0 ? -0.5f : 0.25f;
      want_ce += -w[j] * r_is.outputs[i].logprobs[j];
    }
  }
  auto r_ce = RunForwardBackward(run, 3, "cross_entropy", signed_data);
  EXPECT_NEAR(r_ce.metrics.at("loss:sum"), want_ce, 1e-4 * std::abs(want_ce));
  // A bad clip range is refused by name.
  ppo.seq_id = 4;
  ppo.loss_fn_config = {{"clip_low_threshold", 1.2}, {"clip_high_threshold", 1.1}};
  EXPECT_EQ(service_->ForwardBackward(ppo).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TrainingServiceTest, SaveAndLoadContinueBitExactly) {
  const std::string run = NewRun(0);
  const std::vector<DatumInput> data = ChainData(RandomChain(5, 60), 60);
  int64_t seq = 1;
  for (int i = 0; i < 4; ++i) {
    RunForwardBackward(run, seq++, "cross_entropy", data);
    Step(run, seq++, 1e-2);
  }
  // Mid-accumulation: the saved state holds a gradient too.
  const double loss_at_save =
      RunForwardBackward(run, seq++, "cross_entropy", data).metrics.at("loss:sum");
  SaveWeightsRequest save{run, seq++, "000005", false};
  auto saved = std::get<SaveWeightsResult>(Await(service_->SaveWeights(save)));
  EXPECT_EQ(saved.path, "tinker://" + run + "/weights/000005");
  // The same name again is refused without overwrite.
  auto again = service_->SaveWeights(SaveWeightsRequest{run, seq++, "000005", false});
  ASSERT_TRUE(again.ok());
  FutureStatus dup = AwaitStatus(again->request_id);
  EXPECT_EQ(dup.error.code(), absl::StatusCode::kAlreadyExists) << dup.error;

  auto uninterrupted = [&](const std::string& r, int64_t* s) {
    std::vector<double> out;
    Step(r, (*s)++, 1e-2);
    for (int i = 0; i < 4; ++i) {
      out.push_back(RunForwardBackward(r, (*s)++, "cross_entropy", data).metrics.at("loss:sum"));
      Step(r, (*s)++, 1e-2);
    }
    return out;
  };
  const std::vector<double> expected = uninterrupted(run, &seq);

  // A new run created from the checkpoint (the SDK's create_training_client_from_state_with_
  // optimizer) takes the same losses.
  LoadWeightsRequest load;
  load.session_id = session_;
  load.model_seq_id = 1;
  load.path = saved.path;
  load.optimizer = true;
  auto loaded = std::get<LoadWeightsResult>(Await(service_->LoadWeights(load)));
  EXPECT_EQ(loaded.run_id, session_ + ":train:1");
  int64_t seq2 = 1;
  EXPECT_EQ(uninterrupted(loaded.run_id, &seq2), expected);

  // Loading onto the first run rewinds it to the same state.
  LoadWeightsRequest onto;
  onto.run_id = run;
  onto.seq_id = seq++;
  onto.path = saved.path;
  onto.optimizer = true;
  Await(service_->LoadWeights(onto));
  EXPECT_EQ(uninterrupted(run, &seq), expected);

  // The checkpoint is listed, and survives a restart of the service on the same store.
  auto listed = service_->ListCheckpoints(run);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].checkpoint_id, "weights/000005");
  service_.reset();
  StartService();
  auto info = service_->GetWeightsInfo(saved.path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->lora_rank, 8);
  EXPECT_EQ(info->base_model, "tiny/base");
  load.session_id = session_;
  load.model_seq_id = 0;
  auto restarted = std::get<LoadWeightsResult>(Await(service_->LoadWeights(load)));
  int64_t seq3 = 1;
  EXPECT_EQ(uninterrupted(restarted.run_id, &seq3), expected);
  // Without the optimizer the weights are the same but Adam starts over (and the saved gradient
  // is dropped): the first loss is the one at the save, the next one differs.
  load.model_seq_id = 1;
  load.optimizer = false;
  auto fresh = std::get<LoadWeightsResult>(Await(service_->LoadWeights(load)));
  int64_t seq4 = 1;
  const double first =
      RunForwardBackward(fresh.run_id, seq4++, "cross_entropy", data).metrics.at("loss:sum");
  Step(fresh.run_id, seq4++, 1e-2);
  const double second =
      RunForwardBackward(fresh.run_id, seq4++, "cross_entropy", data).metrics.at("loss:sum");
  EXPECT_EQ(first, loss_at_save);
  EXPECT_NE(second, expected[0]);
}

TEST_F(TrainingServiceTest, ImportanceSamplingRaisesAVerifiableReward) {
  // Reward: the fraction of completion tokens divisible by 4 (a quarter of the vocabulary, so a
  // random policy earns ~0.25).
  const std::string run = NewRun(0, 8, 3);
  auto reward = [](const std::vector<int64_t>& tokens) {
    double r = 0;
    for (int64_t t : tokens) r += t % 4 == 0 ? 1 : 0;
    return r / static_cast<double>(tokens.size());
  };
  const int kPrompts = 4, kGroup = 8, kSteps = 16;
  std::vector<double> mean_reward;
  int64_t seq = 1;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<DatumInput> data;
    double total = 0;
    for (int p = 0; p < kPrompts; ++p) {
      const std::vector<int64_t> prompt = {100 + step * kPrompts + p, 7};
      SampleRequest sample{run, prompt, kGroup, 3, 1.0, {}};
      auto rollouts = std::get<SampleResult>(Await(service_->Sample(sample)));
      ASSERT_EQ(rollouts.sequences.size(), static_cast<size_t>(kGroup));
      std::vector<double> rewards;
      for (const SampledSequence& s : rollouts.sequences) rewards.push_back(reward(s.tokens));
      const double mean = std::accumulate(rewards.begin(), rewards.end(), 0.0) / kGroup;
      total += mean;
      for (int g = 0; g < kGroup; ++g) {
        const SampledSequence& s = rollouts.sequences[g];
        ASSERT_EQ(s.stop_reason, "length");
        std::vector<int64_t> full = prompt;
        full.insert(full.end(), s.tokens.begin(), s.tokens.end());
        const size_t n = full.size() - 1;
        std::vector<float> q(n, 0.0f), adv(n, 0.0f);
        for (size_t j = 0; j < s.tokens.size(); ++j) {
          q[prompt.size() - 1 + j] = s.logprobs[j];
          adv[prompt.size() - 1 + j] = static_cast<float>(rewards[g] - mean);
        }
        DatumInput d;
        d.model_input.assign(full.begin(), full.end() - 1);
        d.loss_fn_inputs["target_tokens"] =
            Ints(std::vector<int64_t>(full.begin() + 1, full.end()));
        d.loss_fn_inputs["logprobs"] = Floats(q);
        d.loss_fn_inputs["advantages"] = Floats(adv);
        data.push_back(std::move(d));
      }
    }
    mean_reward.push_back(total / kPrompts);
    ForwardBackwardResult r = RunForwardBackward(run, seq++, "importance_sampling", data);
    // On-policy: the learner's logprobs of the sampled tokens are the sampler's.
    const auto& q = data[0].loss_fn_inputs.at("logprobs").floats;
    for (size_t j = 0; j < q.size(); ++j) {
      if (q[j] != 0) {
        EXPECT_NEAR(r.outputs[0].logprobs[j], q[j], 1e-3);
      }
    }
    Step(run, seq++, 3e-2);
  }
  const double early = (mean_reward[0] + mean_reward[1] + mean_reward[2]) / 3;
  const double late =
      (mean_reward[kSteps - 1] + mean_reward[kSteps - 2] + mean_reward[kSteps - 3]) / 3;
  EXPECT_GT(late, early + 0.2) << "early " << early << " late " << late;
}

TEST_F(TrainingServiceTest, TwoRunsTrainTogetherAndLearnIndependently) { CheckTwoRuns(false); }

TEST_F(TrainingServiceTest, TwoRunsTrainInSharedBatchesAndLearnIndependently) {
  service_.reset();
  StartService(/*shared_batches=*/true);
  CheckTwoRuns(true);
}

void TrainingServiceTest::CheckTwoRuns(bool shared) {
  const std::string a = NewRun(0, 8, 1);
  const std::string b = NewRun(1, 16, 2);
  const std::vector<DatumInput> data_a = ChainData(RandomChain(21, 40), 40);
  const std::vector<DatumInput> data_b = ChainData(RandomChain(22, 40), 40);
  auto loss = [&](const std::string& run, int64_t* seq, const std::vector<DatumInput>& data) {
    return RunForwardBackward(run, (*seq)++, "cross_entropy", data, true).metrics.at("loss:sum");
  };
  int64_t sa = 1, sb = 1;
  const double a0 = loss(a, &sa, data_a), b0 = loss(b, &sb, data_b);
  const double a_on_b0 = loss(a, &sa, data_b);
  for (int step = 0; step < 40; ++step) {
    // Submitted together: one trainer call for the two runs' forward/backward.
    service_->Pause();
    auto fa = service_->ForwardBackward({a, sa++, "cross_entropy", {}, data_a, false});
    auto fb = service_->ForwardBackward({b, sb++, "cross_entropy", {}, data_b, false});
    AdamParams adam;
    adam.learning_rate = 2e-2;
    auto oa = service_->OptimStep(a, sa++, adam);
    auto ob = service_->OptimStep(b, sb++, adam);
    service_->Resume();
    for (const auto* f : {&fa, &fb, &oa, &ob}) Await(*f);
  }
  const TrainingService::Stats stats = service_->stats();
  if (shared) {
    EXPECT_GE(stats.shared_calls, 80);
  } else {
    EXPECT_EQ(stats.shared_calls, 0);
  }
  const double a1 = loss(a, &sa, data_a), b1 = loss(b, &sb, data_b);
  EXPECT_LE(a1, 0.5 * a0);
  EXPECT_LE(b1, 0.5 * b0);
  // Each run learned its own chain, not the other's.
  const double a_on_b1 = loss(a, &sa, data_b);
  EXPECT_GT(a_on_b1, 0.8 * a_on_b0);

  // Each run publishes its own revision; the paths resolve back to them.
  auto pa =
      std::get<SaveForSamplerResult>(Await(service_->SaveWeightsForSampler({a, sa++, "final"})));
  auto pb = std::get<SaveForSamplerResult>(Await(service_->SaveWeightsForSampler({b, sb++, ""})));
  EXPECT_NE(pa.revision_id, pb.revision_id);
  EXPECT_EQ(pa.path, "tinker://" + a + "/sampler_weights/final");
  auto ra = service_->ResolveSamplerPath(pa.path);
  ASSERT_TRUE(ra.ok()) << ra.status();
  EXPECT_EQ(ra->id, pa.revision_id);
  auto rb = service_->ResolveSamplerPath(pb.path);
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(rb->id, pb.revision_id);
  EXPECT_EQ(rb->lora.r, 16);
  auto runs = service_->ListRuns();
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(runs->size(), 2u);
}

TEST_F(TrainingServiceTest, BadInputsAreRefusedAndOtherRunsKeepTraining) {
  const std::string run = NewRun(0);
  const std::vector<DatumInput> good = ChainData(RandomChain(9, 30), 30);
  auto fb = [&](const std::string& r, int64_t seq, const std::string& loss,
                std::vector<DatumInput> data) {
    return service_->ForwardBackward({r, seq, loss, {}, std::move(data), false}).status();
  };
  auto expect_error = [](const absl::Status& s, absl::StatusCode code, const std::string& text) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(text), std::string::npos) << s;
  };
  expect_error(fb(session_ + ":train:9", 1, "cross_entropy", good), absl::StatusCode::kNotFound,
               "not loaded");
  expect_error(fb("nonsense", 1, "cross_entropy", good), absl::StatusCode::kNotFound,
               "no training run");
  std::vector<DatumInput> bad = good;
  bad[2].model_input[1] = kVocab;
  expect_error(fb(run, 1, "cross_entropy", bad), absl::StatusCode::kInvalidArgument,
               "datum 2: model_input token id 1024 is outside the vocabulary");
  bad = good;
  bad[1].loss_fn_inputs["target_tokens"].ints[0] = -1;
  expect_error(fb(run, 1, "cross_entropy", bad), absl::StatusCode::kInvalidArgument,
               "target token id -1");
  bad = good;
  bad[3].loss_fn_inputs["weights"] = Floats(std::vector<float>(4, 1.0f));
  expect_error(fb(run, 1, "cross_entropy", bad), absl::StatusCode::kInvalidArgument,
               "datum 3: loss_fn_inputs['weights'] has 4 values for 11 model_input tokens");
  bad = good;
  bad[3].loss_fn_inputs["target_tokens"].ints.pop_back();
  expect_error(fb(run, 1, "cross_entropy", bad), absl::StatusCode::kInvalidArgument,
               "loss_fn_inputs['target_tokens'] has shape [11] but 10 values");
  bad = good;
  bad[0].loss_fn_inputs.erase("weights");
  expect_error(fb(run, 1, "cross_entropy", bad), absl::StatusCode::kInvalidArgument,
               "cross_entropy needs loss_fn_inputs['weights']");
  bad = good;
  bad[0].loss_fn_inputs["mask"] = Floats(std::vector<float>(11, 1.0f));
  expect_error(fb(run, 1, "cross_entropy", bad), absl::StatusCode::kInvalidArgument,
               "loss_fn_inputs['mask'] is not an input of cross_entropy");
  expect_error(fb(run, 1, "cispo", good), absl::StatusCode::kUnimplemented,
               "loss_fn 'cispo' is not supported");
  expect_error(fb(run, 1, "importance_sampling", good), absl::StatusCode::kInvalidArgument,
               "importance_sampling needs loss_fn_inputs['logprobs']");
  bad = good;
  bad[0].loss_fn_inputs["weights"].floats[0] = NAN;
  expect_error(fb(run, 1, "cross_entropy", bad), absl::StatusCode::kInvalidArgument, "non-finite");
  ForwardBackwardRequest config{run, 1, "cross_entropy", {{"clip_low_threshold", 0.5}}, good};
  expect_error(service_->ForwardBackward(config).status(), absl::StatusCode::kInvalidArgument,
               "loss_fn_config['clip_low_threshold'] is not a parameter of cross_entropy");
  AdamParams adam;
  adam.learning_rate = 1e-2;
  adam.beta2 = 1.5;
  expect_error(service_->OptimStep(run, 1, adam).status(), absl::StatusCode::kInvalidArgument,
               "betas");
  CreateRunRequest create{session_, 5, "tiny/base", {}, "adamw", {}};
  create.lora.rank = 8;
  create.lora.train_unembed = true;
  expect_error(service_->CreateRun(create).status(), absl::StatusCode::kUnimplemented,
               "train_unembed");
  create.lora.train_unembed = false;
  create.base_model = "Qwen/Qwen3-8B";
  expect_error(service_->CreateRun(create).status(), absl::StatusCode::kInvalidArgument,
               "is not served here");
  create.base_model = "tiny/base";
  create.session_id = "nope";
  expect_error(service_->CreateRun(create).status(), absl::StatusCode::kNotFound, "no session");
  LoadWeightsRequest load;
  load.run_id = run;
  load.seq_id = 1;
  load.path = "tinker://" + run + "/weights/missing";
  expect_error(service_->LoadWeights(load).status(), absl::StatusCode::kNotFound,
               "no checkpoint 'missing'");
  expect_error(service_->SaveWeights({run, 1, "bad/name", false}).status(),
               absl::StatusCode::kInvalidArgument, "checkpoint name 'bad/name'");
  expect_error(service_->Retrieve("no-such-request").status(), absl::StatusCode::kNotFound,
               "no request");

  // Nothing refused took a seq id or touched the run: it trains from seq 1 as if fresh, and
  // matches a second run with the same seed that saw no bad input.
  const std::string twin = NewRun(1);
  for (int64_t seq = 1; seq <= 6; seq += 2) {
    const double l = RunForwardBackward(run, seq, "cross_entropy", good).metrics.at("loss:sum");
    const double t = RunForwardBackward(twin, seq, "cross_entropy", good).metrics.at("loss:sum");
    EXPECT_EQ(l, t);
    Step(run, seq + 1, 1e-2);
    Step(twin, seq + 1, 1e-2);
  }
}

TEST_F(TrainingServiceTest, CallsRunInSeqOrderAndDuplicatesShareAFuture) {
  const std::string run = NewRun(0);
  const std::vector<DatumInput> data = ChainData(RandomChain(3, 30), 30);
  AdamParams adam;
  adam.learning_rate = 1e-2;
  // seq 2 (the step) arrives before seq 1 (its gradient): it waits for it.
  auto step = service_->OptimStep(run, 2, adam);
  ASSERT_TRUE(step.ok()) << step.status();
  auto first = service_->ForwardBackward({run, 1, "cross_entropy", {}, data, false});
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = service_->ForwardBackward({run, 1, "cross_entropy", {}, data, false});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->request_id, first->request_id);
  Await(step);
  Await(first);
  auto late = service_->ForwardBackward({run, 1, "cross_entropy", {}, data, false});
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->request_id, first->request_id);
}

}  // namespace
}  // namespace loradb::training

// Decoder: store-backed multi-LoRA continuous batching. Batch invariance against merged weights
// (16 requests over 16 adapters), alias moves mid-stream, deferral when the device arena is too
// small, sampling determinism, stop tokens, cancellation and input validation; log-probs
// against the recorded logits, the token hook, the gauges after a cancel, and request groups
// (one prefill for n samples).
#include "compute/decoder/decoder.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compute/model/checkpoint.h"
#include "compute/model/kernel_lora_applier.h"
#include "storage/formats/peft.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace loradb::decoder {
namespace {

using ::loradb::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kRank = 4;

std::string ConfigPath(const std::string& name) {
  return std::string(LORADB_SOURCE_DIR) + "/compute/configs/" + name + ".json";
}

// One adapter's factors by module key ("model.layers.0.self_attn.q_proj"), with its scale.
struct TestAdapter {
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> factors;  // key -> (A, B)
  LoraSettings lora;
  double scale = 0;
};

// A base checkpoint, a store with that base, and helpers to publish adapters.
class DecoderTest : public ::testing::Test {
 protected:
  void SetUp() override { Init("tiny-dense"); }

  void Init(const std::string& config_name) {
    absl::StatusOr<ModelConfig> c = ReadModelConfig(ConfigPath(config_name));
    ASSERT_TRUE(c.ok()) << c.status();
    config_ = *c;
    model_dir_ = dir_.file("model");
    ASSERT_TRUE(model::WriteRandomCheckpoint(config_, model_dir_, 7, at::kFloat).ok());
    absl::StatusOr<std::unique_ptr<model::Qwen3Model>> m = model::Qwen3Model::Load(model_dir_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    model_->set_lora_applier(&applier_);
    absl::StatusOr<std::unique_ptr<Store>> s = Store::Open(dir_.file("store"));
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    absl::StatusOr<BaseRecord> b = store_->AddBaseFromConfig("tiny", model_dir_ + "/config.json",
                                                             model_dir_ + "/model.safetensors");
    ASSERT_TRUE(b.ok()) << b.status();
  }

  // Random rank-kRank factors on every q/k/v/o/gate/up/down module, B non-zero. Odd seeds use
  // rsLoRA (scale alpha / sqrt(r)), even ones alpha / r.
  TestAdapter MakeAdapter(uint64_t seed) {
    TestAdapter t;
    at::Generator g = at::detail::createCPUGenerator(seed);
    for (const ModuleShape& m : config_.LoraModules()) {
      if (m.name.find("_proj") == std::string::npos) continue;  // embeddings, router, head
      at::Tensor a = at::randn({kRank, m.in}, g, at::kFloat) * 0.2;
      at::Tensor b = at::randn({m.out, kRank}, g, at::kFloat) * 0.2;
      t.factors["model." + m.name] = {a, b};
    }
    t.lora.r = kRank;
    t.lora.alpha = 8;
    t.lora.use_rslora = seed % 2 == 1;
    t.scale = t.lora.use_rslora ? 8.0 / std::sqrt(double{kRank}) : 8.0 / kRank;
    return t;
  }

  // Publishes `t` as a new revision of `policy` (created on first use), moving `alias`.
  uint64_t Publish(const std::string& policy, const TestAdapter& t, const std::string& alias) {
    std::vector<TensorView> views;
    for (const auto& [key, ab] : t.factors) {
      for (int side = 0; side < 2; ++side) {
        const at::Tensor& x = side == 0 ? ab.first : ab.second;
        TensorView v;
        v.name = peft::PeftTensorNameFor(key, side == 0 ? peft::LoraSide::kA : peft::LoraSide::kB,
                                         false);
        v.dtype = DType::kF32;
        v.shape = x.sizes().vec();
        v.data = static_cast<const std::byte*>(x.data_ptr());
        v.nbytes = x.nbytes();
        views.push_back(v);
      }
    }
    PublishOptions o;
    o.alias = alias;
    o.create_policy_base = "tiny";
    o.lora = t.lora;
    absl::StatusOr<RevisionRecord> r = store_->PublishTensors(policy, views, o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->id : 0;
  }

  // The base with `t` merged into its weights (W + scale B A), loaded as a model.
  std::unique_ptr<model::Qwen3Model> Merged(const TestAdapter& t) {
    std::map<std::string, at::Tensor> deltas;
    for (const auto& [key, ab] : t.factors) {
      deltas[key + ".weight"] =
          t.scale * at::matmul(ab.second.to(at::kDouble), ab.first.to(at::kDouble));
    }
    return MergedDeltas(deltas);
  }

  // The base with `deltas` (weight name -> fp64 delta) added to its weights, loaded as a model.
  std::unique_ptr<model::Qwen3Model> MergedDeltas(const std::map<std::string, at::Tensor>& deltas) {
    absl::StatusOr<TensorSet> set = model::ReadCheckpointTensors(model_dir_);
    EXPECT_TRUE(set.ok()) << set.status();
    auto owned = std::make_shared<std::vector<at::Tensor>>();
    auto merged = std::make_shared<TensorSet>(owned);
    for (const TensorView& v : set->tensors()) {
      at::Tensor w = at::from_blob(const_cast<std::byte*>(v.data), v.shape, at::kFloat).clone();
      if (auto it = deltas.find(v.name); it != deltas.end()) {
        w = (w.to(at::kDouble) + it->second).to(at::kFloat).contiguous();
      }
      owned->push_back(w);
      TensorView o = v;
      o.data = static_cast<const std::byte*>(w.data_ptr());
      EXPECT_TRUE(merged->Add(std::move(o)).ok());
    }
    absl::StatusOr<std::unique_ptr<model::Qwen3Model>> m =
        model::Qwen3Model::FromTensors(config_, merged);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }

  std::vector<int64_t> Prompt(uint64_t seed, size_t len) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> p(len);
    for (auto& x : p) x = static_cast<int64_t>(rng() % static_cast<uint64_t>(config_.vocab_size));
    return p;
  }

  std::unique_ptr<Decoder> NewDecoder(Store* store, DecoderOptions o = {},
                                      model::Qwen3Model* m = nullptr) {
    if (o.device.arena_bytes == (uint64_t{256} << 20)) o.device.arena_bytes = 32 << 20;
    absl::StatusOr<std::unique_ptr<Decoder>> d =
        Decoder::Create(m != nullptr ? m : model_.get(), store, o);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? std::move(*d) : nullptr;
  }

  static GenerateResult RunOne(Decoder& d, GenerateRequest r) {
    absl::StatusOr<uint64_t> id = d.Submit(std::move(r));
    EXPECT_TRUE(id.ok()) << id.status();
    EXPECT_TRUE(d.RunUntilIdle().ok());
    absl::StatusOr<std::optional<GenerateResult>> res = d.Poll(*id);
    EXPECT_TRUE(res.ok() && res->has_value());
    return res.ok() && res->has_value() ? std::move(**res) : GenerateResult{};
  }

  TempDir dir_;
  ModelConfig config_;
  std::string model_dir_;
  model::KernelLoraApplier applier_{1};
  std::unique_ptr<model::Qwen3Model> model_;
  std::unique_ptr<Store> store_;
};

GenerateRequest Req(const std::string& adapter, std::vector<int64_t> prompt, int64_t n) {
  GenerateRequest r;
  r.adapter = adapter;
  r.prompt_ids = std::move(prompt);
  r.max_new_tokens = n;
  return r;
}

TEST_F(DecoderTest, SixteenAdaptersInOneBatchMatchMergedWeightsAlone) {
  constexpr int kN = 16;
  std::vector<TestAdapter> adapters;
  std::vector<uint64_t> revs;
  for (int i = 0; i < kN; ++i) {
    adapters.push_back(MakeAdapter(100 + i));
    revs.push_back(Publish(absl::StrCat("p", i), adapters.back(), "prod"));
  }
  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  std::vector<uint64_t> ids;
  for (int i = 0; i < kN; ++i) {
    absl::StatusOr<uint64_t> id =
        d->Submit(Req(absl::StrCat("p", i, ":prod"), Prompt(i, 3 + i % 7), 6));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  ASSERT_TRUE(d->RunUntilIdle().ok());
  // Every step ran all 16 sequences together: one prefill step + 5 decode steps.
  EXPECT_EQ(d->stats().steps, 6);
  EXPECT_EQ(d->stats().deferrals, 0);
  EXPECT_GT(applier_.kernel_calls(), 0);
  // Prefill (runs of rows per adapter) went through SGMV, decode steps through BGMV.
  EXPECT_GT(applier_.sgmv_calls(), 0);
  EXPECT_LT(applier_.sgmv_calls(), applier_.kernel_calls());
  EXPECT_EQ(applier_.fallback_calls(), 0);
  int differs_from_base = 0;
  std::unique_ptr<Decoder> base = NewDecoder(nullptr);
  for (int i = 0; i < kN; ++i) {
    absl::StatusOr<std::optional<GenerateResult>> r = d->Poll(ids[i]);
    ASSERT_TRUE(r.ok() && r->has_value());
    EXPECT_EQ((*r)->revision, revs[i]);
    EXPECT_EQ((*r)->finish, FinishReason::kLength);
    std::unique_ptr<model::Qwen3Model> merged = Merged(adapters[i]);
    std::unique_ptr<Decoder> alone = NewDecoder(nullptr, {}, merged.get());
    GenerateResult ref = RunOne(*alone, Req("", Prompt(i, 3 + i % 7), 6));
    EXPECT_EQ((*r)->tokens, ref.tokens) << "request " << i;
    GenerateResult b = RunOne(*base, Req("", Prompt(i, 3 + i % 7), 6));
    differs_from_base += b.tokens != ref.tokens;
  }
  // The adapters change the output (otherwise the comparison above would prove nothing).
  EXPECT_GE(differs_from_base, kN / 2);
}

TEST_F(DecoderTest, RecordedLogitsMatchMergedModel) {
  TestAdapter t = MakeAdapter(3);
  Publish("p", t, "prod");
  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  GenerateRequest r = Req("p:prod", Prompt(5, 6), 4);
  r.record_logits = true;
  GenerateResult got = RunOne(*d, r);
  ASSERT_EQ(got.logits.size(), 6u + 4u - 1u);
  std::unique_ptr<model::Qwen3Model> merged = Merged(t);
  std::vector<int64_t> all = Prompt(5, 6);
  all.insert(all.end(), got.tokens.begin(), got.tokens.end() - 1);
  model::ForwardInput in;
  in.token_ids = at::tensor(all, at::kLong);
  absl::StatusOr<model::ForwardOutput> ref = merged->Forward(in);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (size_t p = 0; p < got.logits.size(); ++p) {
    at::Tensor ours = at::tensor(got.logits[p], at::kFloat);
    at::Tensor want = ref->logits[static_cast<int64_t>(p)];
    const double rel = ((ours - want).abs().max() / want.abs().max()).item<double>();
    EXPECT_LT(rel, 1e-4) << "position " << p;
  }
}

TEST_F(DecoderTest, AliasMovedMidStreamPinsRunningRequestsToTheirRevision) {
  TestAdapter t1 = MakeAdapter(11), t2 = MakeAdapter(12);
  const uint64_t rev1 = Publish("p", t1, "prod");
  const uint64_t rev2 = Publish("p", t2, "");
  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  absl::StatusOr<uint64_t> a = d->Submit(Req("p:prod", Prompt(1, 5), 8));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(d->Step().ok());
  ASSERT_TRUE(d->Step().ok());
  ASSERT_TRUE(store_->SetAlias("p", "prod", rev2).ok());
  absl::StatusOr<uint64_t> b = d->Submit(Req("p:prod", Prompt(1, 5), 8));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(d->RunUntilIdle().ok());
  absl::StatusOr<std::optional<GenerateResult>> ra = d->Poll(*a), rb = d->Poll(*b);
  ASSERT_TRUE(ra.ok() && ra->has_value() && rb.ok() && rb->has_value());
  EXPECT_EQ((*ra)->revision, rev1);
  EXPECT_EQ((*rb)->revision, rev2);
  std::unique_ptr<Decoder> fresh = NewDecoder(store_.get());
  EXPECT_EQ((*ra)->tokens, RunOne(*fresh, Req(absl::StrCat(rev1), Prompt(1, 5), 8)).tokens);
  EXPECT_EQ((*rb)->tokens, RunOne(*fresh, Req(absl::StrCat(rev2), Prompt(1, 5), 8)).tokens);
  EXPECT_NE((*ra)->tokens, (*rb)->tokens);
}

TEST_F(DecoderTest, AdaptersThatDoNotFitAreDeferredNotFailed) {
  constexpr int kN = 6;
  std::vector<std::string> refs;
  for (int i = 0; i < kN; ++i) {
    Publish(absl::StrCat("p", i), MakeAdapter(200 + i), "prod");
    refs.push_back(absl::StrCat("p", i, ":prod"));
  }
  // ~143 KB per adapter: an arena of 80 pages of 4 KiB holds two at a time.
  DecoderOptions small;
  small.device.arena_bytes = 80 * 4096;
  small.device.page_bytes = 4096;
  std::unique_ptr<Decoder> d = NewDecoder(store_.get(), small);
  std::vector<uint64_t> ids;
  for (int i = 0; i < kN; ++i) {
    absl::StatusOr<uint64_t> id = d->Submit(Req(refs[i], Prompt(i, 4), 3));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  ASSERT_TRUE(d->Submit(Req("", Prompt(99, 4), 3)).ok());  // base rows always run
  ASSERT_TRUE(d->RunUntilIdle().ok());
  EXPECT_GT(d->stats().deferrals, 0);
  std::unique_ptr<Decoder> roomy = NewDecoder(store_.get());
  int64_t deferred = 0;
  for (int i = 0; i < kN; ++i) {
    absl::StatusOr<std::optional<GenerateResult>> r = d->Poll(ids[i]);
    ASSERT_TRUE(r.ok() && r->has_value());
    EXPECT_EQ((*r)->finish, FinishReason::kLength) << (*r)->status;
    deferred += (*r)->deferred_steps;
    EXPECT_EQ((*r)->tokens, RunOne(*roomy, Req(refs[i], Prompt(i, 4), 3)).tokens);
  }
  EXPECT_GT(deferred, 0);
}

TEST_F(DecoderTest, AdapterLargerThanTheArenaFailsOnlyItsRequest) {
  Publish("p", MakeAdapter(1), "prod");
  DecoderOptions tiny;
  tiny.device.arena_bytes = 8 * 4096;
  tiny.device.page_bytes = 4096;
  std::unique_ptr<Decoder> d = NewDecoder(store_.get(), tiny);
  absl::StatusOr<uint64_t> a = d->Submit(Req("p:prod", Prompt(1, 4), 3));
  absl::StatusOr<uint64_t> b = d->Submit(Req("", Prompt(2, 4), 3));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(d->RunUntilIdle().ok());
  absl::StatusOr<std::optional<GenerateResult>> ra = d->Poll(*a), rb = d->Poll(*b);
  ASSERT_TRUE(ra.ok() && ra->has_value() && rb.ok() && rb->has_value());
  EXPECT_EQ((*ra)->finish, FinishReason::kError);
  EXPECT_TRUE(absl::IsResourceExhausted((*ra)->status)) << (*ra)->status;
  EXPECT_EQ((*rb)->finish, FinishReason::kLength);
  EXPECT_EQ((*rb)->tokens.size(), 3u);
}

TEST_F(DecoderTest, SamplingIsSeededPerRequestAndIndependentOfTheBatch) {
  Publish("p", MakeAdapter(4), "prod");
  GenerateRequest r = Req("p:prod", Prompt(3, 5), 10);
  r.sampling.temperature = 1.5;
  r.sampling.top_k = 50;
  r.sampling.top_p = 0.9;
  r.sampling.seed = 42;
  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  GenerateResult alone = RunOne(*d, r);
  // The same request among others: same tokens.
  absl::StatusOr<uint64_t> x = d->Submit(Req("", Prompt(8, 7), 10));
  absl::StatusOr<uint64_t> id = d->Submit(r);
  ASSERT_TRUE(x.ok() && id.ok());
  ASSERT_TRUE(d->RunUntilIdle().ok());
  absl::StatusOr<std::optional<GenerateResult>> mixed = d->Poll(*id);
  ASSERT_TRUE(mixed.ok() && mixed->has_value());
  EXPECT_EQ((*mixed)->tokens, alone.tokens);
  // Other seeds give other samples (at temperature 1.5 over ~1000 tokens).
  int different = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    GenerateRequest o = r;
    o.sampling.seed = seed;
    different += RunOne(*d, o).tokens != alone.tokens;
  }
  EXPECT_GE(different, 3);
  // top_k = 1 is greedy whatever the temperature.
  GenerateRequest k1 = r;
  k1.sampling.top_k = 1;
  GenerateRequest greedy = Req("p:prod", Prompt(3, 5), 10);
  EXPECT_EQ(RunOne(*d, k1).tokens, RunOne(*d, greedy).tokens);
}

TEST_F(DecoderTest, StopTokensAndCancel) {
  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  GenerateResult full = RunOne(*d, Req("", Prompt(6, 4), 8));
  ASSERT_EQ(full.tokens.size(), 8u);
  GenerateRequest s = Req("", Prompt(6, 4), 8);
  s.stop_token_ids = {full.tokens[2]};
  GenerateResult stopped = RunOne(*d, s);
  EXPECT_EQ(stopped.finish, FinishReason::kStop);
  // Stops at the first occurrence of the stop token, which it includes.
  const auto first = std::find(full.tokens.begin(), full.tokens.end(), full.tokens[2]);
  EXPECT_EQ(stopped.tokens, std::vector<int64_t>(full.tokens.begin(), first + 1));

  absl::StatusOr<uint64_t> id = d->Submit(Req("", Prompt(6, 4), 8));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(d->Step().ok());
  ASSERT_TRUE(d->Cancel(*id).ok());
  ASSERT_TRUE(d->RunUntilIdle().ok());
  absl::StatusOr<std::optional<GenerateResult>> r = d->Poll(*id);
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->finish, FinishReason::kCancelled);
  EXPECT_EQ((*r)->tokens.size(), 1u);
  EXPECT_TRUE(absl::IsNotFound(d->Poll(*id).status()));
  EXPECT_TRUE(absl::IsNotFound(d->Cancel(*id)));

  // Callbacks get the result instead of Poll.
  std::vector<int64_t> got;
  GenerateRequest cb = Req("", Prompt(6, 4), 8);
  cb.on_done = [&](GenerateResult res) { got = res.tokens; };
  absl::StatusOr<uint64_t> cid = d->Submit(std::move(cb));
  ASSERT_TRUE(cid.ok());
  ASSERT_TRUE(d->RunUntilIdle().ok());
  EXPECT_EQ(got, full.tokens);
  EXPECT_TRUE(absl::IsNotFound(d->Poll(*cid).status()));
}

// log-softmax of one recorded logits row, in double.
std::vector<double> LogSoftmax(const std::vector<float>& row) {
  double max = row[0];
  for (float v : row) max = std::max<double>(max, v);
  double sum = 0;
  for (float v : row) sum += std::exp(v - max);
  std::vector<double> out;
  for (float v : row) out.push_back(v - max - std::log(sum));
  return out;
}

// `lp` is `token` under `row`'s log-softmax, with the k most likely tokens in order.
void ExpectLogprobsOf(const std::vector<float>& row, int64_t token, const TokenLogprob& lp,
                      size_t k) {
  const std::vector<double> want = LogSoftmax(row);
  EXPECT_EQ(lp.token, token);
  EXPECT_NEAR(lp.logprob, want[static_cast<size_t>(token)], 1e-5);
  ASSERT_EQ(lp.top.size(), k);
  std::vector<int64_t> order(want.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return want[static_cast<size_t>(a)] > want[static_cast<size_t>(b)];
  });
  for (size_t i = 0; i < k; ++i) {
    EXPECT_EQ(lp.top[i].first, order[i]) << i;
    EXPECT_NEAR(lp.top[i].second, want[static_cast<size_t>(order[i])], 1e-5);
  }
}

TEST_F(DecoderTest, LogprobsAreTheLogSoftmaxOfTheSamplersLogits) {
  Publish("p", MakeAdapter(8), "prod");
  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  GenerateRequest r = Req("p:prod", Prompt(4, 6), 5);
  r.sampling.temperature = 2.0;  // log-probs stay those of the unscaled logits
  r.sampling.seed = 3;
  r.record_logits = true;
  r.logprobs = 4;
  r.prompt_logprobs = true;
  std::vector<int64_t> streamed;
  r.on_token = [&](const TokenEvent& e) {
    EXPECT_NE(e.logprob, nullptr);
    if (e.logprob != nullptr) {
      EXPECT_EQ(e.logprob->token, e.token);
    }
    streamed.push_back(e.token);
    EXPECT_EQ(*e.tokens, streamed);
    return false;
  };
  GenerateResult got = RunOne(*d, r);
  ASSERT_EQ(got.tokens.size(), 5u);
  EXPECT_EQ(streamed, got.tokens);
  ASSERT_EQ(got.logits.size(), 6u + 5u - 1u);
  // Generated token i was sampled from logits row 5 + i.
  ASSERT_EQ(got.logprobs.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    ExpectLogprobsOf(got.logits[5 + i], got.tokens[i], got.logprobs[i], 4);
  // Prompt token p (p >= 1) under row p - 1.
  ASSERT_EQ(got.prompt_logprobs.size(), 5u);
  for (size_t p = 1; p < 6; ++p) {
    ExpectLogprobsOf(got.logits[p - 1], r.prompt_ids[p], got.prompt_logprobs[p - 1], 4);
  }
  // The same request without logits recorded, beside another: the same tokens and log-probs.
  GenerateRequest plain = r;
  plain.record_logits = false;
  plain.on_token = nullptr;
  ASSERT_TRUE(d->Submit(Req("", Prompt(9, 3), 7)).ok());
  GenerateResult again = RunOne(*d, plain);
  EXPECT_EQ(again.tokens, got.tokens);
  ASSERT_EQ(again.logprobs.size(), got.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_NEAR(again.logprobs[i].logprob, got.logprobs[i].logprob, 1e-5);
  }
  EXPECT_TRUE(RunOne(*d, Req("", Prompt(4, 6), 2)).logprobs.empty());
}

TEST_F(DecoderTest, TokenHookEndsTheSequenceAndGaugesFollowCancel) {
  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  const GenerateResult full = RunOne(*d, Req("", Prompt(6, 4), 8));
  GenerateRequest hooked = Req("", Prompt(6, 4), 8);
  hooked.on_token = [](const TokenEvent& e) { return e.tokens->size() == 2; };
  const GenerateResult stopped = RunOne(*d, hooked);
  EXPECT_EQ(stopped.finish, FinishReason::kStop);
  EXPECT_EQ(stopped.tokens, std::vector<int64_t>(full.tokens.begin(), full.tokens.begin() + 2));

  Publish("a", MakeAdapter(21), "prod");
  absl::StatusOr<uint64_t> a = d->Submit(Req("a:prod", Prompt(1, 4), 20));
  absl::StatusOr<uint64_t> b = d->Submit(Req("", Prompt(2, 4), 20));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(d->Step().ok());
  ASSERT_TRUE(d->Step().ok());
  DecoderStats s = d->stats();
  EXPECT_EQ(s.running, 2);
  EXPECT_EQ(s.kv_sequences, 2);
  EXPECT_EQ(s.leased_adapters, 1);
  EXPECT_GT(s.kv_bytes, 0);
  ASSERT_TRUE(d->Cancel(*a).ok());
  ASSERT_TRUE(d->Step().ok());  // one step: a's KV cache and adapter lease are gone
  s = d->stats();
  EXPECT_EQ(s.running, 1);
  EXPECT_EQ(s.kv_sequences, 1);
  EXPECT_EQ(s.leased_adapters, 0);
  ASSERT_TRUE(d->RunUntilIdle().ok());
  s = d->stats();
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.kv_sequences, 0);
  EXPECT_EQ(s.kv_bytes, 0);
}

TEST_F(DecoderTest, GroupPrefillsOnceAndEachMemberMatchesItsRequestAlone) {
  Publish("p", MakeAdapter(9), "prod");
  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  std::vector<GenerateRequest> group;
  for (uint64_t i = 0; i < 3; ++i) {
    GenerateRequest r = Req("p:prod", Prompt(12, 7), 6);
    r.sampling.temperature = 1.4;
    r.sampling.seed = 50 + i;
    r.logprobs = i == 1 ? 2 : -1;
    r.prompt_logprobs = i == 2;
    group.push_back(r);
  }
  ASSERT_TRUE(d->Submit(Req("", Prompt(13, 5), 4)).ok());  // another request in the batch
  absl::StatusOr<std::vector<uint64_t>> ids = d->SubmitGroup(group);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 3u);
  ASSERT_TRUE(d->RunUntilIdle().ok());
  EXPECT_EQ(d->stats().prefill_tokens, 5 + 7);  // the group's prompt once
  std::unique_ptr<Decoder> alone = NewDecoder(store_.get());
  std::vector<std::vector<int64_t>> tokens;
  for (size_t i = 0; i < 3; ++i) {
    absl::StatusOr<std::optional<GenerateResult>> r = d->Poll((*ids)[i]);
    ASSERT_TRUE(r.ok() && r->has_value());
    const GenerateResult want = RunOne(*alone, group[i]);
    EXPECT_EQ((*r)->tokens, want.tokens) << i;
    ASSERT_EQ((*r)->logprobs.size(), want.logprobs.size());
    for (size_t t = 0; t < want.logprobs.size(); ++t) {
      EXPECT_NEAR((*r)->logprobs[t].logprob, want.logprobs[t].logprob, 1e-4);
    }
    ASSERT_EQ((*r)->prompt_logprobs.size(), want.prompt_logprobs.size());
    for (size_t t = 0; t < want.prompt_logprobs.size(); ++t) {
      EXPECT_NEAR((*r)->prompt_logprobs[t].logprob, want.prompt_logprobs[t].logprob, 1e-4);
    }
    tokens.push_back((*r)->tokens);
  }
  EXPECT_NE(tokens[0], tokens[1]);
  EXPECT_EQ(tokens.size(), 3u);
  EXPECT_TRUE(absl::IsInvalidArgument(
      d->SubmitGroup({Req("", Prompt(1, 3), 2), Req("", Prompt(2, 3), 2)}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(d->SubmitGroup({}).status()));

  // The leader cancelled before its prefill: the others still run, from their own prefill.
  absl::StatusOr<std::vector<uint64_t>> again = d->SubmitGroup(group);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(d->Cancel((*again)[0]).ok());
  ASSERT_TRUE(d->Cancel((*again)[2]).ok());
  ASSERT_TRUE(d->RunUntilIdle().ok());
  absl::StatusOr<std::optional<GenerateResult>> lead = d->Poll((*again)[0]);
  absl::StatusOr<std::optional<GenerateResult>> mid = d->Poll((*again)[1]);
  absl::StatusOr<std::optional<GenerateResult>> last = d->Poll((*again)[2]);
  ASSERT_TRUE(lead.ok() && lead->has_value() && mid.ok() && mid->has_value() && last.ok() &&
              last->has_value());
  EXPECT_EQ((*lead)->finish, FinishReason::kCancelled);
  EXPECT_EQ((*last)->finish, FinishReason::kCancelled);
  EXPECT_TRUE((*last)->tokens.empty());
  EXPECT_EQ((*mid)->finish, FinishReason::kLength);
  EXPECT_EQ((*mid)->tokens, tokens[1]);
  EXPECT_EQ(d->stats().kv_sequences, 0);
}

TEST_F(DecoderTest, GroupsSubmittedAtOncePrefillInOneStepOrNotAtAll) {
  Publish("p", MakeAdapter(9), "prod");
  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  std::vector<std::vector<GenerateRequest>> groups = {
      {Req("p:prod", Prompt(21, 5), 4)},
      {Req("", Prompt(22, 7), 4)},
      {Req("p:prod", Prompt(23, 3), 4), Req("p:prod", Prompt(23, 3), 4)}};
  groups[2][0].sampling = {1.2, 0, 1.0, 7};
  groups[2][1].sampling = {1.2, 0, 1.0, 8};
  // The second group is invalid: nothing of any group is queued, and the error names it.
  std::vector<std::vector<GenerateRequest>> bad = groups;
  bad[1][0].prompt_ids.push_back(config_.vocab_size);
  absl::Status refused = d->SubmitGroups(bad).status();
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("group 1: "));
  EXPECT_TRUE(d->Idle());
  EXPECT_TRUE(absl::IsInvalidArgument(d->SubmitGroups({}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(d->SubmitGroups({{}}).status()));

  absl::StatusOr<std::vector<std::vector<uint64_t>>> ids = d->SubmitGroups(groups);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 3u);
  ASSERT_EQ((*ids)[2].size(), 2u);
  ASSERT_TRUE(d->Step().ok());
  // One step prefilled every group's prompt (the third group's once).
  EXPECT_EQ(d->stats().steps, 1);
  EXPECT_EQ(d->stats().prefill_tokens, 5 + 7 + 3);
  ASSERT_TRUE(d->RunUntilIdle().ok());
  EXPECT_EQ(d->stats().steps, 4);
  std::unique_ptr<Decoder> alone = NewDecoder(store_.get());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].size(); ++i) {
      absl::StatusOr<std::optional<GenerateResult>> r = d->Poll((*ids)[g][i]);
      ASSERT_TRUE(r.ok() && r->has_value());
      EXPECT_EQ((*r)->tokens, RunOne(*alone, groups[g][i]).tokens) << g << " " << i;
    }
  }
}

TEST_F(DecoderTest, BadRequestsAreRejectedAndNothingIsQueued) {
  Publish("p", MakeAdapter(5), "prod");
  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  EXPECT_TRUE(absl::IsInvalidArgument(d->Submit(Req("", {}, 4)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(d->Submit(Req("", {1, config_.vocab_size}, 4)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(d->Submit(Req("", {1, -1}, 4)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(d->Submit(Req("", {1, 2}, 0)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      d->Submit(Req("", {1, 2}, config_.max_position_embeddings)).status()));
  GenerateRequest bad_p = Req("", {1, 2}, 4);
  bad_p.sampling.temperature = 1;
  bad_p.sampling.top_p = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(d->Submit(bad_p).status()));
  EXPECT_TRUE(absl::IsNotFound(d->Submit(Req("p:staging", {1, 2}, 4)).status()));
  EXPECT_TRUE(absl::IsNotFound(d->Submit(Req("nope:prod", {1, 2}, 4)).status()));
  std::unique_ptr<Decoder> no_store = NewDecoder(nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(no_store->Submit(Req("p:prod", {1, 2}, 4)).status()));
  EXPECT_TRUE(d->Idle());
  EXPECT_TRUE(absl::IsNotFound(d->Poll(12345).status()));
  // A revision of another base (different weights) is refused.
  const std::string other = dir_.file("other");
  ASSERT_TRUE(model::WriteRandomCheckpoint(config_, other, 8, at::kFloat).ok());
  ASSERT_TRUE(
      store_->AddBaseFromConfig("other", other + "/config.json", other + "/model.safetensors")
          .ok());
  TestAdapter t = MakeAdapter(6);
  std::vector<TensorView> views;
  for (const auto& [key, ab] : t.factors) {
    for (int side = 0; side < 2; ++side) {
      const at::Tensor& x = side == 0 ? ab.first : ab.second;
      views.push_back(
          {peft::PeftTensorNameFor(key, side == 0 ? peft::LoraSide::kA : peft::LoraSide::kB, false),
           DType::kF32, x.sizes().vec(), static_cast<const std::byte*>(x.data_ptr()), x.nbytes()});
    }
  }
  PublishOptions o;
  o.alias = "prod";
  o.create_policy_base = "other";
  o.lora = t.lora;
  ASSERT_TRUE(store_->PublishTensors("q", views, o).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(d->Submit(Req("q:prod", {1, 2}, 4)).status()));
  EXPECT_TRUE(d->Idle());
}

class MoeDecoderTest : public DecoderTest {
 protected:
  void SetUp() override { Init("tiny-moe"); }
};

TEST_F(MoeDecoderTest, MixedAdaptersMatchMergedWeights) {
  std::vector<TestAdapter> adapters;
  for (int i = 0; i < 3; ++i) {
    adapters.push_back(MakeAdapter(300 + i));
    Publish(absl::StrCat("m", i), adapters.back(), "prod");
  }
  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<uint64_t> id = d->Submit(Req(absl::StrCat("m", i, ":prod"), Prompt(i, 5), 5));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  ASSERT_TRUE(d->RunUntilIdle().ok());
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::optional<GenerateResult>> r = d->Poll(ids[i]);
    ASSERT_TRUE(r.ok() && r->has_value());
    ASSERT_EQ((*r)->finish, FinishReason::kLength) << (*r)->status;
    std::unique_ptr<model::Qwen3Model> merged = Merged(adapters[i]);
    std::unique_ptr<Decoder> alone = NewDecoder(nullptr, {}, merged.get());
    EXPECT_EQ((*r)->tokens, RunOne(*alone, Req("", Prompt(i, 5), 5)).tokens) << i;
  }
}

// PEFT's target_parameters layout (LoRA on the fused expert parameters gate_up_proj [E, 2I, H]
// and down_proj [E, H, I]), imported from a PEFT directory into the packed layout and served in
// a batch with a plain adapter and a base-only request: equals the base with every expert's
// delta merged, computed here from the fused layout (expert e's A is rows [e r, (e + 1) r) of
// A, its B column k is column k E + e of B; gate_up's rows are gate_proj's, then up_proj's).
TEST_F(MoeDecoderTest, TargetParametersAdapterMatchesMergedExperts) {
  const int64_t e_n = config_.num_experts, h = config_.hidden_size,
                i_n = config_.moe_intermediate_size;
  constexpr int64_t r = 2;
  const double scale = 6.0 / r;
  at::Generator g = at::detail::createCPUGenerator(41);
  std::map<std::string, at::Tensor> tensors;  // PEFT names
  std::map<std::string, at::Tensor> deltas;   // per-expert weight name -> delta
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (!config_.IsMoeLayer(l)) continue;
    const std::string m = absl::StrCat("model.layers.", l, ".mlp.experts");
    // gate_up_proj is registered first, so PEFT nests it innermost (one base_layer).
    const at::Tensor gu_a = at::randn({r * e_n, h}, g, at::kFloat) * 0.2;
    const at::Tensor gu_b = at::randn({2 * i_n, r * e_n}, g, at::kFloat) * 0.2;
    const at::Tensor d_a = at::randn({r * e_n, i_n}, g, at::kFloat) * 0.2;
    const at::Tensor d_b = at::randn({h, r * e_n}, g, at::kFloat) * 0.2;
    tensors[peft::PeftTensorNameFor(m + ".base_layer", peft::LoraSide::kA, false)] = gu_a;
    tensors[peft::PeftTensorNameFor(m + ".base_layer", peft::LoraSide::kB, false)] = gu_b;
    tensors[peft::PeftTensorNameFor(m, peft::LoraSide::kA, false)] = d_a;
    tensors[peft::PeftTensorNameFor(m, peft::LoraSide::kB, false)] = d_b;
    for (int64_t e = 0; e < e_n; ++e) {
      const at::Tensor a = gu_a.narrow(0, e * r, r).to(at::kDouble);
      const at::Tensor b = gu_b.view({2 * i_n, r, e_n}).select(2, e).to(at::kDouble);
      const at::Tensor da = d_a.narrow(0, e * r, r).to(at::kDouble);
      const at::Tensor db = d_b.view({h, r, e_n}).select(2, e).to(at::kDouble);
      const std::string p = absl::StrCat("model.layers.", l, ".mlp.experts.", e, ".");
      deltas[p + "gate_proj.weight"] = scale * at::matmul(b.narrow(0, 0, i_n), a);
      deltas[p + "up_proj.weight"] = scale * at::matmul(b.narrow(0, i_n, i_n), a);
      deltas[p + "down_proj.weight"] = scale * at::matmul(db, da);
    }
  }
  std::vector<TensorView> views;
  for (const auto& [name, t] : tensors) {
    views.push_back({name, DType::kF32, t.sizes().vec(),
                     static_cast<const std::byte*>(t.data_ptr()), t.nbytes()});
  }
  absl::StatusOr<peft::LoraConfig> pc = peft::ParseLoraConfig(
      R"({"peft_type":"LORA","r":2,"lora_alpha":6,"target_modules":[],)"
      R"("target_parameters":["mlp.experts.gate_up_proj","mlp.experts.down_proj"]})");
  ASSERT_TRUE(pc.ok()) << pc.status();
  const std::string peft_dir = dir_.file("experts-peft");
  ASSERT_TRUE(peft::WritePeftDir(peft_dir, *pc, views).ok());
  PublishOptions o;
  o.alias = "prod";
  o.create_policy_base = "tiny";
  absl::StatusOr<RevisionRecord> rev = store_->PublishPeftDir("experts", peft_dir, o);
  ASSERT_TRUE(rev.ok()) << rev.status();
  TestAdapter plain = MakeAdapter(310);
  Publish("plain", plain, "prod");

  std::unique_ptr<model::Qwen3Model> merged = MergedDeltas(deltas);
  ASSERT_NE(merged, nullptr);

  std::unique_ptr<Decoder> d = NewDecoder(store_.get());
  const std::vector<std::string> refs = {"experts:prod", "", "plain:prod"};
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < refs.size(); ++i) {
    GenerateRequest q = Req(refs[i], Prompt(20 + i, 6), 5);
    q.record_logits = true;
    absl::StatusOr<uint64_t> id = d->Submit(std::move(q));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  ASSERT_TRUE(d->RunUntilIdle().ok());
  std::vector<GenerateResult> got;
  for (uint64_t id : ids) {
    absl::StatusOr<std::optional<GenerateResult>> res = d->Poll(id);
    ASSERT_TRUE(res.ok() && res->has_value());
    ASSERT_EQ((*res)->finish, FinishReason::kLength) << (*res)->status;
    got.push_back(std::move(**res));
  }
  std::unique_ptr<model::Qwen3Model> plain_merged = Merged(plain);
  const model::Qwen3Model* refs_model[] = {merged.get(), model_.get(), plain_merged.get()};
  for (size_t i = 0; i < refs.size(); ++i) {
    std::vector<int64_t> all = Prompt(20 + i, 6);
    all.insert(all.end(), got[i].tokens.begin(), got[i].tokens.end() - 1);
    model::ForwardInput in;
    in.token_ids = at::tensor(all, at::kLong);
    absl::StatusOr<model::ForwardOutput> want = refs_model[i]->Forward(in);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(got[i].logits.size(), all.size());
    for (size_t p = 0; p < all.size(); ++p) {
      at::Tensor ours = at::tensor(got[i].logits[p], at::kFloat);
      at::Tensor ref = want->logits[static_cast<int64_t>(p)];
      EXPECT_LT(((ours - ref).abs().max() / ref.abs().max()).item<double>(), 1e-4)
          << refs[i] << " position " << p;
    }
  }
  // The expert LoRA changes the output (else the comparison proves nothing).
  model::ForwardInput in;
  in.token_ids = at::tensor(Prompt(20, 6), at::kLong);
  absl::StatusOr<model::ForwardOutput> a = merged->Forward(in), b = model_->Forward(in);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT((a->logits - b->logits).abs().max().item<double>(),
            1e-3 * b->logits.abs().max().item<double>());
}

}  // namespace
}  // namespace loradb::decoder

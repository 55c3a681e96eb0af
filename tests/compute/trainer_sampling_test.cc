// Rollouts that share a prompt: KvCache::Fork and the trainer's shared prefill (the requests of
// one policy with the same prompt prefill it once and fork its cache).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "compute/model/kv_cache.h"
#include "compute/trainer/trainer.h"
#include "tests/compute/trainer_test_util.h"

namespace loradb::trainer {
namespace {

using ::loradb::testing::TinyTrainerModel;

at::Tensor Ids(std::vector<int64_t> ids) {
  return at::from_blob(ids.data(), {static_cast<int64_t>(ids.size())}, at::kLong).clone();
}

// Last-row logits of `ids` appended to `seq`.
at::Tensor Step(model::KvCache* cache, model::KvCache::SeqId seq, std::vector<int64_t> ids) {
  model::ForwardInput in;
  in.token_ids = Ids(std::move(ids));
  in.cache_seqs = {seq};
  in.last_row_logits_only = true;
  auto out = TinyTrainerModel().Forward(in, cache);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? out->logits : at::Tensor();
}

TEST(KvCacheFork, ForkContinuesLikeItsOwnPrefill) {
  const auto& m = TinyTrainerModel();
  model::KvCache cache = m.NewKvCache();
  const model::KvCache::SeqId prompt = cache.AddSequence();
  Step(&cache, prompt, {1, 13, 20, 15, 21});
  auto a = cache.Fork(prompt, 2);
  auto b = cache.Fork(prompt);  // no reservation: grows on demand
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*cache.Length(*a), 5);
  EXPECT_EQ(*cache.Length(*b), 5);
  // The forks and the original diverge without touching each other.
  at::Tensor la = Step(&cache, *a, {11});
  at::Tensor lb = Step(&cache, *b, {12});
  at::Tensor lp = Step(&cache, prompt, {11});
  const model::KvCache::SeqId fresh = cache.AddSequence();
  at::Tensor ra = Step(&cache, fresh, {1, 13, 20, 15, 21, 11});
  const model::KvCache::SeqId fresh_b = cache.AddSequence();
  at::Tensor rb = Step(&cache, fresh_b, {1, 13, 20, 15, 21, 12});
  EXPECT_TRUE(at::allclose(la, ra, 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(lp, ra, 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(lb, rb, 1e-4, 1e-5));
  EXPECT_FALSE(at::allclose(la, lb, 1e-4, 1e-5));
  EXPECT_EQ(*cache.Length(*a), 6);
  EXPECT_EQ(*cache.Length(prompt), 6);
  EXPECT_EQ(cache.Fork(fresh_b + 100).status().code(), absl::StatusCode::kNotFound);
}

PolicyOptions Options(const std::string& name, uint64_t seed) {
  PolicyOptions o;
  o.name = name;
  o.seed = seed;
  o.schedule.lr = 5e-2;
  return o;
}

TEST(TrainerSampling, RequestsSharingAPromptSampleFromForkedCaches) {
  Trainer t(&TinyTrainerModel());
  ASSERT_TRUE(t.AddPolicy(Options("a", 1)).ok());
  ASSERT_TRUE(t.AddPolicy(Options("b", 2)).ok());
  // Train both a little so their adapters differ from the base and each other.
  for (int p = 0; p < 2; ++p) {
    Datum d;
    d.tokens = {1, 13, 20, 15, 21, 100 + p, 200 + p};
    d.weights = {0, 0, 0, 0, 1, 1};
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(t.ForwardBackward({{p, LossKind::kCrossEntropy, {d}}}).ok());
      ASSERT_TRUE(t.OptimStep(p).ok());
    }
  }
  const std::vector<int64_t> prompt = {1, 13, 20, 15, 21};
  std::vector<SampleRequest> reqs;
  for (int p = 0; p < 2; ++p) {
    for (int g = 0; g < 4; ++g) reqs.push_back({p, prompt, 4, 1.0, {}});
    reqs.push_back({p, prompt, 3, 0.0, {}});  // greedy
  }
  reqs.push_back({0, {1, 14, 20, 15, 21}, 2, 1.0, {}});  // another prompt
  auto out = t.Sample(reqs);
  ASSERT_TRUE(out.ok()) << out.status();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ((*out)[i].tokens.size(), static_cast<size_t>(reqs[i].max_tokens)) << i;
    // Every sampled token's log-prob equals a full forward's over prompt + completion: the
    // forked caches held the right keys and values.
    Datum d;
    d.tokens = reqs[i].prompt;
    d.tokens.insert(d.tokens.end(), (*out)[i].tokens.begin(), (*out)[i].tokens.end());
    auto lp = t.Logprobs(reqs[i].policy, {d});
    ASSERT_TRUE(lp.ok()) << lp.status();
    for (size_t j = 0; j < (*out)[i].tokens.size(); ++j) {
      EXPECT_NEAR((*lp)[0][reqs[i].prompt.size() - 1 + j], (*out)[i].logprobs[j], 1e-4)
          << "request " << i << " token " << j;
    }
  }
  // Greedy requests sharing a prompt equal the same request sampled alone.
  for (size_t i : {size_t{4}, size_t{9}}) {
    auto alone = t.Sample({reqs[i]});
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ((*alone)[0].tokens, (*out)[i].tokens) << i;
  }
}

}  // namespace
}  // namespace loradb::trainer

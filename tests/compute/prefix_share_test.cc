// Shared prefixes in one training forward (ForwardInput::continues, logit_rows) and the
// trainer's use of them: every continuing sequence's logits equal those of the whole sequence run
// alone, and losses and gradients with sharing on equal those with it off (SFT, DPO, GRPO with a
// KL reference, two policies in one call), for uniform and ragged groups.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "compute/model/qwen3_model.h"
#include "compute/trainer/trainer.h"
#include "tests/compute/trainer_test_util.h"

namespace loradb::trainer {
namespace {

using ::loradb::testing::TinyUnitLogitModel;

at::Tensor Ids(const std::vector<int64_t>& v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong));
}

// Logits of `tokens` run alone, every row.
at::Tensor WholeLogits(const model::Qwen3Model& m, const std::vector<int64_t>& tokens) {
  model::ForwardInput in;
  in.token_ids = Ids(tokens);
  auto out = m.Forward(in);
  EXPECT_TRUE(out.ok()) << out.status();
  return out->logits;
}

struct Case {
  std::vector<std::vector<int64_t>> prefixes;
  // (prefix index, continuation tokens)
  std::vector<std::pair<int64_t, std::vector<int64_t>>> conts;
};

// Runs `c` as one forward with continuations and checks every row's logits against the whole
// sequences run alone; logit_rows picks a subset in a shuffled order.
void CheckCase(const Case& c) {
  const model::Qwen3Model& m = TinyUnitLogitModel();
  model::ForwardInput in;
  std::vector<int64_t> ids;
  std::vector<int64_t> prefix_row;
  for (const auto& p : c.prefixes) {
    prefix_row.push_back(static_cast<int64_t>(ids.size()));
    ids.insert(ids.end(), p.begin(), p.end());
    in.seq_lens.push_back(static_cast<int64_t>(p.size()));
    in.continues.push_back(-1);
  }
  std::vector<int64_t> cont_row;
  for (const auto& [p, toks] : c.conts) {
    cont_row.push_back(static_cast<int64_t>(ids.size()));
    ids.insert(ids.end(), toks.begin(), toks.end());
    in.seq_lens.push_back(static_cast<int64_t>(toks.size()));
    in.continues.push_back(p);
  }
  in.token_ids = Ids(ids);
  auto out = m.Forward(in);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->logits.size(0), static_cast<int64_t>(ids.size()));
  for (size_t i = 0; i < c.prefixes.size(); ++i) {
    at::Tensor want = WholeLogits(m, c.prefixes[i]);
    at::Tensor got = out->logits.narrow(0, prefix_row[i], want.size(0));
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5)) << "prefix " << i;
  }
  std::vector<int64_t> picked;
  std::vector<at::Tensor> expected;
  for (size_t i = 0; i < c.conts.size(); ++i) {
    const auto& [p, toks] = c.conts[i];
    std::vector<int64_t> whole = c.prefixes[p];
    whole.insert(whole.end(), toks.begin(), toks.end());
    at::Tensor want = WholeLogits(m, whole).narrow(0, c.prefixes[p].size(), toks.size());
    at::Tensor got = out->logits.narrow(0, cont_row[i], toks.size());
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5))
        << "continuation " << i << " max diff " << (got - want).abs().max().item<float>();
    // Pick the continuation's last row and its prefix's last row, in reverse order below.
    picked.push_back(cont_row[i] + static_cast<int64_t>(toks.size()) - 1);
    expected.push_back(want[toks.size() - 1]);
  }
  std::reverse(picked.begin(), picked.end());
  std::reverse(expected.begin(), expected.end());
  in.logit_rows = picked;
  auto some = m.Forward(in);
  ASSERT_TRUE(some.ok()) << some.status();
  ASSERT_EQ(some->logits.size(0), static_cast<int64_t>(picked.size()));
  EXPECT_TRUE(at::allclose(some->logits, at::stack(expected), 1e-4, 1e-5));
}

TEST(ForwardContinues, UniformGroupsMatchWholeSequences) {
  // Every continuation 2 tokens over a 4-token prefix: the batched path.
  CheckCase({{{1, 5, 7, 9}, {1, 6, 8, 10}},
             {{0, {11, 12}}, {0, {13, 14}}, {1, {15, 16}}, {1, {11, 12}}}});
}

TEST(ForwardContinues, RaggedGroupsMatchWholeSequences) {
  // Prefixes of 4 and 3 tokens, continuations of 1 to 3: the per-sequence path; one prefix
  // continued by nothing.
  CheckCase({{{1, 5, 7, 9}, {1, 6, 8}, {1, 2}},
             {{0, {11, 12}}, {0, {13}}, {1, {15, 16, 17}}, {1, {18}}}});
}

TEST(ForwardContinues, RejectsMalformedLayouts) {
  const model::Qwen3Model& m = TinyUnitLogitModel();
  model::ForwardInput in;
  in.token_ids = Ids({1, 2, 3, 4, 5});
  in.seq_lens = {2, 2, 1};
  auto bad = [&](std::vector<int64_t> continues, const std::string& what) {
    in.continues = std::move(continues);
    auto out = m.Forward(in);
    ASSERT_FALSE(out.ok()) << what;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << what;
  };
  bad({-1, 0}, "wrong length");
  bad({-1, 2, -1}, "continues a later sequence");
  bad({-1, 0, 1}, "continues a continuing sequence");
  bad({-1, 0, -1}, "a root after a continuation");
  bad({-1, 1, -1}, "continues itself");
  in.continues = {-1, 0, 0};
  model::KvCache cache = m.NewKvCache();
  in.cache_seqs = {cache.AddSequence(), cache.AddSequence(), cache.AddSequence()};
  auto cached = m.Forward(in, &cache);
  EXPECT_EQ(cached.status().code(), absl::StatusCode::kInvalidArgument);
  in.cache_seqs.clear();
  in.logit_rows = {0, 5};
  EXPECT_EQ(m.Forward(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.logit_rows = {0};
  in.last_row_logits_only = true;
  EXPECT_EQ(m.Forward(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.last_row_logits_only = false;
  EXPECT_TRUE(m.Forward(in).ok());
}

PolicyOptions Options(const std::string& name, uint64_t seed, double kl_beta) {
  PolicyOptions o;
  o.name = name;
  o.seed = seed;
  o.lora.rank = 4;
  o.schedule.lr = 1e-2;
  o.grpo.kl_beta = kl_beta;
  return o;
}

Datum Make(std::vector<int64_t> prompt, const std::vector<int64_t>& completion, float advantage,
           float temperature) {
  Datum d;
  const size_t p = prompt.size();
  d.tokens = std::move(prompt);
  d.tokens.insert(d.tokens.end(), completion.begin(), completion.end());
  d.weights.assign(d.tokens.size() - 1, 0.0f);
  for (size_t j = p - 1; j < d.weights.size(); ++j) d.weights[j] = 1.0f;
  d.sampling_logprobs.assign(d.weights.size(), -2.0f);
  d.advantage = advantage;
  d.temperature = temperature;
  return d;
}

// Two GRPO groups (one ragged: completions of 1 to 3 tokens), a DPO pair sharing its prompt and
// an SFT datum with a weight hole.
std::vector<PolicyBatch> Batches(int policy_a, int policy_b) {
  PolicyBatch grpo{policy_a, LossKind::kGrpo, {}};
  for (int i = 0; i < 4; ++i) {
    grpo.data.push_back(Make({1, 10, 20, 11, 21}, {30 + i, 40}, 0.5f + 0.25f * i, 0.7f));
  }
  // (Advantages of one sign: with both, the gradient is a difference of near-equal terms whose
  // relative error says little about the sharing.)
  grpo.data.push_back(Make({1, 12, 20, 13, 21}, {31}, 0.5f, 0.7f));
  grpo.data.push_back(Make({1, 12, 20, 13, 21}, {32, 41, 42}, 1.5f, 0.7f));
  grpo.data.push_back(Make({1, 12, 20, 13, 21}, {33, 3}, 0.0f, 0.7f));
  PolicyBatch dpo{policy_b, LossKind::kDpo, {}};
  dpo.data.push_back(Make({1, 14, 20, 15}, {50, 51, 3}, 0, 1.0f));
  dpo.data.push_back(Make({1, 14, 20, 15}, {52, 3}, 0, 1.0f));
  PolicyBatch sft{policy_b, LossKind::kCrossEntropy, {}};
  sft.data.push_back(Make({1, 16, 20}, {60, 61, 62, 3}, 0, 1.0f));
  sft.data.back().weights[3] = 0;  // a hole inside the trained range
  // The same prompt as the GRPO group under the other policy: its rows are not shared.
  sft.data.push_back(Make({1, 10, 20, 11, 21}, {30, 40}, 0, 1.0f));
  return {grpo, dpo, sft};
}

TEST(TrainerSharedPrefixes, LossesAndGradientsMatchUnsharedRuns) {
  std::vector<std::vector<LossReport>> reports;
  std::vector<std::map<std::string, at::Tensor>> grads;
  for (bool share : {true, false}) {
    Trainer t(&TinyUnitLogitModel());
    t.set_share_prefixes(share);
    ASSERT_TRUE(t.AddPolicy(Options("a", 3, 0.05)).ok());
    ASSERT_TRUE(t.AddPolicy(Options("b", 4, 0.0)).ok());
    // A step first so every factor (B included) is nonzero; and a reference for "a" (KL) that
    // differs from its current weights.
    for (int p : {0, 1}) {
      auto warm = t.ForwardBackward({{p, LossKind::kCrossEntropy, {Make({1, 2}, {5, 6}, 0, 1)}}});
      ASSERT_TRUE(warm.ok()) << warm.status();
      ASSERT_TRUE(t.OptimStep(p).ok());
    }
    std::vector<model::LoraModuleInput> ref;
    for (const auto& m : t.parameters(1).modules()) {
      ref.push_back({m.name, m.a.detach(), m.b.detach(), t.parameters(1).config().Scale()});
    }
    ASSERT_TRUE(t.SetReference(0, ref).ok());
    const int64_t rows_before = t.loss_forward_rows();
    auto r = t.ForwardBackward(Batches(0, 1));
    ASSERT_TRUE(r.ok()) << r.status();
    // Policy pass: 76 rows whole; shared, 22 prefix rows (5 + 5 for "a"'s two groups, 4 + 3 + 5
    // for "b"'s DPO pair and two SFT data) and 14 continuation rows (4, 3, 3, 3, 1). Reference
    // pass ("a"'s GRPO KL and "b"'s DPO): 62 whole, 17 + 7 shared.
    EXPECT_EQ(t.loss_forward_rows() - rows_before, share ? 36 + 24 : 76 + 62);
    reports.push_back(*r);
    std::map<std::string, at::Tensor> g;
    for (int p : {0, 1}) {
      for (const auto& [name, param] : t.parameters(p).named()) {
        ASSERT_TRUE(param.grad().defined()) << name;
        g[std::to_string(p) + name] = param.grad().clone();
      }
    }
    grads.push_back(std::move(g));
    auto e = t.Evaluate(Batches(0, 1));
    ASSERT_TRUE(e.ok()) << e.status();
    for (size_t i = 0; i < e->size(); ++i) EXPECT_NEAR((*e)[i].loss, (*r)[i].loss, 1e-6);
  }
  ASSERT_EQ(reports[0].size(), reports[1].size());
  for (size_t i = 0; i < reports[0].size(); ++i) {
    EXPECT_NEAR(reports[0][i].loss, reports[1][i].loss, 1e-5) << "batch " << i;
    EXPECT_NEAR(reports[0][i].accuracy, reports[1][i].accuracy, 1e-6) << "batch " << i;
    EXPECT_NEAR(reports[0][i].metric, reports[1][i].metric, 1e-5) << "batch " << i;
    EXPECT_NEAR(reports[0][i].kl, reports[1][i].kl, 1e-5 * std::abs(reports[1][i].kl) + 1e-7)
        << "batch " << i;
    EXPECT_EQ(reports[0][i].tokens, reports[1][i].tokens);
  }
  EXPECT_GT(reports[0][0].kl, 0);  // the KL term ran
  for (const auto& [name, g] : grads[0]) {
    const at::Tensor& want = grads[1].at(name);
    EXPECT_GT(want.abs().sum().item<float>(), 0) << name;
    // fp32 sums in another order: the error norm is ~1e-7..5e-6 in every factor (the logits
    // agree to ~4e-7 relative), so small gradients carry a larger relative error. A row that
    // lost its gradient or attended to the wrong keys would be off by the gradient's size.
    const double err = (g - want).norm().item<double>(), norm = want.norm().item<double>();
    EXPECT_LT(err, 1e-4 * norm + 1e-5) << name << " error " << err << " of " << norm;
  }
}

}  // namespace
}  // namespace loradb::trainer

// Qwen3Model: loading, KV cache consistency, batching, LoRA hooks (against merged weights),
// the kernel-backed applier, the per-row kernels against LibTorch's operations, autograd through
// LoRA factors, and error handling.
#include "compute/model/qwen3_model.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compute/model/checkpoint.h"
#include "compute/model/dense_linear.h"
#include "compute/model/kernel_lora_applier.h"
#include "compute/model/pointwise.h"
#include "kernels/lora_kernels.h"
#include "storage/formats/safetensors.h"
#include "storage/formats/weights_fingerprint.h"
#include "storage/util/file_util.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace loradb::model {
namespace {

using ::loradb::testing::TempDir;

std::string ConfigPath(const std::string& name) {
  return std::string(LORADB_SOURCE_DIR) + "/compute/configs/" + name + ".json";
}

ModelConfig Config(const std::string& name) {
  absl::StatusOr<ModelConfig> c = ReadModelConfig(ConfigPath(name));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::unique_ptr<Qwen3Model> WriteAndLoad(const TempDir& dir, const std::string& name,
                                         uint64_t seed = 1, at::ScalarType dtype = at::kFloat) {
  const std::string path = dir.file(name);
  absl::Status st = WriteRandomCheckpoint(Config(name), path, seed, dtype);
  EXPECT_TRUE(st.ok()) << st;
  absl::StatusOr<std::unique_ptr<Qwen3Model>> m = Qwen3Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

at::Tensor Ids(std::vector<int64_t> ids) {
  return at::from_blob(ids.data(), {static_cast<int64_t>(ids.size())}, at::kLong).clone();
}

at::Tensor Logits(const Qwen3Model& m, const ForwardInput& in, KvCache* cache = nullptr) {
  absl::StatusOr<ForwardOutput> out = m.Forward(in, cache);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? out->logits.to(at::kFloat) : at::Tensor();
}

// max |a - b| / max |b|.
double RelErr(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs().max() / b.to(at::kDouble).abs().max())
      .item<double>();
}

// An in-memory TensorSet over owned tensors (so tests can edit weights).
std::shared_ptr<const TensorSet> OwnedSet(const std::map<std::string, at::Tensor>& tensors) {
  auto owned = std::make_shared<std::vector<at::Tensor>>();
  auto set = std::make_shared<TensorSet>(owned);
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.contiguous().clone();
    owned->push_back(c);
    TensorView v;
    v.name = name;
    v.dtype = c.scalar_type() == at::kFloat ? DType::kF32 : DType::kBF16;
    v.shape = c.sizes().vec();
    v.data = static_cast<const std::byte*>(c.data_ptr());
    v.nbytes = c.nbytes();
    EXPECT_TRUE(set->Add(std::move(v)).ok());
  }
  return set;
}

std::map<std::string, at::Tensor> ReadAll(const std::string& dir) {
  absl::StatusOr<TensorSet> set = ReadCheckpointTensors(dir);
  EXPECT_TRUE(set.ok()) << set.status();
  std::map<std::string, at::Tensor> out;
  for (const TensorView& v : set->tensors()) {
    at::ScalarType st = v.dtype == DType::kF32 ? at::kFloat : at::kBFloat16;
    out[v.name] = at::from_blob(const_cast<std::byte*>(v.data), v.shape, st).clone();
  }
  return out;
}

// Random LoRA factors for every dense / expert projection of `config`.
std::vector<LoraModuleInput> RandomAdapter(const ModelConfig& c, uint64_t seed, int64_t rank,
                                           double scale) {
  at::manual_seed(seed);
  std::vector<LoraModuleInput> mods;
  for (const ModuleShape& s : c.LoraModules()) {
    const bool router = s.name.size() > 9 && s.name.substr(s.name.size() - 9) == ".mlp.gate";
    if (s.name == "embed_tokens" || s.name == "lm_head" || router) {
      continue;
    }
    mods.push_back({s.name, at::randn({rank, s.in}) * 0.1, at::randn({s.out, rank}) * 0.1, scale});
  }
  return mods;
}

// `base` with every adapter module merged: W += scale * B A.
std::map<std::string, at::Tensor> Merge(std::map<std::string, at::Tensor> base,
                                        const std::vector<LoraModuleInput>& mods) {
  for (const LoraModuleInput& m : mods) {
    const std::string name = "model." + m.module + ".weight";
    EXPECT_TRUE(base.count(name)) << name;
    base[name] = base[name] + m.scale * at::matmul(m.b, m.a);
  }
  return base;
}

TEST(Qwen3ModelTest, LoadsCheckpointZeroCopyWithFingerprint) {
  TempDir dir;
  auto m = WriteAndLoad(dir, "tiny-dense", 7);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->dtype(), at::kFloat);
  EXPECT_GT(m->num_parameters(), 500000);
  absl::StatusOr<TensorSet> set = ReadCheckpointTensors(dir.file("tiny-dense"));
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(m->fingerprint(), WeightsFingerprint(*set));
  // Same seed, same bytes and fingerprint; another seed differs.
  auto again = WriteAndLoad(dir, "tiny-dense", 7);
  EXPECT_EQ(again->fingerprint(), m->fingerprint());
  TempDir other;
  auto m2 = WriteAndLoad(other, "tiny-dense", 8);
  EXPECT_NE(m2->fingerprint(), m->fingerprint());
}

TEST(Qwen3ModelTest, FingerprintIgnoresFileOrder) {
  TensorSet a, b;
  const float x[2] = {1, 2}, y[2] = {3, 4};
  auto view = [](const char* name, const float* p) {
    return TensorView{name, DType::kF32, {2}, reinterpret_cast<const std::byte*>(p), 8};
  };
  ASSERT_TRUE(a.Add(view("a", x)).ok());
  ASSERT_TRUE(a.Add(view("b", y)).ok());
  ASSERT_TRUE(b.Add(view("b", y)).ok());
  ASSERT_TRUE(b.Add(view("a", x)).ok());
  EXPECT_EQ(WeightsFingerprint(a), WeightsFingerprint(b));
  TensorSet c;
  ASSERT_TRUE(c.Add(view("a", y)).ok());
  ASSERT_TRUE(c.Add(view("b", x)).ok());
  EXPECT_NE(WeightsFingerprint(a), WeightsFingerprint(c));
}

// The base layers' linear: the dense kernel in inference on fp32 CPU tensors (same values as
// at::linear up to summation order, any leading shape, bias added), the GEMM where autograd
// records the activations' graph through a frozen weight (forward and dx the same as
// at::linear's), at::linear where the weight itself trains or the dtype is not fp32.
TEST(BaseLinearTest, DenseKernelInInferenceGemmUnderAutogradAtLinearOtherwise) {
  if (!kernels::cpu::DenseLinearIsVectorized()) {
    GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512: BaseLinear always uses at::linear";
  }
  at::manual_seed(3);
  const at::Tensor w = at::randn({19, 33});
  const at::Tensor bias = at::randn({19});
  const at::Tensor x = at::randn({2, 5, 33});
  {
    at::NoGradGuard no_grad;
    ASSERT_TRUE(UsesDenseKernel(x, w, bias));
    const at::Tensor got = BaseLinear(x, w, bias);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 5, 19}));
    EXPECT_LT(RelErr(got, at::linear(x, w, bias)), 1e-6);
    EXPECT_LT(RelErr(BaseLinear(x.select(0, 1), w), at::linear(x.select(0, 1), w)), 1e-6);
    EXPECT_FALSE(UsesDenseKernel(x.to(at::kBFloat16), w.to(at::kBFloat16)));
    EXPECT_FALSE(UsesDenseKernel(x, w.t().contiguous().t()));  // a transposed view
  }
  // Grad mode with nothing requiring grad (a frozen base in plain evaluation): still the kernel.
  EXPECT_TRUE(UsesDenseKernel(x, w));
  EXPECT_FALSE(UsesFrozenGemm(x, w));
  // Training a LoRA: the activations require grad, the weight is frozen: the GEMM, forward and
  // backward, on a non-contiguous input and a non-contiguous incoming gradient.
  const at::Tensor xg = x.transpose(0, 1).contiguous().transpose(0, 1).requires_grad_(true);
  ASSERT_FALSE(UsesDenseKernel(xg, w));
  ASSERT_TRUE(UsesFrozenGemm(xg, w, bias));
  const at::Tensor y = BaseLinear(xg, w, bias);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 5, 19}));
  EXPECT_LT(RelErr(y.detach(), at::linear(x, w, bias)), 1e-6);
  const at::Tensor g = at::randn({5, 2, 19}).transpose(0, 1);
  (y * g).sum().backward();
  ASSERT_TRUE(xg.grad().defined());
  EXPECT_LT(RelErr(xg.grad(), at::matmul(g, w)), 1e-6);
  {
    at::NoGradGuard no_grad;
    EXPECT_FALSE(UsesFrozenGemm(xg, w));  // no graph recorded: the dense kernel
  }
  // A weight that trains (full fine-tuning, modules_to_save): at::linear, gradients for both.
  const at::Tensor wg = w.clone().requires_grad_(true);
  const at::Tensor xg2 = x.clone().requires_grad_(true);
  ASSERT_FALSE(UsesFrozenGemm(xg2, wg));
  ASSERT_FALSE(UsesDenseKernel(xg2, wg));
  BaseLinear(xg2, wg).sum().backward();
  ASSERT_TRUE(wg.grad().defined());
  EXPECT_LT(RelErr(xg2.grad(), w.sum(0).expand_as(x)), 1e-6);
}

// The per-row kernels give LibTorch's results, take fp32 contiguous CPU tensors only, and step
// aside while autograd records a graph through any of their inputs.
TEST(PointwiseTest, KernelsMatchLibTorchAndStepAsideForAutograd) {
  at::manual_seed(5);
  const at::Tensor x = at::randn({3, 4, 64}) * 3;
  const at::Tensor w = at::randn({64});
  const at::Tensor cos = at::randn({3, 64}).cos(), sin = at::randn({3, 64}).sin();
  const at::Tensor g = at::randn({3, 96}) * 4, u = at::randn({3, 96});
  {
    at::NoGradGuard no_grad;
    ASSERT_TRUE(UsesPointwiseKernels({x, w, cos, sin, g, u}));
    const at::Tensor norm = RmsNormKernel(x, w, 1e-6);
    EXPECT_LT(RelErr(norm, w * (x * at::rsqrt(x.pow(2).mean({-1}, true) + 1e-6))), 1e-6);
    at::Tensor q = x.clone();
    RopeKernel(q, cos, sin);
    const at::Tensor rotated = at::cat({-x.narrow(-1, 32, 32), x.narrow(-1, 0, 32)}, -1);
    EXPECT_LT(RelErr(q, x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)), 1e-6);
    at::Tensor gm = g.clone();
    SiluMulKernel(gm, u);
    EXPECT_LT(RelErr(gm, at::silu(g) * u), 1e-6);
    EXPECT_FALSE(UsesPointwiseKernels({x.to(at::kBFloat16), w}));
    EXPECT_FALSE(UsesPointwiseKernels({x.transpose(0, 1), w}));  // a transposed view
  }
  const at::Tensor xg = x.clone().requires_grad_(true);
  EXPECT_TRUE(UsesPointwiseKernels({x, w}));  // grad mode, nothing requiring grad
  EXPECT_FALSE(UsesPointwiseKernels({xg, w}));
  at::NoGradGuard no_grad;
  EXPECT_TRUE(UsesPointwiseKernels({xg, w}));  // no graph recorded
}

// A forward in inference (the per-row kernels) and one recording a graph through a LoRA
// (LibTorch's operations after the adapted layer) give the same logits.
TEST(PointwiseTest, InferenceForwardMatchesTheAutogradForward) {
  TempDir dir;
  auto m = WriteAndLoad(dir, "tiny-dense");
  const ModelConfig& c = m->config();
  at::manual_seed(6);
  at::Tensor a = (at::randn({2, c.hidden_size}) * 0.1).requires_grad_(true);
  at::Tensor b = (at::randn({c.num_attention_heads * c.head_dim, 2}) * 0.1).requires_grad_(true);
  auto adapter = LoraAdapter::Create(c, {{"layers.0.self_attn.q_proj", a, b, 1.0}}, at::kFloat);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  LoraBatch lb{{&*adapter}, {0, 0, 0, 0, 0}};
  ForwardInput in;
  in.token_ids = Ids({10, 20, 30, 40, 50});
  in.lora = &lb;
  const at::Tensor graph = Logits(*m, in);
  ASSERT_TRUE(graph.requires_grad());
  at::NoGradGuard no_grad;
  const at::Tensor inference = Logits(*m, in);
  EXPECT_LT(RelErr(inference, graph.detach()), 1e-5);
}

// A LoRA's delta under autograd on the CPU kernels: the same output and the same gradients for
// x, A and B as LibTorch's at::linear chain, on a 3-D, non-contiguous input; with only A and B
// trainable (the first layer's input) no gradient flows to x; without a graph, at::linear.
TEST(LoraDeltaTest, CpuKernelsMatchAtLinearForwardAndBackward) {
  if (!kernels::cpu::DenseLinearIsVectorized()) {
    GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512: LoraDelta always uses at::linear";
  }
  at::manual_seed(5);
  const double scale = 2.5;
  const at::Tensor x0 = at::randn({3, 70, 41}).transpose(0, 1);  // [70, 3, 41], not contiguous
  const at::Tensor a0 = at::randn({8, 41}), b0 = at::randn({53, 8});
  const at::Tensor g = at::randn({70, 3, 53});
  for (const bool x_grad : {true, false}) {
    SCOPED_TRACE(x_grad ? "x requires grad" : "x frozen");
    const at::Tensor x = x0.clone().requires_grad_(x_grad);
    const at::Tensor a = a0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    ASSERT_TRUE(UsesLoraKernels(x, a, b));
    const at::Tensor y = LoraDelta(x, a, b, scale);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{70, 3, 53}));
    (y * g).sum().backward();
    const at::Tensor xr = x0.clone().requires_grad_(x_grad);
    const at::Tensor ar = a0.clone().requires_grad_(true), br = b0.clone().requires_grad_(true);
    const at::Tensor yr = at::linear(at::linear(xr, ar), br) * scale;
    (yr * g).sum().backward();
    EXPECT_LT(RelErr(y.detach(), yr.detach()), 1e-5);
    EXPECT_LT(RelErr(a.grad(), ar.grad()), 1e-5);
    EXPECT_LT(RelErr(b.grad(), br.grad()), 1e-5);
    if (x_grad) {
      EXPECT_LT(RelErr(x.grad(), xr.grad()), 1e-5);
    } else {
      EXPECT_FALSE(x.grad().defined());
    }
  }
  at::NoGradGuard no_grad;
  EXPECT_FALSE(UsesLoraKernels(x0, a0, b0));
  EXPECT_LT(RelErr(LoraDelta(x0, a0, b0, scale), at::linear(at::linear(x0, a0), b0) * scale), 1e-6);
}

class ModelKindTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelKindTest, PrefillThenDecodeMatchesFullSequence) {
  TempDir dir;
  auto m = WriteAndLoad(dir, GetParam());
  ASSERT_NE(m, nullptr);
  const std::vector<int64_t> ids = {5, 900, 31, 31, 7, 1000, 2, 64, 128, 3};
  ForwardInput full;
  full.token_ids = Ids(ids);
  at::Tensor ref = Logits(*m, full);
  ASSERT_EQ(ref.size(0), 10);

  KvCache cache = m->NewKvCache();
  KvCache::SeqId seq = cache.AddSequence(2);  // forces regrowth while decoding
  std::vector<at::Tensor> got;
  ForwardInput pre;
  pre.token_ids = Ids({ids.begin(), ids.begin() + 4});
  pre.cache_seqs = {seq};
  got.push_back(Logits(*m, pre, &cache));
  for (size_t i = 4; i < ids.size(); ++i) {
    ForwardInput step;
    step.token_ids = Ids({ids[i]});
    step.cache_seqs = {seq};
    got.push_back(Logits(*m, step, &cache));
  }
  EXPECT_EQ(*cache.Length(seq), 10);
  EXPECT_LT(RelErr(at::cat(got, 0), ref), 1e-5);

  // Truncate and re-decode the last token: same logits.
  ASSERT_TRUE(cache.Truncate(seq, 9).ok());
  ForwardInput last;
  last.token_ids = Ids({ids.back()});
  last.cache_seqs = {seq};
  EXPECT_LT(RelErr(Logits(*m, last, &cache), ref.narrow(0, 9, 1)), 1e-5);
}

// Sequences at different lengths in one batch: decode steps beside a prefill, then decode steps
// with every sequence at its own length (on a float32 CPU model these attend through the CPU
// decode kernel, the prefill through LibTorch). Each sequence's logits match its full-sequence
// forward, and a decode step's logits are the same bits batched as alone.
TEST_P(ModelKindTest, DecodeStepsAtDifferentLengthsMatchFullSequences) {
  TempDir dir;
  auto m = WriteAndLoad(dir, GetParam());
  ASSERT_NE(m, nullptr);
  const std::vector<std::vector<int64_t>> seqs = {
      {5, 900, 31, 31, 7, 1000, 2, 64}, {3, 1, 4, 1, 5, 9, 2, 6}, {77, 78, 79, 80, 81, 82, 83}};
  std::vector<at::Tensor> ref;
  for (const std::vector<int64_t>& s : seqs) {
    ForwardInput full;
    full.token_ids = Ids(s);
    ref.push_back(Logits(*m, full));
  }
  KvCache cache = m->NewKvCache(), alone_cache = m->NewKvCache();
  std::vector<KvCache::SeqId> ids, alone_ids;
  for (size_t i = 0; i < seqs.size(); ++i) {
    ids.push_back(cache.AddSequence(2));  // regrows while decoding
    alone_ids.push_back(alone_cache.AddSequence(2));
  }
  std::vector<int64_t> pos(seqs.size(), 0);
  // Each step: (sequence, tokens it adds).
  const std::vector<std::vector<std::pair<size_t, int64_t>>> steps = {
      {{0, 3}, {1, 1}},          // a prefill beside a one-token first step
      {{0, 1}, {1, 1}, {2, 3}},  // two decode steps beside a prefill
      {{0, 1}, {1, 1}, {2, 1}},  // decode steps at lengths 4, 3, 3
      {{1, 1}, {0, 1}, {2, 1}}, {{2, 1}, {0, 1}}, {{0, 1}, {1, 2}, {2, 1}}};
  for (const auto& step : steps) {
    ForwardInput in;
    std::vector<int64_t> tokens;
    for (const auto& [s, n] : step) {
      tokens.insert(tokens.end(), seqs[s].begin() + pos[s], seqs[s].begin() + pos[s] + n);
      in.seq_lens.push_back(n);
      in.cache_seqs.push_back(ids[s]);
    }
    in.token_ids = Ids(tokens);
    const at::Tensor got = Logits(*m, in, &cache);
    int64_t row = 0;
    for (const auto& [s, n] : step) {
      SCOPED_TRACE(::testing::Message() << "sequence " << s << " at " << pos[s] << " + " << n);
      EXPECT_LT(RelErr(got.narrow(0, row, n), ref[s].narrow(0, pos[s], n)), 1e-5);
      ForwardInput one;
      one.token_ids = Ids({seqs[s].begin() + pos[s], seqs[s].begin() + pos[s] + n});
      one.cache_seqs = {alone_ids[s]};
      const at::Tensor alone = Logits(*m, one, &alone_cache);
      if (n == 1) {
        EXPECT_TRUE(at::equal(got.narrow(0, row, n), alone));
      }
      row += n;
      pos[s] += n;
    }
  }
  for (size_t s = 0; s < seqs.size(); ++s) EXPECT_EQ(*cache.Length(ids[s]), pos[s]);
}

TEST_P(ModelKindTest, BatchedSequencesMatchSeparateRuns) {
  TempDir dir;
  auto m = WriteAndLoad(dir, GetParam());
  const std::vector<int64_t> a = {1, 2, 3, 4, 5}, b = {900, 800, 7};
  ForwardInput ia, ib, both;
  ia.token_ids = Ids(a);
  ib.token_ids = Ids(b);
  std::vector<int64_t> ab = a;
  ab.insert(ab.end(), b.begin(), b.end());
  both.token_ids = Ids(ab);
  both.seq_lens = {5, 3};
  at::Tensor la = Logits(*m, ia), lb = Logits(*m, ib), lab = Logits(*m, both);
  EXPECT_LT(RelErr(lab.narrow(0, 0, 5), la), 1e-5);
  EXPECT_LT(RelErr(lab.narrow(0, 5, 3), lb), 1e-5);
  both.last_row_logits_only = true;
  at::Tensor last = Logits(*m, both);
  ASSERT_EQ(last.size(0), 2);
  EXPECT_LT(RelErr(last[0], la[4]), 1e-5);
  EXPECT_LT(RelErr(last[1], lb[2]), 1e-5);
}

TEST_P(ModelKindTest, LoraEqualsMergedWeightsPerRow) {
  TempDir dir;
  const std::string name = GetParam();
  auto m = WriteAndLoad(dir, name);
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  auto base = ReadAll(dir.file(name));
  auto mods0 = RandomAdapter(c, 100, 4, 2.0);
  auto mods1 = RandomAdapter(c, 200, 2, 0.5);
  absl::StatusOr<LoraAdapter> a0 = LoraAdapter::Create(c, mods0, at::kFloat);
  absl::StatusOr<LoraAdapter> a1 = LoraAdapter::Create(c, mods1, at::kFloat);
  ASSERT_TRUE(a0.ok()) << a0.status();
  ASSERT_TRUE(a1.ok()) << a1.status();
  auto merged0 = Qwen3Model::FromTensors(c, OwnedSet(Merge(base, mods0)));
  auto merged1 = Qwen3Model::FromTensors(c, OwnedSet(Merge(base, mods1)));
  ASSERT_TRUE(merged0.ok()) << merged0.status();
  ASSERT_TRUE(merged1.ok());

  // Three sequences in one batch: adapter 1, none, adapter 0.
  const std::vector<int64_t> s0 = {4, 8, 15, 16}, s1 = {23, 42}, s2 = {99, 98, 97};
  std::vector<int64_t> all = s0;
  all.insert(all.end(), s1.begin(), s1.end());
  all.insert(all.end(), s2.begin(), s2.end());
  LoraBatch lb;
  lb.adapters = {&*a0, &*a1};
  lb.row_slot = {1, 1, 1, 1, -1, -1, 0, 0, 0};
  ForwardInput in;
  in.token_ids = Ids(all);
  in.seq_lens = {4, 2, 3};
  in.lora = &lb;
  at::Tensor got = Logits(*m, in);

  ForwardInput i0, i1, i2;
  i0.token_ids = Ids(s0);
  i1.token_ids = Ids(s1);
  i2.token_ids = Ids(s2);
  at::Tensor want0 = Logits(**merged1, i0), want1 = Logits(*m, i1), want2 = Logits(**merged0, i2);
  EXPECT_LT(RelErr(got.narrow(0, 0, 4), want0), 1e-4);
  EXPECT_LT(RelErr(got.narrow(0, 4, 2), want1), 1e-5);
  EXPECT_LT(RelErr(got.narrow(0, 6, 3), want2), 1e-4);
  // And the adapter made a difference.
  EXPECT_GT(RelErr(want0, Logits(*m, i0)), 1e-3);

  // The kernel-backed applier gives the same answer and actually served the calls.
  KernelLoraApplier kernel(1);
  m->set_lora_applier(&kernel);
  at::Tensor via_kernel = Logits(*m, in);
  EXPECT_LT(RelErr(via_kernel, got), 1e-5);
  EXPECT_GT(kernel.kernel_calls(), 0);
  EXPECT_EQ(kernel.fallback_calls(), 0);

  // On LibTorch's intra-op threads the calls are split into row ranges; a row's result does not
  // depend on the rows beside it, so the bits are those of one thread: prefill-shaped runs of
  // rows (SGMV) and decode-shaped alternating adapters (BGMV).
  KernelLoraApplier intra_op(KernelLoraApplier::kIntraOpThreads);
  LoraBatch alternating{{&*a0, &*a1}, {0, 1, -1, 1, 0, 1, 0, -1, 1}};
  const int threads = at::get_num_threads();
  for (LoraBatch* b : {&lb, &alternating}) {
    in.lora = b;
    at::set_num_threads(1);
    m->set_lora_applier(&kernel);
    const at::Tensor one = Logits(*m, in);
    at::set_num_threads(2);
    m->set_lora_applier(&intra_op);
    EXPECT_TRUE(at::equal(Logits(*m, in), one));
  }
  at::set_num_threads(threads);
  EXPECT_GT(intra_op.kernel_calls(), 0);
  EXPECT_GT(intra_op.sgmv_calls(), 0);
  EXPECT_LT(intra_op.sgmv_calls(), intra_op.kernel_calls());
  EXPECT_EQ(intra_op.fallback_calls(), 0);
}

TEST_P(ModelKindTest, Bf16FactorsOnAnF32Base) {
  TempDir dir;
  auto m = WriteAndLoad(dir, GetParam());
  const ModelConfig& c = m->config();
  auto mods = RandomAdapter(c, 300, 4, 2.0);
  auto f32 = LoraAdapter::Create(c, mods, at::kFloat);
  auto bf16 = LoraAdapter::Create(c, mods, at::kBFloat16);
  ASSERT_TRUE(f32.ok());
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->Find(0, LoraTarget::kQ)->a.scalar_type(), at::kBFloat16);
  ForwardInput in;
  in.token_ids = Ids({9, 8, 7, 6, 5});
  LoraBatch l32{{&*f32}, std::vector<int32_t>(5, 0)}, l16{{&*bf16}, {0, -1, 0, 0, 0}};
  in.lora = &l16;
  const at::Tensor reference = Logits(*m, in);
  KernelLoraApplier kernel(1);
  m->set_lora_applier(&kernel);
  EXPECT_LT(RelErr(Logits(*m, in), reference), 1e-5);
  EXPECT_GT(kernel.kernel_calls(), 0);
  EXPECT_EQ(kernel.fallback_calls(), 0);
  // Rounding the factors to bf16 moves the logits only a little (dense only: in the tiny MoE the
  // random router is nearly uniform, so a small perturbation can flip a top-k expert choice).
  if (std::string(GetParam()) != "tiny-dense") return;
  l16.row_slot = std::vector<int32_t>(5, 0);
  in.lora = &l32;
  const at::Tensor full = Logits(*m, in);
  in.lora = &l16;
  EXPECT_LT(RelErr(Logits(*m, in), full), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Tiny, ModelKindTest, ::testing::Values("tiny-dense", "tiny-moe"));

TEST(Qwen3ModelTest, PackedExpertFactorsEqualPerExpertOnes) {
  TempDir dir;
  auto m = WriteAndLoad(dir, "tiny-moe");
  const ModelConfig& c = m->config();
  auto mods = RandomAdapter(c, 5, 3, 1.5);
  // Pack layer 0's up_proj experts into one 3-D module; keep the rest per expert.
  std::vector<LoraModuleInput> packed;
  std::vector<at::Tensor> as(c.num_experts), bs(c.num_experts);
  for (const LoraModuleInput& x : mods) {
    const std::string pre = "layers.0.mlp.experts.";
    if (x.module.rfind(pre, 0) == 0 && x.module.size() > 8 &&
        x.module.substr(x.module.size() - 7) == "up_proj") {
      as[std::stoi(x.module.substr(pre.size()))] = x.a;
      bs[std::stoi(x.module.substr(pre.size()))] = x.b;
    } else {
      packed.push_back(x);
    }
  }
  packed.push_back({"layers.0.mlp.experts.up_proj", at::stack(as), at::stack(bs), 1.5});
  auto a = LoraAdapter::Create(c, mods, at::kFloat);
  auto b = LoraAdapter::Create(c, packed, at::kFloat);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ForwardInput in;
  in.token_ids = Ids({1, 2, 3, 4, 5, 6});
  LoraBatch la{{&*a}, std::vector<int32_t>(6, 0)}, lb{{&*b}, std::vector<int32_t>(6, 0)};
  in.lora = &la;
  at::Tensor x = Logits(*m, in);
  in.lora = &lb;
  EXPECT_LT(RelErr(Logits(*m, in), x), 1e-6);
}

TEST(Qwen3ModelTest, GradientsFlowIntoLoraFactors) {
  TempDir dir;
  auto m = WriteAndLoad(dir, "tiny-dense");
  const ModelConfig& c = m->config();
  at::Tensor a = (at::randn({2, c.hidden_size}) * 0.1).requires_grad_(true);
  at::Tensor b = (at::randn({c.num_attention_heads * c.head_dim, 2}) * 0.1).requires_grad_(true);
  auto adapter = LoraAdapter::Create(c, {{"layers.1.self_attn.q_proj", a, b, 1.0}}, at::kFloat);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  LoraBatch lb{{&*adapter}, {0, 0, 0, 0}};
  ForwardInput in;
  in.token_ids = Ids({10, 20, 30, 40});
  in.lora = &lb;
  KernelLoraApplier kernel(1);  // must fall back to the differentiable path
  m->set_lora_applier(&kernel);
  absl::StatusOr<ForwardOutput> out = m->Forward(in);
  ASSERT_TRUE(out.ok()) << out.status();
  out->logits.logsumexp(-1).sum().backward();
  ASSERT_TRUE(a.grad().defined());
  ASSERT_TRUE(b.grad().defined());
  EXPECT_GT(a.grad().abs().sum().item<double>(), 0.0);
  EXPECT_GT(b.grad().abs().sum().item<double>(), 0.0);
  EXPECT_GT(kernel.fallback_calls(), 0);
}

TEST(Qwen3ModelTest, Bf16CheckpointRunsInBf16AndTracksF32) {
  TempDir dir;
  auto m16 = WriteAndLoad(dir, "tiny-dense", 3, at::kBFloat16);
  ASSERT_NE(m16, nullptr);
  EXPECT_EQ(m16->dtype(), at::kBFloat16);
  LoadOptions f32;
  f32.dtype = at::kFloat;
  auto m32 = Qwen3Model::Load(dir.file("tiny-dense"), f32);
  ASSERT_TRUE(m32.ok());
  EXPECT_EQ(m32->get()->fingerprint(), m16->fingerprint());  // same stored bytes
  ForwardInput in;
  in.token_ids = Ids({1, 50, 500, 1000});
  at::Tensor lo = Logits(*m16, in), hi = Logits(**m32, in);
  EXPECT_LT(RelErr(lo, hi), 0.1);
  EXPECT_GT(RelErr(lo, hi), 0.0);  // really computed in bf16
}

TEST(Qwen3ModelTest, BadInputsAreRejectedAndLeaveTheCacheAlone) {
  TempDir dir;
  auto m = WriteAndLoad(dir, "tiny-dense");
  KvCache cache = m->NewKvCache();
  KvCache::SeqId seq = cache.AddSequence();
  ForwardInput ok;
  ok.token_ids = Ids({1, 2});
  ok.cache_seqs = {seq};
  ASSERT_TRUE(m->Forward(ok, &cache).ok());

  ForwardInput bad = ok;
  bad.token_ids = Ids({1, 1024});
  absl::StatusOr<ForwardOutput> r = m->Forward(bad, &cache);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("vocabulary"), std::string::npos);
  bad = ok;
  bad.seq_lens = {1};
  EXPECT_EQ(m->Forward(bad, &cache).status().code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.cache_seqs = {seq + 100};
  EXPECT_EQ(m->Forward(bad, &cache).status().code(), absl::StatusCode::kNotFound);
  bad = ok;
  EXPECT_EQ(m->Forward(bad, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.token_ids = Ids({1, 2}).to(at::kInt);
  EXPECT_EQ(m->Forward(bad, &cache).status().code(), absl::StatusCode::kInvalidArgument);
  LoraBatch lb{{nullptr}, {0, 0}};
  bad = ok;
  bad.lora = &lb;
  EXPECT_EQ(m->Forward(bad, &cache).status().code(), absl::StatusCode::kInvalidArgument);
  LoraBatch short_batch{{}, {-1}};
  bad.lora = &short_batch;
  EXPECT_EQ(m->Forward(bad, &cache).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*cache.Length(seq), 2);
  EXPECT_EQ(cache.Truncate(seq, 3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cache.RemoveSequence(seq).ok());
  EXPECT_EQ(cache.RemoveSequence(seq).code(), absl::StatusCode::kNotFound);
}

TEST(Qwen3ModelTest, BadAdaptersAreRejectedWithTheModuleName) {
  const ModelConfig dense = Config("tiny-dense");
  const ModelConfig moe = Config("tiny-moe");
  auto t = [](std::vector<int64_t> s) { return at::zeros(s); };
  const int64_t h = dense.hidden_size, q = dense.num_attention_heads * dense.head_dim;
  struct Case {
    const ModelConfig* config;
    LoraModuleInput module;
    absl::StatusCode code;
  };
  std::vector<Case> cases = {
      {&dense,
       {"layers.0.self_attn.q_proj", t({2, h + 1}), t({q, 2})},
       absl::StatusCode::kInvalidArgument},
      {&dense,
       {"layers.0.self_attn.q_proj", t({2, h}), t({q, 3})},
       absl::StatusCode::kInvalidArgument},
      {&dense,
       {"layers.9.self_attn.q_proj", t({2, h}), t({q, 2})},
       absl::StatusCode::kInvalidArgument},
      {&dense,
       {"layers.0.self_attn.x_proj", t({2, h}), t({q, 2})},
       absl::StatusCode::kInvalidArgument},
      {&dense,
       {"lm_head", t({2, h}), t({dense.vocab_size + 1, 2})},
       absl::StatusCode::kInvalidArgument},
      {&moe,
       {"layers.0.mlp.gate", t({2, h}), t({moe.num_experts, 2})},
       absl::StatusCode::kUnimplemented},
      {&moe, {"layers.0.mlp.gate_proj", t({2, h}), t({64, 2})}, absl::StatusCode::kInvalidArgument},
      {&moe,
       {"layers.0.mlp.experts.8.up_proj", t({2, h}), t({64, 2})},
       absl::StatusCode::kInvalidArgument},
      {&moe,
       {"layers.2.mlp.experts.0.up_proj", t({2, h}), t({64, 2})},
       absl::StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    absl::StatusOr<LoraAdapter> a = LoraAdapter::Create(*c.config, {c.module}, at::kFloat);
    EXPECT_EQ(a.status().code(), c.code) << c.module.module << ": " << a.status();
    EXPECT_NE(a.status().message().find(c.module.module), std::string::npos) << a.status();
  }
  // Twice the same module; experts of one set with different ranks.
  LoraModuleInput m{"layers.0.self_attn.q_proj", t({2, h}), t({q, 2})};
  EXPECT_EQ(LoraAdapter::Create(dense, {m, m}, at::kFloat).status().code(),
            absl::StatusCode::kInvalidArgument);
  LoraModuleInput e0{"layers.0.mlp.experts.0.up_proj", t({2, h}), t({64, 2})};
  LoraModuleInput e1{"layers.0.mlp.experts.1.up_proj", t({3, h}), t({64, 3})};
  EXPECT_EQ(LoraAdapter::Create(moe, {e0, e1}, at::kFloat).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Qwen3ModelTest, BadCheckpointsAreRejectedWithTheTensorName) {
  TempDir dir;
  ASSERT_TRUE(WriteRandomCheckpoint(Config("tiny-dense"), dir.file("m"), 1, at::kFloat).ok());
  const ModelConfig c = Config("tiny-dense");
  auto base = ReadAll(dir.file("m"));

  auto missing = base;
  missing.erase("model.layers.1.self_attn.k_norm.weight");
  auto r = Qwen3Model::FromTensors(c, OwnedSet(missing));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("layers.1.self_attn.k_norm"), std::string::npos);

  auto wrong = base;
  wrong["model.norm.weight"] = at::ones({c.hidden_size + 1});
  r = Qwen3Model::FromTensors(c, OwnedSet(wrong));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("model.norm.weight"), std::string::npos);

  auto extra = base;
  extra["model.layers.0.mlp.extra.weight"] = at::ones({3});
  r = Qwen3Model::FromTensors(c, OwnedSet(extra));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("mlp.extra"), std::string::npos);

  EXPECT_EQ(Qwen3Model::Load(dir.file("nope")).status().code(), absl::StatusCode::kNotFound);
  TempDir empty;
  ASSERT_TRUE(WriteFileAtomic(empty.file("config.json"), c.ToJson()).ok());
  EXPECT_EQ(Qwen3Model::Load(empty.path()).status().code(), absl::StatusCode::kNotFound);
}

TEST(Qwen3ModelTest, LoadsShardedCheckpoints) {
  TempDir dir;
  const std::string src = dir.file("single");
  ASSERT_TRUE(WriteRandomCheckpoint(Config("tiny-moe"), src, 4, at::kFloat).ok());
  auto single = Qwen3Model::Load(src);
  ASSERT_TRUE(single.ok());
  // Split into two shards + an index.
  absl::StatusOr<TensorSet> set = ReadCheckpointTensors(src);
  ASSERT_TRUE(set.ok());
  std::vector<TensorView> s1, s2;
  std::string weight_map;
  for (const TensorView& v : set->tensors()) {
    const bool first = v.name < "model.layers.2";
    (first ? s1 : s2).push_back(v);
    weight_map += (weight_map.empty() ? "" : ",") + std::string("\"") + v.name + "\":\"" +
                  (first ? "a.safetensors" : "b.safetensors") + "\"";
  }
  const std::string sharded = dir.file("sharded");
  ASSERT_TRUE(CreateDirectories(sharded).ok());
  ASSERT_TRUE(safetensors::WriteFile(sharded + "/a.safetensors", s1, {}).ok());
  ASSERT_TRUE(safetensors::WriteFile(sharded + "/b.safetensors", s2, {}).ok());
  ASSERT_TRUE(WriteFileAtomic(sharded + "/model.safetensors.index.json",
                              "{\"metadata\":{},\"weight_map\":{" + weight_map + "}}")
                  .ok());
  ASSERT_TRUE(WriteFileAtomic(sharded + "/config.json", Config("tiny-moe").ToJson()).ok());
  auto m = Qwen3Model::Load(sharded);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->fingerprint(), (*single)->fingerprint());
  ForwardInput in;
  in.token_ids = Ids({3, 1, 4, 1, 5});
  // Same values; only memory alignment differs, which may change SIMD summation order.
  EXPECT_LT(RelErr(Logits(**m, in), Logits(**single, in)), 1e-6);
}

}  // namespace
}  // namespace loradb::model

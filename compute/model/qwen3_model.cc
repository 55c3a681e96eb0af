#include "compute/model/qwen3_model.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compute/model/checkpoint.h"
#include "compute/model/dense_linear.h"
#include "compute/model/pointwise.h"
#include "compute/model/torch_dtype.h"
#include "kernels/lora_kernels.h"
#include "storage/formats/weights_fingerprint.h"
#include "storage/util/status_macros.h"

namespace loradb::model {

// Per-forward state shared by every layer.
struct Qwen3Model::Context {
  const LoraBatch* lora = nullptr;
  LoraRowGroups groups;
  // Some adapter of the batch uses DoRA / changes embed_tokens or lm_head.
  bool any_dora = false;
  bool any_whole = false;
  std::vector<int64_t> seq_lens;
  std::vector<KvCache::SeqId> cache_seqs;
  KvCache* cache = nullptr;
  at::Tensor cos, sin;  // [rows, head_dim] in the model dtype
  // The sequences that continue none (ForwardInput::continues), first in the batch: their
  // lengths and rows.
  std::vector<int64_t> root_lens;
  int64_t root_rows = 0;
  // > 0 when every such sequence has this many new tokens and (with a cache) the same past length
  // `uniform_past`: attention then runs as one batched matmul instead of a loop over sequences.
  int64_t uniform_len = 0;
  int64_t uniform_past = 0;
  // The continuing sequences, after the roots: their lengths, and the first row and length of
  // the sequence each continues.
  std::vector<int64_t> cont_lens, cont_prefix_row, cont_prefix_len;
  // > 0 when every continuing sequence has this many tokens and its prefix `cont_uniform_prefix`
  // tokens: one batched attention over the rows in `cont_prefix_index` ([S * prefix]).
  int64_t cont_uniform_len = 0;
  int64_t cont_uniform_prefix = 0;
  at::Tensor cont_prefix_index;
};

namespace {

absl::StatusOr<at::ScalarType> TorchDType(DType d, const std::string& name) {
  return TorchFloatScalarType(d, absl::StrCat("weight tensor \"", name, "\""));
}

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Qwen3Model>> Qwen3Model::Load(const std::string& dir,
                                                             const LoadOptions& options) {
  LORADB_ASSIGN_OR_RETURN(ModelConfig config, ReadModelConfig(dir));
  LORADB_ASSIGN_OR_RETURN(TensorSet tensors, ReadCheckpointTensors(dir));
  return FromTensors(config, std::make_shared<const TensorSet>(std::move(tensors)), options);
}

absl::StatusOr<std::unique_ptr<Qwen3Model>> Qwen3Model::FromTensors(
    const ModelConfig& config, std::shared_ptr<const TensorSet> tensors,
    const LoadOptions& options) {
  try {
    return FromTensorsImpl(config, std::move(tensors), options);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("Qwen3Model: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<std::unique_ptr<Qwen3Model>> Qwen3Model::FromTensorsImpl(
    const ModelConfig& config, std::shared_ptr<const TensorSet> tensors,
    const LoadOptions& options) {
  // Sizes, head grouping, even head_dim and MoE counts; configs built in code are checked here.
  LORADB_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<Qwen3Model> m(new Qwen3Model());
  m->config_ = config;
  m->tensors_ = std::move(tensors);
  m->device_ = options.device;
  const TensorSet& set = *m->tensors_;
  const TensorView* embed = set.Find("model.embed_tokens.weight");
  if (embed == nullptr) {
    return absl::InvalidArgumentError("checkpoint has no tensor \"model.embed_tokens.weight\"");
  }
  if (options.dtype.has_value()) {
    m->dtype_ = *options.dtype;
  } else {
    LORADB_ASSIGN_OR_RETURN(m->dtype_, TorchDType(embed->dtype, embed->name));
  }
  if (!at::isFloatingType(m->dtype_)) {
    return absl::InvalidArgumentError("compute dtype must be floating point");
  }

  std::set<std::string> used;
  const std::shared_ptr<const TensorSet>& keep = m->tensors_;
  auto take = [&](const std::string& name,
                  std::vector<int64_t> shape) -> absl::StatusOr<at::Tensor> {
    const TensorView* v = set.Find(name);
    if (v == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint has no tensor \"", name, "\""));
    }
    if (v->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" has shape ",
                                                     ShapeString(v->shape), ", expected ",
                                                     ShapeString(shape)));
    }
    LORADB_ASSIGN_OR_RETURN(at::ScalarType st, TorchDType(v->dtype, name));
    used.insert(name);
    m->num_parameters_ += static_cast<int64_t>(v->numel());
    // A view over the checkpoint bytes (never written: weights are read-only). The TensorSet is
    // held by the model, and by the tensor's deleter so a weight outlives a dropped model.
    auto* data = const_cast<std::byte*>(v->data);
    at::Tensor t = at::from_blob(
        data, shape, [keep](void*) {}, at::TensorOptions(st));
    const bool aligned = reinterpret_cast<uintptr_t>(data) % DTypeSize(v->dtype) == 0;
    if (st == m->dtype_ && aligned && m->device_.is_cpu()) return t;
    // One copy, converting dtype or placing on the device.
    if (!aligned) t = t.clone();
    return t.to(m->device_, m->dtype_, /*non_blocking=*/false, /*copy=*/true);
  };

  const ModelConfig& c = config;
  const int64_t hd = c.head_dim, nh = c.num_attention_heads, kvh = c.num_key_value_heads;
  LORADB_ASSIGN_OR_RETURN(m->embed_,
                          take("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}));
  LORADB_ASSIGN_OR_RETURN(m->final_norm_, take("model.norm.weight", {c.hidden_size}));
  if (c.tie_word_embeddings) {
    m->lm_head_ = m->embed_;
    used.insert("lm_head.weight");  // transformers ignores a stored copy of a tied head
  } else {
    LORADB_ASSIGN_OR_RETURN(m->lm_head_, take("lm_head.weight", {c.vocab_size, c.hidden_size}));
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer l;
    LORADB_ASSIGN_OR_RETURN(l.input_norm, take(p + "input_layernorm.weight", {c.hidden_size}));
    LORADB_ASSIGN_OR_RETURN(l.post_norm,
                            take(p + "post_attention_layernorm.weight", {c.hidden_size}));
    const std::string a = p + "self_attn.";
    LORADB_ASSIGN_OR_RETURN(l.q, take(a + "q_proj.weight", {nh * hd, c.hidden_size}));
    LORADB_ASSIGN_OR_RETURN(l.k, take(a + "k_proj.weight", {kvh * hd, c.hidden_size}));
    LORADB_ASSIGN_OR_RETURN(l.v, take(a + "v_proj.weight", {kvh * hd, c.hidden_size}));
    LORADB_ASSIGN_OR_RETURN(l.o, take(a + "o_proj.weight", {c.hidden_size, nh * hd}));
    if (c.attention_bias) {
      LORADB_ASSIGN_OR_RETURN(l.q_bias, take(a + "q_proj.bias", {nh * hd}));
      LORADB_ASSIGN_OR_RETURN(l.k_bias, take(a + "k_proj.bias", {kvh * hd}));
      LORADB_ASSIGN_OR_RETURN(l.v_bias, take(a + "v_proj.bias", {kvh * hd}));
      LORADB_ASSIGN_OR_RETURN(l.o_bias, take(a + "o_proj.bias", {c.hidden_size}));
    }
    LORADB_ASSIGN_OR_RETURN(l.q_norm, take(a + "q_norm.weight", {hd}));
    LORADB_ASSIGN_OR_RETURN(l.k_norm, take(a + "k_norm.weight", {hd}));
    l.moe = c.IsMoeLayer(i);
    if (l.moe) {
      const int64_t mi = c.moe_intermediate_size;
      LORADB_ASSIGN_OR_RETURN(l.router,
                              take(p + "mlp.gate.weight", {c.num_experts, c.hidden_size}));
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string ep = absl::StrCat(p, "mlp.experts.", e, ".");
        Expert x;
        LORADB_ASSIGN_OR_RETURN(x.gate, take(ep + "gate_proj.weight", {mi, c.hidden_size}));
        LORADB_ASSIGN_OR_RETURN(x.up, take(ep + "up_proj.weight", {mi, c.hidden_size}));
        LORADB_ASSIGN_OR_RETURN(x.down, take(ep + "down_proj.weight", {c.hidden_size, mi}));
        l.experts.push_back(std::move(x));
      }
    } else {
      const int64_t im = c.intermediate_size;
      LORADB_ASSIGN_OR_RETURN(l.gate, take(p + "mlp.gate_proj.weight", {im, c.hidden_size}));
      LORADB_ASSIGN_OR_RETURN(l.up, take(p + "mlp.up_proj.weight", {im, c.hidden_size}));
      LORADB_ASSIGN_OR_RETURN(l.down, take(p + "mlp.down_proj.weight", {c.hidden_size, im}));
    }
    m->layers_.push_back(std::move(l));
  }
  for (const TensorView& v : set.tensors()) {
    if (used.count(v.name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", v.name, "\" is not a weight of a ", c.model_type, " model"));
    }
  }
  // RoPE inverse frequencies, computed in fp32 as transformers does.
  at::Tensor exponents = at::arange(0, hd, 2, at::kLong).to(at::kFloat) / static_cast<double>(hd);
  m->inv_freq_ = at::reciprocal(at::pow(at::Scalar(c.rope_theta), exponents)).to(m->device_);
  m->fingerprint_ = WeightsFingerprint(set);
  return m;
}

KvCache Qwen3Model::NewKvCache() const {
  return KvCache(config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim, dtype_,
                 device_);
}

at::Tensor Qwen3Model::RmsNorm(const at::Tensor& x, const at::Tensor& w) const {
  if (UsesPointwiseKernels({x, w})) return RmsNormKernel(x, w, config_.rms_norm_eps);
  const at::ScalarType in = x.scalar_type();
  at::Tensor h = x.to(at::kFloat);
  at::Tensor var = h.pow(2).mean({-1}, /*keepdim=*/true);
  h = h * at::rsqrt(var + config_.rms_norm_eps);
  return w * h.to(in);
}

at::Tensor Qwen3Model::Project(const Context& ctx, const at::Tensor& x, const at::Tensor& w,
                               const at::Tensor& bias, int64_t layer, LoraTarget target) const {
  at::Tensor y = BaseLinear(x, w, bias);
  if (ctx.lora != nullptr && !ctx.groups.empty()) {
    y = applier_->Apply(x, y, layer, target, /*expert=*/-1, at::Tensor(), *ctx.lora, ctx.groups);
    if (ctx.any_dora) y = ApplyDora(ctx, std::move(y), bias, layer, target);
  }
  return y;
}

at::Tensor Qwen3Model::ApplyDora(const Context& ctx, at::Tensor y, const at::Tensor& bias,
                                 int64_t layer, LoraTarget target) const {
  for (size_t i = 0; i < ctx.groups.slots.size(); ++i) {
    const LoraFactors* f = ctx.lora->adapters[ctx.groups.slots[i]]->Find(layer, target);
    if (f == nullptr || !f->dora_scale.defined()) continue;
    const at::Tensor& idx = ctx.groups.rows[i];
    const bool all = idx.numel() == y.size(0);
    at::Tensor part = all ? y : y.index_select(0, idx);
    part = bias.defined() ? (part - bias) * f->dora_scale + bias : part * f->dora_scale;
    y = all ? part : y.index_copy(0, idx, part);
  }
  return y;
}

namespace {

at::Tensor Cast(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

}  // namespace

at::Tensor Qwen3Model::EmbedAdapters(const Context& ctx, const at::Tensor& ids,
                                     at::Tensor h) const {
  for (size_t i = 0; i < ctx.groups.slots.size(); ++i) {
    const LoraAdapter& a = *ctx.lora->adapters[ctx.groups.slots[i]];
    const at::Tensor& own = a.ReplacedWeight(LoraWholeModule::kEmbedTokens);
    const LoraFactors* f = a.FindWhole(LoraWholeModule::kEmbedTokens);
    if (!own.defined() && f == nullptr) continue;
    const at::Tensor& idx = ctx.groups.rows[i];
    const at::Tensor tokens = ids.index_select(0, idx);
    at::Tensor part =
        own.defined() ? at::embedding(Cast(own, dtype_), tokens) : h.index_select(0, idx);
    if (f != nullptr) {
      // PEFT's embedding LoRA: scale * B @ A[:, token], i.e. a row lookup in A^T.
      at::Tensor after_a = at::embedding(Cast(f->a, dtype_).t(), tokens);  // [n, r]
      part = part + at::linear(after_a, Cast(f->b, dtype_)) * f->scale;
      if (f->dora_scale.defined()) part = part * f->dora_scale;
    }
    h = h.index_copy(0, idx, part);
  }
  return h;
}

at::Tensor Qwen3Model::HeadAdapters(const Context& ctx, const std::vector<int64_t>& out_rows,
                                    const at::Tensor& hidden, at::Tensor logits) const {
  const std::vector<int32_t>& row_slot = ctx.lora->row_slot;
  const int64_t n = hidden.size(0);
  for (int32_t slot : ctx.groups.slots) {
    const LoraAdapter& a = *ctx.lora->adapters[slot];
    const at::Tensor& own = a.ReplacedWeight(LoraWholeModule::kLmHead);
    const LoraFactors* f = a.FindWhole(LoraWholeModule::kLmHead);
    if (!own.defined() && f == nullptr) continue;
    std::vector<int64_t> local;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t row = out_rows.empty() ? j : out_rows[j];
      if (row_slot[row] == slot) local.push_back(j);
    }
    if (local.empty()) continue;
    const at::Tensor idx =
        at::from_blob(local.data(), {static_cast<int64_t>(local.size())}, at::kLong)
            .to(device_, /*non_blocking=*/false, /*copy=*/true);
    const at::Tensor hs = hidden.index_select(0, idx);
    at::Tensor part =
        own.defined() ? BaseLinear(hs, Cast(own, dtype_)) : logits.index_select(0, idx);
    if (f != nullptr) {
      part = part + at::linear(at::linear(hs, Cast(f->a, dtype_)), Cast(f->b, dtype_)) * f->scale;
      if (f->dora_scale.defined()) part = part * f->dora_scale;
    }
    logits = logits.index_copy(0, idx, part);
  }
  return logits;
}

absl::Status Qwen3Model::PrepareAdapter(LoraAdapter* adapter) const {
  if (adapter->prepared()) return absl::OkStatus();
  try {
    return PrepareAdapterImpl(adapter);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("Qwen3Model::PrepareAdapter: ", e.what_without_backtrace()));
  }
}

absl::Status Qwen3Model::PrepareAdapterImpl(LoraAdapter* adapter) const {
  if (reducer_ != nullptr) {
    return absl::UnimplementedError(
        "a tensor-parallel model cannot apply DoRA, embed_tokens or lm_head adapter weights");
  }
  at::NoGradGuard no_grad;
  for (int m = 0; m < kNumLoraWholeModules; ++m) {
    const auto which = static_cast<LoraWholeModule>(m);
    const at::Tensor& saved = adapter->BaseLayerWeight(which);
    const at::Tensor& base = which == LoraWholeModule::kEmbedTokens ? embed_ : lm_head_;
    if (saved.defined() && !at::equal(saved.to(base.device(), base.scalar_type()), base)) {
      return absl::UnimplementedError(absl::StrCat(
          which == LoraWholeModule::kEmbedTokens ? "embed_tokens" : "lm_head",
          ": the adapter's saved base_layer weight differs from the base's (a resized or "
          "retrained base layer is not applied)"));
    }
  }
  // PEFT's weight norm: per output row of W + scale * B A, in fp32.
  auto dora_scale = [&](const at::Tensor& w, const LoraFactors& f) {
    at::Tensor merged =
        w.to(at::kFloat) + f.scale * at::matmul(f.b.to(at::kFloat), f.a.to(at::kFloat));
    return (f.magnitude.to(at::kFloat) / merged.norm(2, {1})).to(device_, dtype_);
  };
  std::vector<std::pair<LoraFactors*, at::Tensor>> scales;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const auto target = static_cast<LoraTarget>(t);
      LoraFactors* f = adapter->FindMutable(static_cast<int64_t>(i), target);
      if (f == nullptr || !f->magnitude.defined()) continue;
      const at::Tensor* w = nullptr;
      switch (target) {
        case LoraTarget::kQ:
          w = &l.q;
          break;
        case LoraTarget::kK:
          w = &l.k;
          break;
        case LoraTarget::kV:
          w = &l.v;
          break;
        case LoraTarget::kO:
          w = &l.o;
          break;
        case LoraTarget::kGate:
          w = &l.gate;
          break;
        case LoraTarget::kUp:
          w = &l.up;
          break;
        case LoraTarget::kDown:
          w = &l.down;
          break;
      }
      if (w == nullptr || !w->defined()) {
        return absl::UnimplementedError(absl::StrCat("layer ", i, " ", LoraTargetName(target),
                                                     ": DoRA on this module is not supported"));
      }
      scales.emplace_back(f, dora_scale(*w, *f));
    }
  }
  if (LoraFactors* f = adapter->FindWholeMutable(LoraWholeModule::kLmHead);
      f != nullptr && f->magnitude.defined()) {
    scales.emplace_back(f, dora_scale(lm_head_, *f));
  }
  if (LoraFactors* f = adapter->FindWholeMutable(LoraWholeModule::kEmbedTokens);
      f != nullptr && f->magnitude.defined()) {
    // The [hidden, vocab] view of the table: B A is [hidden, vocab] for embedding LoRA.
    scales.emplace_back(f, dora_scale(embed_.t(), *f));
  }
  for (auto& [f, s] : scales) f->dora_scale = std::move(s);
  adapter->set_prepared();
  return absl::OkStatus();
}

namespace {

// [.., kv_heads, T, hd] -> [.., kv_heads * rep, T, hd] (grouped-query attention).
at::Tensor RepeatKv(const at::Tensor& t, int64_t rep) {
  if (rep == 1) return t;
  std::vector<int64_t> expanded(t.sizes().begin(), t.sizes().end());
  const int64_t d = t.dim() - 3;  // the kv_heads dim
  expanded.insert(expanded.begin() + d + 1, rep);
  std::vector<int64_t> merged(t.sizes().begin(), t.sizes().end());
  merged[d] *= rep;
  return t.unsqueeze(d + 1).expand(expanded).reshape(merged);
}

}  // namespace

at::Tensor Qwen3Model::Attention(const Context& ctx, const Layer& l, int64_t layer,
                                 const at::Tensor& x) const {
  const int64_t rows = x.size(0), hd = config_.head_dim;
  const int64_t nh = config_.num_attention_heads, kvh = config_.num_key_value_heads;
  at::Tensor q = Project(ctx, x, l.q, l.q_bias, layer, LoraTarget::kQ).view({rows, nh, hd});
  at::Tensor k = Project(ctx, x, l.k, l.k_bias, layer, LoraTarget::kK).view({rows, kvh, hd});
  at::Tensor v = Project(ctx, x, l.v, l.v_bias, layer, LoraTarget::kV).view({rows, kvh, hd});
  q = RmsNorm(q, l.q_norm);
  k = RmsNorm(k, l.k_norm);
  if (UsesPointwiseKernels({q, k, ctx.cos, ctx.sin})) {
    RopeKernel(q, ctx.cos, ctx.sin);  // q and k are the norms' own outputs
    RopeKernel(k, ctx.cos, ctx.sin);
  } else {
    const at::Tensor cos = ctx.cos.unsqueeze(1), sin = ctx.sin.unsqueeze(1);
    q = q * cos + RotateHalf(q) * sin;
    k = k * cos + RotateHalf(k) * sin;
  }
  at::Tensor attn;
  if (ctx.root_rows == rows) {
    attn = AttendCausal(ctx, layer, q, k, v);
  } else {
    const int64_t rr = ctx.root_rows;
    attn = at::cat(
        {AttendCausal(ctx, layer, q.narrow(0, 0, rr), k.narrow(0, 0, rr), v.narrow(0, 0, rr)),
         AttendContinuations(ctx, q.narrow(0, rr, rows - rr), k, v)},
        0);
  }
  return ReducePartial(Project(ctx, attn, l.o, l.o_bias, layer, LoraTarget::kO));
}

bool Qwen3Model::UsesCpuDecodeAttention(const Context& ctx, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v) const {
  const bool graph =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  return ctx.cache != nullptr && device_.is_cpu() && dtype_ == at::kFloat && !graph;
}

void Qwen3Model::CpuDecodeAttention(const Context& ctx, int64_t layer, const at::Tensor& q,
                                    const at::Tensor& k, const at::Tensor& v,
                                    const std::vector<size_t>& seqs,
                                    const std::vector<int64_t>& rows, at::Tensor& out) const {
  const int64_t hd = config_.head_dim;
  const int64_t nh = config_.num_attention_heads, kvh = config_.num_key_value_heads;
  const float scaling = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const float* qp = qc.data_ptr<float>();
  const float* kp = kc.data_ptr<float>();
  const float* vp = vc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // Each sequence reads and writes only its own cache buffer and output row.
  at::parallel_for(0, static_cast<int64_t>(seqs.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = rows[static_cast<size_t>(i)];
      const KvCache::LayerSpan span =
          ctx.cache->Span(ctx.cache_seqs[seqs[static_cast<size_t>(i)]], layer);
      for (int64_t g = 0; g < kvh; ++g) {
        const int64_t at = g * span.head_stride + span.length * hd;
        std::copy_n(kp + (row * kvh + g) * hd, hd, span.k + at);
        std::copy_n(vp + (row * kvh + g) * hd, hd, span.v + at);
      }
      kernels::cpu::DecodeAttention(qp + row * nh * hd, nh, kvh, hd, span.k, span.v,
                                    span.head_stride, span.length + 1, scaling, op + row * nh * hd);
    }
  });
}

at::Tensor Qwen3Model::AttendCausal(const Context& ctx, int64_t layer, const at::Tensor& q,
                                    at::Tensor k, at::Tensor v) const {
  const int64_t hd = config_.head_dim;
  const int64_t nh = config_.num_attention_heads, kvh = config_.num_key_value_heads;
  const int64_t rep = nh / kvh;
  const double scaling = 1.0 / std::sqrt(static_cast<double>(hd));
  const std::vector<int64_t>& lens = ctx.root_lens;

  // Sequences adding one token to a CPU fp32 cache (decode steps) attend through the CPU
  // kernel, which writes the new K and V into the cache and reads it in place: the LibTorch path
  // below costs about twenty operations per sequence and layer, more than the attention itself.
  // A batch of decode steps only goes through the kernel at once; in a batch that mixes them
  // with longer sequences, the loop below sends each one-token sequence to the kernel.
  const bool cpu_decode = UsesCpuDecodeAttention(ctx, q, k, v);
  if (cpu_decode && std::all_of(lens.begin(), lens.end(), [](int64_t n) { return n == 1; })) {
    std::vector<size_t> seqs(lens.size());
    std::vector<int64_t> rows(lens.size());
    for (size_t s = 0; s < lens.size(); ++s) {
      seqs[s] = s;
      rows[s] = static_cast<int64_t>(s);  // one row per sequence
    }
    at::Tensor out = at::empty({q.size(0), nh * hd}, q.options());
    CpuDecodeAttention(ctx, layer, q, k, v, seqs, rows, out);
    return out;
  }

  if (ctx.uniform_len > 0 && lens.size() > 1) {
    // S sequences of n new tokens each, all with `past` cached tokens: one batched attention
    // (a training batch, or a decode step of equally long rollouts), the same math as the loop.
    const int64_t seqs = static_cast<int64_t>(lens.size());
    const int64_t n = ctx.uniform_len, past = ctx.uniform_past, total = past + n;
    at::Tensor qs = q.view({seqs, n, nh, hd}).transpose(1, 2);   // [S, nh, n, hd]
    at::Tensor ks = k.view({seqs, n, kvh, hd}).transpose(1, 2);  // [S, kvh, n, hd]
    at::Tensor vs = v.view({seqs, n, kvh, hd}).transpose(1, 2);
    if (ctx.cache != nullptr) {
      std::vector<at::Tensor> kc, vc;
      kc.reserve(seqs);
      vc.reserve(seqs);
      for (int64_t s = 0; s < seqs; ++s) {
        auto [ka, va] = ctx.cache->Append(ctx.cache_seqs[s], layer, ks[s], vs[s]);
        kc.push_back(std::move(ka));
        vc.push_back(std::move(va));
      }
      ks = at::stack(kc);  // [S, kvh, total, hd]
      vs = at::stack(vc);
    }
    ks = RepeatKv(ks, rep);
    vs = RepeatKv(vs, rep);
    at::Tensor scores = at::matmul(qs, ks.transpose(-1, -2)) * scaling;  // [S, nh, n, total]
    if (n > 1) {
      at::Tensor masked =
          at::ones({n, total}, at::TensorOptions(at::kBool).device(device_)).triu(past + 1);
      scores = scores.masked_fill(masked, -std::numeric_limits<double>::infinity());
    }
    at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(dtype_);
    return at::matmul(probs, vs).transpose(1, 2).reshape({seqs * n, nh * hd});
  }

  std::vector<at::Tensor> outs;
  outs.reserve(lens.size());
  int64_t offset = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    const int64_t n = lens[s];
    if (cpu_decode && n == 1) {
      at::Tensor row = at::empty({1, nh * hd}, q.options());
      CpuDecodeAttention(ctx, layer, q.narrow(0, offset, 1), k.narrow(0, offset, 1),
                         v.narrow(0, offset, 1), {s}, {0}, row);
      outs.push_back(std::move(row));
      offset += n;
      continue;
    }
    at::Tensor qs = q.narrow(0, offset, n).transpose(0, 1);  // [nh, n, hd]
    at::Tensor ks = k.narrow(0, offset, n).transpose(0, 1);  // [kvh, n, hd]
    at::Tensor vs = v.narrow(0, offset, n).transpose(0, 1);
    int64_t past = 0;
    if (ctx.cache != nullptr) {
      past = ctx.cache->Length(ctx.cache_seqs[s]).value();
      std::tie(ks, vs) = ctx.cache->Append(ctx.cache_seqs[s], layer, ks, vs);
    }
    const int64_t total = past + n;
    ks = RepeatKv(ks, rep);
    vs = RepeatKv(vs, rep);
    at::Tensor scores = at::matmul(qs, ks.transpose(1, 2)) * scaling;  // [nh, n, total]
    if (n > 1) {
      // Query i (position past + i) sees keys 0 .. past + i.
      at::Tensor masked =
          at::ones({n, total}, at::TensorOptions(at::kBool).device(device_)).triu(past + 1);
      scores = scores.masked_fill(masked, -std::numeric_limits<double>::infinity());
    }
    at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(dtype_);
    outs.push_back(at::matmul(probs, vs).transpose(0, 1).reshape({n, nh * hd}));
    offset += n;
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

at::Tensor Qwen3Model::AttendContinuations(const Context& ctx, const at::Tensor& q,
                                           const at::Tensor& k, const at::Tensor& v) const {
  const int64_t hd = config_.head_dim;
  const int64_t nh = config_.num_attention_heads, kvh = config_.num_key_value_heads;
  const int64_t rep = nh / kvh;
  const double scaling = 1.0 / std::sqrt(static_cast<double>(hd));
  // Query i of a continuation (position prefix + i) sees the prefix and its keys 0 .. i.
  auto attend = [&](const at::Tensor& qs, const at::Tensor& ks, const at::Tensor& vs, int64_t n,
                    int64_t prefix) {
    at::Tensor scores = at::matmul(qs, RepeatKv(ks, rep).transpose(-1, -2)) * scaling;
    if (n > 1) {
      at::Tensor masked =
          at::ones({n, prefix + n}, at::TensorOptions(at::kBool).device(device_)).triu(prefix + 1);
      scores = scores.masked_fill(masked, -std::numeric_limits<double>::infinity());
    }
    at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(dtype_);
    return at::matmul(probs, RepeatKv(vs, rep));
  };
  const int64_t rr = ctx.root_rows;
  if (ctx.cont_uniform_len > 0) {
    const int64_t seqs = static_cast<int64_t>(ctx.cont_lens.size());
    const int64_t n = ctx.cont_uniform_len, prefix = ctx.cont_uniform_prefix;
    auto gather = [&](const at::Tensor& t) {  // [S, kvh, prefix + n, hd]
      at::Tensor shared = t.index_select(0, ctx.cont_prefix_index).view({seqs, prefix, kvh, hd});
      at::Tensor own = t.narrow(0, rr, seqs * n).view({seqs, n, kvh, hd});
      return at::cat({shared, own}, 1).transpose(1, 2);
    };
    at::Tensor qs = q.view({seqs, n, nh, hd}).transpose(1, 2);  // [S, nh, n, hd]
    return attend(qs, gather(k), gather(v), n, prefix).transpose(1, 2).reshape({seqs * n, nh * hd});
  }
  std::vector<at::Tensor> outs;
  outs.reserve(ctx.cont_lens.size());
  int64_t offset = 0;
  for (size_t s = 0; s < ctx.cont_lens.size(); ++s) {
    const int64_t n = ctx.cont_lens[s], prefix = ctx.cont_prefix_len[s];
    auto keys = [&](const at::Tensor& t) {  // [kvh, prefix + n, hd]
      return at::cat({t.narrow(0, ctx.cont_prefix_row[s], prefix), t.narrow(0, rr + offset, n)}, 0)
          .transpose(0, 1);
    };
    at::Tensor qs = q.narrow(0, offset, n).transpose(0, 1);  // [nh, n, hd]
    outs.push_back(attend(qs, keys(k), keys(v), n, prefix).transpose(0, 1).reshape({n, nh * hd}));
    offset += n;
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

at::Tensor Qwen3Model::DenseMlp(const Context& ctx, const Layer& l, int64_t layer,
                                const at::Tensor& x) const {
  at::Tensor g = Project(ctx, x, l.gate, {}, layer, LoraTarget::kGate);
  at::Tensor u = Project(ctx, x, l.up, {}, layer, LoraTarget::kUp);
  at::Tensor mid = UsesPointwiseKernels({g, u}) ? SiluMulKernel(g, u) : at::silu(g) * u;
  return ReducePartial(Project(ctx, mid, l.down, {}, layer, LoraTarget::kDown));
}

at::Tensor Qwen3Model::MoeMlp(const Context& ctx, const Layer& l, int64_t layer,
                              const at::Tensor& x) const {
  const int64_t top_k = config_.num_experts_per_tok;
  at::Tensor router_logits = BaseLinear(x, l.router);
  at::Tensor probs = at::softmax(router_logits, -1, at::kFloat);
  auto [weights, experts] = at::topk(probs, top_k, -1);
  if (config_.norm_topk_prob) weights = weights / weights.sum({-1}, /*keepdim=*/true);
  weights = weights.to(router_logits.scalar_type());

  // Group the (token, k) assignments by expert: a stable sort of the flat expert ids.
  at::Tensor flat = experts.reshape({-1});
  auto sorted = at::sort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  at::Tensor order = std::get<1>(sorted);
  at::Tensor counts = at::bincount(flat, {}, config_.num_experts).to(at::kCPU);
  const int64_t* count = counts.data_ptr<int64_t>();
  at::Tensor flat_weights = weights.reshape({-1});
  const bool lora = ctx.lora != nullptr && !ctx.groups.empty();

  at::Tensor out = at::zeros_like(x);
  int64_t offset = 0;
  for (int64_t e = 0; e < config_.num_experts; ++e) {
    const int64_t n = count[e];
    if (n == 0) continue;
    at::Tensor picks = order.narrow(0, offset, n);
    offset += n;
    at::Tensor tokens = at::floor_divide(picks, top_k);
    at::Tensor xs = x.index_select(0, tokens);
    const Expert& ex = l.experts[e];
    at::Tensor g = BaseLinear(xs, ex.gate);
    at::Tensor u = BaseLinear(xs, ex.up);
    if (lora) {
      g = applier_->Apply(xs, g, layer, LoraTarget::kGate, e, tokens, *ctx.lora, ctx.groups);
      u = applier_->Apply(xs, u, layer, LoraTarget::kUp, e, tokens, *ctx.lora, ctx.groups);
    }
    at::Tensor h = at::silu(g) * u;
    at::Tensor d = BaseLinear(h, ex.down);
    if (lora) {
      d = applier_->Apply(h, d, layer, LoraTarget::kDown, e, tokens, *ctx.lora, ctx.groups);
    }
    d = d * flat_weights.index_select(0, picks).unsqueeze(1);
    out = out.index_add(0, tokens, d);
  }
  return ReducePartial(std::move(out));
}

absl::StatusOr<ForwardOutput> Qwen3Model::Forward(const ForwardInput& input, KvCache* cache) const {
  try {
    return ForwardImpl(input, cache);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("Qwen3Model::Forward: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<ForwardOutput> Qwen3Model::ForwardImpl(const ForwardInput& input,
                                                      KvCache* cache) const {
  const at::Tensor& ids = input.token_ids;
  if (!ids.defined() || ids.dim() != 1 || ids.scalar_type() != at::kLong || ids.size(0) == 0) {
    return absl::InvalidArgumentError("token_ids must be a non-empty 1-D int64 tensor");
  }
  const int64_t rows = ids.size(0);
  Context ctx;
  ctx.seq_lens = input.seq_lens.empty() ? std::vector<int64_t>{rows} : input.seq_lens;
  int64_t sum = 0;
  for (int64_t n : ctx.seq_lens) {
    if (n <= 0) return absl::InvalidArgumentError("every sequence needs at least one token");
    sum += n;
  }
  if (sum != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_lens sum to ", sum, " but there are ", rows, " token ids"));
  }
  const int64_t min_id = ids.min().item<int64_t>(), max_id = ids.max().item<int64_t>();
  if (min_id < 0 || max_id >= config_.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("token id ", min_id < 0 ? min_id : max_id,
                                                   " is outside the vocabulary [0, ",
                                                   config_.vocab_size, ")"));
  }
  const size_t num_seqs = ctx.seq_lens.size();
  if (!input.continues.empty()) {
    if (input.continues.size() != num_seqs) {
      return absl::InvalidArgumentError(
          absl::StrCat(input.continues.size(), " continues entries for ", num_seqs, " sequences"));
    }
    if (!input.cache_seqs.empty()) {
      return absl::InvalidArgumentError("continuing sequences cannot use a KV cache");
    }
  }
  // First row of each sequence.
  std::vector<int64_t> seq_row(num_seqs, 0);
  for (size_t s = 1; s < num_seqs; ++s) seq_row[s] = seq_row[s - 1] + ctx.seq_lens[s - 1];
  for (size_t s = 0; s < num_seqs; ++s) {
    const int64_t c = input.continues.empty() ? -1 : input.continues[s];
    if (c == -1) {
      if (!ctx.cont_lens.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, " continues none but comes after a continuing sequence"));
      }
      ctx.root_lens.push_back(ctx.seq_lens[s]);
      ctx.root_rows += ctx.seq_lens[s];
      continue;
    }
    if (c < 0 || c >= static_cast<int64_t>(s) || input.continues[c] != -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, " continues ", c,
                       ", which is not an earlier sequence that continues none"));
    }
    ctx.cont_lens.push_back(ctx.seq_lens[s]);
    ctx.cont_prefix_row.push_back(seq_row[c]);
    ctx.cont_prefix_len.push_back(ctx.seq_lens[c]);
  }
  std::vector<int64_t> positions;
  positions.reserve(rows);
  if (!input.cache_seqs.empty()) {
    if (cache == nullptr) return absl::InvalidArgumentError("cache_seqs given without a cache");
    if (input.cache_seqs.size() != ctx.seq_lens.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          input.cache_seqs.size(), " cache sequences for ", ctx.seq_lens.size(), " sequences"));
    }
    std::set<KvCache::SeqId> distinct(input.cache_seqs.begin(), input.cache_seqs.end());
    if (distinct.size() != input.cache_seqs.size()) {
      return absl::InvalidArgumentError("a cache sequence appears twice in one batch");
    }
    std::set<int64_t> pasts;
    for (size_t s = 0; s < ctx.seq_lens.size(); ++s) {
      LORADB_ASSIGN_OR_RETURN(int64_t past, cache->Length(input.cache_seqs[s]));
      pasts.insert(past);
      for (int64_t i = 0; i < ctx.seq_lens[s]; ++i) positions.push_back(past + i);
    }
    ctx.uniform_past = pasts.size() == 1 ? *pasts.begin() : -1;
    for (size_t s = 0; s < ctx.seq_lens.size(); ++s) {
      LORADB_RETURN_IF_ERROR(cache->Reserve(input.cache_seqs[s], ctx.seq_lens[s]));
    }
    ctx.cache = cache;
    ctx.cache_seqs = input.cache_seqs;
  } else {
    for (int64_t n : ctx.root_lens) {
      for (int64_t i = 0; i < n; ++i) positions.push_back(i);
    }
    for (size_t s = 0; s < ctx.cont_lens.size(); ++s) {
      for (int64_t i = 0; i < ctx.cont_lens[s]; ++i)
        positions.push_back(ctx.cont_prefix_len[s] + i);
    }
  }
  auto all_equal = [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [&](int64_t n) { return n == v[0]; });
  };
  if (all_equal(ctx.root_lens) && ctx.uniform_past >= 0) ctx.uniform_len = ctx.root_lens[0];
  if (!ctx.cont_lens.empty() && all_equal(ctx.cont_lens) && all_equal(ctx.cont_prefix_len)) {
    ctx.cont_uniform_len = ctx.cont_lens[0];
    ctx.cont_uniform_prefix = ctx.cont_prefix_len[0];
    std::vector<int64_t> index;
    index.reserve(ctx.cont_lens.size() * ctx.cont_uniform_prefix);
    for (int64_t first : ctx.cont_prefix_row) {
      for (int64_t i = 0; i < ctx.cont_uniform_prefix; ++i) index.push_back(first + i);
    }
    ctx.cont_prefix_index =
        at::from_blob(index.data(), {static_cast<int64_t>(index.size())}, at::kLong)
            .clone()
            .to(device_);
  }
  if (!input.logit_rows.empty()) {
    if (input.last_row_logits_only) {
      return absl::InvalidArgumentError("logit_rows and last_row_logits_only exclude each other");
    }
    for (int64_t r : input.logit_rows) {
      if (r < 0 || r >= rows) {
        return absl::InvalidArgumentError(
            absl::StrCat("logit row ", r, " is outside the batch's ", rows, " rows"));
      }
    }
  }
  if (input.lora != nullptr) {
    ctx.lora = input.lora;
    LORADB_ASSIGN_OR_RETURN(ctx.groups, GroupLoraRows(*input.lora, rows, device_));
    for (int32_t slot : ctx.groups.slots) {
      const LoraAdapter& a = *input.lora->adapters[slot];
      if (!a.prepared()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "LoRA batch slot ", slot,
            ": an adapter with DoRA or embed_tokens / lm_head weights needs PrepareAdapter"));
      }
      ctx.any_dora = ctx.any_dora || a.has_dora();
      ctx.any_whole = ctx.any_whole || a.has_whole_modules();
    }
  }
  at::Tensor pos = at::from_blob(positions.data(), {rows}, at::kLong).to(device_, at::kFloat);
  at::Tensor freqs = pos.unsqueeze(1) * inv_freq_.unsqueeze(0);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  ctx.cos = emb.cos().to(dtype_);
  ctx.sin = emb.sin().to(dtype_);

  const at::Tensor ids_on_device = ids.to(device_);
  at::Tensor h = at::embedding(embed_, ids_on_device);
  if (ctx.any_whole) h = EmbedAdapters(ctx, ids_on_device, std::move(h));
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    const int64_t li = static_cast<int64_t>(i);
    h = h + Attention(ctx, l, li, RmsNorm(h, l.input_norm));
    at::Tensor x = RmsNorm(h, l.post_norm);
    h = h + (l.moe ? MoeMlp(ctx, l, li, x) : DenseMlp(ctx, l, li, x));
  }
  std::vector<int64_t> out_rows;  // the batch row of each logits row; empty: all rows
  if (input.last_row_logits_only) {
    std::vector<int64_t> last;
    int64_t end = 0;
    for (int64_t n : ctx.seq_lens) last.push_back((end += n) - 1);
    out_rows = last;
    at::Tensor idx = at::from_blob(last.data(), {static_cast<int64_t>(last.size())}, at::kLong)
                         .clone()
                         .to(device_);
    h = h.index_select(0, idx);
  } else if (!input.logit_rows.empty()) {
    // A copy: backward keeps the index.
    std::vector<int64_t> picked = input.logit_rows;
    out_rows = picked;
    h = h.index_select(
        0, at::from_blob(picked.data(), {static_cast<int64_t>(picked.size())}, at::kLong)
               .clone()
               .to(device_));
  }
  ForwardOutput out;
  out.hidden = RmsNorm(h, final_norm_);
  out.logits = BaseLinear(out.hidden, lm_head_);
  if (ctx.any_whole) out.logits = HeadAdapters(ctx, out_rows, out.hidden, std::move(out.logits));
  if (ctx.cache != nullptr) {
    for (size_t s = 0; s < ctx.seq_lens.size(); ++s) {
      ctx.cache->Commit(ctx.cache_seqs[s], ctx.seq_lens[s]);
    }
  }
  return out;
}

}  // namespace loradb::model

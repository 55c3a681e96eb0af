#include "compute/model/lora.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "compute/model/dense_linear.h"
#include "storage/util/status_macros.h"

namespace loradb::model {
namespace {

constexpr const char* kTargetNames[kNumLoraTargets] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

// A module name split into its parts. expert == -1: dense; expert == -2: packed expert set.
struct ParsedModule {
  int64_t layer = 0;
  LoraTarget target = LoraTarget::kQ;
  int64_t expert = -1;
};

absl::StatusOr<ParsedModule> ParseModuleName(const ModelConfig& config, const std::string& name) {
  std::vector<std::string> parts = absl::StrSplit(name, '.');
  ParsedModule p;
  if (parts.size() < 4 || parts[0] != "layers" || !absl::SimpleAtoi(parts[1], &p.layer) ||
      p.layer < 0 || p.layer >= config.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA module \"", name, "\": not a module of this base"));
  }
  const std::string rest = absl::StrJoin(parts.begin() + 2, parts.end(), ".");
  if (rest == "mlp.gate") {
    return absl::UnimplementedError(
        absl::StrCat("LoRA module \"", name, "\": router (mlp.gate) LoRA is not supported"));
  }
  for (int t = 0; t < kNumLoraTargets; ++t) {
    if (rest == kTargetNames[t]) {
      p.target = static_cast<LoraTarget>(t);
      if (t >= static_cast<int>(LoraTarget::kGate) && config.IsMoeLayer(p.layer)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "LoRA module \"", name, "\": layer ", p.layer, " is a MoE layer (use mlp.experts.*)"));
      }
      return p;
    }
  }
  // mlp.experts.E.<proj> or mlp.experts.<proj> (packed).
  if (parts.size() >= 5 && parts[2] == "mlp" && parts[3] == "experts") {
    if (!config.IsMoeLayer(p.layer)) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoRA module \"", name, "\": layer ", p.layer, " has no experts"));
    }
    std::string proj;
    if (parts.size() == 6) {
      if (!absl::SimpleAtoi(parts[4], &p.expert) || p.expert < 0 ||
          p.expert >= config.num_experts) {
        return absl::InvalidArgumentError(
            absl::StrCat("LoRA module \"", name, "\": expert index out of range"));
      }
      proj = parts[5];
    } else if (parts.size() == 5) {
      p.expert = -2;
      proj = parts[4];
    }
    if (proj == "gate_proj")
      p.target = LoraTarget::kGate;
    else if (proj == "up_proj")
      p.target = LoraTarget::kUp;
    else if (proj == "down_proj")
      p.target = LoraTarget::kDown;
    else {
      return absl::InvalidArgumentError(
          absl::StrCat("LoRA module \"", name, "\": not a module of this base"));
    }
    return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("LoRA module \"", name, "\": not a module of this base"));
}

// (in, out) features of a target in a layer.
std::pair<int64_t, int64_t> TargetShape(const ModelConfig& c, int64_t layer, LoraTarget t) {
  const int64_t q = c.num_attention_heads * c.head_dim;
  const int64_t kv = c.num_key_value_heads * c.head_dim;
  const int64_t inter = c.IsMoeLayer(layer) ? c.moe_intermediate_size : c.intermediate_size;
  switch (t) {
    case LoraTarget::kQ:
      return {c.hidden_size, q};
    case LoraTarget::kK:
    case LoraTarget::kV:
      return {c.hidden_size, kv};
    case LoraTarget::kO:
      return {q, c.hidden_size};
    case LoraTarget::kGate:
    case LoraTarget::kUp:
      return {c.hidden_size, inter};
    case LoraTarget::kDown:
      return {inter, c.hidden_size};
  }
  return {0, 0};
}

absl::Status CheckFactors(const std::string& name, const at::Tensor& a, const at::Tensor& b,
                          int64_t in, int64_t out, int64_t extra_dims) {
  if (!a.defined() || !b.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA module \"", name, "\": missing A or B"));
  }
  if (!at::isFloatingType(a.scalar_type()) || !at::isFloatingType(b.scalar_type())) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA module \"", name, "\": factors must be floating point"));
  }
  const int64_t dims = 2 + extra_dims;
  if (a.dim() != dims || b.dim() != dims) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA module \"", name, "\": A and B must be ", dims, "-D"));
  }
  const int64_t r = a.size(-2);
  const bool ok = r > 0 && a.size(-1) == in && b.size(-2) == out && b.size(-1) == r &&
                  (extra_dims == 0 || a.size(0) == b.size(0));
  if (!ok) {
    std::string as, bs;
    for (int64_t d : a.sizes()) absl::StrAppend(&as, as.empty() ? "" : ", ", d);
    for (int64_t d : b.sizes()) absl::StrAppend(&bs, bs.empty() ? "" : ", ", d);
    return absl::InvalidArgumentError(absl::StrCat("LoRA module \"", name, "\": A [", as,
                                                   "] and B [", bs, "] do not fit in=", in,
                                                   " out=", out, " with one rank"));
  }
  return absl::OkStatus();
}

// The whole module `name` names ("embed_tokens", "lm_head"), or nullopt.
std::optional<LoraWholeModule> WholeModuleOf(const std::string& name) {
  if (name == "embed_tokens") return LoraWholeModule::kEmbedTokens;
  if (name == "lm_head") return LoraWholeModule::kLmHead;
  return std::nullopt;
}

std::string ShapeText(const at::Tensor& t) {
  std::string s;
  for (int64_t d : t.sizes()) absl::StrAppend(&s, s.empty() ? "" : ", ", d);
  return absl::StrCat("[", s, "]");
}

// A DoRA magnitude must be 1-D with one entry per output feature.
absl::Status CheckMagnitude(const std::string& name, const at::Tensor& m, int64_t out) {
  if (!at::isFloatingType(m.scalar_type()) || m.dim() != 1 || m.size(0) != out) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA module \"", name,
                                                   "\": DoRA magnitude has shape ", ShapeText(m),
                                                   ", expected [", out, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* LoraTargetName(LoraTarget target) { return kTargetNames[static_cast<int>(target)]; }

absl::StatusOr<LoraAdapter> LoraAdapter::Create(const ModelConfig& config,
                                                std::vector<LoraModuleInput> modules,
                                                at::ScalarType dtype, at::Device device,
                                                std::vector<LoraWeightInput> weights) {
  LoraAdapter adapter;
  adapter.table_.resize(static_cast<size_t>(config.num_hidden_layers) * kNumLoraTargets);
  auto convert = [&](const at::Tensor& t) { return t.to(device, dtype); };
  for (LoraWeightInput& w : weights) {
    const std::optional<LoraWholeModule> whole = WholeModuleOf(w.module);
    if (!whole.has_value()) {
      return absl::UnimplementedError(absl::StrCat(
          "module \"", w.module, "\": only embed_tokens and lm_head can be replaced whole"));
    }
    if (!w.weight.defined() || !at::isFloatingType(w.weight.scalar_type()) || w.weight.dim() != 2 ||
        w.weight.size(0) != config.vocab_size || w.weight.size(1) != config.hidden_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("module \"", w.module, "\": weight has shape ",
                       w.weight.defined() ? ShapeText(w.weight) : "[]", ", expected [",
                       config.vocab_size, ", ", config.hidden_size, "]"));
    }
    at::Tensor& slot =
        (w.base_layer ? adapter.base_layer_ : adapter.replaced_)[static_cast<int>(*whole)];
    if (slot.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("module \"", w.module, "\" given twice"));
    }
    slot = convert(w.weight);
    adapter.has_whole_ = true;
    adapter.prepared_ = false;
    ++adapter.num_modules_;
  }
  // Per-expert inputs of one (layer, target), packed after the loop.
  std::map<std::pair<int64_t, int>, std::map<int64_t, const LoraModuleInput*>> experts;
  for (const LoraModuleInput& m : modules) {
    if (const std::optional<LoraWholeModule> whole = WholeModuleOf(m.module); whole.has_value()) {
      const bool embed = *whole == LoraWholeModule::kEmbedTokens;
      const int64_t in = embed ? config.vocab_size : config.hidden_size;
      const int64_t out = embed ? config.hidden_size : config.vocab_size;
      LORADB_RETURN_IF_ERROR(CheckFactors(m.module, m.a, m.b, in, out, 0));
      if (adapter.whole_lora_[static_cast<int>(*whole)].has_value() ||
          adapter.replaced_[static_cast<int>(*whole)].defined()) {
        return absl::InvalidArgumentError(
            absl::StrCat("LoRA module \"", m.module, "\" given twice"));
      }
      LoraFactors f{convert(m.a), convert(m.b), m.scale};
      if (m.magnitude.defined()) {
        LORADB_RETURN_IF_ERROR(CheckMagnitude(m.module, m.magnitude, out));
        f.magnitude = convert(m.magnitude);
        adapter.has_dora_ = true;
      }
      adapter.whole_lora_[static_cast<int>(*whole)] = std::move(f);
      adapter.has_whole_ = true;
      adapter.prepared_ = false;
      adapter.max_rank_ = std::max(adapter.max_rank_, m.a.size(0));
      ++adapter.num_modules_;
      continue;
    }
    LORADB_ASSIGN_OR_RETURN(ParsedModule p, ParseModuleName(config, m.module));
    if (m.magnitude.defined() && p.expert != -1) {
      return absl::UnimplementedError(
          absl::StrCat("LoRA module \"", m.module, "\": DoRA on experts is not supported"));
    }
    const auto [in, out] = TargetShape(config, p.layer, p.target);
    const size_t slot =
        static_cast<size_t>(p.layer) * kNumLoraTargets + static_cast<size_t>(p.target);
    if (p.expert == -1 || p.expert == -2) {
      const bool packed = p.expert == -2;
      LORADB_RETURN_IF_ERROR(CheckFactors(m.module, m.a, m.b, in, out, packed ? 1 : 0));
      if (packed && m.a.size(0) != config.num_experts) {
        return absl::InvalidArgumentError(absl::StrCat("LoRA module \"", m.module,
                                                       "\": ", m.a.size(0), " experts, base has ",
                                                       config.num_experts));
      }
      if (adapter.table_[slot].has_value() ||
          experts.count({p.layer, static_cast<int>(p.target)})) {
        return absl::InvalidArgumentError(
            absl::StrCat("LoRA module \"", m.module, "\" given twice"));
      }
      adapter.table_[slot] = LoraFactors{convert(m.a), convert(m.b), m.scale};
      if (m.magnitude.defined()) {
        LORADB_RETURN_IF_ERROR(CheckMagnitude(m.module, m.magnitude, out));
        adapter.table_[slot]->magnitude = convert(m.magnitude);
        adapter.has_dora_ = true;
        adapter.prepared_ = false;
      }
      adapter.max_rank_ = std::max(adapter.max_rank_, m.a.size(-2));
      adapter.num_modules_ += packed ? config.num_experts : 1;
    } else {
      LORADB_RETURN_IF_ERROR(CheckFactors(m.module, m.a, m.b, in, out, 0));
      auto& set = experts[{p.layer, static_cast<int>(p.target)}];
      if (adapter.table_[slot].has_value() || !set.emplace(p.expert, &m).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("LoRA module \"", m.module, "\" given twice"));
      }
    }
  }
  for (const auto& [key, set] : experts) {
    const auto [layer, target] = key;
    const auto [in, out] = TargetShape(config, layer, static_cast<LoraTarget>(target));
    const LoraModuleInput* first = set.begin()->second;
    const int64_t r = first->a.size(0);
    bool same_scale = true;
    for (const auto& [e, m] : set) {
      if (m->a.size(0) != r) {
        return absl::InvalidArgumentError(absl::StrCat("LoRA module \"", m->module, "\": rank ",
                                                       m->a.size(0), " differs from rank ", r,
                                                       " of the other experts of this layer"));
      }
      same_scale = same_scale && m->scale == first->scale;
    }
    // Experts without LoRA get zero factors; differing scales are folded into B.
    at::Tensor a = at::zeros({config.num_experts, r, in}, at::TensorOptions(dtype).device(device));
    at::Tensor b = at::zeros({config.num_experts, out, r}, at::TensorOptions(dtype).device(device));
    std::vector<at::Tensor> as(config.num_experts, at::Tensor()), bs(config.num_experts);
    for (int64_t e = 0; e < config.num_experts; ++e) {
      auto it = set.find(e);
      if (it == set.end()) {
        as[e] = a[e];
        bs[e] = b[e];
      } else {
        as[e] = convert(it->second->a);
        bs[e] = same_scale ? convert(it->second->b) : convert(it->second->b) * it->second->scale;
      }
    }
    const size_t slot = static_cast<size_t>(layer) * kNumLoraTargets + static_cast<size_t>(target);
    adapter.table_[slot] =
        LoraFactors{at::stack(as), at::stack(bs), same_scale ? first->scale : 1.0};
    adapter.max_rank_ = std::max(adapter.max_rank_, r);
    adapter.num_modules_ += set.size();
  }
  return adapter;
}

absl::StatusOr<LoraRowGroups> GroupLoraRows(const LoraBatch& batch, int64_t num_rows,
                                            at::Device device) {
  if (static_cast<int64_t>(batch.row_slot.size()) != num_rows) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA batch has ", batch.row_slot.size(),
                                                   " row slots for ", num_rows, " rows"));
  }
  std::map<int32_t, std::vector<int64_t>> by_slot;
  for (int64_t i = 0; i < num_rows; ++i) {
    const int32_t s = batch.row_slot[i];
    if (s < 0) continue;
    if (s >= static_cast<int32_t>(batch.adapters.size()) || batch.adapters[s] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoRA batch row ", i, " uses slot ", s, " which holds no adapter"));
    }
    by_slot[s].push_back(i);
  }
  LoraRowGroups g;
  g.contiguous = true;
  for (auto& [slot, rows] : by_slot) {
    g.slots.push_back(slot);
    g.first_row.push_back(rows.front());
    g.num_rows.push_back(static_cast<int64_t>(rows.size()));
    g.contiguous =
        g.contiguous && rows.back() - rows.front() + 1 == static_cast<int64_t>(rows.size());
    g.rows.push_back(at::from_blob(rows.data(), {static_cast<int64_t>(rows.size())}, at::kLong)
                         .to(device, /*non_blocking=*/false, /*copy=*/true));
  }
  std::vector<int32_t> rs(batch.row_slot.begin(), batch.row_slot.end());
  for (int32_t& s : rs) s = s < 0 ? -1 : s;
  g.row_slot =
      at::from_blob(rs.data(), {num_rows}, at::kInt).to(device, /*non_blocking=*/false, true);
  return g;
}

namespace {

at::Tensor Delta(const at::Tensor& x, const LoraFactors& f, int64_t expert) {
  at::Tensor a = expert >= 0 ? f.a[expert] : f.a;
  at::Tensor b = expert >= 0 ? f.b[expert] : f.b;
  if (a.scalar_type() != x.scalar_type()) a = a.to(x.scalar_type());
  if (b.scalar_type() != x.scalar_type()) b = b.to(x.scalar_type());
  return LoraDelta(x, a, b, f.scale);
}

// Every row of x belongs to one of K >= 2 slots, each a contiguous range of the same length n,
// and the K adapters have factors of one rank and dtype for this dense module: the delta is two
// batched matmuls over x viewed as [K, n, in] (no gather or scatter, one op per factor for all
// K adapters). Undefined when that does not hold.
at::Tensor StackedDelta(const at::Tensor& x, int64_t layer, LoraTarget target,
                        const LoraBatch& batch, const LoraRowGroups& groups) {
  const size_t k = groups.slots.size();
  if (!groups.contiguous || k < 2) return at::Tensor();
  const int64_t n = groups.num_rows[0];
  if (n * static_cast<int64_t>(k) != x.size(0)) return at::Tensor();
  std::vector<size_t> order(k);
  for (size_t i = 0; i < k; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return groups.first_row[a] < groups.first_row[b]; });
  std::vector<at::Tensor> as, bs;
  std::vector<double> scales;
  for (size_t j = 0; j < k; ++j) {
    const size_t i = order[j];
    if (groups.num_rows[i] != n || groups.first_row[i] != static_cast<int64_t>(j) * n) {
      return at::Tensor();
    }
    const LoraFactors* f = batch.adapters[groups.slots[i]]->Find(layer, target);
    if (f == nullptr || f->a.dim() != 2) return at::Tensor();
    if (!as.empty() &&
        (f->a.size(0) != as[0].size(0) || f->a.scalar_type() != as[0].scalar_type())) {
      return at::Tensor();
    }
    as.push_back(f->a);
    bs.push_back(f->b);
    scales.push_back(f->scale);
  }
  at::Tensor a = at::stack(as), b = at::stack(bs);  // [K, r, in], [K, out, r]
  if (a.scalar_type() != x.scalar_type()) a = a.to(x.scalar_type());
  if (b.scalar_type() != x.scalar_type()) b = b.to(x.scalar_type());
  at::Tensor xs = x.reshape({static_cast<int64_t>(k), n, x.size(1)});
  at::Tensor d = at::bmm(at::bmm(xs, a.transpose(1, 2)), b.transpose(1, 2));  // [K, n, out]
  if (std::all_of(scales.begin(), scales.end(), [&](double s) { return s == scales[0]; })) {
    d = d * scales[0];
  } else {
    at::Tensor s =
        at::tensor(scales, at::TensorOptions(at::kDouble)).to(x.device(), d.scalar_type());
    d = d * s.view({static_cast<int64_t>(k), 1, 1});
  }
  return d.reshape({x.size(0), d.size(2)});
}

}  // namespace

at::Tensor TorchLoraApplier::Apply(const at::Tensor& x, const at::Tensor& y, int64_t layer,
                                   LoraTarget target, int64_t expert, const at::Tensor& rows,
                                   const LoraBatch& batch, const LoraRowGroups& groups) const {
  at::Tensor out = y;
  if (groups.empty()) return out;
  if (!rows.defined() && expert < 0) {
    at::Tensor stacked = StackedDelta(x, layer, target, batch, groups);
    if (stacked.defined()) return out + stacked;
  }
  // Slots of the rows of x: all batch rows, or the subset routed to this expert.
  at::Tensor local_slots;
  if (rows.defined()) local_slots = groups.row_slot.index_select(0, rows);
  for (size_t i = 0; i < groups.slots.size(); ++i) {
    const LoraFactors* f = batch.adapters[groups.slots[i]]->Find(layer, target);
    if (f == nullptr) continue;
    at::Tensor idx;
    if (rows.defined()) {
      idx = (local_slots == groups.slots[i]).nonzero().squeeze(1);
      if (idx.numel() == 0) continue;
    } else {
      idx = groups.rows[i];
    }
    if (idx.numel() == x.size(0)) {
      out = out + Delta(x, *f, expert);
    } else {
      out = out.index_add(0, idx, Delta(x.index_select(0, idx), *f, expert));
    }
  }
  return out;
}

}  // namespace loradb::model

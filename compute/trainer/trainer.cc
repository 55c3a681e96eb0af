#include "compute/trainer/trainer.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/util/status_macros.h"

namespace loradb::trainer {
namespace {

// Sum of lp * w over each datum's rows: [data].
at::Tensor SequenceSums(const at::Tensor& lp, const at::Tensor& w,
                        const std::vector<int64_t>& lens) {
  std::vector<at::Tensor> sums;
  sums.reserve(lens.size());
  int64_t off = 0;
  for (int64_t n : lens) {
    sums.push_back((lp.narrow(0, off, n) * w.narrow(0, off, n)).sum());
    off += n;
  }
  return at::stack(sums);
}

// Positions whose logits a datum has: one per token with explicit targets, otherwise one per
// token but the last.
int64_t Positions(const Datum& d) {
  return static_cast<int64_t>(d.tokens.size()) - (d.targets.empty() ? 1 : 0);
}

int64_t TargetAt(const Datum& d, int64_t j) {
  return d.targets.empty() ? d.tokens[j + 1] : d.targets[j];
}

// A flat float tensor of `values`.
at::Tensor FloatTensor(const std::vector<float>& values) {
  return at::from_blob(const_cast<float*>(values.data()), {static_cast<int64_t>(values.size())},
                       at::kFloat)
      .clone();
}

}  // namespace

const char* LossKindName(LossKind kind) {
  switch (kind) {
    case LossKind::kCrossEntropy:
      return "sft";
    case LossKind::kDpo:
      return "dpo";
    case LossKind::kGrpo:
      return "grpo";
  }
  return "?";
}

Trainer::Trainer(const model::Qwen3Model* model) : model_(model) {}

absl::StatusOr<int> Trainer::AddPolicy(const PolicyOptions& options) {
  if (options.name.empty()) return absl::InvalidArgumentError("a policy needs a name");
  if (FindPolicy(options.name).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy ", options.name, " is already in this trainer"));
  }
  LORADB_RETURN_IF_ERROR(ValidateAdamWOptions(options.adamw));
  LORADB_RETURN_IF_ERROR(ValidateSchedule(options.schedule));
  if (!(options.dpo_beta > 0)) return absl::InvalidArgumentError("dpo_beta must be > 0");
  if (!(options.grpo.clip_epsilon > 0) || options.grpo.kl_beta < 0) {
    return absl::InvalidArgumentError("GRPO needs clip_epsilon > 0 and kl_beta >= 0");
  }
  LORADB_ASSIGN_OR_RETURN(
      LoraParameters params,
      LoraParameters::Create(model_->config(), options.lora, options.seed, model_->device()));
  // The RNG stream of data and sampling is independent of the initialisation stream.
  policies_.push_back(Policy{options, std::move(params), AdamW(options.adamw),
                             Rng(options.seed ^ 0x5eed5eed5eed5eedULL), 0, std::nullopt});
  return static_cast<int>(policies_.size()) - 1;
}

absl::StatusOr<int> Trainer::FindPolicy(const std::string& name) const {
  for (size_t i = 0; i < policies_.size(); ++i) {
    if (policies_[i].options.name == name) return static_cast<int>(i);
  }
  return absl::NotFoundError(absl::StrCat("no policy ", name, " in this trainer"));
}

absl::Status Trainer::SetReference(int policy, std::vector<model::LoraModuleInput> modules) {
  if (policy < 0 || policy >= num_policies()) {
    return absl::InvalidArgumentError(absl::StrCat("no policy index ", policy));
  }
  for (auto& m : modules) {
    m.a = m.a.detach().clone();
    m.b = m.b.detach().clone();
  }
  LORADB_ASSIGN_OR_RETURN(model::LoraAdapter ref,
                          model::LoraAdapter::Create(model_->config(), std::move(modules),
                                                     model_->dtype(), model_->device()));
  policies_[policy].reference = std::move(ref);
  return absl::OkStatus();
}

absl::Status Trainer::Validate(const std::vector<PolicyBatch>& batches) const {
  if (batches.empty()) return absl::InvalidArgumentError("no batches");
  const int64_t vocab = model_->config().vocab_size;
  for (const PolicyBatch& b : batches) {
    if (b.policy < 0 || b.policy >= num_policies()) {
      return absl::InvalidArgumentError(absl::StrCat("no policy index ", b.policy));
    }
    if (b.data.empty()) return absl::InvalidArgumentError("a batch has no data");
    if (b.loss == LossKind::kDpo && b.data.size() % 2 != 0) {
      return absl::InvalidArgumentError("DPO data must come in (chosen, rejected) pairs");
    }
    for (size_t i = 0; i < b.data.size(); ++i) {
      const Datum& d = b.data[i];
      if (!d.targets.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "datum ", i, " has explicit targets: those are for the token losses (TokenLosses)"));
      }
      if (d.tokens.size() < 2) {
        return absl::InvalidArgumentError(absl::StrCat("datum ", i, " has fewer than 2 tokens"));
      }
      if (d.weights.size() != d.tokens.size() - 1) {
        return absl::InvalidArgumentError(absl::StrCat("datum ", i, " has ", d.weights.size(),
                                                       " weights for ", d.tokens.size() - 1,
                                                       " targets"));
      }
      for (int64_t t : d.tokens) {
        if (t < 0 || t >= vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat("datum ", i, " has token id ", t, " outside [0, ", vocab, ")"));
        }
      }
      if (!(d.temperature > 0) || !std::isfinite(d.temperature)) {
        return absl::InvalidArgumentError(absl::StrCat("datum ", i, " has a bad temperature"));
      }
      for (float w : d.weights) {
        if (!std::isfinite(w) || w < 0) {
          return absl::InvalidArgumentError(absl::StrCat("datum ", i, " has a bad weight"));
        }
      }
      if (b.loss == LossKind::kGrpo && d.sampling_logprobs.size() != d.weights.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("GRPO datum ", i, " needs one sampling logprob per target"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> Trainer::RowLogprobs(
    const std::vector<const Datum*>& data, const std::vector<const model::LoraAdapter*>& adapters,
    const std::vector<int32_t>& slots, bool all_positions, at::Tensor* argmax_hits) const {
  // The forward's sequences: first those that continue none (a whole datum, or a prefix shared
  // by the data of one adapter whose tokens agree up to their first trained position: a GRPO
  // group's prompt, a DPO pair's), then the continuations (a datum's tokens after its prefix, up
  // to its last trained position; later rows predict nothing trained).
  struct Seq {
    std::vector<int64_t> tokens;
    int32_t slot = -1;
    int64_t continues = -1;  // index into roots
  };
  std::vector<Seq> roots, conts;
  // Per datum: its root, its continuation (-1: none) and the positions whose logits count.
  struct Plan {
    int64_t root = -1, cont = -1, first = 0, last = -1;
  };
  std::vector<Plan> plans(data.size());
  std::map<std::pair<int32_t, std::vector<int64_t>>, int64_t> root_of;
  for (size_t i = 0; i < data.size(); ++i) {
    const Datum& d = *data[i];
    Plan& plan = plans[i];
    if (all_positions || !share_prefixes_) {
      plan.root = static_cast<int64_t>(roots.size());
      plan.last = Positions(d) - 1;
      roots.push_back(Seq{d.tokens, slots[i], -1});
      continue;
    }
    const int64_t targets = static_cast<int64_t>(d.weights.size());
    int64_t first = 0, last = targets - 1;
    while (first < targets && d.weights[first] == 0) ++first;
    while (last >= first && d.weights[last] == 0) --last;
    if (first > last) continue;  // nothing trained: no rows
    plan.first = first;
    plan.last = last;
    std::vector<int64_t> prefix(d.tokens.begin(), d.tokens.begin() + first + 1);
    auto [it, fresh] =
        root_of.emplace(std::make_pair(slots[i], prefix), static_cast<int64_t>(roots.size()));
    if (fresh) roots.push_back(Seq{std::move(prefix), slots[i], -1});
    plan.root = it->second;
    if (last > first) {
      plan.cont = static_cast<int64_t>(conts.size());
      conts.push_back(
          Seq{std::vector<int64_t>(d.tokens.begin() + first + 1, d.tokens.begin() + last + 1),
              slots[i], it->second});
    }
  }

  std::vector<int64_t> ids, seq_lens, continues, root_row, cont_row;
  std::vector<int32_t> row_slot;
  for (const Seq& s : roots) {
    root_row.push_back(static_cast<int64_t>(ids.size()));
    ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
    seq_lens.push_back(static_cast<int64_t>(s.tokens.size()));
    continues.push_back(-1);
    row_slot.insert(row_slot.end(), s.tokens.size(), s.slot);
  }
  for (const Seq& s : conts) {
    cont_row.push_back(static_cast<int64_t>(ids.size()));
    ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
    seq_lens.push_back(static_cast<int64_t>(s.tokens.size()));
    continues.push_back(s.continues);
    row_slot.insert(row_slot.end(), s.tokens.size(), s.slot);
  }
  // The logits to compute: forward row, target token, temperature, and where the log-prob goes
  // in the output (position j of datum i at offset(i) + j).
  std::vector<int64_t> logit_rows, targets, out_index;
  std::vector<float> inv_temp;
  bool tempered = false;
  int64_t offset = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    const Datum& d = *data[i];
    const Plan& plan = plans[i];
    for (int64_t j = plan.first; j <= plan.last && plan.root >= 0; ++j) {
      int64_t row = root_row[plan.root] + j;
      if (plan.cont >= 0 && j > plan.first) row = cont_row[plan.cont] + (j - plan.first - 1);
      logit_rows.push_back(row);
      targets.push_back(TargetAt(d, j));
      out_index.push_back(offset + j);
      inv_temp.push_back(1.0f / d.temperature);
    }
    tempered = tempered || d.temperature != 1.0f;
    offset += static_cast<int64_t>(d.tokens.size());
  }
  const int64_t total = offset;
  const int64_t picked = static_cast<int64_t>(logit_rows.size());
  if (picked == 0) {
    if (argmax_hits != nullptr) *argmax_hits = at::zeros({total}, at::kFloat);
    return at::zeros({total}, at::kFloat);
  }

  const int64_t rows = static_cast<int64_t>(ids.size());
  model::ForwardInput in;
  in.token_ids = at::from_blob(ids.data(), {rows}, at::kLong).clone();
  in.seq_lens = std::move(seq_lens);
  if (!conts.empty()) in.continues = std::move(continues);
  in.logit_rows = std::move(logit_rows);
  model::LoraBatch lora;
  if (!adapters.empty()) {
    lora.adapters = adapters;
    lora.row_slot = std::move(row_slot);
    in.lora = &lora;
  }
  LORADB_ASSIGN_OR_RETURN(model::ForwardOutput out, model_->Forward(in));
  if (!all_positions) loss_forward_rows_ += rows;
  const at::Device device = out.logits.device();
  at::Tensor tgt = at::from_blob(targets.data(), {picked}, at::kLong).clone().to(device);
  at::Tensor where = at::from_blob(out_index.data(), {picked}, at::kLong).clone();
  if (argmax_hits != nullptr) {
    at::NoGradGuard no_grad;
    at::Tensor hits = (out.logits.argmax(-1) == tgt).to(at::kFloat).to(at::kCPU);
    *argmax_hits = at::zeros({total}, at::kFloat).index_add(0, where, hits);
  }
  at::Tensor logits = out.logits;
  if (tempered) {
    at::Tensor scale = at::from_blob(inv_temp.data(), {picked}, at::kFloat)
                           .clone()
                           .to(device, logits.scalar_type());
    logits = logits * scale.unsqueeze(1);
  }
  return at::zeros({total}, at::kFloat)
      .index_add(0, where, TokenLogprobs(logits, tgt).to(at::kCPU));
}

absl::StatusOr<std::vector<LossReport>> Trainer::RunLosses(const std::vector<PolicyBatch>& batches,
                                                           bool backward) {
  LORADB_RETURN_IF_ERROR(Validate(batches));
  std::optional<at::NoGradGuard> no_grad;
  if (!backward) no_grad.emplace();

  // Flatten: every datum with its batch, and per-row weights.
  std::vector<const Datum*> all;
  std::vector<int64_t> lens;
  for (const PolicyBatch& b : batches) {
    for (const Datum& d : b.data) {
      all.push_back(&d);
      lens.push_back(static_cast<int64_t>(d.tokens.size()));
    }
  }

  // Reference pass (no grad): DPO, and GRPO with a KL term.
  std::vector<at::Tensor> ref_lp(batches.size());
  {
    std::vector<const Datum*> rdata;
    std::vector<const model::LoraAdapter*> radapters;
    std::vector<int32_t> rslots;
    std::vector<size_t> rbatches;
    std::map<int, int32_t> slot_of;
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      const PolicyBatch& b = batches[bi];
      const Policy& p = policies_[b.policy];
      const bool needs =
          b.loss == LossKind::kDpo || (b.loss == LossKind::kGrpo && p.options.grpo.kl_beta > 0);
      if (!needs) continue;
      rbatches.push_back(bi);
      int32_t slot = -1;
      if (p.reference.has_value()) {
        auto [it, fresh] = slot_of.emplace(b.policy, static_cast<int32_t>(radapters.size()));
        if (fresh) radapters.push_back(&*p.reference);
        slot = it->second;
      }
      for (const Datum& d : b.data) {
        rdata.push_back(&d);
        rslots.push_back(slot);
      }
    }
    if (!rdata.empty()) {
      at::NoGradGuard ref_no_grad;
      LORADB_ASSIGN_OR_RETURN(
          at::Tensor lp, RowLogprobs(rdata, radapters, rslots, /*all_positions=*/false, nullptr));
      int64_t off = 0;
      for (size_t bi : rbatches) {
        int64_t n = 0;
        for (const Datum& d : batches[bi].data) n += static_cast<int64_t>(d.tokens.size());
        ref_lp[bi] = lp.narrow(0, off, n);
        off += n;
      }
    }
  }

  // Policy pass: one forward over every batch's rows, each row with its policy's adapter.
  std::vector<int> policy_of;
  for (const PolicyBatch& b : batches) policy_of.insert(policy_of.end(), b.data.size(), b.policy);
  std::vector<model::LoraAdapter> built;
  std::vector<int32_t> slots;
  LORADB_RETURN_IF_ERROR(BuildAdapters(policy_of, &built, &slots));
  std::vector<const model::LoraAdapter*> adapters;
  for (const auto& a : built) adapters.push_back(&a);
  at::Tensor hits;
  LORADB_ASSIGN_OR_RETURN(at::Tensor lp,
                          RowLogprobs(all, adapters, slots, /*all_positions=*/false, &hits));

  std::vector<LossReport> reports;
  at::Tensor total;
  int64_t off = 0;
  for (size_t bi = 0; bi < batches.size(); ++bi) {
    const PolicyBatch& b = batches[bi];
    const Policy& p = policies_[b.policy];
    std::vector<float> w, old, adv;
    std::vector<int64_t> blens;
    for (const Datum& d : b.data) {
      w.insert(w.end(), d.weights.begin(), d.weights.end());
      w.push_back(0);
      blens.push_back(static_cast<int64_t>(d.tokens.size()));
      if (b.loss == LossKind::kGrpo) {
        old.insert(old.end(), d.sampling_logprobs.begin(), d.sampling_logprobs.end());
        old.push_back(0);
        adv.insert(adv.end(), d.tokens.size(), d.advantage);
      }
    }
    const int64_t n = static_cast<int64_t>(w.size());
    at::Tensor wt = at::from_blob(w.data(), {n}, at::kFloat).clone();
    at::Tensor blp = lp.narrow(0, off, n);
    at::Tensor bhits = hits.narrow(0, off, n);
    off += n;
    LossReport r;
    r.policy = b.policy;
    const double wsum = wt.sum().item<double>();
    r.tokens = static_cast<int64_t>(std::llround(wsum));
    at::Tensor loss;
    switch (b.loss) {
      case LossKind::kCrossEntropy: {
        LORADB_ASSIGN_OR_RETURN(loss, SftLoss(blp, wt));
        r.accuracy = (bhits * wt).sum().item<double>() / wsum;
        break;
      }
      case LossKind::kDpo: {
        at::Tensor sums = SequenceSums(blp, wt, blens);
        at::Tensor rsums = SequenceSums(ref_lp[bi], wt, blens);
        const int64_t pairs = static_cast<int64_t>(blens.size()) / 2;
        at::Tensor even = at::arange(0, 2 * pairs, 2, at::kLong);
        at::Tensor odd = even + 1;
        LORADB_ASSIGN_OR_RETURN(
            DpoOutput o,
            DpoLoss(sums.index_select(0, even), sums.index_select(0, odd),
                    rsums.index_select(0, even), rsums.index_select(0, odd), p.options.dpo_beta));
        loss = o.loss;
        r.metric = o.margins.mean().item<double>();
        r.accuracy = (o.margins > 0).to(at::kFloat).mean().item<double>();
        break;
      }
      case LossKind::kGrpo: {
        at::Tensor oldt = at::from_blob(old.data(), {n}, at::kFloat).clone();
        at::Tensor advt = at::from_blob(adv.data(), {n}, at::kFloat).clone();
        at::Tensor ref = ref_lp[bi].defined() ? ref_lp[bi] : at::Tensor();
        LORADB_ASSIGN_OR_RETURN(GrpoOutput o, GrpoLoss(blp, oldt, advt, wt, ref, p.options.grpo));
        loss = o.loss;
        r.metric = o.clip_fraction;
        r.kl = o.mean_kl;
        r.accuracy = (bhits * wt).sum().item<double>() / wsum;
        break;
      }
    }
    r.loss = loss.item<double>();
    if (!std::isfinite(r.loss)) {
      return absl::InvalidArgumentError(absl::StrCat("policy ", p.options.name, ": ",
                                                     LossKindName(b.loss), " loss is not finite"));
    }
    total = total.defined() ? total + loss : loss;
    reports.push_back(r);
  }
  if (backward) {
    total.backward();
    for (const PolicyBatch& b : batches) ++policies_[b.policy].micro_steps;
  }
  return reports;
}

absl::StatusOr<std::vector<LossReport>> Trainer::ForwardBackward(
    const std::vector<PolicyBatch>& batches) {
  try {
    return RunLosses(batches, /*backward=*/true);
  } catch (const std::exception& e) {
    // LibTorch reports failures by exception; none crosses the trainer's API.
    return absl::InternalError(absl::StrCat("forward/backward failed: ", e.what()));
  }
}

absl::StatusOr<std::vector<LossReport>> Trainer::Evaluate(const std::vector<PolicyBatch>& batches) {
  try {
    return RunLosses(batches, /*backward=*/false);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("evaluation failed: ", e.what()));
  }
}

absl::StatusOr<StepStats> Trainer::OptimStep(int policy) {
  if (policy < 0 || policy >= num_policies()) {
    return absl::InvalidArgumentError(absl::StrCat("no policy index ", policy));
  }
  Policy& p = policies_[policy];
  if (p.micro_steps == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("policy ", p.options.name, ": no gradients accumulated since the last step"));
  }
  const double lr = p.options.schedule.At(p.adamw.step());
  LORADB_ASSIGN_OR_RETURN(StepStats stats, p.adamw.Step(p.params.named(), lr,
                                                        1.0 / static_cast<double>(p.micro_steps)));
  ClearGradients(p);
  return stats;
}

absl::StatusOr<StepStats> Trainer::OptimStep(int policy, double lr, const AdamWOptions& hyper) {
  if (policy < 0 || policy >= num_policies()) {
    return absl::InvalidArgumentError(absl::StrCat("no policy index ", policy));
  }
  if (!(lr >= 0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrCat("learning rate ", lr, " must be >= 0"));
  }
  Policy& p = policies_[policy];
  if (p.micro_steps == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("policy ", p.options.name, ": no gradients accumulated since the last step"));
  }
  LORADB_ASSIGN_OR_RETURN(StepStats stats, p.adamw.Step(p.params.named(), lr, 1.0, hyper));
  ClearGradients(p);
  return stats;
}

void Trainer::ClearGradients(Policy& p) {
  for (const auto& [name, t] : p.params.named()) {
    at::Tensor param = t;
    param.mutable_grad() = at::Tensor();
  }
  p.micro_steps = 0;
}

absl::Status Trainer::BuildAdapters(const std::vector<int>& policy_of_datum,
                                    std::vector<model::LoraAdapter>* built,
                                    std::vector<int32_t>* slots) const {
  std::map<int, int32_t> slot_of;
  slots->clear();
  for (int policy : policy_of_datum) {
    if (policy < 0) {
      slots->push_back(-1);
      continue;
    }
    auto [it, fresh] = slot_of.emplace(policy, static_cast<int32_t>(built->size()));
    if (fresh) {
      LORADB_ASSIGN_OR_RETURN(model::LoraAdapter a,
                              policies_[policy].params.BuildAdapter(
                                  model_->config(), model_->dtype(), model_->device()));
      built->push_back(std::move(a));
    }
    slots->push_back(it->second);
  }
  return absl::OkStatus();
}

absl::Status Trainer::ValidateTokenBatches(const std::vector<TokenBatch>& batches) const {
  if (batches.empty()) return absl::InvalidArgumentError("no batches");
  const int64_t vocab = model_->config().vocab_size;
  auto finite = [](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
  };
  for (const TokenBatch& b : batches) {
    if (b.policy < 0 || b.policy >= num_policies()) {
      return absl::InvalidArgumentError(absl::StrCat("no policy index ", b.policy));
    }
    if (b.data.empty()) return absl::InvalidArgumentError("a batch has no data");
    const bool rl = b.loss != TokenLossKind::kCrossEntropy;
    for (size_t i = 0; i < b.data.size(); ++i) {
      const Datum& d = b.data[i];
      const size_t n = d.tokens.size();
      if (n == 0) return absl::InvalidArgumentError(absl::StrCat("datum ", i, " has no tokens"));
      if (d.targets.size() != n || d.weights.size() != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("datum ", i, " has ", n, " input tokens but ", d.targets.size(),
                         " targets and ", d.weights.size(), " weights"));
      }
      if (rl && (d.sampling_logprobs.size() != n || d.advantages.size() != n)) {
        return absl::InvalidArgumentError(
            absl::StrCat(TokenLossName(b.loss), " datum ", i, " has ", n, " input tokens but ",
                         d.sampling_logprobs.size(), " sampling logprobs and ", d.advantages.size(),
                         " advantages"));
      }
      for (const std::vector<int64_t>* ids : {&d.tokens, &d.targets}) {
        for (int64_t t : *ids) {
          if (t < 0 || t >= vocab) {
            return absl::InvalidArgumentError(
                absl::StrCat("datum ", i, " has token id ", t, " outside [0, ", vocab, ")"));
          }
        }
      }
      if (!finite(d.weights) || !finite(d.sampling_logprobs) || !finite(d.advantages)) {
        return absl::InvalidArgumentError(
            absl::StrCat("datum ", i, " has a non-finite weight, logprob or advantage"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TokenBatchResult>> Trainer::TokenLosses(
    const std::vector<TokenBatch>& batches, bool backward) {
  try {
    return RunTokenLosses(batches, backward);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("token losses failed: ", e.what()));
  }
}

absl::StatusOr<std::vector<TokenBatchResult>> Trainer::RunTokenLosses(
    const std::vector<TokenBatch>& batches, bool backward) {
  LORADB_RETURN_IF_ERROR(ValidateTokenBatches(batches));
  std::optional<at::NoGradGuard> no_grad;
  if (!backward) no_grad.emplace();
  std::vector<const Datum*> all;
  std::vector<int> policy_of;
  for (const TokenBatch& b : batches) {
    for (const Datum& d : b.data) {
      all.push_back(&d);
      policy_of.push_back(b.policy);
    }
  }
  std::vector<model::LoraAdapter> built;
  std::vector<int32_t> slots;
  LORADB_RETURN_IF_ERROR(BuildAdapters(policy_of, &built, &slots));
  std::vector<const model::LoraAdapter*> adapters;
  for (const auto& a : built) adapters.push_back(&a);
  LORADB_ASSIGN_OR_RETURN(at::Tensor lp,
                          RowLogprobs(all, adapters, slots, /*all_positions=*/true, nullptr));

  std::vector<TokenBatchResult> results;
  at::Tensor total;
  int64_t off = 0;
  for (const TokenBatch& b : batches) {
    // Explicit targets: a datum's positions are exactly its tokens' slots in `lp`.
    std::vector<float> w, old, adv;
    for (const Datum& d : b.data) {
      w.insert(w.end(), d.weights.begin(), d.weights.end());
      old.insert(old.end(), d.sampling_logprobs.begin(), d.sampling_logprobs.end());
      adv.insert(adv.end(), d.advantages.begin(), d.advantages.end());
    }
    const int64_t n = static_cast<int64_t>(w.size());
    at::Tensor blp = lp.narrow(0, off, n);
    off += n;
    const bool rl = b.loss != TokenLossKind::kCrossEntropy;
    LORADB_ASSIGN_OR_RETURN(
        at::Tensor elements,
        TokenLossElements(b.loss, blp, FloatTensor(w), rl ? FloatTensor(old) : at::Tensor(),
                          rl ? FloatTensor(adv) : at::Tensor(), b.options));
    at::Tensor loss = elements.sum();
    TokenBatchResult r;
    r.policy = b.policy;
    r.loss_sum = loss.item<double>();
    if (!std::isfinite(r.loss_sum)) {
      return absl::InvalidArgumentError(absl::StrCat("policy ", policies_[b.policy].options.name,
                                                     ": ", TokenLossName(b.loss),
                                                     " loss is not finite"));
    }
    at::Tensor lpc = blp.detach().contiguous();
    at::Tensor elc = elements.detach().contiguous();
    const float* lpp = lpc.data_ptr<float>();
    const float* elp = elc.data_ptr<float>();
    for (const Datum& d : b.data) {
      const size_t len = d.tokens.size();
      r.logprobs.emplace_back(lpp, lpp + len);
      r.elementwise_loss.emplace_back(elp, elp + len);
      lpp += len;
      elp += len;
    }
    total = total.defined() ? total + loss : loss;
    results.push_back(std::move(r));
  }
  if (backward) {
    total.backward();
    for (const TokenBatch& b : batches) ++policies_[b.policy].micro_steps;
  }
  return results;
}

absl::StatusOr<std::vector<std::vector<float>>> Trainer::Logprobs(int policy,
                                                                  const std::vector<Datum>& data) {
  if (policy < -1 || policy >= num_policies()) {
    return absl::InvalidArgumentError(absl::StrCat("no policy index ", policy));
  }
  if (data.empty()) return std::vector<std::vector<float>>{};
  at::NoGradGuard no_grad;
  std::vector<const Datum*> ptrs;
  for (const Datum& d : data) {
    if (d.tokens.size() < 2) return absl::InvalidArgumentError("a datum has fewer than 2 tokens");
    ptrs.push_back(&d);
  }
  std::vector<model::LoraAdapter> built;
  std::vector<const model::LoraAdapter*> adapters;
  std::vector<int32_t> slots(data.size(), -1);
  if (policy >= 0) {
    LORADB_ASSIGN_OR_RETURN(
        model::LoraAdapter a,
        policies_[policy].params.BuildAdapter(model_->config(), model_->dtype(), model_->device()));
    built.push_back(std::move(a));
    adapters.push_back(&built[0]);
    std::fill(slots.begin(), slots.end(), 0);
  }
  LORADB_ASSIGN_OR_RETURN(at::Tensor lp,
                          RowLogprobs(ptrs, adapters, slots, /*all_positions=*/true, nullptr));
  lp = lp.contiguous();
  const float* p = lp.data_ptr<float>();
  std::vector<std::vector<float>> out;
  for (const Datum& d : data) {
    out.emplace_back(p, p + d.tokens.size() - 1);
    p += d.tokens.size();
  }
  return out;
}

absl::StatusOr<std::vector<SampleResult>> Trainer::Sample(
    const std::vector<SampleRequest>& requests) {
  try {
    return SampleImpl(requests);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("sampling failed: ", e.what()));
  }
}

absl::StatusOr<std::vector<SampleResult>> Trainer::SampleImpl(
    const std::vector<SampleRequest>& requests) {
  const int64_t vocab = model_->config().vocab_size;
  for (const SampleRequest& r : requests) {
    if (r.policy < -1 || r.policy >= num_policies()) {
      return absl::InvalidArgumentError(absl::StrCat("no policy index ", r.policy));
    }
    if (r.prompt.empty()) return absl::InvalidArgumentError("a sample request has no prompt");
    if (r.max_tokens < 1) return absl::InvalidArgumentError("max_tokens must be >= 1");
    if (!(r.temperature >= 0)) return absl::InvalidArgumentError("temperature must be >= 0");
    for (int64_t t : r.prompt) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("prompt token ", t, " outside the vocab"));
      }
    }
  }
  std::vector<SampleResult> results(requests.size());
  if (requests.empty()) return results;
  at::NoGradGuard no_grad;

  std::vector<int> policy_of;
  for (const SampleRequest& r : requests) policy_of.push_back(r.policy);
  std::vector<model::LoraAdapter> built;
  std::vector<int32_t> request_slot;
  LORADB_RETURN_IF_ERROR(BuildAdapters(policy_of, &built, &request_slot));
  std::vector<const model::LoraAdapter*> adapters;
  for (const auto& a : built) adapters.push_back(&a);

  // Requests of one policy with the same prompt (a GRPO group) share the prompt's prefill: it
  // runs once, each request samples its first token from those logits (in request order, so
  // every RNG stream draws as if each had its own prefill), and the requests that continue
  // fork the prompt's cache.
  model::KvCache cache = model_->NewKvCache();
  std::map<std::pair<int, std::vector<int64_t>>, size_t> prefix_index;
  std::vector<size_t> prefix_of(requests.size()), prefix_first;
  std::vector<int64_t> prefix_reserve;
  for (size_t i = 0; i < requests.size(); ++i) {
    const SampleRequest& r = requests[i];
    auto [it, fresh] =
        prefix_index.emplace(std::make_pair(r.policy, r.prompt), prefix_first.size());
    if (fresh) {
      prefix_first.push_back(i);
      prefix_reserve.push_back(0);
    }
    prefix_of[i] = it->second;
    prefix_reserve[it->second] =
        std::max(prefix_reserve[it->second], static_cast<int64_t>(r.prompt.size()) + r.max_tokens);
  }
  std::vector<model::KvCache::SeqId> prefix_seq;
  for (int64_t reserve : prefix_reserve) prefix_seq.push_back(cache.AddSequence(reserve));
  std::vector<model::KvCache::SeqId> seqs(requests.size(), -1);
  std::vector<size_t> active(requests.size());
  for (size_t i = 0; i < active.size(); ++i) active[i] = i;
  // The token to feed per active request in the next forward (after the prefill).
  std::vector<int64_t> feed(requests.size(), 0);

  bool prefill = true;
  while (!active.empty()) {
    model::ForwardInput in;
    std::vector<int64_t> ids;
    model::LoraBatch lora;
    lora.adapters = adapters;
    // Logits row of each active request.
    std::vector<size_t> row_of(active.size());
    if (prefill) {
      for (size_t u = 0; u < prefix_first.size(); ++u) {
        const SampleRequest& r = requests[prefix_first[u]];
        ids.insert(ids.end(), r.prompt.begin(), r.prompt.end());
        in.seq_lens.push_back(static_cast<int64_t>(r.prompt.size()));
        in.cache_seqs.push_back(prefix_seq[u]);
        lora.row_slot.insert(lora.row_slot.end(), r.prompt.size(), request_slot[prefix_first[u]]);
      }
      for (size_t k = 0; k < active.size(); ++k) row_of[k] = prefix_of[active[k]];
    } else {
      for (size_t k = 0; k < active.size(); ++k) {
        const size_t i = active[k];
        ids.push_back(feed[i]);
        in.seq_lens.push_back(1);
        in.cache_seqs.push_back(seqs[i]);
        lora.row_slot.push_back(request_slot[i]);
        row_of[k] = k;
      }
    }
    in.token_ids = at::from_blob(ids.data(), {static_cast<int64_t>(ids.size())}, at::kLong).clone();
    in.lora = adapters.empty() ? nullptr : &lora;
    in.last_row_logits_only = true;
    LORADB_ASSIGN_OR_RETURN(model::ForwardOutput out, model_->Forward(in, &cache));
    // Every distribution at once (vectorized), one per distinct (logits row, temperature) — the
    // samples of a prefilled prompt share its row: exp((logit - max) / T) and its running sum,
    // which the request's uniform draw searches; the last running sum is the normaliser.
    at::Tensor logits = out.logits.to(at::kCPU, at::kDouble).contiguous();
    std::map<std::pair<size_t, double>, int64_t> dist_of;
    std::vector<int64_t> dist_row;
    std::vector<double> inv_t;
    std::vector<int64_t> dist(active.size());
    for (size_t k = 0; k < active.size(); ++k) {
      const double t = requests[active[k]].temperature;
      auto [it, fresh] = dist_of.emplace(std::make_pair(row_of[k], t), dist_row.size());
      if (fresh) {
        dist_row.push_back(static_cast<int64_t>(row_of[k]));
        inv_t.push_back(t > 0 ? 1.0 / t : 1.0);
      }
      dist[k] = it->second;
    }
    const int64_t n_dist = static_cast<int64_t>(dist_row.size());
    at::Tensor shifted = logits - std::get<0>(logits.max(-1, /*keepdim=*/true));
    at::Tensor scaled =
        (shifted.index_select(0, at::from_blob(dist_row.data(), {n_dist}, at::kLong)) *
         at::from_blob(inv_t.data(), {n_dist, 1}, at::kDouble))
            .contiguous();
    at::Tensor cdf = scaled.exp().cumsum(-1).contiguous();
    const double* base = logits.data_ptr<double>();
    const double* scaled_base = scaled.data_ptr<double>();
    const double* cdf_base = cdf.data_ptr<double>();
    std::vector<size_t> still;
    for (size_t k = 0; k < active.size(); ++k) {
      const size_t i = active[k];
      const SampleRequest& r = requests[i];
      const double* row = base + row_of[k] * vocab;
      const double* c = cdf_base + dist[k] * vocab;
      int64_t tok = 0;
      if (r.temperature == 0) {
        tok = std::max_element(row, row + vocab) - row;
      } else {
        Rng& rng = r.policy < 0 ? base_rng_ : policies_[r.policy].rng;
        // The first token whose running sum passes u (the last one if rounding leaves u at
        // the very top).
        const double u = rng.Uniform() * c[vocab - 1];
        tok = std::min<int64_t>(std::upper_bound(c, c + vocab, u) - c, vocab - 1);
      }
      SampleResult& res = results[i];
      res.tokens.push_back(tok);
      // log softmax(row / T) at tok (T = 1 for greedy requests).
      res.logprobs.push_back(
          static_cast<float>(scaled_base[dist[k] * vocab + tok] - std::log(c[vocab - 1])));
      const bool stop =
          std::find(r.stop_tokens.begin(), r.stop_tokens.end(), tok) != r.stop_tokens.end();
      if (!stop && static_cast<int64_t>(res.tokens.size()) < r.max_tokens) {
        feed[i] = tok;
        still.push_back(i);
      }
    }
    if (prefill) {
      // Continuing requests take their prompt's cache: the last one of each prompt the
      // prefilled sequence itself, the others a copy.
      std::vector<size_t> left(prefix_first.size(), 0);
      for (size_t i : still) ++left[prefix_of[i]];
      for (size_t i : still) {
        const size_t u = prefix_of[i];
        if (--left[u] == 0) {
          seqs[i] = prefix_seq[u];
        } else {
          LORADB_ASSIGN_OR_RETURN(seqs[i], cache.Fork(prefix_seq[u], requests[i].max_tokens));
        }
      }
      prefill = false;
    }
    active = std::move(still);
  }
  return results;
}

absl::StatusOr<PolicySnapshot> Trainer::Snapshot(int policy) const {
  if (policy < 0 || policy >= num_policies()) {
    return absl::InvalidArgumentError(absl::StrCat("no policy index ", policy));
  }
  const Policy& p = policies_[policy];
  PolicySnapshot s;
  for (const auto& [name, t] : p.params.named()) {
    s.master[name] = t.detach().clone();
    if (p.micro_steps > 0) {
      at::Tensor g = t.grad();
      s.gradients[name] = g.defined() ? g.detach().clone() : at::zeros_like(t.detach());
    }
  }
  for (const auto& [name, t] : p.adamw.ExportState()) s.optimizer[name] = t.detach().clone();
  s.micro_steps = p.micro_steps;
  s.scheduler_name = p.options.schedule.Name();
  s.scheduler_position = p.adamw.step();
  s.rng_state = p.rng.Serialize();
  s.lora_rank = p.params.config().rank;
  s.lora_alpha = p.params.config().alpha;
  s.use_rslora = p.params.config().use_rslora;
  return s;
}

absl::Status Trainer::Restore(int policy, const PolicySnapshot& s) {
  if (policy < 0 || policy >= num_policies()) {
    return absl::InvalidArgumentError(absl::StrCat("no policy index ", policy));
  }
  Policy& p = policies_[policy];
  if (s.scheduler_name != p.options.schedule.Name()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint uses the ", s.scheduler_name,
                                                   " schedule, this policy ",
                                                   p.options.schedule.Name()));
  }
  if (s.micro_steps < 0) return absl::InvalidArgumentError("negative micro-step count");
  if (s.lora_alpha != 0) {
    if (!(s.lora_alpha > 0) || !std::isfinite(s.lora_alpha)) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint has LoRA alpha ", s.lora_alpha));
    }
    if (s.lora_rank != p.params.config().rank) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint has LoRA rank ", s.lora_rank,
                                                     ", this policy ", p.params.config().rank));
    }
  }
  AdamW adamw(p.options.adamw);
  LORADB_RETURN_IF_ERROR(adamw.ImportState(s.optimizer, p.params.named()));
  if (adamw.step() != s.scheduler_position) {
    return absl::InvalidArgumentError(absl::StrCat("scheduler position ", s.scheduler_position,
                                                   " differs from the optimizer step ",
                                                   adamw.step()));
  }
  LORADB_ASSIGN_OR_RETURN(Rng rng, Rng::Restore(s.rng_state));
  if (s.micro_steps > 0) {
    for (const auto& [name, t] : p.params.named()) {
      auto it = s.gradients.find(name);
      if (it == s.gradients.end() || !it->second.sizes().equals(t.sizes())) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint lacks the accumulated gradient of ", name));
      }
    }
    if (s.gradients.size() != p.params.named().size()) {
      return absl::InvalidArgumentError("checkpoint has gradients for unknown parameters");
    }
  } else if (!s.gradients.empty()) {
    return absl::InvalidArgumentError("checkpoint has gradients but no accumulated micro-steps");
  }
  LORADB_RETURN_IF_ERROR(p.params.Assign(s.master));
  if (s.lora_alpha != 0) {
    LORADB_RETURN_IF_ERROR(p.params.SetScaling(s.lora_alpha, s.use_rslora));
    p.options.lora.alpha = s.lora_alpha;
    p.options.lora.use_rslora = s.use_rslora;
  }
  p.adamw = std::move(adamw);
  p.rng = rng;
  p.micro_steps = s.micro_steps;
  for (const auto& [name, t] : p.params.named()) {
    at::Tensor param = t;
    param.mutable_grad() =
        s.micro_steps > 0 ? s.gradients.at(name).to(t.device(), at::kFloat).clone() : at::Tensor();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, at::Tensor>> Trainer::ExportWeights(
    int policy, at::ScalarType dtype) const {
  if (policy < 0 || policy >= num_policies()) {
    return absl::InvalidArgumentError(absl::StrCat("no policy index ", policy));
  }
  const LoraParameters& params = policies_[policy].params;
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : params.named()) out[name] = t.detach().to(at::kCPU, dtype).clone();
  // A shared expert A is exported under every part's name (the per-expert layout).
  for (const auto& [name, first] : params.shared()) out[name] = out.at(first);
  return out;
}

}  // namespace loradb::trainer

#include "storage/formats/peft_experts.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "storage/util/status_macros.h"

namespace loradb::peft {
namespace {

// Memory for converted tensors, plus the backing of the views passed through.
struct Buffers {
  std::shared_ptr<const void> source;
  std::vector<std::unique_ptr<std::byte[]>> owned;
  std::byte* Allocate(size_t n) {
    owned.push_back(std::make_unique<std::byte[]>(n));
    return owned.back().get();
  }
};

// True when `module_key` is "<anything>layers.<L>.<layout.module>".
bool IsExpertsModule(const std::string& module_key, const ExpertsLayout& layout) {
  const std::string tail = absl::StrCat(".", layout.module);
  if (!absl::EndsWith(module_key, tail)) return false;
  absl::string_view head(module_key);
  head.remove_suffix(tail.size());
  const size_t dot = head.rfind('.');
  int64_t layer = 0;
  absl::string_view before = dot == absl::string_view::npos ? "" : head.substr(0, dot + 1);
  return absl::SimpleAtoi(head.substr(dot == absl::string_view::npos ? 0 : dot + 1), &layer) &&
         absl::EndsWith(before, "layers.") &&
         (before.size() == 7 || absl::EndsWith(before, ".layers."));
}

// For a per-expert module key "<experts module>.<e>.<part>": the experts module key, e, part.
bool SplitPerExpertKey(const std::string& module_key, const ExpertsLayout& layout,
                       std::string* experts, int64_t* expert, std::string* part) {
  const size_t last = module_key.rfind('.');
  if (last == std::string::npos) return false;
  const size_t mid = module_key.rfind('.', last - 1);
  if (mid == std::string::npos || mid == 0) return false;
  if (!absl::SimpleAtoi(module_key.substr(mid + 1, last - mid - 1), expert)) return false;
  *experts = module_key.substr(0, mid);
  *part = module_key.substr(last + 1);
  return IsExpertsModule(*experts, layout);
}

std::string EscapeRegex(const std::string& s) { return absl::StrReplaceAll(s, {{".", "\\."}}); }

std::string PerExpertName(const std::string& experts, int64_t e, const std::string& part,
                          LoraSide side) {
  return PeftTensorNameFor(absl::StrCat(experts, ".", e, ".", part), side, false);
}

std::string FusedName(const std::string& experts, int depth, LoraSide side) {
  std::string key = experts;
  for (int i = 0; i < depth; ++i) absl::StrAppend(&key, ".base_layer");
  return PeftTensorNameFor(key, side, false);
}

}  // namespace

int64_t ExpertParameter::out() const {
  int64_t n = 0;
  for (const auto& [name, rows] : parts) n += rows;
  return n;
}

ExpertsLayout Qwen3MoeExpertsLayout(int64_t num_experts, int64_t hidden_size,
                                    int64_t moe_intermediate_size) {
  ExpertsLayout l;
  l.module = "mlp.experts";
  l.num_experts = num_experts;
  l.params.push_back({"gate_up_proj",
                      hidden_size,
                      {{"gate_proj", moe_intermediate_size}, {"up_proj", moe_intermediate_size}}});
  l.params.push_back({"down_proj", moe_intermediate_size, {{"down_proj", hidden_size}}});
  return l;
}

absl::StatusOr<std::vector<size_t>> TargetedParameters(const LoraConfig& config,
                                                       const ExpertsLayout& layout) {
  std::set<size_t> hit;
  for (const std::string& entry : config.target_parameters) {
    const size_t dot = entry.rfind('.');
    const std::string module = dot == std::string::npos ? "" : entry.substr(0, dot);
    const std::string param = dot == std::string::npos ? entry : entry.substr(dot + 1);
    bool found = false;
    for (size_t i = 0; i < layout.params.size(); ++i) {
      if (layout.params[i].name != param) continue;
      if (!module.empty() && module != layout.module &&
          !absl::EndsWith(layout.module, absl::StrCat(".", module))) {
        continue;
      }
      hit.insert(i);
      found = true;
    }
    if (!found) {
      std::vector<std::string> have;
      for (const ExpertParameter& p : layout.params) {
        have.push_back(absl::StrCat(layout.module, ".", p.name));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "target_parameters names \"", entry, "\", a parameter the base does not have (its ",
          "expert parameters: ", absl::StrJoin(have, ", "), ")"));
    }
  }
  return std::vector<size_t>(hit.begin(), hit.end());
}

absl::StatusOr<TensorSet> UnfuseTargetParameters(const LoraConfig& config, const TensorSet& tensors,
                                                 const ExpertsLayout& layout,
                                                 LoraConfig* per_expert) {
  LORADB_ASSIGN_OR_RETURN(std::vector<size_t> targeted, TargetedParameters(config, layout));
  LORADB_ASSIGN_OR_RETURN(*per_expert, PerExpertConfig(config, tensors.tensors(), layout));
  auto buffers = std::make_shared<Buffers>();
  buffers->source = tensors.backing();
  std::vector<TensorView> out;
  struct Pair {
    const TensorView* a = nullptr;
    const TensorView* b = nullptr;
  };
  std::map<std::pair<std::string, int>, Pair> fused;
  for (const TensorView& t : tensors.tensors()) {
    const PeftTensorInfo n = ClassifyPeftTensor(t.name);
    if (n.kind == PeftTensorKind::kLora && (n.depth > 0 || IsExpertsModule(n.module_key, layout))) {
      if (!IsExpertsModule(n.module_key, layout) || n.embedding) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", t.name, "\" is in the target_parameters layout, but \"",
                         n.module_key, "\" is not a layers.<L>.", layout.module, " module"));
      }
      Pair& p = fused[{n.module_key, n.depth}];
      (n.side == LoraSide::kA ? p.a : p.b) = &t;
      continue;
    }
    out.push_back(t);
  }
  const int64_t experts = layout.num_experts;
  for (const auto& [where, p] : fused) {
    const auto& [module_key, depth] = where;
    if (p.a == nullptr || p.b == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("module \"", module_key, "\" lacks lora_A or lora_B at depth ", depth));
    }
    if (static_cast<size_t>(depth) >= targeted.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", p.a->name, "\": ", depth, " base_layer wrapper(s), but target_parameters ",
          "names ", targeted.size(), " parameter(s) of ", layout.module));
    }
    const ExpertParameter& param = layout.params[targeted[targeted.size() - 1 - depth]];
    const std::string key = absl::StrCat(module_key, ".", param.name);
    const int64_t r = config.RankFor(key);
    const TensorView& a = *p.a;
    const TensorView& b = *p.b;
    if (a.shape.size() != 2 || b.shape.size() != 2 || a.shape[0] != b.shape[1]) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", key, ": lora_A ",
                                                     ShapeString(a.shape), " and lora_B ",
                                                     ShapeString(b.shape), " do not pair"));
    }
    if (a.shape[0] != r * experts) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", key, ": lora_A \"", a.name, "\" has ", a.shape[0], " rows; r = ", r,
          " per expert gives ",
          a.shape[0] % r == 0 ? absl::StrCat(a.shape[0] / r) : absl::StrCat(a.shape[0], "/", r),
          " experts, but the base has ", experts, " (num_experts)"));
    }
    if (a.shape[1] != param.in || b.shape[0] != param.out()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", key, ": lora_A ", ShapeString(a.shape), " / lora_B ", ShapeString(b.shape),
          " do not fit the base's [", experts, ", ", param.out(), ", ", param.in, "] (want A [",
          r * experts, ", ", param.in, "], B [", param.out(), ", ", r * experts, "])"));
    }
    const size_t ea = DTypeSize(a.dtype);
    const size_t eb = DTypeSize(b.dtype);
    for (int64_t e = 0; e < experts; ++e) {
      int64_t row0 = 0;
      for (const auto& [part, rows] : param.parts) {
        TensorView av{PerExpertName(module_key, e, part, LoraSide::kA),
                      a.dtype,
                      {r, param.in},
                      a.data + static_cast<size_t>(e * r * param.in) * ea,
                      static_cast<size_t>(r * param.in) * ea};
        out.push_back(std::move(av));
        const size_t nb = static_cast<size_t>(rows * r) * eb;
        std::byte* dst = buffers->Allocate(nb);
        for (int64_t o = 0; o < rows; ++o) {
          for (int64_t k = 0; k < r; ++k) {
            std::memcpy(
                dst + static_cast<size_t>(o * r + k) * eb,
                b.data + static_cast<size_t>((row0 + o) * r * experts + k * experts + e) * eb, eb);
          }
        }
        out.push_back(TensorView{
            PerExpertName(module_key, e, part, LoraSide::kB), b.dtype, {rows, r}, dst, nb});
        row0 += rows;
      }
    }
  }
  TensorSet set(std::static_pointer_cast<const void>(std::shared_ptr<Buffers>(buffers)));
  set.Reserve(out.size());
  for (TensorView& v : out) LORADB_RETURN_IF_ERROR(set.Add(std::move(v)));
  set.metadata() = tensors.metadata();
  return set;
}

absl::StatusOr<TensorSet> FuseTargetParameters(const LoraConfig& config, const TensorSet& tensors,
                                               const ExpertsLayout& layout) {
  LORADB_ASSIGN_OR_RETURN(std::vector<size_t> targeted, TargetedParameters(config, layout));
  std::map<std::string, size_t> part_owner;  // part -> index into `targeted`
  for (size_t k = 0; k < targeted.size(); ++k) {
    for (const auto& [part, rows] : layout.params[targeted[k]].parts) part_owner[part] = k;
  }
  auto buffers = std::make_shared<Buffers>();
  buffers->source = tensors.backing();
  std::vector<TensorView> out;
  // experts module -> (part, expert, side) -> tensor
  std::map<std::string, std::map<std::tuple<std::string, int64_t, LoraSide>, const TensorView*>>
      found;
  for (const TensorView& t : tensors.tensors()) {
    const PeftTensorInfo n = ClassifyPeftTensor(t.name);
    std::string experts, part;
    int64_t e = 0;
    if (n.kind == PeftTensorKind::kLora && !n.embedding && n.depth == 0 &&
        SplitPerExpertKey(n.module_key, layout, &experts, &e, &part) && part_owner.count(part)) {
      found[experts][{part, e, n.side}] = &t;
      continue;
    }
    out.push_back(t);
  }
  const int64_t num = layout.num_experts;
  for (const auto& entry : found) {
    // Named references, not structured bindings: the lambda below captures them.
    const std::string& experts = entry.first;
    const auto& parts = entry.second;
    for (size_t k = 0; k < targeted.size(); ++k) {
      const ExpertParameter& param = layout.params[targeted[k]];
      const int depth = static_cast<int>(targeted.size() - 1 - k);
      auto get = [&](const std::string& part, int64_t e,
                     LoraSide side) -> absl::StatusOr<const TensorView*> {
        auto it = parts.find({part, e, side});
        if (it == parts.end()) {
          return absl::FailedPreconditionError(
              absl::StrCat("cannot rebuild target_parameters ", experts, ".", param.name, ": \"",
                           PerExpertName(experts, e, part, side), "\" is missing"));
        }
        return it->second;
      };
      LORADB_ASSIGN_OR_RETURN(const TensorView* a0, get(param.parts[0].first, 0, LoraSide::kA));
      LORADB_ASSIGN_OR_RETURN(const TensorView* b0, get(param.parts[0].first, 0, LoraSide::kB));
      const int64_t r = a0->shape[0];
      const size_t ea = DTypeSize(a0->dtype);
      const size_t eb = DTypeSize(b0->dtype);
      const size_t a_bytes = static_cast<size_t>(r * param.in) * ea;
      std::byte* a = buffers->Allocate(a_bytes * static_cast<size_t>(num));
      const size_t b_bytes = static_cast<size_t>(param.out() * r * num) * eb;
      std::byte* b = buffers->Allocate(b_bytes);
      for (int64_t e = 0; e < num; ++e) {
        int64_t row0 = 0;
        for (const auto& [part, rows] : param.parts) {
          LORADB_ASSIGN_OR_RETURN(const TensorView* pa, get(part, e, LoraSide::kA));
          LORADB_ASSIGN_OR_RETURN(const TensorView* pb, get(part, e, LoraSide::kB));
          if (pa->dtype != a0->dtype || pa->shape != std::vector<int64_t>{r, param.in} ||
              pb->dtype != b0->dtype || pb->shape != std::vector<int64_t>{rows, r}) {
            return absl::FailedPreconditionError(absl::StrCat(
                "cannot rebuild target_parameters ", experts, ".", param.name, ": \"", pa->name,
                "\" / \"", pb->name, "\" differ in dtype or shape from expert 0's"));
          }
          std::byte* a_e = a + static_cast<size_t>(e) * a_bytes;
          if (row0 == 0) {
            std::memcpy(a_e, pa->data, a_bytes);
          } else if (std::memcmp(a_e, pa->data, a_bytes) != 0) {
            return absl::FailedPreconditionError(
                absl::StrCat("cannot export in the target_parameters layout: \"", pa->name,
                             "\" differs from the A of ", param.parts[0].first, " (", param.name,
                             " shares one A per expert); export with the per-expert layout"));
          }
          for (int64_t o = 0; o < rows; ++o) {
            for (int64_t j = 0; j < r; ++j) {
              std::memcpy(b + static_cast<size_t>((row0 + o) * r * num + j * num + e) * eb,
                          pb->data + static_cast<size_t>(o * r + j) * eb, eb);
            }
          }
          row0 += rows;
        }
      }
      out.push_back(TensorView{FusedName(experts, depth, LoraSide::kA),
                               a0->dtype,
                               {r * num, param.in},
                               a,
                               a_bytes * static_cast<size_t>(num)});
      out.push_back(TensorView{
          FusedName(experts, depth, LoraSide::kB), b0->dtype, {param.out(), r * num}, b, b_bytes});
    }
  }
  TensorSet set(std::static_pointer_cast<const void>(std::shared_ptr<Buffers>(buffers)));
  set.Reserve(out.size());
  for (TensorView& v : out) LORADB_RETURN_IF_ERROR(set.Add(std::move(v)));
  set.metadata() = tensors.metadata();
  return set;
}

absl::StatusOr<LoraConfig> PerExpertConfig(const LoraConfig& config,
                                           const std::vector<TensorView>& tensors,
                                           const ExpertsLayout& layout) {
  LORADB_ASSIGN_OR_RETURN(std::vector<size_t> targeted, TargetedParameters(config, layout));
  std::set<std::string> modules;  // experts module keys present, in either layout
  for (const TensorView& t : tensors) {
    const PeftTensorInfo n = ClassifyPeftTensor(t.name);
    if (n.kind != PeftTensorKind::kLora) continue;
    std::string experts, part;
    int64_t e = 0;
    if (IsExpertsModule(n.module_key, layout)) {
      modules.insert(n.module_key);
    } else if (SplitPerExpertKey(n.module_key, layout, &experts, &e, &part)) {
      modules.insert(experts);
    }
  }
  LoraConfig out = config;
  out.target_parameters.clear();
  std::vector<std::pair<std::string, int>> rank_first;
  std::vector<std::pair<std::string, double>> alpha_first;
  for (size_t k : targeted) {
    const ExpertParameter& param = layout.params[k];
    std::vector<std::string> parts;
    for (const auto& [part, rows] : param.parts) {
      parts.push_back(part);
      if (out.target_modules_is_regex) continue;
      if (std::find(out.target_modules.begin(), out.target_modules.end(), part) ==
          out.target_modules.end()) {
        out.target_modules.push_back(part);
      }
    }
    if (out.target_modules_is_regex) {
      out.target_modules[0] =
          absl::StrCat("(?:", out.target_modules[0], ")|(?:.*\\.", EscapeRegex(layout.module),
                       "\\.[0-9]+\\.(?:", absl::StrJoin(parts, "|"), "))");
    }
    for (const std::string& m : modules) {
      const std::string key = absl::StrCat(m, ".", param.name);
      const std::string example = absl::StrCat(m, ".0.", parts[0]);
      const std::string pattern =
          absl::StrCat(EscapeRegex(m), "\\.[0-9]+\\.(?:", absl::StrJoin(parts, "|"), ")");
      if (config.RankFor(key) != config.RankFor(example)) {
        rank_first.emplace_back(pattern, config.RankFor(key));
      }
      if (config.AlphaFor(key) != config.AlphaFor(example)) {
        alpha_first.emplace_back(pattern, config.AlphaFor(key));
      }
    }
  }
  out.rank_pattern.insert(out.rank_pattern.begin(), rank_first.begin(), rank_first.end());
  out.alpha_pattern.insert(out.alpha_pattern.begin(), alpha_first.begin(), alpha_first.end());
  return out;
}

}  // namespace loradb::peft

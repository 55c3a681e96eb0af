// `loradb model ...`: the Qwen3 base model (compute/model). Built only when compute/ is
// (LibTorch found); the CLI then defines LORADB_COMPUTE_AVAILABLE.
#ifdef LORADB_COMPUTE_AVAILABLE

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "compute/model/model_tools.h"
#include "storage/util/json.h"
#include "tools/loradb/command.h"

namespace loradb::cli {
namespace {

absl::StatusOr<std::vector<int64_t>> ParseIds(const std::string& text) {
  std::vector<int64_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-ids: \"", part, "\" is not an integer"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--prompt-ids: no token ids");
  return ids;
}

struct InitRandomArgs {
  std::string config, out_dir, dtype = "f32";
  uint64_t seed = 0;
  double lm_head_std = 0;
  CLI::Option* lm_head_std_option = nullptr;  // count() > 0 when --lm-head-std was given
  bool json = false;
};

struct LogitsArgs {
  std::string model, ids, dtype, adapter;
  int64_t prefill = 0;
  bool json = false;
};

struct InfoArgs {
  std::string model;
  bool json = false;
};

void SetupModel(CLI::App* sub, Invocation* inv) {
  sub->require_subcommand(1);

  auto init = std::make_shared<InitRandomArgs>();
  CLI::App* ir = sub->add_subcommand(
      "init-random", "write a random-initialised Hugging Face checkpoint (fixed seed)");
  ir->add_option("--config", init->config, "config.json (file or directory)")->required();
  ir->add_option("out_dir", init->out_dir, "output directory")->required();
  ir->add_option("--seed", init->seed, "generator seed (default 0)");
  ir->add_option("--dtype", init->dtype, "f32 | bf16 | f16 (default f32)");
  init->lm_head_std_option = ir->add_option(
      "--lm-head-std", init->lm_head_std,
      "std of the output layer lm_head.weight, a finite number > 0 (default 1/sqrt(hidden_size): "
      "logits of unit variance at init; every other linear and the embeddings use 0.02, and "
      "0.02 on the head leaves a tiny base too flat for GRPO). Not allowed when the config ties "
      "lm_head to the embeddings");
  AddJsonFlag(ir, &init->json);
  ir->callback([inv, init] {
    inv->run = [init]() -> absl::Status {
      std::optional<double> lm_head_std;
      if (init->lm_head_std_option->count() > 0) {
        if (!(std::isfinite(init->lm_head_std) && init->lm_head_std > 0)) {
          return absl::InvalidArgumentError(
              absl::StrCat("--lm-head-std must be a finite number > 0, got ", init->lm_head_std));
        }
        lm_head_std = init->lm_head_std;
      }
      double used = 0;
      absl::StatusOr<Hash128> fp = model::InitRandomCheckpoint(
          init->config, init->out_dir, init->seed, init->dtype, lm_head_std, &used);
      if (!fp.ok()) return fp.status();
      if (init->json) {
        PrintJson({{"dir", init->out_dir},
                   {"seed", init->seed},
                   {"dtype", init->dtype},
                   {"lm_head_std", used > 0 ? nlohmann::json(used) : nlohmann::json(nullptr)},
                   {"fingerprint", fp->Hex()}});
      } else {
        const std::string head = used > 0 ? absl::StrCat("lm_head std ", used) : "tied lm_head";
        std::printf("wrote %s (seed %llu, %s, %s), fingerprint %s\n", init->out_dir.c_str(),
                    static_cast<unsigned long long>(init->seed), init->dtype.c_str(), head.c_str(),
                    fp->Hex().c_str());
      }
      return absl::OkStatus();
    };
  });

  auto info = std::make_shared<InfoArgs>();
  CLI::App* in = sub->add_subcommand("info", "load a checkpoint and print its architecture");
  in->add_option("--model", info->model, "checkpoint directory")->required();
  AddJsonFlag(in, &info->json);
  in->callback([inv, info] {
    inv->run = [info]() -> absl::Status {
      absl::StatusOr<model::ModelSummary> s = model::DescribeModel(info->model);
      if (!s.ok()) return s.status();
      if (info->json) {
        absl::StatusOr<nlohmann::json> config = ParseJson(s->config.ToJson(), "config");
        if (!config.ok()) return config.status();
        PrintJson({{"model_type", s->config.model_type},
                   {"config", *std::move(config)},
                   {"dtype", s->dtype},
                   {"parameters", s->num_parameters},
                   {"fingerprint", s->fingerprint.Hex()}});
      } else {
        std::printf("%s: %lld layers, hidden %lld, %lld parameters (%s), fingerprint %s\n",
                    s->config.model_type.c_str(),
                    static_cast<long long>(s->config.num_hidden_layers),
                    static_cast<long long>(s->config.hidden_size),
                    static_cast<long long>(s->num_parameters), s->dtype.c_str(),
                    s->fingerprint.Hex().c_str());
      }
      return absl::OkStatus();
    };
  });

  auto logits = std::make_shared<LogitsArgs>();
  CLI::App* lg = sub->add_subcommand("logits", "print the logits at every prompt position");
  lg->add_option("--model", logits->model, "checkpoint directory")->required();
  lg->add_option("--prompt-ids", logits->ids, "comma-separated token ids")->required();
  lg->add_option("--prefill", logits->prefill,
                 "prefill this many tokens into a KV cache, then decode the rest one by one "
                 "(default: one full-sequence forward)");
  lg->add_option("--dtype", logits->dtype, "compute dtype f32 | bf16 | f16 (default: weights')");
  lg->add_option("--adapter", logits->adapter,
                 "PEFT LoRA adapter directory applied to every token (default: base only)");
  AddJsonFlag(lg, &logits->json);
  lg->callback([inv, logits] {
    inv->run = [logits]() -> absl::Status {
      absl::StatusOr<std::vector<int64_t>> ids = ParseIds(logits->ids);
      if (!ids.ok()) return ids.status();
      if (!logits->dtype.empty()) {
        absl::Status st = model::CheckDTypeName(logits->dtype);
        if (!st.ok()) return st;
      }
      absl::StatusOr<std::vector<std::vector<float>>> rows = model::ComputeLogits(
          {logits->model, *ids, logits->prefill, logits->dtype, logits->adapter});
      if (!rows.ok()) return rows.status();
      if (logits->json) {
        PrintJson({{"token_ids", *ids}, {"prefill", logits->prefill}, {"logits", *rows}});
      } else {
        for (size_t i = 0; i < rows->size(); ++i) {
          const std::vector<float>& r = (*rows)[i];
          size_t best = 0;
          for (size_t j = 1; j < r.size(); ++j) best = r[j] > r[best] ? j : best;
          std::printf("position %zu (token %lld): argmax %zu logit %.6f\n", i,
                      static_cast<long long>((*ids)[i]), best, r[best]);
        }
      }
      return absl::OkStatus();
    };
  });
}

LORADB_REGISTER_COMMAND("model", "the Qwen3 base model: init-random, info, logits", SetupModel);

}  // namespace
}  // namespace loradb::cli

#endif  // LORADB_COMPUTE_AVAILABLE

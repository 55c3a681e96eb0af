// `loradb train`: trains a policy's LoRA adapter over a base checkpoint, on a built-in toy task
// (--task) or on the user's data (--data FILE.jsonl: SFT, DPO, or GRPO with --reward-cmd), with
// checkpoints in the store (resuming from the latest), and publishes the result as a revision.
// Data are validated whole before anything is trained or written (storage/formats/
// training_data.h). Progress: a bar on stderr when it is a terminal, one JSON line per step on
// stdout with --json, otherwise one line per step on stderr.
// Built only when compute/ is (LibTorch found).
#ifdef LORADB_COMPUTE_AVAILABLE

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compute/trainer/data_training.h"
#include "compute/trainer/train_tools.h"
#include "storage/formats/model_config.h"
#include "storage/formats/training_data.h"
#include "storage/util/status_macros.h"
#include "text/tokenizer.h"
#include "tools/loradb/command.h"

namespace loradb::cli {
namespace {

struct TrainArgs {
  trainer::TrainRunOptions run;
  trainer::DataRunOptions data;
  std::string data_path;
  std::vector<std::string> stop;  // --stop: token ids or token strings
  bool fresh = false;
  bool no_publish = false;
  bool json = false;
};

// "1:05:09", "4:02", "0:07".
std::string Clock(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// Step progress of a --data run: a bar redrawn in place on a terminal, JSON lines on stdout
// (--json), or plain lines on stderr. Event lines (resumed, checkpoint, published) go to stderr
// above the bar.
class StepDisplay {
 public:
  explicit StepDisplay(bool json) : json_(json), bar_(!json && ::isatty(STDERR_FILENO) != 0) {}

  void Event(const std::string& line) {
    ClearBar();
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }

  void Step(const trainer::StepProgress& s) {
    ++steps_;
    tokens_ += s.tokens;
    seconds_ += s.seconds;
    const double rate = seconds_ > 0 ? static_cast<double>(tokens_) / seconds_ : 0;
    const double eta = seconds_ / static_cast<double>(steps_) *
                       static_cast<double>(std::max<int64_t>(0, s.last_step - s.step));
    if (json_) {
      PrintJson({{"event", "step"},
                 {"step", s.step},
                 {"steps", s.last_step},
                 {"loss_kind", s.loss_kind},
                 {"loss", s.loss},
                 {s.metric_name, s.metric},
                 {"lr", s.lr},
                 {"grad_norm", s.grad_norm},
                 {"tokens", s.tokens},
                 {"step_s", s.seconds},
                 {"tokens_per_s", rate},
                 {"eta_s", eta}});
      std::fflush(stdout);
      return;
    }
    const std::string stats =
        absl::StrFormat("%d/%d %s loss %.4f %s %.3f | %.0f tok/s | ETA %s", s.step, s.last_step,
                        s.loss_kind, s.loss, s.metric_name, s.metric, rate, Clock(eta));
    if (!bar_) {
      std::fprintf(stderr, "step %s\n", stats.c_str());
      return;
    }
    constexpr int kWidth = 24;
    const int64_t span = std::max<int64_t>(1, s.last_step - s.first_step);
    const double frac = std::clamp(
        static_cast<double>(s.step - s.first_step) / static_cast<double>(span), 0.0, 1.0);
    std::string bar(static_cast<size_t>(frac * kWidth), '=');
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r\033[K[%s] %s", bar.c_str(), stats.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }

  void ClearBar() {
    if (!drawn_) return;
    std::fprintf(stderr, "\n");
    drawn_ = false;
  }

 private:
  bool json_;
  bool bar_;
  bool drawn_ = false;
  int64_t steps_ = 0, tokens_ = 0;
  double seconds_ = 0;
};

// Validates the file against the base (config.json's vocabulary; its tokenizer.json for text
// fields) and trains on it.
absl::Status RunData(TrainArgs* a) {
  const std::string model_dir = a->run.model_dir;
  LORADB_ASSIGN_OR_RETURN(
      ModelConfig config,
      ReadModelConfig((std::filesystem::path(model_dir) / "config.json").string()));
  dataset::ParseOptions po;
  po.vocab_size = config.vocab_size;
  const std::string tok_path = (std::filesystem::path(model_dir) / "tokenizer.json").string();
  std::unique_ptr<text::Tokenizer> tokenizer;
  absl::StatusOr<std::unique_ptr<text::Tokenizer>> loaded =
      std::filesystem::exists(tok_path)
          ? text::Tokenizer::Load(tok_path)
          : absl::NotFoundError(absl::StrCat(tok_path, " does not exist"));
  if (loaded.ok()) {
    tokenizer = std::move(loaded).value();
    const text::Tokenizer* tok = tokenizer.get();
    po.tokenize = [tok](const std::string& t) -> absl::StatusOr<std::vector<int64_t>> {
      LORADB_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(t));
      return std::vector<int64_t>(ids.begin(), ids.end());
    };
    if (!tok->TokenToId("<|im_start|>").has_value() || !tok->TokenToId("<|im_end|>").has_value()) {
      po.no_chat_reason =
          absl::StrCat(tok_path, " has no <|im_start|> / <|im_end|> tokens (ChatML)");
    }
    a->data.decode = [tok](const std::vector<int64_t>& ids) -> absl::StatusOr<std::string> {
      return tok->Decode(std::vector<int32_t>(ids.begin(), ids.end()), false);
    };
  } else {
    // Token-id data still train on a base whose tokenizer.json cannot be read.
    po.no_tokenizer_reason = std::string(loaded.status().message());
  }
  for (const std::string& stop : a->stop) {
    int64_t id = -1;
    std::optional<int32_t> named = tokenizer ? tokenizer->TokenToId(stop) : std::nullopt;
    if (named.has_value()) {
      id = *named;
    } else if (!absl::SimpleAtoi(stop, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--stop ", stop, ": not a token id",
                                                     tokenizer ? " nor a token of " : "",
                                                     tokenizer ? tok_path : ""));
    }
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--stop ", stop, ": id ", id, " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
    a->data.stop_tokens.push_back(id);
  }
  LORADB_ASSIGN_OR_RETURN(dataset::Dataset data, dataset::ReadTrainingData(a->data_path, po));
  a->data.data = &data;
  const int64_t steps = trainer::DataRunSteps(a->run, a->data);
  auto display = std::make_shared<StepDisplay>(a->json);
  display->Event(absl::StrFormat(
      "data %s: %d %s examples, %d tokens (%d lines tokenized from text); training to step %d",
      a->data_path, data.examples.size(), dataset::KindName(data.kind), data.tokens,
      data.text_lines, steps));
  a->run.progress = [display](const std::string& line) { display->Event(line); };
  a->run.on_step = [display](const trainer::StepProgress& s) { display->Step(s); };
  absl::StatusOr<trainer::TrainRunResult> res = trainer::RunDataTraining(a->run, a->data);
  display->ClearBar();
  if (!res.ok()) return res.status();
  const double rate =
      res->train_seconds > 0 ? static_cast<double>(res->tokens) / res->train_seconds : 0;
  const char* score = data.kind == dataset::Kind::kSft   ? "accuracy"
                      : data.kind == dataset::Kind::kDpo ? "preferred"
                                                         : "mean_reward";
  if (a->json) {
    PrintJson({{"event", "result"},
               {"policy", a->run.policy},
               {"data", a->data_path},
               {"kind", dataset::KindName(data.kind)},
               {"examples", data.examples.size()},
               {"start_step", res->start_step},
               {"end_step", res->end_step},
               {"start_loss", res->start_loss},
               {"end_loss", res->end_loss},
               {absl::StrCat("start_", score), res->start_score},
               {absl::StrCat("end_", score), res->end_score},
               {"last_loss", res->last_loss},
               {"tokens", res->tokens},
               {"train_s", res->train_seconds},
               {"tokens_per_s", rate},
               {"checkpoint", res->checkpoint_id},
               {"revision", res->revision_id}});
    return absl::OkStatus();
  }
  std::string losses;
  if (!std::isnan(res->start_loss)) {
    losses = absl::StrFormat("loss %.4f -> %.4f, ", res->start_loss, res->end_loss);
  }
  std::printf(
      "%s: steps %lld -> %lld, %s%s %.4f -> %.4f, %.0f tokens/s, checkpoint %llu, "
      "revision %llu\n",
      a->run.policy.c_str(), static_cast<long long>(res->start_step),
      static_cast<long long>(res->end_step), losses.c_str(), score, res->start_score,
      res->end_score, rate, static_cast<unsigned long long>(res->checkpoint_id),
      static_cast<unsigned long long>(res->revision_id));
  return absl::OkStatus();
}

absl::Status RunTask(TrainArgs* a) {
  a->run.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  absl::StatusOr<trainer::TrainRunResult> res = trainer::RunTraining(a->run);
  if (!res.ok()) return res.status();
  if (a->json) {
    PrintJson({{"policy", a->run.policy},
               {"task", a->run.task},
               {"start_step", res->start_step},
               {"end_step", res->end_step},
               {"start_score", res->start_score},
               {"end_score", res->end_score},
               {"last_loss", res->last_loss},
               {"checkpoint", res->checkpoint_id},
               {"revision", res->revision_id}});
  } else {
    std::printf("%s: steps %lld -> %lld, score %.4f -> %.4f, checkpoint %llu, revision %llu\n",
                a->run.policy.c_str(), static_cast<long long>(res->start_step),
                static_cast<long long>(res->end_step), res->start_score, res->end_score,
                static_cast<unsigned long long>(res->checkpoint_id),
                static_cast<unsigned long long>(res->revision_id));
  }
  return absl::OkStatus();
}

void SetupTrain(CLI::App* sub, Invocation* inv) {
  auto a = std::make_shared<TrainArgs>();
  trainer::TrainRunOptions& r = a->run;
  trainer::DataRunOptions& d = a->data;
  r.steps = 0;
  sub->add_option("--model", r.model_dir, "base checkpoint directory (config.json + weights)")
      ->required();
  sub->add_option("--policy", r.policy, "policy name (created on the base if missing)")->required();
  CLI::Option* task =
      sub->add_option("--task", r.task, "mapping (SFT) | preference (DPO) | arithmetic (GRPO)");
  CLI::Option* data = sub->add_option(
      "--data", a->data_path,
      "JSONL training data: SFT, DPO pairs or GRPO prompts (docs/trainer.md has the formats)");
  task->excludes(data);
  sub->add_option("--steps", r.steps,
                  "train until this optimizer step (required with --task; with --data default "
                  "--epochs over the data)");
  sub->add_option("--epochs", d.epochs, "--data without --steps: passes over the data (default 1)");
  sub->add_option("--eval", d.eval_examples,
                  "--data: examples (GRPO: prompts) scored before and after (default 64)");
  sub->add_option("--reward-cmd", d.reward_cmd,
                  "--data GRPO: reward program (shell command; rollouts as JSON lines on stdin, "
                  "one reward per line on stdout)");
  sub->add_option("--reward-timeout", d.reward_timeout_s,
                  "seconds the reward program may stay silent (default 60)");
  sub->add_option("--max-tokens", d.max_tokens, "--data GRPO: tokens per completion (default 16)");
  sub->add_option("--stop", a->stop,
                  "--data GRPO: a token (id, or token string of the base's tokenizer) that ends a "
                  "completion; repeatable");
  sub->add_option("--base", r.base_name, "base name in the store (default: model dir name)");
  sub->add_option("--rank", r.rank, "LoRA rank (default 8)");
  sub->add_option("--alpha", r.alpha, "LoRA alpha (default 16)");
  sub->add_flag("--rslora", r.rslora, "scale by alpha/sqrt(r)");
  sub->add_option("--target-modules", r.target_modules,
                  "modules to adapt, comma-separated (default: q/k/v/o_proj and "
                  "gate/up/down_proj; with --target-parameters: q/k/v/o_proj)")
      ->delimiter(',');
  sub->add_option("--target-parameters", r.target_parameters,
                  "MoE bases: fused expert parameters to adapt as PEFT target_parameters, "
                  "comma-separated (gate_up_proj, down_proj); exported in that PEFT layout")
      ->delimiter(',');
  sub->add_option("--lr", r.lr, "peak learning rate (default 5e-3)");
  sub->add_option("--schedule", r.schedule, "constant | cosine (default constant)");
  sub->add_option("--warmup", r.warmup_steps, "linear warmup steps (cosine)");
  sub->add_option("--seed", r.seed, "seed of initialisation, data and sampling (default 0)");
  sub->add_option("--batch", r.batch_size, "SFT sequences / DPO pairs per step (default 32)");
  sub->add_option("--micro-batches", r.micro_batches, "gradient accumulation (default 1)");
  sub->add_option("--grpo-prompts", r.grpo_prompts, "GRPO prompts per step (default 8)");
  sub->add_option("--grpo-group", r.grpo_group, "GRPO samples per prompt (default 8)");
  sub->add_option("--temperature", r.temperature, "GRPO sampling temperature (default 1)");
  sub->add_option("--warm-start", r.warm_start_steps,
                  "--task arithmetic: SFT steps first (default 0)");
  sub->add_option("--checkpoint-every", r.checkpoint_every, "checkpoint every N steps");
  sub->add_option("--alias", r.alias, "alias moved to the published revision (default latest)");
  sub->add_option(
      "--reference", r.reference,
      "DPO/GRPO reference revision (ID, POLICY:ALIAS or POLICY@SEQ; default: the base)");
  sub->add_option("--threads", r.threads,
                  "LibTorch intra-op threads (default 0 = one per hardware core)");
  sub->add_flag("--fresh", a->fresh, "ignore existing checkpoints");
  sub->add_flag("--no-publish", a->no_publish, "do not publish a revision");
  AddJsonFlag(sub, &a->json);
  sub->callback([inv, a] {
    inv->run = [inv, a]() -> absl::Status {
      a->run.store_dir = inv->global.store;
      a->run.resume = !a->fresh;
      a->run.publish = !a->no_publish;
      if (a->run.task.empty() == a->data_path.empty()) {
        return absl::InvalidArgumentError("give one of --task NAME or --data FILE.jsonl");
      }
      if (a->run.steps < 0) return absl::InvalidArgumentError("--steps must be >= 1");
      if (!a->data_path.empty()) return RunData(a.get());
      if (!a->data.reward_cmd.empty()) {
        return absl::InvalidArgumentError("--reward-cmd is for --data GRPO prompts");
      }
      if (a->run.steps == 0) return absl::InvalidArgumentError("--task needs --steps N");
      return RunTask(a.get());
    };
  });
}

LORADB_REGISTER_COMMAND("train",
                        "train a policy's LoRA adapter (SFT, DPO, GRPO; built-in tasks or --data)",
                        SetupTrain);

}  // namespace
}  // namespace loradb::cli

#endif  // LORADB_COMPUTE_AVAILABLE

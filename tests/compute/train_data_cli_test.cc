// `loradb train --data FILE.jsonl` driven through the built binary on a tiny random base: SFT on
// token ids and on text (tests/testdata/tokenizer/mini_tokenizer.json), DPO pairs, GRPO with a
// reward program (tests/compute/testdata/exact_answer_reward.py) after an SFT warm start; each
// lowers its loss or raises its reward (measured by the command's own before/after evaluation)
// and publishes a revision. Malformed files fail with their line numbers and leave the store as
// it was.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/compute/cli_test_util.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

namespace fs = std::filesystem;
using testing::Cli;
using testing::CliRun;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;
using Json = nlohmann::json;

// Two bases written once per binary: the tiny dense config with 2 layers, one without and one
// with a tokenizer.json.
struct Bases {
  TempDir dir;
  std::string plain, with_tokenizer;
};

const Bases& TheBases() {
  static Bases* b = [] {
    auto* out = new Bases;
    std::ifstream in(std::string(LORADB_SOURCE_DIR) + "/compute/configs/tiny-dense.json");
    Json config = Json::parse(in);
    config["num_hidden_layers"] = 2;
    const std::string cfg = out->dir.file("config.json");
    std::ofstream(cfg) << config.dump();
    out->plain = out->dir.file("base");
    CliRun r =
        Cli(out->dir, out->dir.file("unused-store"),
            absl::StrCat("model init-random --config '", cfg, "' '", out->plain, "' --seed 5"));
    EXPECT_EQ(r.rc, 0) << r.err;
    out->with_tokenizer = out->dir.file("base-tok");
    fs::copy(out->plain, out->with_tokenizer, fs::copy_options::recursive);
    fs::copy_file(testing::TestData("tokenizer/mini_tokenizer.json"),
                  out->with_tokenizer + "/tokenizer.json");
    return out;
  }();
  return *b;
}

std::string WriteLines(const TempDir& dir, const std::string& name,
                       const std::vector<std::string>& lines) {
  const std::string path = dir.file(name);
  std::ofstream out(path);
  for (const std::string& l : lines) out << l << "\n";
  return path;
}

// `loradb train --model BASE --policy POLICY --data DATA --json --threads 1 EXTRA`.
CliRun Train(const TempDir& dir, const std::string& store, const std::string& base,
             const std::string& policy, const std::string& data, const std::string& extra) {
  return Cli(dir, store,
             absl::StrCat("train --model '", base, "' --policy ", policy, " --data '", data,
                          "' --json --threads 1 ", extra),
             "OMP_NUM_THREADS=1");
}

struct Output {
  std::vector<Json> steps;
  Json result;
};

Output ParseOutput(const CliRun& r) {
  Output o;
  for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    Json j = Json::parse(line);
    if (j["event"] == "step") {
      o.steps.push_back(j);
    } else if (j["event"] == "result") {
      o.result = j;
    }
  }
  return o;
}

// The mapping task as data: [1, 100 + k, 2] -> 200 + (7k + 3) % 32, k < 32.
int64_t Answer(int k) { return 200 + (7 * k + 3) % 32; }
std::vector<std::string> MappingLines() {
  std::vector<std::string> lines;
  for (int k = 0; k < 32; ++k) {
    lines.push_back(absl::StrCat("{\"tokens\": [1, ", 100 + k, ", 2, ", Answer(k),
                                 "], \"weights\": [0, 0, 0, 1]}"));
  }
  return lines;
}

// Every file under `dir` with its size: what a run that changes nothing leaves as it was.
std::string Listing(const std::string& dir) {
  std::vector<std::string> entries;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    entries.push_back(absl::StrCat(e.path().string(), " ",
                                   e.is_regular_file() ? std::to_string(e.file_size()) : "dir"));
  }
  std::sort(entries.begin(), entries.end());
  return absl::StrJoin(entries, "\n");
}

TEST(TrainDataCli, SftOnTokenIdsLowersTheLossAndPublishes) {
  TempDir dir;
  const std::string store = dir.file("store");
  const std::string data = WriteLines(dir, "sft.jsonl", MappingLines());
  CliRun r = Train(dir, store, TheBases().plain, "sft", data, "--steps 30 --batch 16 --lr 1e-2");
  ASSERT_EQ(r.rc, 0) << r.err;
  Output o = ParseOutput(r);
  ASSERT_EQ(o.steps.size(), 30u) << r.out;
  for (const Json& s : o.steps) {
    EXPECT_EQ(s["tokens"], 16 * 4);
    EXPECT_GT(s["tokens_per_s"].get<double>(), 0);
    EXPECT_TRUE(s.contains("eta_s") && s.contains("acc") && s.contains("loss"));
  }
  EXPECT_EQ(o.steps.back()["step"], 30);
  const Json& res = o.result;
  EXPECT_EQ(res["kind"], "SFT");
  EXPECT_EQ(res["examples"], 32);
  EXPECT_EQ(res["end_step"], 30);
  // Measured on the first 32 examples (all of them) before and after.
  EXPECT_LT(res["end_loss"].get<double>(), 0.5 * res["start_loss"].get<double>()) << res.dump();
  EXPECT_GT(res["end_accuracy"].get<double>(), res["start_accuracy"].get<double>());
  EXPECT_GT(res["tokens_per_s"].get<double>(), 0);
  ASSERT_GT(res["revision"].get<uint64_t>(), 0u);
  CliRun show = Cli(dir, store, "show sft:latest --json");
  ASSERT_EQ(show.rc, 0) << show.err;
  EXPECT_EQ(Json::parse(show.out)["id"], res["revision"]);

  // A second run resumes from the checkpoint and walks on through the data.
  CliRun more = Train(dir, store, TheBases().plain, "sft", data, "--steps 34 --batch 16 --lr 1e-2");
  ASSERT_EQ(more.rc, 0) << more.err;
  Output o2 = ParseOutput(more);
  EXPECT_EQ(o2.result["start_step"], 30);
  EXPECT_EQ(o2.steps.size(), 4u);
  EXPECT_NEAR(o2.result["start_loss"].get<double>(), res["end_loss"].get<double>(), 1e-6);
}

TEST(TrainDataCli, ATerminalGetsAProgressBar) {
  if (std::system("command -v script >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no `script` to run the command on a pseudo-terminal";
  }
  TempDir dir;
  const std::string data = WriteLines(dir, "sft.jsonl", MappingLines());
  // script(1) runs the command with stdout and stderr on a pseudo-terminal and copies what it
  // wrote to its own stdout.
  const std::string cmd = absl::StrCat(
      "OMP_NUM_THREADS=1 script -qec \"'", LORADB_CLI_PATH, "' --store '", dir.file("store"),
      "' train --model '", TheBases().plain, "' --policy bar --data '", data,
      "' --steps 3 --batch 8 --threads 1\" /dev/null >'", dir.file("tty"), "' 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << testing::Slurp(dir.file("tty"));
  const std::string tty = testing::Slurp(dir.file("tty"));
  EXPECT_THAT(tty, HasSubstr("\r\033[K[========"));
  EXPECT_THAT(tty, HasSubstr("3/3 sft loss "));
  EXPECT_THAT(tty, HasSubstr(" tok/s | ETA 0:00"));
  EXPECT_THAT(tty, Not(HasSubstr("\"event\"")));
}

TEST(TrainDataCli, SftOnTextAndChatWithTheBasesTokenizer) {
  TempDir dir;
  const std::vector<std::string> colours = {"red", "green", "blue", "yellow", "white"};
  const std::vector<std::string> things = {"apple", "grass", "sky", "sun", "snow"};
  std::vector<std::string> lines;
  for (size_t i = 0; i < things.size(); ++i) {
    lines.push_back(absl::StrCat("{\"prompt\": \"What colour is the ", things[i],
                                 "?\", \"completion\": \" It is ", colours[i], ".\"}"));
    lines.push_back(absl::StrCat(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Name a ", colours[i],
        " thing.\"}, {\"role\": \"assistant\", \"content\": \"The ", things[i], "!\"}]}"));
  }
  const std::string data = WriteLines(dir, "text.jsonl", lines);
  CliRun r = Train(dir, dir.file("store"), TheBases().with_tokenizer, "text", data,
                   "--steps 30 --batch 10 --lr 1e-2");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("10 SFT examples"));
  EXPECT_THAT(r.err, HasSubstr("(10 lines tokenized from text)"));
  Output o = ParseOutput(r);
  EXPECT_LT(o.result["end_loss"].get<double>(), 0.5 * o.result["start_loss"].get<double>())
      << o.result.dump();
  EXPECT_GT(o.result["revision"].get<uint64_t>(), 0u);

  // The same file on a base without tokenizer.json: refused, naming the file; no store written.
  const std::string store = dir.file("untouched");
  CliRun refused = Train(dir, store, TheBases().plain, "text", data, "--steps 3");
  EXPECT_EQ(refused.rc, 1);
  EXPECT_THAT(refused.err,
              HasSubstr(absl::StrCat("line 1: 'prompt' is text and the base has no tokenizer (",
                                     TheBases().plain, "/tokenizer.json does not exist)")));
  EXPECT_THAT(refused.err, HasSubstr("10 of 10 lines failed validation (nothing was trained)"));
  EXPECT_FALSE(fs::exists(store));
}

TEST(TrainDataCli, DpoPairsTrain) {
  TempDir dir;
  std::vector<std::string> lines;
  for (int k = 0; k < 32; ++k) {
    lines.push_back(absl::StrCat("{\"prompt\": [1, ", 300 + k, ", 2], \"chosen\": [", 400 + k,
                                 "], \"rejected\": [", 440 + k, "]}"));
  }
  const std::string data = WriteLines(dir, "dpo.jsonl", lines);
  CliRun r = Train(dir, dir.file("store"), TheBases().plain, "dpo", data,
                   "--steps 20 --batch 16 --lr 1e-2");
  ASSERT_EQ(r.rc, 0) << r.err;
  Output o = ParseOutput(r);
  ASSERT_EQ(o.steps.size(), 20u);
  EXPECT_TRUE(o.steps[0].contains("margin"));
  EXPECT_EQ(o.result["kind"], "DPO");
  // Before training the policy is the reference: loss ln 2, no pair preferred.
  EXPECT_NEAR(o.result["start_loss"].get<double>(), std::log(2.0), 1e-4);
  EXPECT_LT(o.result["end_loss"].get<double>(), 0.5 * std::log(2.0)) << o.result.dump();
  EXPECT_GT(o.result["end_preferred"].get<double>(), 0.9);
  EXPECT_GT(o.result["revision"].get<uint64_t>(), 0u);
}

TEST(TrainDataCli, GrpoWithARewardProgramRaisesTheReward) {
  TempDir dir;
  const std::string store = dir.file("store");
  // Warm start: a few SFT steps on the answers, so rollouts at temperature 1 sometimes earn the
  // reward (a random base almost never samples the one right token of 1024; after 9 steps the
  // argmax is right on 29 of 32 keys but sampling earns ~0.2).
  CliRun warm =
      Train(dir, store, TheBases().plain, "rl", WriteLines(dir, "sft.jsonl", MappingLines()),
            "--steps 9 --batch 16 --lr 1e-2 --no-publish");
  ASSERT_EQ(warm.rc, 0) << warm.err;
  std::vector<std::string> prompts;
  for (int k = 0; k < 32; ++k) {
    prompts.push_back(
        absl::StrCat("{\"prompt\": [1, ", 100 + k, ", 2], \"answer\": ", Answer(k), "}"));
  }
  const std::string reward = absl::StrCat("python3 '", LORADB_SOURCE_DIR,
                                          "/tests/compute/testdata/exact_answer_reward.py'");
  CliRun r = Train(dir, store, TheBases().plain, "rl", WriteLines(dir, "rl.jsonl", prompts),
                   absl::StrCat("--steps 29 --grpo-prompts 8 --grpo-group 8 --max-tokens 1 ",
                                "--lr 5e-3 --eval 32 --reward-cmd \"", reward, "\""));
  ASSERT_EQ(r.rc, 0) << r.err;
  Output o = ParseOutput(r);
  EXPECT_EQ(o.result["kind"], "GRPO");
  EXPECT_EQ(o.result["start_step"], 9);
  ASSERT_EQ(o.steps.size(), 20u);
  EXPECT_TRUE(o.steps[0].contains("reward"));
  const double before = o.result["start_mean_reward"].get<double>();
  const double after = o.result["end_mean_reward"].get<double>();
  // 32 prompts x 8 rollouts each time, at fixed seeds (measured: 0.18 -> 0.55; seeds 1 and 2
  // of the whole run: 0.12 -> 0.45, 0.20 -> 0.45). A rate of 1e-2 collapses instead.
  EXPECT_GT(after, before + 0.15) << o.result.dump();
  EXPECT_GT(o.result["revision"].get<uint64_t>(), 0u);
}

TEST(TrainDataCli, TheRewardProgramGetsEachRolloutAsAJsonLine) {
  TempDir dir;
  const std::string data =
      WriteLines(dir, "rl.jsonl",
                 {R"({"prompt": "What colour is the sky?", "answer": "blue", "meta": {"id": 7}})",
                  R"({"prompt": [1, 2, 3]})"});
  const std::string log = dir.file("rollouts.jsonl");
  const std::string script = dir.file("reward.sh");
  std::ofstream(script) << "while read -r l; do printf '%s\\n' \"$l\" >> '" << log
                        << "'; echo 0.25; done\n";
  CliRun r = Train(dir, dir.file("store"), TheBases().with_tokenizer, "rl", data,
                   absl::StrCat("--steps 1 --grpo-prompts 2 --grpo-group 3 --max-tokens 4 ",
                                "--eval 2 --reward-cmd 'sh ", script, "'"));
  ASSERT_EQ(r.rc, 0) << r.err;
  // Evaluation before, one step, evaluation after: 3 batches of 2 prompts x 3 rollouts.
  std::vector<Json> rollouts;
  for (absl::string_view line : absl::StrSplit(testing::Slurp(log), '\n', absl::SkipEmpty())) {
    rollouts.push_back(Json::parse(line));
  }
  ASSERT_EQ(rollouts.size(), 18u);
  for (const Json& ro : rollouts) {
    const int line = ro["line"].get<int>();
    ASSERT_TRUE(line == 1 || line == 2) << ro.dump();
    EXPECT_LE(ro["completion_ids"].size(), 4u);
    EXPECT_GE(ro["completion_ids"].size(), 1u);
    EXPECT_TRUE(ro.contains("completion"));  // text or null (ids past the tokenizer's 366)
    if (line == 1) {
      EXPECT_EQ(ro["prompt"], "What colour is the sky?");
      EXPECT_EQ(ro["example"]["answer"], "blue");
      EXPECT_EQ(ro["example"]["meta"]["id"], 7);
    } else {
      EXPECT_EQ(ro["prompt_ids"], Json::array({1, 2, 3}));
      EXPECT_EQ(ro["example"], Json::parse(R"({"prompt": [1, 2, 3]})"));
    }
  }
  Output o = ParseOutput(r);
  EXPECT_NEAR(o.result["start_mean_reward"].get<double>(), 0.25, 1e-12);
}

TEST(TrainDataCli, RewardProgramFailuresStopTheRun) {
  TempDir dir;
  const std::string data = WriteLines(dir, "rl.jsonl", {"{\"prompt\": [1, 2], \"answer\": 3}"});
  CliRun garbage = Train(dir, dir.file("store"), TheBases().plain, "rl", data,
                         "--steps 2 --grpo-prompts 1 --grpo-group 2 --reward-cmd "
                         "'while read -r l; do echo good; done'");
  EXPECT_EQ(garbage.rc, 1);
  EXPECT_THAT(garbage.err, HasSubstr("wrote \"good\" for rollout 1"));
  CliRun dies = Train(dir, dir.file("store"), TheBases().plain, "rl", data,
                      "--steps 2 --grpo-prompts 1 --grpo-group 2 --reward-cmd 'exit 4'");
  EXPECT_EQ(dies.rc, 1);
  EXPECT_THAT(dies.err, HasSubstr("reward program 'exit 4'"));
  EXPECT_THAT(dies.err, HasSubstr("exited with status 4"));
  CliRun missing = Train(dir, dir.file("store"), TheBases().plain, "rl", data, "--steps 2");
  EXPECT_EQ(missing.rc, 1);
  EXPECT_THAT(missing.err, HasSubstr("--reward-cmd is required"));
}

TEST(TrainDataCli, MalformedFilesNameTheLineAndLeaveTheStoreAsItWas) {
  TempDir dir;
  const std::string store = dir.file("store");
  // A store with a trained policy in it.
  CliRun ok = Train(dir, store, TheBases().plain, "kept",
                    WriteLines(dir, "good.jsonl", MappingLines()), "--steps 1 --batch 4");
  ASSERT_EQ(ok.rc, 0) << ok.err;
  CliRun policies = Cli(dir, store, "policy ls --json");
  ASSERT_EQ(policies.rc, 0);
  const std::string before = Listing(store);

  const std::string good = "{\"tokens\": [1, 2, 3]}";
  struct Case {
    std::vector<std::string> lines;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{good, good, "{\"tokens\": [1, 2, 3}"}, "line 3: the line is not valid JSON"},
      {{good, "{\"tokens\": [1, \"two\", 3]}"}, "line 2: 'tokens'[1] must be an integer token id"},
      {{good, "{\"tokens\": [1, 2], \"weights\": \"all\"}"}, "line 2: 'weights' must be an array"},
      {{good, good, good, "{\"tokens\": [1, 1024, 3]}"},
       "line 4: 'tokens'[1] = 1024 is outside the base's vocabulary [0, 1024)"},
      {{good, "{\"prompt\": [1], \"chosen\": [2], \"rejected\": [3]}"},
       "line 2: a DPO line (prompt, chosen, rejected), but line 1 is SFT"},
      {{good, "{\"tokens\": [1, 2], \"weights\": [0, 0]}"}, "line 2: no target"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string data = WriteLines(dir, absl::StrCat("bad", i, ".jsonl"), cases[i].lines);
    CliRun r = Train(dir, store, TheBases().plain, absl::StrCat("new", i), data, "--steps 5");
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_THAT(r.err, HasSubstr(cases[i].want));
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat(data, ": 1 of ")));
    EXPECT_THAT(r.err, HasSubstr("nothing was trained"));
    EXPECT_EQ(r.out, "");
  }
  // Data that parse but do not fit the run are refused before the store is touched too.
  const std::string sft = WriteLines(dir, "sft.jsonl", {good});
  CliRun reward_on_sft = Train(dir, store, TheBases().plain, "new", sft, "--reward-cmd true");
  EXPECT_EQ(reward_on_sft.rc, 1);
  EXPECT_THAT(reward_on_sft.err, HasSubstr("--reward-cmd is for GRPO prompt data"));
  EXPECT_EQ(Listing(store), before);
  CliRun after = Cli(dir, store, "policy ls --json");
  EXPECT_EQ(after.out, policies.out);
}

}  // namespace
}  // namespace loradb

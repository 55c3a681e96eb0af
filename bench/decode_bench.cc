// Scenario `decode`: multi-LoRA decode throughput on the CPU with a ~60M-parameter random dense
// base (compute/configs/bench-60m.json, fp32) and rank-16 adapters on q/k/v/o/gate/up/down. It
// owns every decode-throughput figure; two cases:
//  - `decoder` (default): the store-backed decoder end to end (compute/decoder): adapters
//    published into a store; per batch size, decode tokens/s with the base only and with d
//    distinct adapters for each d of --distinct (each step: one device-tier lease over the
//    step's adapters, the kernels' BGMV applier), and the merge path for the largest d (per
//    adapter: copy the base, merge W += scale B A, serve that adapter's requests; merge time
//    counted).
//  - `model`: the bare Qwen3 model (compute/model, no store): base only, one adapter, `batch`
//    distinct adapters through the kernels and through the torch reference applier, and
//    distinct bf16 adapters (the serving layout) through the kernels.
//  - `linear`: the base's linear layers alone (every projection and the LM head, one pass =
//    the weights a decode step reads) on --linear-rows input rows, through the dense kernel the
//    model uses in inference and through LibTorch's at::linear (BLAS), alternately; then on
//    --linear-train-rows rows as in training (inputs that require grad, forward plus backward
//    to the inputs), through the GEMM the model uses there and through at::linear.
// `all` runs all three. Cases run round-robin --rounds times so that all of them see the same
// machine load; every figure is the median over the rounds (the merge path runs once: it is slow).
// The decoder case also serves each batch with one row on an adapter that uses DoRA, and one row
// on an adapter with its own lm_head (modules_to_save), the other rows as in distinct_<d>.
// Goal lines: distinct adapters >= 0.6x base-only decode tokens/s at the same batch
// (decoder and bare model); the decoder with distinct adapters >= 2x the merge path; one DoRA /
// lm_head row costs at most 1.3x the all-plain batch's decode time; the dense kernel at least as
// fast as BLAS at every measured row count (the model uses it for every row count).
// Flags: --batches=16,64 --distinct=1,16,64 --steps=N --prompt=N --rank=N --rounds=N
// --threads=N (LibTorch intra-op and kernel threads, default 1: on a shared 2-core machine
// multi-threaded ATen spins at barriers) --merge-batches=N,.. (batches that also run the merge
// path; default every batch) --no-merge --config=PATH.
#if defined(LORADB_COMPUTE_AVAILABLE)

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "compute/decoder/decode_bench_tools.h"
#include "compute/model/model_tools.h"

namespace loradb::bench {
namespace {

struct Options {
  std::string which = "decoder";  // decoder | model | linear | all
  std::vector<int64_t> batches = {16, 64};
  std::vector<int64_t> distinct = {1, 16, 64};
  std::vector<int64_t> merge_batches;  // batches that run the merge path (empty: every batch)
  std::vector<int64_t> linear_rows = {1, 8, 64, 256};
  std::vector<int64_t> linear_train_rows = {512};
  int64_t steps = 8, prompt = 16, rank = 16, threads = 1, rounds = 1;
  bool merge = true;
  std::string config = std::string(LORADB_SOURCE_DIR) + "/compute/configs/bench-60m.json";
};

absl::Status ParseArgs(const std::vector<std::string>& args, Options* o) {
  CLI::App app("decode: the multi-LoRA decoder and model, adapters per batch", "decode");
  app.add_option("case", o->which, "decoder, model, linear or all")
      ->check(CLI::IsMember({"decoder", "model", "linear", "all"}));
  app.add_option("--batches", o->batches, "batch sizes, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--distinct", o->distinct, "distinct adapters per batch, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--merge-batches", o->merge_batches,
                 "batches that run the merge path (default: every batch)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--linear-rows", o->linear_rows, "linear: input rows, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--linear-train-rows", o->linear_train_rows,
                 "linear: input rows of the training passes, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", o->steps, "decode steps")->check(CLI::PositiveNumber);
  app.add_option("--prompt", o->prompt, "prompt tokens")->check(CLI::PositiveNumber);
  app.add_option("--rank", o->rank, "LoRA rank")->check(CLI::PositiveNumber);
  app.add_option("--rounds", o->rounds, "rounds (medians are reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", o->threads, "LibTorch and LoRA kernel threads")
      ->check(CLI::PositiveNumber);
  app.add_flag("!--no-merge", o->merge, "skip the merge path");
  app.add_option("--config", o->config, "model config (JSON)");
  return ParseFlags(&app, args);
}

// One measured case: `run` measures it once and returns its figures (numbers, including
// "decode_tokens_per_s").
struct Case {
  std::string name;
  int64_t adapters = 0;
  bool once = false;  // run in the first round only
  std::function<absl::StatusOr<nlohmann::json>()> run;
};

// Runs `cases` round-robin `rounds` times and returns, per case, its figures with every number
// replaced by its median over the rounds.
absl::StatusOr<std::vector<nlohmann::json>> RunRoundRobin(const std::vector<Case>& cases,
                                                          int64_t rounds,
                                                          const std::string& label) {
  std::vector<std::vector<nlohmann::json>> runs(cases.size());
  for (int64_t round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases[i].once && round > 0) continue;
      Progress(absl::StrCat(label, " round ", round + 1, "/", rounds, ": ", cases[i].name));
      absl::StatusOr<nlohmann::json> r = cases[i].run();
      if (!r.ok()) return r.status();
      runs[i].push_back(*std::move(r));
    }
  }
  std::vector<nlohmann::json> medians;
  for (const std::vector<nlohmann::json>& case_runs : runs) {
    nlohmann::json m = case_runs.back();
    for (auto& [key, value] : m.items()) {
      if (!value.is_number()) continue;
      std::vector<double> samples;
      for (const nlohmann::json& r : case_runs) samples.push_back(r[key].get<double>());
      const double median = Quantile(samples, 0.5);
      if (value.is_number_integer()) {
        value = static_cast<int64_t>(median);
      } else {
        value = median;
      }
    }
    m["rounds"] = case_runs.size();
    medians.push_back(std::move(m));
  }
  return medians;
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

// The measurement line of one case: its parameters, then its (median) figures.
nlohmann::json CaseLine(const Options& o, const std::string& path, int64_t batch, const Case& c,
                        const nlohmann::json& figures) {
  nlohmann::json line = {{"bench", "decode"},      {"case", c.name},
                         {"path", path},           {"batch", batch},
                         {"adapters", c.adapters}, {"rank", o.rank},
                         {"threads", o.threads},   {"prompt_tokens", o.prompt},
                         {"decode_steps", o.steps}};
  line.update(figures);
  return line;
}

absl::Status RunDecoderCases(const Options& o, const std::string& dir) {
  int64_t adapters = 1;
  for (int64_t b : o.batches) {
    for (int64_t d : o.distinct) adapters = std::max(adapters, std::min(b, d));
  }
  Progress(absl::StrCat("decoder: writing a random base and publishing ", adapters, " adapters"));
  absl::StatusOr<std::unique_ptr<decoder::DecodeBenchHarness>> created =
      decoder::DecodeBenchHarness::Create(o.config, dir, adapters, o.rank,
                                          static_cast<int>(o.threads), static_cast<int>(o.threads));
  if (!created.ok()) return created.status();
  decoder::DecodeBenchHarness& h = **created;
  Emit({{"bench", "decode"},
        {"case", "setup"},
        {"path", "decoder"},
        {"parameters", h.num_parameters()},
        {"adapter_bytes", h.adapter_bytes()},
        {"adapters", adapters}});
  auto figures = [](const decoder::DecodeBenchRun& r, bool merged) {
    return nlohmann::json{
        {"decode_tokens", r.decode_tokens},
        {"decode_tokens_per_s", merged ? r.end_to_end_tokens_per_s() : r.decode_tokens_per_s()},
        {"decode_only_tokens_per_s", r.decode_tokens_per_s()},
        {"prefill_s", r.prefill_seconds},
        {"merge_s", r.merge_seconds},
        {"deferrals", r.deferrals},
        {"adapter_builds", r.adapter_builds}};
  };
  for (int64_t batch : o.batches) {
    std::vector<int64_t> distincts;
    for (int64_t d : o.distinct) {
      if (d <= batch && std::find(distincts.begin(), distincts.end(), d) == distincts.end()) {
        distincts.push_back(d);
      }
    }
    if (distincts.empty()) distincts.push_back(batch);
    std::sort(distincts.begin(), distincts.end());
    const int64_t most = distincts.back();
    std::vector<Case> cases;
    cases.push_back({"base", 0, false, [&, batch]() -> absl::StatusOr<nlohmann::json> {
                       absl::StatusOr<decoder::DecodeBenchRun> r =
                           h.RunDecoder(batch, 0, o.prompt, o.steps);
                       if (!r.ok()) return r.status();
                       return figures(*r, false);
                     }});
    for (int64_t d : distincts) {
      cases.push_back({d == 1 ? "one_adapter" : absl::StrCat("distinct_", d), d, false,
                       [&, batch, d]() -> absl::StatusOr<nlohmann::json> {
                         absl::StatusOr<decoder::DecodeBenchRun> r =
                             h.RunDecoder(batch, d, o.prompt, o.steps);
                         if (!r.ok()) return r.status();
                         return figures(*r, false);
                       }});
    }
    // One row of the batch on an adapter that uses DoRA / its own lm_head (modules_to_save),
    // the others on the same plain adapters as distinct_<most>.
    const std::vector<std::pair<std::string, std::string>> features = {
        {"dora", decoder::DecodeBenchHarness::kDoraAdapter},
        {"lm_head_mts", decoder::DecodeBenchHarness::kLmHeadAdapter}};
    for (const auto& [feature, ref] : features) {
      cases.push_back({absl::StrCat("one_", feature, "_of_", batch), most, false,
                       [&, batch, most, ref = ref]() -> absl::StatusOr<nlohmann::json> {
                         absl::StatusOr<decoder::DecodeBenchRun> r =
                             h.RunDecoder(batch, most, o.prompt, o.steps, ref);
                         if (!r.ok()) return r.status();
                         return figures(*r, false);
                       }});
    }
    const bool merge = o.merge && (o.merge_batches.empty() ||
                                   std::find(o.merge_batches.begin(), o.merge_batches.end(),
                                             batch) != o.merge_batches.end());
    if (merge) {
      cases.push_back({absl::StrCat("merge_", most), most, true,
                       [&, batch, most]() -> absl::StatusOr<nlohmann::json> {
                         absl::StatusOr<decoder::DecodeBenchRun> r =
                             h.RunMerged(batch, most, o.prompt, o.steps);
                         if (!r.ok()) return r.status();
                         return figures(*r, true);
                       }});
    }
    absl::StatusOr<std::vector<nlohmann::json>> results =
        RunRoundRobin(cases, o.rounds, absl::StrCat("decoder batch ", batch));
    if (!results.ok()) return results.status();
    double base_tps = 0, most_tps = 0, merge_tps = 0;
    std::map<std::string, double> feature_tps;
    for (size_t i = 0; i < cases.size(); ++i) {
      Emit(CaseLine(o, "decoder", batch, cases[i], (*results)[i]));
      const double tps = (*results)[i]["decode_tokens_per_s"].get<double>();
      if (cases[i].name == "base") base_tps = tps;
      if (cases[i].once) {
        merge_tps = tps;
      } else if (absl::StartsWith(cases[i].name, "one_") && cases[i].name != "one_adapter") {
        feature_tps[cases[i].name] = tps;
      } else if (cases[i].adapters == most) {
        most_tps = tps;
      }
    }
    // Decode time of the batch with one feature row over the all-plain batch's.
    for (const auto& [name, tps] : feature_tps) {
      const double slowdown = Ratio(most_tps, tps);
      EmitGoal("decode", absl::StrCat(name, "_vs_plain_batch", batch, "_time"), slowdown, "<= 1.3",
               slowdown > 0 && slowdown <= 1.3);
    }
    const double vs_base = Ratio(most_tps, base_tps);
    EmitGoal("decode", absl::StrCat("distinct_", most, "_vs_base_batch", batch), vs_base, ">= 0.6",
             vs_base >= 0.6);
    if (merge) {
      const double vs_merge = Ratio(most_tps, merge_tps);
      EmitGoal("decode", absl::StrCat("distinct_", most, "_vs_merge_batch", batch), vs_merge,
               ">= 2", vs_merge >= 2);
    }
  }
  return absl::OkStatus();
}

absl::Status RunModelCases(const Options& o, const std::string& dir) {
  Progress("model: writing a random checkpoint for " + o.config);
  absl::StatusOr<Hash128> fp = model::InitRandomCheckpoint(o.config, dir, 1, "f32");
  if (!fp.ok()) return fp.status();
  struct Variant {
    std::string name;
    bool per_row;  // one adapter per sequence
    std::string applier;
    std::string adapter_dtype;
  };
  const std::vector<Variant> variants = {{"model_base", false, "kernel", "f32"},
                                         {"model_one_adapter", false, "kernel", "f32"},
                                         {"model_distinct_kernel", true, "kernel", "f32"},
                                         {"model_distinct_torch", true, "torch", "f32"},
                                         {"model_distinct_kernel_bf16", true, "kernel", "bf16"}};
  for (int64_t batch : o.batches) {
    std::vector<Case> cases;
    for (size_t i = 0; i < variants.size(); ++i) {
      const Variant& v = variants[i];
      const int64_t adapters = i == 0 ? 0 : (v.per_row ? batch : 1);
      cases.push_back({v.name, adapters, false,
                       [&o, &dir, v, batch, adapters]() -> absl::StatusOr<nlohmann::json> {
                         model::DecodeBenchOptions bo;
                         bo.model_dir = dir;
                         bo.batch = batch;
                         bo.prompt_len = o.prompt;
                         bo.steps = o.steps;
                         bo.num_adapters = adapters;
                         bo.rank = o.rank;
                         bo.applier = v.applier;
                         bo.adapter_dtype = v.adapter_dtype;
                         bo.threads = static_cast<int>(o.threads);
                         absl::StatusOr<model::DecodeBenchResult> r = model::RunDecodeBenchmark(bo);
                         if (!r.ok()) return r.status();
                         return nlohmann::json{{"prefill_tokens_per_s", r->prefill_tokens_per_s},
                                               {"decode_tokens_per_s", r->decode_tokens_per_s},
                                               {"decode_step_p50_ms", r->decode_step_ms_p50},
                                               {"kernel_calls", r->kernel_calls},
                                               {"fallback_calls", r->fallback_calls}};
                       }});
    }
    absl::StatusOr<std::vector<nlohmann::json>> results =
        RunRoundRobin(cases, o.rounds, absl::StrCat("model batch ", batch));
    if (!results.ok()) return results.status();
    std::vector<double> tps;
    for (size_t i = 0; i < cases.size(); ++i) {
      nlohmann::json line = CaseLine(o, "model", batch, cases[i], (*results)[i]);
      line["applier"] = variants[i].applier;
      line["adapter_dtype"] = variants[i].adapter_dtype;
      Emit(line);
      tps.push_back((*results)[i]["decode_tokens_per_s"].get<double>());
    }
    const double ratio = Ratio(tps[2], tps[0]);
    EmitGoal("decode", absl::StrCat("model_distinct_adapters_vs_base_batch", batch), ratio,
             ">= 0.6", ratio >= 0.6);
    const double bf16_ratio = Ratio(tps[4], tps[0]);
    EmitGoal("decode", absl::StrCat("model_distinct_bf16_adapters_vs_base_batch", batch),
             bf16_ratio, ">= 0.6", bf16_ratio >= 0.6);
    Emit({{"bench", "decode"},
          {"case", "model_kernel_vs_torch_applier"},
          {"path", "model"},
          {"batch", batch},
          {"speedup", Ratio(tps[2], tps[3])}});
  }
  return absl::OkStatus();
}

absl::Status RunLinearCases(const Options& o, const std::string& dir) {
  Progress("linear: writing a random base");
  absl::StatusOr<std::unique_ptr<decoder::DecodeBenchHarness>> created =
      decoder::DecodeBenchHarness::Create(o.config, dir, 1, o.rank, static_cast<int>(o.threads),
                                          static_cast<int>(o.threads));
  if (!created.ok()) return created.status();
  const int rounds = static_cast<int>(std::max<int64_t>(3, 2 * o.rounds + 1));
  std::vector<std::pair<int64_t, bool>> cases;
  for (int64_t rows : o.linear_rows) cases.emplace_back(rows, false);
  for (int64_t rows : o.linear_train_rows) cases.emplace_back(rows, true);
  for (const auto& [rows, training] : cases) {
    Progress(absl::StrCat("linear: ", rows, " rows, ",
                          training ? "forward + backward, GEMM" : "forward, dense kernel",
                          " and at::linear x ", rounds));
    absl::StatusOr<decoder::BaseLinearTiming> t =
        (*created)->TimeBaseLinears(rows, rounds, training);
    if (!t.ok()) return t.status();
    const double gb = static_cast<double>(t->weight_bytes) / 1e9;
    // Multiply-adds of one pass: rows x every weight, twice in training (forward and dx).
    const double gflop = 2.0 * static_cast<double>(rows) * static_cast<double>(t->weight_bytes) /
                         4.0 * (training ? 2 : 1) / 1e9;
    Emit({{"bench", "decode"},
          {"case", training ? "base_linear_train" : "base_linear"},
          {"path", "model"},
          {"rows", rows},
          {"threads", o.threads},
          {"matrices", t->matrices},
          {"weight_bytes", t->weight_bytes},
          {training ? "gemm_seconds" : "dense_seconds", t->dense_seconds},
          {"blas_seconds", t->blas_seconds},
          {training ? "gemm_gflop_per_s" : "dense_weight_gb_per_s",
           Ratio(training ? gflop : gb, t->dense_seconds)},
          {training ? "blas_gflop_per_s" : "blas_weight_gb_per_s",
           Ratio(training ? gflop : gb, t->blas_seconds)},
          {"max_rel_diff", t->max_rel_diff}});
    const double speedup = Ratio(t->blas_seconds, t->dense_seconds);
    EmitGoal("decode",
             absl::StrCat(training ? "base_linear_train_gemm_vs_blas_rows"
                                   : "base_linear_dense_vs_blas_rows",
                          rows),
             speedup, ">= 1", speedup >= 1);
  }
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  Options o;
  absl::Status st = ParseArgs(args, &o);
  if (!st.ok()) return st;
  const ScopedBenchDir scratch("loradb-bench-decode");
  const std::filesystem::path& dir = scratch.path();
  std::filesystem::create_directories(dir / "decoder");
  std::filesystem::create_directories(dir / "model");
  std::filesystem::create_directories(dir / "linear");
  absl::Status result = absl::OkStatus();
  if (o.which == "decoder" || o.which == "all") {
    result = RunDecoderCases(o, (dir / "decoder").string());
  }
  if (result.ok() && (o.which == "model" || o.which == "all")) {
    result = RunModelCases(o, (dir / "model").string());
  }
  if (result.ok() && (o.which == "linear" || o.which == "all")) {
    result = RunLinearCases(o, (dir / "linear").string());
  }
  return result;
}

LORADB_REGISTER_SCENARIO({"decode",
                          "multi-LoRA decode tokens/s: decoder (store-backed: base, d distinct "
                          "adapters, merge path) | model (bare model: kernels vs torch applier, "
                          "bf16) | linear (base linears: dense kernel vs BLAS) | all",
                          Run,
                          {"all", "--batches=16,64", "--distinct=1,4,16,64", "--merge-batches=16",
                           "--steps=8", "--rounds=3"}});

}  // namespace
}  // namespace loradb::bench

#endif  // LORADB_COMPUTE_AVAILABLE

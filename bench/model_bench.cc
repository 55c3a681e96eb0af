// Scenario `model`: decode throughput of the Qwen3 model (compute/model) on the CPU with a
// ~60M-parameter random dense base (compute/configs/bench-60m.json, fp32): per batch size, base
// only; one adapter; `batch` distinct adapters through the kernels' BGMV applier; the same
// through the torch reference applier; distinct bf16 adapters (the serving layout) through the
// kernels. Rank 16 on q/k/v/o/gate/up/down. Goal line (issue 6's
// goal, measured here on the bare model without the store): distinct adapters via the kernels at
// >= 0.6x base-only decode tokens/s at the same batch size.
// Flags: --batches=16,64 --rounds=N (cases round-robin, median) --steps=N --prompt=N --rank=N
// --threads=N (default 1: on a shared 2-core machine multi-threaded ATen spins at barriers and is
// many times slower) --config=PATH.
#if defined(LORADB_COMPUTE_AVAILABLE)

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "compute/model/model_tools.h"

namespace loradb::bench {
namespace {

struct Options {
  std::vector<int64_t> batches = {16, 64};
  int64_t steps = 8, prompt = 16, rank = 16, threads = 1, rounds = 3;
  std::string config = std::string(LORADB_SOURCE_DIR) + "/compute/configs/bench-60m.json";
};

absl::Status ParseArgs(const std::vector<std::string>& args, Options* o) {
  for (const std::string& a : args) {
    auto num = [&](size_t skip, int64_t* v) {
      return absl::SimpleAtoi(a.substr(skip), v) && *v > 0;
    };
    bool ok = true;
    if (a.rfind("--batches=", 0) == 0) {
      o->batches.clear();
      for (absl::string_view p : absl::StrSplit(a.substr(10), ',')) {
        int64_t v = 0;
        ok = ok && absl::SimpleAtoi(p, &v) && v > 0;
        o->batches.push_back(v);
      }
    } else if (a.rfind("--steps=", 0) == 0) {
      ok = num(8, &o->steps);
    } else if (a.rfind("--prompt=", 0) == 0) {
      ok = num(9, &o->prompt);
    } else if (a.rfind("--rounds=", 0) == 0) {
      ok = num(9, &o->rounds);
    } else if (a.rfind("--threads=", 0) == 0) {
      ok = num(10, &o->threads);
    } else if (a.rfind("--rank=", 0) == 0) {
      ok = num(7, &o->rank);
    } else if (a.rfind("--config=", 0) == 0) {
      o->config = a.substr(9);
    } else {
      ok = false;
    }
    if (!ok) return absl::InvalidArgumentError("model bench: bad argument " + a);
  }
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  Options o;
  absl::Status st = ParseArgs(args, &o);
  if (!st.ok()) return st;
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("loradb-bench-model-", getpid()))
          .string();
  Progress("writing a random checkpoint for " + o.config);
  absl::StatusOr<Hash128> fp = model::InitRandomCheckpoint(o.config, dir, 1, "f32");
  if (!fp.ok()) return fp.status();
  struct Case {
    std::string name;
    bool per_row;  // one adapter per sequence
    int64_t adapters;
    std::string applier;
    std::string adapter_dtype = "f32";
  };
  absl::Status result = absl::OkStatus();
  for (int64_t batch : o.batches) {
    const std::vector<Case> cases = {{"base", false, 0, "kernel"},
                                     {"one_adapter", false, 1, "kernel"},
                                     {"distinct_kernel", true, batch, "kernel"},
                                     {"distinct_torch", true, batch, "torch"},
                                     {"distinct_kernel_bf16", true, batch, "kernel", "bf16"}};
    // Cases run round-robin, `rounds` times, so that all of them see the same machine load;
    // each figure is the median over the rounds.
    std::vector<std::vector<model::DecodeBenchResult>> runs(cases.size());
    for (int64_t round = 0; round < o.rounds && result.ok(); ++round) {
      for (size_t i = 0; i < cases.size(); ++i) {
        const Case& c = cases[i];
        Progress(absl::StrCat("batch ", batch, " round ", round + 1, "/", o.rounds, ": ", c.name));
        model::DecodeBenchOptions bo;
        bo.model_dir = dir;
        bo.batch = batch;
        bo.prompt_len = o.prompt;
        bo.steps = o.steps;
        bo.num_adapters = c.adapters;
        bo.rank = o.rank;
        bo.applier = c.applier;
        bo.adapter_dtype = c.adapter_dtype;
        bo.threads = static_cast<int>(o.threads);
        absl::StatusOr<model::DecodeBenchResult> r = model::RunDecodeBenchmark(bo);
        if (!r.ok()) {
          result = r.status();
          break;
        }
        runs[i].push_back(*r);
      }
    }
    if (!result.ok()) break;
    std::vector<double> decode_tps(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      std::vector<double> tps, pre, p50;
      for (const model::DecodeBenchResult& r : runs[i]) {
        tps.push_back(r.decode_tokens_per_s);
        pre.push_back(r.prefill_tokens_per_s);
        p50.push_back(r.decode_step_ms_p50);
      }
      decode_tps[i] = Quantile(tps, 0.5);
      Emit({{"bench", "model"},
            {"case", c.name},
            {"batch", batch},
            {"adapters", c.adapters},
            {"rank", o.rank},
            {"applier", c.applier},
            {"adapter_dtype", c.adapter_dtype},
            {"threads", o.threads},
            {"rounds", o.rounds},
            {"prompt_tokens", o.prompt},
            {"decode_steps", o.steps},
            {"prefill_tokens_per_s", Quantile(pre, 0.5)},
            {"decode_tokens_per_s", decode_tps[i]},
            {"decode_step_p50_ms", Quantile(p50, 0.5)},
            {"kernel_calls", runs[i].back().kernel_calls},
            {"fallback_calls", runs[i].back().fallback_calls}});
    }
    const double base_tps = decode_tps[0];
    const double ratio = base_tps > 0 ? decode_tps[2] / base_tps : 0;
    EmitGoal("model", absl::StrCat("distinct_adapters_vs_base_batch", batch), ratio, ">= 0.6",
             ratio >= 0.6);
    const double bf16_ratio = base_tps > 0 ? decode_tps[4] / base_tps : 0;
    EmitGoal("model", absl::StrCat("distinct_bf16_adapters_vs_base_batch", batch), bf16_ratio,
             ">= 0.6", bf16_ratio >= 0.6);
    const double vs_torch = decode_tps[3] > 0 ? decode_tps[2] / decode_tps[3] : 0;
    Emit({{"bench", "model"},
          {"case", "kernel_vs_torch_applier"},
          {"batch", batch},
          {"speedup", vs_torch}});
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return result;
}

LORADB_REGISTER_SCENARIO({"model",
                          "Qwen3 model decode tokens/s: base, 1 adapter, distinct adapters "
                          "(kernels vs torch applier)",
                          Run,
                          {"--batches=16,64", "--steps=4", "--rounds=2"}});

}  // namespace
}  // namespace loradb::bench

#endif  // LORADB_COMPUTE_AVAILABLE

// Scenario `decode`: the store-backed multi-LoRA decoder end to end (compute/decoder) on the
// CPU with a ~60M-parameter random dense base (compute/configs/bench-60m.json, fp32) and rank-16
// adapters on q/k/v/o/gate/up/down published into a store. Per batch size: decode tokens/s with
// the base only, one adapter, 16 and 64 distinct adapters (each step: one device-tier lease over
// the step's adapters, kernels' BGMV applier), and the merge path (per adapter: copy the base,
// merge W += scale B A, serve that adapter's requests grouped; merge time counted).
// Goal lines (issue 6): 64 distinct adapters >= 0.6x base-only decode tokens/s at the same
// batch; distinct adapters well ahead (>= 2x) of the merge path.
// Flags: --batches=16,64 --steps=N --prompt=N --rank=N --lora-threads=N --config=PATH.
#if defined(LORADB_COMPUTE_AVAILABLE)

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "compute/decoder/decode_bench_tools.h"

namespace loradb::bench {
namespace {

struct Options {
  std::vector<int64_t> batches = {16, 64};
  int64_t steps = 16, prompt = 16, rank = 16, lora_threads = 1;
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
    } else if (a.rfind("--rank=", 0) == 0) {
      ok = num(7, &o->rank);
    } else if (a.rfind("--lora-threads=", 0) == 0) {
      ok = num(15, &o->lora_threads);
    } else if (a.rfind("--config=", 0) == 0) {
      o->config = a.substr(9);
    } else {
      ok = false;
    }
    if (!ok) return absl::InvalidArgumentError("decode bench: bad argument " + a);
  }
  return absl::OkStatus();
}

absl::Status RunCases(const Options& o, decoder::DecodeBenchHarness& h) {
  for (int64_t batch : o.batches) {
    double base_tps = 0;
    std::vector<int64_t> distincts = {16, 64};
    distincts.erase(
        std::remove_if(distincts.begin(), distincts.end(), [&](int64_t d) { return d > batch; }),
        distincts.end());
    if (distincts.empty()) distincts.push_back(batch);
    struct Case {
      std::string name;
      int64_t distinct;
      bool merged;
    };
    std::vector<Case> cases = {{"base", 0, false}, {"one_adapter", 1, false}};
    for (int64_t d : distincts) cases.push_back({absl::StrCat("distinct_", d), d, false});
    const int64_t most = distincts.back();
    cases.push_back({absl::StrCat("merge_", most), most, true});
    double most_tps = 0, merge_tps = 0;
    for (const Case& c : cases) {
      Progress(absl::StrCat("batch ", batch, ": ", c.name));
      absl::StatusOr<decoder::DecodeBenchRun> r =
          c.merged ? h.RunMerged(batch, c.distinct, o.prompt, o.steps)
                   : h.RunDecoder(batch, c.distinct, o.prompt, o.steps);
      if (!r.ok()) return r.status();
      const double tps = c.merged ? r->end_to_end_tokens_per_s() : r->decode_tokens_per_s();
      Emit({{"bench", "decode"},
            {"case", c.name},
            {"batch", batch},
            {"adapters", c.distinct},
            {"rank", o.rank},
            {"prompt_tokens", o.prompt},
            {"decode_steps", o.steps},
            {"decode_tokens", r->decode_tokens},
            {"decode_tokens_per_s", tps},
            {"decode_only_tokens_per_s", r->decode_tokens_per_s()},
            {"prefill_s", r->prefill_seconds},
            {"merge_s", r->merge_seconds},
            {"deferrals", r->deferrals},
            {"adapter_builds", r->adapter_builds}});
      if (c.name == "base") base_tps = tps;
      if (!c.merged && c.distinct == most) most_tps = tps;
      if (c.merged) merge_tps = tps;
    }
    const double vs_base = base_tps > 0 ? most_tps / base_tps : 0;
    EmitGoal("decode", absl::StrCat("distinct_", most, "_vs_base_batch", batch), vs_base, ">= 0.6",
             vs_base >= 0.6);
    const double vs_merge = merge_tps > 0 ? most_tps / merge_tps : 0;
    EmitGoal("decode", absl::StrCat("distinct_", most, "_vs_merge_batch", batch), vs_merge, ">= 2",
             vs_merge >= 2);
  }
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  Options o;
  absl::Status parsed = ParseArgs(args, &o);
  if (!parsed.ok()) return parsed;
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("loradb-bench-decode-", getpid()))
          .string();
  std::filesystem::create_directories(dir);
  const int64_t adapters =
      std::min<int64_t>(64, *std::max_element(o.batches.begin(), o.batches.end()));
  Progress(absl::StrCat("writing a random base and publishing ", adapters, " adapters"));
  absl::Status result = absl::OkStatus();
  {
    absl::StatusOr<std::unique_ptr<decoder::DecodeBenchHarness>> h =
        decoder::DecodeBenchHarness::Create(o.config, dir, adapters, o.rank,
                                            static_cast<int>(o.lora_threads));
    if (!h.ok()) {
      result = h.status();
    } else {
      Emit({{"bench", "decode"},
            {"case", "setup"},
            {"parameters", (*h)->num_parameters()},
            {"adapter_bytes", (*h)->adapter_bytes()},
            {"adapters", adapters}});
      result = RunCases(o, **h);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return result;
}

LORADB_REGISTER_SCENARIO({"decode",
                          "store-backed multi-LoRA decoder tokens/s: base, 1, 16, 64 adapters, "
                          "merge path",
                          Run,
                          {"--batches=16,64", "--steps=8"}});

}  // namespace
}  // namespace loradb::bench

#endif  // LORADB_COMPUTE_AVAILABLE

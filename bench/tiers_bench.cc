// loradb-bench tiers [cold-burst|dedup|traces|moe-load|all] [--flags]: the residency tiers
// (issue 4). See BENCHMARKS.md, section "tiers", for what each case measures and the exact
// trace definitions.
//
// Flags: --dir=PATH (scratch directory for adapter files, default $TMPDIR/loradb-tiers-bench),
// --requests=N (trace length, default 1000000), --burst=16,64 (cold-burst sizes),
// --moe=4,8,16 (moe-load live-load sizes), --keep (keep generated files).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_util.h"
#include "storage/formats/safetensors.h"
#include "storage/tiers/cpu_cache.h"
#include "storage/tiers/device_slots.h"
#include "storage/tiers/eviction.h"
#include "storage/tiers/loader.h"
#include "storage/util/file_util.h"
#include "storage/util/hash.h"
#include "storage/util/status_macros.h"

namespace loradb::bench {
namespace {

using tiers::EvictionPolicyKind;

struct Flags {
  std::string case_name = "all";
  std::string dir;
  uint64_t requests = 1'000'000;
  std::vector<int> burst = {16, 64};
  std::vector<int> moe = {4, 8, 16};
  bool keep = false;
  uint64_t budget = 256;  // traces: adapters the cache holds
  double zipf = 1.0;      // traces: Zipf exponent inside hot sets
};

absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view s) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad number list \"", s, "\""));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<Flags> ParseFlags(const std::vector<std::string>& args) {
  Flags f;
  f.dir = (std::filesystem::temp_directory_path() / "loradb-tiers-bench").string();
  for (const std::string& a : args) {
    if (a.rfind("--", 0) != 0) {
      f.case_name = a;
      continue;
    }
    std::string key = a.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    if (key == "dir") {
      f.dir = value;
    } else if (key == "requests") {
      if (!absl::SimpleAtoi(value, &f.requests) || f.requests == 0) {
        return absl::InvalidArgumentError("--requests wants a positive number");
      }
    } else if (key == "burst") {
      LORADB_ASSIGN_OR_RETURN(f.burst, ParseIntList(value));
    } else if (key == "moe") {
      LORADB_ASSIGN_OR_RETURN(f.moe, ParseIntList(value));
    } else if (key == "budget") {
      if (!absl::SimpleAtoi(value, &f.budget) || f.budget == 0) {
        return absl::InvalidArgumentError("--budget wants a positive number");
      }
    } else if (key == "zipf") {
      if (!absl::SimpleAtod(value, &f.zipf) || f.zipf <= 0) {
        return absl::InvalidArgumentError("--zipf wants a positive number");
      }
    } else if (key == "keep") {
      f.keep = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
    }
  }
  return f;
}

// ---------------------------------------------------------------------------------------------
// traces
// ---------------------------------------------------------------------------------------------

// A uniform double in [0, 1) from the top 53 bits of one mt19937_64 draw.
double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Zipf(s) over ranks 0..n-1 (rank k has weight 1/(k+1)^s), sampled by inverse CDF.
class Zipf {
 public:
  Zipf(uint64_t n, double s) : cdf_(n) {
    double sum = 0;
    for (uint64_t k = 0; k < n; ++k)
      cdf_[k] = (sum += 1.0 / std::pow(static_cast<double>(k + 1), s));
    for (double& c : cdf_) c /= sum;
  }
  uint64_t Sample(std::mt19937_64& rng) const {
    double u = Uniform(rng);
    auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
    return std::min<uint64_t>(static_cast<uint64_t>(it - cdf_.begin()), cdf_.size() - 1);
  }

 private:
  std::vector<double> cdf_;
};

// `k` distinct ids drawn uniformly from [0, universe) (rejection of repeats), in draw order.
std::vector<uint64_t> DrawSet(std::mt19937_64& rng, uint64_t universe, uint64_t k) {
  std::vector<uint64_t> out;
  absl::flat_hash_set<uint64_t> seen;
  while (out.size() < k) {
    uint64_t id = rng() % universe;
    if (seen.insert(id).second) out.push_back(id);
  }
  return out;
}

struct Trace {
  std::string name;
  std::string description;
  std::vector<uint64_t> keys;
};

constexpr uint64_t kUniverse = 100'000;

Trace SkewedHot(uint64_t n, uint64_t seed, double s) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> hot = DrawSet(rng, kUniverse, 512);
  Zipf zipf(512, s);
  Trace t{"skewed-hot", "", {}};
  for (uint64_t i = 0; i < n; ++i) {
    t.keys.push_back(Uniform(rng) < 0.9 ? hot[zipf.Sample(rng)] : rng() % kUniverse);
  }
  return t;
}

Trace WeakLocality(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> set = DrawSet(rng, kUniverse, 2048);
  Zipf zipf(2048, 0.5);
  Trace t{"weak-locality", "", {}};
  for (uint64_t i = 0; i < n; ++i) t.keys.push_back(set[zipf.Sample(rng)]);
  return t;
}

Trace ScanPolluted(uint64_t n, uint64_t seed, double s) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> hot = DrawSet(rng, kUniverse, 512);
  Zipf zipf(512, s);
  Trace t{"scan-polluted", "", {}};
  uint64_t scan_id = kUniverse;  // scans use ids never requested otherwise
  while (t.keys.size() < n) {
    for (int i = 0; i < 20'000 && t.keys.size() < n; ++i) {
      t.keys.push_back(Uniform(rng) < 0.9 ? hot[zipf.Sample(rng)] : rng() % kUniverse);
    }
    for (int i = 0; i < 1'000 && t.keys.size() < n; ++i) t.keys.push_back(scan_id++);
  }
  return t;
}

Trace Shifting(uint64_t n, uint64_t seed, double s) {
  std::mt19937_64 rng(seed);
  Zipf zipf(512, s);
  Trace t{"shifting", "", {}};
  std::vector<uint64_t> hot;
  for (uint64_t i = 0; i < n; ++i) {
    if (i % 100'000 == 0) hot = DrawSet(rng, kUniverse, 512);
    t.keys.push_back(Uniform(rng) < 0.9 ? hot[zipf.Sample(rng)] : rng() % kUniverse);
  }
  return t;
}

// Loads (misses) of `kind` on `keys` with room for `capacity` unit-size adapters, replayed the
// way CpuCache drives a policy: RecordAccess on every request, Touch on a hit, Insert then
// EvictOne until within budget on a miss.
uint64_t SimulatePolicy(EvictionPolicyKind kind, const std::vector<uint64_t>& keys,
                        uint64_t capacity) {
  auto policy = tiers::MakeEvictionPolicy(kind, capacity, capacity);
  absl::flat_hash_set<uint64_t> resident;
  uint64_t loads = 0;
  auto any = [](uint64_t) { return true; };
  for (uint64_t k : keys) {
    policy->RecordAccess(k);
    if (resident.contains(k)) {
      policy->Touch(k);
      continue;
    }
    ++loads;
    policy->Insert(k, 1);
    resident.insert(k);
    while (resident.size() > capacity) resident.erase(*policy->EvictOne(any));
  }
  return loads;
}

// Belady's MIN with bypass (the offline optimum for unit sizes): on a miss with a full cache,
// drop whichever of the residents and the newcomer is next requested furthest in the future.
uint64_t SimulateBelady(const std::vector<uint64_t>& keys, uint64_t capacity) {
  const uint64_t kNever = UINT64_MAX;
  std::vector<uint64_t> next(keys.size());
  absl::flat_hash_map<uint64_t, uint64_t> last;
  for (size_t i = keys.size(); i-- > 0;) {
    auto it = last.find(keys[i]);
    next[i] = it == last.end() ? kNever : it->second;
    last[keys[i]] = i;
  }
  std::set<std::pair<uint64_t, uint64_t>> by_next;   // (next use, key), furthest last
  absl::flat_hash_map<uint64_t, uint64_t> resident;  // key -> its next use
  uint64_t loads = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    uint64_t k = keys[i];
    if (auto it = resident.find(k); it != resident.end()) {
      by_next.erase({it->second, k});
      it->second = next[i];
      by_next.insert({next[i], k});
      continue;
    }
    ++loads;
    if (resident.size() < capacity) {
      resident[k] = next[i];
      by_next.insert({next[i], k});
      continue;
    }
    auto furthest = std::prev(by_next.end());
    if (furthest->first <= next[i]) continue;  // the newcomer is needed last: bypass it
    resident.erase(furthest->second);
    by_next.erase(furthest);
    resident[k] = next[i];
    by_next.insert({next[i], k});
  }
  return loads;
}

// An offline frequency oracle: the `capacity` keys requested most over the whole trace stay
// resident from their first request on; everything else is loaded on every request. This is
// what a perfect frequency-based online policy can approach on a stationary trace.
uint64_t SimulateStaticOracle(const std::vector<uint64_t>& keys, uint64_t capacity) {
  absl::flat_hash_map<uint64_t, uint64_t> freq;
  for (uint64_t k : keys) freq[k]++;
  std::vector<std::pair<uint64_t, uint64_t>> by_freq(freq.begin(), freq.end());
  std::sort(by_freq.begin(), by_freq.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  uint64_t loads = 0;
  for (size_t i = 0; i < by_freq.size(); ++i) loads += i < capacity ? 1 : by_freq[i].second;
  return loads;
}

absl::Status RunTraces(const Flags& f) {
  std::vector<Trace> traces = {SkewedHot(f.requests, 1, f.zipf), WeakLocality(f.requests, 2),
                               ScanPolluted(f.requests, 3, f.zipf),
                               Shifting(f.requests, 4, f.zipf)};
  const uint64_t kTraceBudget = f.budget;
  std::map<std::string, double> belady_limit = {
      {"skewed-hot", 1.3}, {"weak-locality", 1.5}, {"scan-polluted", 1.3}, {"shifting", 1.3}};
  for (const Trace& t : traces) {
    Progress(absl::StrCat("tiers traces: ", t.name, " (", t.keys.size(), " requests)"));
    uint64_t belady = SimulateBelady(t.keys, kTraceBudget);
    absl::flat_hash_set<uint64_t> distinct(t.keys.begin(), t.keys.end());
    nlohmann::json line = {{"bench", "tiers"},
                           {"case", "traces"},
                           {"trace", t.name},
                           {"requests", t.keys.size()},
                           {"distinct", distinct.size()},
                           {"budget_adapters", kTraceBudget},
                           {"belady_loads", belady},
                           {"static_oracle_loads", SimulateStaticOracle(t.keys, kTraceBudget)},
                           {"zipf", f.zipf}};
    std::map<EvictionPolicyKind, uint64_t> loads;
    for (auto kind :
         {EvictionPolicyKind::kLru, EvictionPolicyKind::kS3Fifo, EvictionPolicyKind::kWTinyLfu}) {
      loads[kind] = SimulatePolicy(kind, t.keys, kTraceBudget);
      std::string name = tiers::EvictionPolicyName(kind);
      line[name + "_loads"] = loads[kind];
      line[name + "_vs_belady"] = static_cast<double>(loads[kind]) / static_cast<double>(belady);
    }
    Emit(line);
    // Goals for the default policy (W-TinyLFU).
    uint64_t def = loads[EvictionPolicyKind::kWTinyLfu];
    uint64_t lru = loads[EvictionPolicyKind::kLru];
    EmitGoal("tiers", absl::StrCat("traces_", t.name, "_default_vs_lru"),
             static_cast<double>(def) / static_cast<double>(lru), "<= 1", def <= lru);
    double ratio = static_cast<double>(def) / static_cast<double>(belady);
    double limit = belady_limit[t.name];
    EmitGoal("tiers", absl::StrCat("traces_", t.name, "_default_vs_belady"), ratio,
             absl::StrCat("<= ", limit), ratio <= limit);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTiersBench(const std::vector<std::string>& args);

absl::Status RunTiersBench(const std::vector<std::string>& args) {
  LORADB_ASSIGN_OR_RETURN(Flags f, ParseFlags(args));
  bool all = f.case_name == "all";
  bool any = false;
  if (all || f.case_name == "traces") {
    any = true;
    LORADB_RETURN_IF_ERROR(RunTraces(f));
  }
  if (!any) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown tiers case \"", f.case_name, "\" (cold-burst, dedup, traces, moe-load, all)"));
  }
  return absl::OkStatus();
}

}  // namespace loradb::bench

LORADB_REGISTER_SCENARIO({"tiers",
                          "residency tiers: cold-burst, dedup, traces, moe-load (issue 4)",
                          loradb::bench::RunTiersBench,
                          {"all", "--requests=300000", "--burst=16", "--moe=4"}});

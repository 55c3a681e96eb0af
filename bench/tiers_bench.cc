// loradb-bench tiers [cold-burst|dedup|traces|moe-load|fixed-buffers|all] [--flags]: the residency
// tiers. See docs/bench/notes/measurements.md, section "tiers", for what each case measures and the
// exact trace definitions. moe-load also measures this machine's sequential O_DIRECT disk
// bandwidth and page-cache bandwidth on its own files in the same run, and holds the cold and
// warm adapter reads against them; PyPI safetensors runs from bench/safetensors_read.py.
//
// Flags: --dir=PATH (scratch directory for adapter files, default $TMPDIR/loradb-tiers-bench),
// --requests=N (trace length, default 1000000), --burst=16,64 (cold-burst sizes),
// --moe=4,8,16 (moe-load live-load sizes), --seed-sets=N (traces: replay each trace with seeds
// base, base+10, ...; default 2), --keep (keep generated files).
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
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
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "storage/formats/blob.h"
#include "storage/formats/safetensors.h"
#include "storage/tiers/adapter_files.h"
#include "storage/tiers/cpu_cache.h"
#include "storage/tiers/device_slots.h"
#include "storage/tiers/eviction.h"
#include "storage/tiers/host_buffer.h"
#include "storage/tiers/loader.h"
#include "storage/util/file_util.h"
#include "storage/util/hash.h"
#include "storage/util/mutex.h"
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
  uint64_t budget = 256;      // traces: adapters the cache holds
  double zipf = 1.0;          // traces: Zipf exponent inside hot sets
  uint64_t seed_sets = 2;     // traces: set j replays every trace with seed base + 10 j
  unsigned inflight = 8;      // cold-burst: CpuCache max_inflight_loads
  uint64_t chunk_kib = 1024;  // loader chunk size
  unsigned qd = 32;           // loader chunks in flight per file
};

absl::StatusOr<Flags> ParseTiersFlags(const std::vector<std::string>& args) {
  Flags f;
  f.dir = (std::filesystem::temp_directory_path() / "loradb-tiers-bench").string();
  CLI::App app("tiers: the residency tiers (traces, cold bursts, MoE loads, device slots)",
               "tiers");
  app.add_option("case", f.case_name, "the case to run (default: all)");
  app.add_option("--dir", f.dir, "work directory");
  app.add_option("--requests", f.requests, "traces: requests per trace")
      ->check(CLI::PositiveNumber);
  app.add_option("--burst", f.burst, "cold-burst: burst sizes, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--moe", f.moe, "moe-load: adapters, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--budget", f.budget, "traces: adapters the cache holds")
      ->check(CLI::PositiveNumber);
  app.add_option("--zipf", f.zipf, "traces: Zipf exponent inside hot sets")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed-sets", f.seed_sets, "traces: seed sets (1-100)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{100}));
  app.add_option("--inflight", f.inflight, "cold-burst: CpuCache max_inflight_loads")
      ->check(CLI::PositiveNumber);
  app.add_option("--chunk-kib", f.chunk_kib, "loader chunk size (a multiple of 4)")
      ->check(CLI::PositiveNumber);
  app.add_option("--qd", f.qd, "loader chunks in flight per file")->check(CLI::PositiveNumber);
  app.add_flag("--keep", f.keep, "keep the work directory");
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  if (f.chunk_kib % 4 != 0) return absl::InvalidArgumentError("--chunk-kib wants a multiple of 4");
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
  uint64_t seed = 0;
};

constexpr uint64_t kUniverse = 100'000;

Trace SkewedHot(uint64_t n, uint64_t seed, double s) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> hot = DrawSet(rng, kUniverse, 512);
  Zipf zipf(512, s);
  Trace t{"skewed-hot", "", {}, seed};
  for (uint64_t i = 0; i < n; ++i) {
    t.keys.push_back(Uniform(rng) < 0.9 ? hot[zipf.Sample(rng)] : rng() % kUniverse);
  }
  return t;
}

Trace WeakLocality(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> set = DrawSet(rng, kUniverse, 2048);
  Zipf zipf(2048, 0.5);
  Trace t{"weak-locality", "", {}, seed};
  for (uint64_t i = 0; i < n; ++i) t.keys.push_back(set[zipf.Sample(rng)]);
  return t;
}

Trace ScanPolluted(uint64_t n, uint64_t seed, double s) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> hot = DrawSet(rng, kUniverse, 512);
  Zipf zipf(512, s);
  Trace t{"scan-polluted", "", {}, seed};
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
  Trace t{"shifting", "", {}, seed};
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
// `shifts` (optional) receives the popularity shifts the policy detected.
uint64_t SimulatePolicy(EvictionPolicyKind kind, const std::vector<uint64_t>& keys,
                        uint64_t capacity, uint64_t* shifts = nullptr) {
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
  if (shifts != nullptr) *shifts = policy->detected_shifts();
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
  std::vector<Trace> traces;
  for (uint64_t set = 0; set < f.seed_sets; ++set) {
    const uint64_t d = 10 * set;
    traces.push_back(SkewedHot(f.requests, 1 + d, f.zipf));
    traces.push_back(WeakLocality(f.requests, 2 + d));
    traces.push_back(ScanPolluted(f.requests, 3 + d, f.zipf));
    traces.push_back(Shifting(f.requests, 4 + d, f.zipf));
  }
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
                           {"seed", t.seed},
                           {"requests", t.keys.size()},
                           {"distinct", distinct.size()},
                           {"budget_adapters", kTraceBudget},
                           {"belady_loads", belady},
                           {"static_oracle_loads", SimulateStaticOracle(t.keys, kTraceBudget)},
                           {"zipf", f.zipf}};
    std::map<EvictionPolicyKind, uint64_t> loads;
    for (auto kind :
         {EvictionPolicyKind::kLru, EvictionPolicyKind::kS3Fifo, EvictionPolicyKind::kWTinyLfu}) {
      uint64_t shifts = 0;
      loads[kind] = SimulatePolicy(kind, t.keys, kTraceBudget, &shifts);
      std::string name = tiers::EvictionPolicyName(kind);
      if (kind == EvictionPolicyKind::kWTinyLfu) line[name + "_detected_shifts"] = shifts;
      line[name + "_loads"] = loads[kind];
      line[name + "_vs_belady"] = static_cast<double>(loads[kind]) / static_cast<double>(belady);
    }
    Emit(line);
    // Goals for the default policy (W-TinyLFU).
    uint64_t def = loads[EvictionPolicyKind::kWTinyLfu];
    uint64_t lru = loads[EvictionPolicyKind::kLru];
    // The first seed set keeps the original goal names; later sets add the seed.
    const std::string id = t.seed < 10 ? t.name : absl::StrCat(t.name, "_seed", t.seed);
    EmitGoal("tiers", absl::StrCat("traces_", id, "_default_vs_lru"),
             static_cast<double>(def) / static_cast<double>(lru), "<= 1", def <= lru);
    double ratio = static_cast<double>(def) / static_cast<double>(belady);
    double limit = belady_limit[t.name];
    EmitGoal("tiers", absl::StrCat("traces_", id, "_default_vs_belady"), ratio,
             absl::StrCat("<= ", limit), ratio <= limit);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// adapter files
// ---------------------------------------------------------------------------------------------

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

std::string PeftName(int layer, const std::string& module, const char* ab) {
  return absl::StrCat("base_model.model.model.layers.", layer, ".", module, ".lora_", ab,
                      ".weight");
}

// Qwen3-4B, rank `r`: 36 layers; q 2560->4096, k/v 2560->1024, o 4096->2560, gate/up
// 2560->9728, down 9728->2560; A is [r, in], B is [out, r].
std::vector<TensorSpec> Qwen3_4B(int64_t r) {
  struct M {
    const char* name;
    int64_t in, out;
  };
  const M mods[] = {{"self_attn.q_proj", 2560, 4096}, {"self_attn.k_proj", 2560, 1024},
                    {"self_attn.v_proj", 2560, 1024}, {"self_attn.o_proj", 4096, 2560},
                    {"mlp.gate_proj", 2560, 9728},    {"mlp.up_proj", 2560, 9728},
                    {"mlp.down_proj", 9728, 2560}};
  std::vector<TensorSpec> out;
  for (int l = 0; l < 36; ++l) {
    for (const M& m : mods) {
      out.push_back({PeftName(l, m.name, "A"), {r, m.in}});
      out.push_back({PeftName(l, m.name, "B"), {m.out, r}});
    }
  }
  return out;
}

// Qwen3-30B-A3B, rank 1: 48 layers; attention q 2048->4096, k/v 2048->512, o 4096->2048; 128
// experts with gate/up 2048->768 and down 768->2048. Unpacked: 48 x (8 + 128 x 6) = 37,248
// tensors. Packed: each (layer, projection, A|B) expert set stacked into one 3-D tensor
// [128, r, in] / [128, out, r]: 48 x (8 + 6) = 672 tensors.
std::vector<TensorSpec> Qwen3MoE(bool packed) {
  const int64_t r = 1, experts = 128;
  struct M {
    const char* name;
    int64_t in, out;
  };
  const M attn[] = {{"self_attn.q_proj", 2048, 4096},
                    {"self_attn.k_proj", 2048, 512},
                    {"self_attn.v_proj", 2048, 512},
                    {"self_attn.o_proj", 4096, 2048}};
  const M expert[] = {{"gate_proj", 2048, 768}, {"up_proj", 2048, 768}, {"down_proj", 768, 2048}};
  std::vector<TensorSpec> out;
  for (int l = 0; l < 48; ++l) {
    for (const M& m : attn) {
      out.push_back({PeftName(l, m.name, "A"), {r, m.in}});
      out.push_back({PeftName(l, m.name, "B"), {m.out, r}});
    }
    for (const M& m : expert) {
      if (packed) {
        std::string mod = absl::StrCat("mlp.experts.", m.name);
        out.push_back({PeftName(l, mod, "A"), {experts, r, m.in}});
        out.push_back({PeftName(l, mod, "B"), {experts, m.out, r}});
      } else {
        for (int e = 0; e < experts; ++e) {
          std::string mod = absl::StrCat("mlp.experts.", e, ".", m.name);
          out.push_back({PeftName(l, mod, "A"), {r, m.in}});
          out.push_back({PeftName(l, mod, "B"), {m.out, r}});
        }
      }
    }
  }
  return out;
}

// Writes a bf16 safetensors adapter with pseudo-random contents (xorshift64 seeded by `seed`);
// returns the file's xxh3-128 and size.
absl::StatusOr<std::pair<Hash128, uint64_t>> WriteAdapter(const std::string& path,
                                                          const std::vector<TensorSpec>& specs,
                                                          uint64_t seed, bool blob = false) {
  uint64_t total = 0;
  for (const auto& t : specs) {
    LORADB_ASSIGN_OR_RETURN(uint64_t n, CheckedNumBytes(t.shape, DType::kBF16));
    total += n;
  }
  std::vector<uint64_t> words((total + 7) / 8);
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (uint64_t& w : words) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    w = x;
  }
  const std::byte* data = reinterpret_cast<const std::byte*>(words.data());
  std::vector<TensorView> views;
  uint64_t off = 0;
  for (const auto& t : specs) {
    TensorView v;
    v.name = t.name;
    v.dtype = DType::kBF16;
    v.shape = t.shape;
    v.nbytes = *CheckedNumBytes(t.shape, DType::kBF16);
    v.data = data + off;
    off += v.nbytes;
    views.push_back(std::move(v));
  }
  std::string bytes;
  if (blob) {  // packed blob: MoE expert sets stacked per (layer, projection, A|B)
    LORADB_ASSIGN_OR_RETURN(bytes, SerializeBlob(views, {{"r", "1"}}, BlobOptions{true}));
  } else {
    LORADB_ASSIGN_OR_RETURN(bytes, safetensors::Serialize(views, {{"r", "1"}}));
  }
  LORADB_RETURN_IF_ERROR(WriteFileAtomic(path, bytes));
  return std::make_pair(Xxh3_128(bytes.data(), bytes.size()), uint64_t{bytes.size()});
}

// Asks the kernel to drop clean page-cache pages; true when it accepted.
bool DropPageCache() {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, "3", 1) == 1;
  ::close(fd);
  return ok;
}

// The hardware limit: the same files read one after another by one thread, 8 MiB O_DIRECT
// preads into one aligned buffer (buffered where O_DIRECT is refused). Returns seconds.
absl::StatusOr<double> SequentialRead(const std::vector<std::string>& paths, bool direct = true) {
  const uint64_t kBlock = 8 << 20;
  LORADB_ASSIGN_OR_RETURN(auto buf, tiers::HostBuffer::Allocate(kBlock, false));
  double start = NowSeconds();
  for (const std::string& p : paths) {
    int fd = direct ? ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
    if (fd < 0) fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", p));
    off_t off = 0;
    while (true) {
      ssize_t n = ::pread(fd, buf->data(), kBlock, off);
      if (n < 0) {
        int err = errno;
        ::close(fd);
        return ErrnoToStatus(err, absl::StrCat("read ", p));
      }
      if (n == 0) break;
      off += n;
    }
    ::close(fd);
  }
  return NowSeconds() - start;
}

// Sequential read bandwidth of `paths` (bytes/s): `threads` threads each read every
// `threads`-th 8 MiB block of each file with pread into their own aligned buffer, so up to
// `threads` requests are in flight. `direct`: O_DIRECT (from the device, past the page cache);
// otherwise buffered (from the page cache when the files are in it).
absl::StatusOr<double> ParallelReadBandwidth(const std::vector<std::string>& paths, int threads,
                                             bool direct) {
  const uint64_t kBlock = 8 << 20;
  std::vector<std::unique_ptr<tiers::HostBuffer>> bufs;
  for (int t = 0; t < threads; ++t) {
    LORADB_ASSIGN_OR_RETURN(auto buf, tiers::HostBuffer::Allocate(kBlock, false));
    bufs.push_back(std::move(buf));
  }
  std::vector<absl::Status> errors(threads);
  std::atomic<uint64_t> bytes{0};
  const double start = NowSeconds();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (const std::string& p : paths) {
        const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
        if (fd < 0) {
          errors[t] = ErrnoToStatus(errno, absl::StrCat("open ", p));
          return;
        }
        for (off_t off = static_cast<off_t>(t) * kBlock;;
             off += static_cast<off_t>(threads) * kBlock) {
          const ssize_t n = ::pread(fd, bufs[t]->data(), kBlock, off);
          if (n < 0) errors[t] = ErrnoToStatus(errno, absl::StrCat("read ", p));
          if (n <= 0) break;
          bytes += static_cast<uint64_t>(n);
        }
        ::close(fd);
      }
    });
  }
  for (auto& w : workers) w.join();
  const double seconds = NowSeconds() - start;
  for (const absl::Status& st : errors) LORADB_RETURN_IF_ERROR(st);
  return static_cast<double>(bytes.load()) / seconds;
}

// What this machine's storage or page cache delivers on `path`, read sequentially with 8 MiB
// preads. Cold: O_DIRECT from the device (page cache dropped before each probe); one stream is the
// device's sequential bandwidth, and 4 threads, reported beside it, have not read faster here.
// Warm: buffered from the page cache into a reused buffer; the best of 1 and 2 threads, since a
// warm read may use both cores.
struct Bandwidth {
  double reference = 0;  // bytes/s: what our reads are held against
  double one_thread = 0;
  double parallel = 0;  // 4 threads cold, 2 warm
};

absl::StatusOr<Bandwidth> ProbeBandwidth(const std::string& path, bool cold) {
  Bandwidth bw;
  if (cold) (void)DropPageCache();
  LORADB_ASSIGN_OR_RETURN(bw.one_thread, ParallelReadBandwidth({path}, 1, cold));
  if (cold) (void)DropPageCache();
  LORADB_ASSIGN_OR_RETURN(bw.parallel, ParallelReadBandwidth({path}, cold ? 4 : 2, cold));
  bw.reference = cold ? bw.one_thread : std::max(bw.one_thread, bw.parallel);
  return bw;
}

struct AdapterFileSet {
  tiers::AdapterFileKind kind = tiers::AdapterFileKind::kSafetensors;
  std::vector<std::string> paths;
  std::vector<Hash128> hashes;
  uint64_t bytes = 0;
};

absl::StatusOr<AdapterFileSet> WriteAdapters(const std::string& dir, const std::string& stem,
                                             const std::vector<TensorSpec>& specs, int n,
                                             uint64_t seed, bool blob = false) {
  LORADB_RETURN_IF_ERROR(CreateDirectories(dir));
  AdapterFileSet set;
  set.kind = blob ? tiers::AdapterFileKind::kBlobStored : tiers::AdapterFileKind::kSafetensors;
  for (int i = 0; i < n; ++i) {
    std::string path = absl::StrCat(dir, "/", stem, "-", i, blob ? ".blob" : ".safetensors");
    LORADB_ASSIGN_OR_RETURN(auto written,
                            WriteAdapter(path, specs, seed + static_cast<uint64_t>(i), blob));
    set.paths.push_back(path);
    set.hashes.push_back(written.first);
    set.bytes += written.second;
  }
  return set;
}

tiers::AdapterLoadFn FileLoadFn(tiers::Loader* loader, const AdapterFileSet* files) {
  return
      [loader, files](uint64_t rev) -> absl::StatusOr<std::shared_ptr<const tiers::CachedAdapter>> {
        if (rev >= files->paths.size())
          return absl::NotFoundError(absl::StrCat("no revision ", rev));
        return tiers::LoadAdapterFile(*loader, files->paths[rev], files->kind, files->hashes[rev]);
      };
}

// ---------------------------------------------------------------------------------------------
// cold-burst and dedup
// ---------------------------------------------------------------------------------------------

// One burst: `files.paths.size()` threads each Acquire one adapter through a fresh CPU cache after
// a common start. Page cache dropped before; O_DIRECT reads.
struct Burst {
  std::vector<double> latency, load_start, load_end;  // seconds since the common start
  double total = 0;
  tiers::LoaderStats loader;
  tiers::CpuCacheStats cache;
};

absl::StatusOr<Burst> RunBurst(const Flags& f, const AdapterFileSet& files) {
  const int n = static_cast<int>(files.paths.size());
  tiers::LoaderOptions lo;
  lo.chunk_bytes = f.chunk_kib << 10;
  lo.queue_depth = f.qd;
  LORADB_ASSIGN_OR_RETURN(auto loader, tiers::Loader::Create(lo));
  tiers::CpuCacheOptions co;
  co.budget_bytes = files.bytes * 2;
  co.max_inflight_loads = f.inflight;
  co.max_queued_loads = static_cast<unsigned>(n);
  Burst r;
  r.latency.resize(n);
  r.load_start.resize(n);
  r.load_end.resize(n);
  std::atomic<double> start_at{0};
  tiers::AdapterLoadFn inner = FileLoadFn(loader.get(), &files);
  auto timed = [&r, &start_at, inner](uint64_t rev) {
    double t0 = NowSeconds();
    auto loaded = inner(rev);
    if (rev < r.load_start.size()) {
      r.load_start[rev] = t0 - start_at.load();
      r.load_end[rev] = NowSeconds() - start_at.load();
    }
    return loaded;
  };
  LORADB_ASSIGN_OR_RETURN(auto cache, tiers::CpuCache::Create(co, timed));
  std::vector<absl::Status> errors(static_cast<size_t>(n));
  std::vector<tiers::CpuLease> leases(static_cast<size_t>(n));
  Mutex mu;
  bool go = false;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      {
        MutexLock lock(&mu);
        mu.Await([&go] { return go; });
      }
      double t0 = NowSeconds();
      auto lease = cache->Acquire(static_cast<uint64_t>(i));
      r.latency[i] = NowSeconds() - t0;
      if (lease.ok()) {
        leases[i] = *std::move(lease);
      } else {
        errors[i] = lease.status();
      }
    });
  }
  double start = NowSeconds();
  start_at.store(start);
  {
    MutexLock lock(&mu);
    go = true;
  }
  for (auto& t : threads) t.join();
  r.total = NowSeconds() - start;
  for (const auto& e : errors) LORADB_RETURN_IF_ERROR(e);
  leases.clear();
  r.loader = loader->stats();
  r.cache = cache->stats();
  cache.reset();  // joins the workers: the timeline is complete
  return r;
}

// Faults in `count` host buffers of `size` bytes and leaves them in the pool of released
// buffers (raising its limit to hold them), as a server would before an expected burst.
absl::Status ReserveHostBuffers(uint64_t size, int count) {
  const uint64_t capacity = tiers::AlignUp(tiers::AlignUp(size, tiers::kHostAlignment), 2 << 20);
  const uint64_t want = capacity * static_cast<uint64_t>(count);
  if (tiers::GetHostBufferPoolStats().limit < want) tiers::SetHostBufferPoolLimit(want);
  std::vector<std::unique_ptr<tiers::HostBuffer>> held;
  for (int i = 0; i < count; ++i) {
    LORADB_ASSIGN_OR_RETURN(std::unique_ptr<tiers::HostBuffer> b,
                            tiers::HostBuffer::AllocateForOverwrite(size, /*pin=*/true));
    held.push_back(std::move(b));
  }
  return absl::OkStatus();  // releasing `held` parks every buffer in the pool
}

absl::Status RunColdBurst(const Flags& f) {
  int max_n = *std::max_element(f.burst.begin(), f.burst.end());
  std::string dir = f.dir + "/qwen3-4b-r16";
  Progress(
      absl::StrCat("tiers cold-burst: writing ", max_n, " Qwen3-4B rank-16 adapters to ", dir));
  LORADB_ASSIGN_OR_RETURN(AdapterFileSet files,
                          WriteAdapters(dir, "adapter", Qwen3_4B(16), max_n, 1000));
  const uint64_t adapter_bytes = files.bytes / static_cast<uint64_t>(max_n);
  auto ms = [](const std::vector<double>& v) {
    std::vector<int64_t> out;
    for (double x : v) out.push_back(static_cast<int64_t>(std::lround(x * 1000)));
    return out;
  };
  for (int n : f.burst) {
    AdapterFileSet subset;
    subset.paths.assign(files.paths.begin(), files.paths.begin() + n);
    subset.hashes.assign(files.hashes.begin(), files.hashes.begin() + n);
    subset.bytes = adapter_bytes * static_cast<uint64_t>(n);
    bool dropped = DropPageCache();
    LORADB_ASSIGN_OR_RETURN(double seq_before, SequentialRead(subset.paths));
    // "fresh": the pool of released host buffers starts empty, so every load maps new memory
    // (a process's first burst). "reserved": n buffers were faulted in and pooled before the
    // start (tiers/host_buffer.h), as the sequential line reuses its one buffer; the difference
    // is the cost of fresh pages.
    std::map<std::string, Burst> bursts;
    const uint64_t pool_limit = tiers::GetHostBufferPoolStats().limit;
    for (const char* buffers : {"fresh", "reserved"}) {
      const bool reserved = std::string(buffers) == "reserved";
      tiers::SetHostBufferPoolLimit(0);  // empties the pool
      tiers::SetHostBufferPoolLimit(pool_limit);
      if (reserved) LORADB_RETURN_IF_ERROR(ReserveHostBuffers(adapter_bytes, n));
      const uint64_t reused_before = tiers::GetHostBufferPoolStats().reused;
      dropped = DropPageCache() && dropped;
      absl::StatusOr<Burst> b = RunBurst(f, subset);
      const uint64_t reused = tiers::GetHostBufferPoolStats().reused - reused_before;
      tiers::SetHostBufferPoolLimit(0);
      tiers::SetHostBufferPoolLimit(pool_limit);
      if (!b.ok()) return b.status();
      if (reserved && reused < static_cast<uint64_t>(n)) {
        return absl::InternalError(
            absl::StrCat("cold-burst: only ", reused, " of ", n, " loads used a reserved buffer"));
      }
      bursts[buffers] = *std::move(b);
    }
    dropped = DropPageCache() && dropped;
    LORADB_ASSIGN_OR_RETURN(double seq_after, SequentialRead(subset.paths));
    double seq = std::min(seq_before, seq_after);
    for (const auto& [buffers, b] : bursts) {
      double p50 = Quantile(b.latency, 0.5), p95 = Quantile(b.latency, 0.95);
      double mx = *std::max_element(b.latency.begin(), b.latency.end());
      double load_sum = 0;
      for (int i = 0; i < n; ++i) load_sum += b.load_end[i] - b.load_start[i];
      Emit({{"bench", "tiers"},
            {"case", "cold-burst"},
            {"n", n},
            {"buffers", buffers},
            {"bytes", subset.bytes},
            {"max_inflight_loads", f.inflight},
            {"chunk_kib", f.chunk_kib},
            {"queue_depth", f.qd},
            {"backend", tiers::LoaderBackendName(b.loader.backend)},
            {"o_direct_files", b.loader.o_direct_files},
            {"page_cache_dropped", dropped},
            {"loads", b.cache.loads},
            {"admission_p50_s", p50},
            {"admission_p95_s", p95},
            {"admission_max_s", mx},
            {"total_s", b.total},
            {"total_gbps", static_cast<double>(subset.bytes) / b.total / 1e9},
            {"sequential_s", seq},
            {"sequential_before_s", seq_before},
            {"sequential_after_s", seq_after},
            {"sequential_gbps", static_cast<double>(subset.bytes) / seq / 1e9},
            // With all N requested at once and the disk the bottleneck, no order of service
            // gets the 95th percentile admitted before 95% of the bytes are read (at the
            // sequential rate; parallel reads may beat it on some devices).
            {"p95_bandwidth_bound_s", 0.95 * seq},
            {"p95_vs_bandwidth_bound", p95 / (0.95 * seq)},
            {"anchor_p95_s", 0.95 * n * 1.4},
            {"load_mean_s", load_sum / n},
            {"load_start_ms", ms(b.load_start)},
            {"load_end_ms", ms(b.load_end)}});
      // Goal lines: the default path (fresh buffers) keeps the goal names; the reserved run
      // adds "_reserved".
      const std::string id =
          buffers == "fresh" ? absl::StrCat("n", n) : absl::StrCat("n", n, "_reserved");
      EmitGoal("tiers", absl::StrCat("cold_burst_", id, "_total_vs_sequential"), b.total / seq,
               "<= 2", b.total / seq <= 2.0);
      // The vLLM anchor admits cold adapters one by one at ~1.4 s each. "p95 far below" it,
      // read three ways from this run's figures (docs/bench/notes/measurements.md,
      // tiers/cold-burst, says why):
      // (1) the per-adapter admission cost of the burst (total / N) at least 10x below 1.4 s;
      // (2) p95 at least 10x below the anchor's p95 for the same burst: one-by-one admission
      //     puts the 95th-percentile adapter behind 0.95 N others, 0.95 N x 1.4 s;
      // (3) p95 within 2x of the hardware bound (0.95 x the sequential read), as the total.
      const double anchor_s = 1.4;
      const double anchor_p95 = 0.95 * n * anchor_s;
      EmitGoal("tiers", absl::StrCat("cold_burst_", id, "_per_adapter_s"), b.total / n,
               absl::StrCat("<= ", anchor_s / 10), b.total / n <= anchor_s / 10);
      EmitGoal("tiers", absl::StrCat("cold_burst_", id, "_p95_vs_anchor"), p95 / anchor_p95,
               "<= 0.1", p95 / anchor_p95 <= 0.1);
      EmitGoal("tiers", absl::StrCat("cold_burst_", id, "_p95_vs_bandwidth_bound"),
               p95 / (0.95 * seq), "<= 2", p95 / (0.95 * seq) <= 2.0);
    }
  }
  if (!f.keep) std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

// Registered (fixed) io_uring buffers vs plain reads: the first `n` adapters of the cold-burst
// shape read at once by `n` threads through one Loader per mode, cold (page cache dropped,
// O_DIRECT) and warm (buffered, from the page cache), modes alternated, best of 3 each. No
// content hash: this isolates the read path the option changes.
absl::Status RunFixedBuffers(const Flags& f) {
  const int n = 8;
  std::string dir = f.dir + "/fixed-buffers";
  LORADB_ASSIGN_OR_RETURN(AdapterFileSet files,
                          WriteAdapters(dir, "adapter", Qwen3_4B(16), n, 3000));
  for (bool cold : {true, false}) {
    std::map<bool, double> best = {{false, 1e9}, {true, 1e9}};
    std::map<bool, tiers::LoaderStats> stats;
    for (int rep = 0; rep < 3; ++rep) {
      for (bool fixed : {false, true}) {
        tiers::LoaderOptions lo;
        lo.backend = tiers::LoaderBackend::kIoUring;
        lo.o_direct = cold;
        lo.registered_buffers = fixed;
        lo.chunk_bytes = f.chunk_kib << 10;
        lo.queue_depth = f.qd;
        LORADB_ASSIGN_OR_RETURN(auto loader, tiers::Loader::Create(lo));
        if (cold) {
          (void)DropPageCache();
        } else {
          LORADB_RETURN_IF_ERROR(SequentialRead(files.paths, /*direct=*/false).status());
        }
        std::vector<absl::Status> errors(n);
        std::vector<std::thread> threads;
        double t0 = NowSeconds();
        for (int i = 0; i < n; ++i) {
          threads.emplace_back([&, i] {
            errors[i] = loader->ReadFile(files.paths[i]).status();  // I/O only, no hash
          });
        }
        for (auto& t : threads) t.join();
        double dt = NowSeconds() - t0;
        for (const auto& e : errors) LORADB_RETURN_IF_ERROR(e);
        best[fixed] = std::min(best[fixed], dt);
        stats[fixed] = loader->stats();
      }
    }
    Emit({{"bench", "tiers"},
          {"case", "fixed-buffers"},
          {"page_cache", cold ? "cold" : "warm"},
          {"files", n},
          {"bytes", files.bytes},
          {"plain_s", best[false]},
          {"fixed_s", best[true]},
          {"fixed_vs_plain", best[true] / best[false]},
          {"fixed_buffer_files", stats[true].fixed_buffer_files},
          {"fixed_buffer_failures", stats[true].fixed_buffer_failures},
          {"plain_gbps", static_cast<double>(files.bytes) / best[false] / 1e9},
          {"fixed_gbps", static_cast<double>(files.bytes) / best[true] / 1e9}});
  }
  if (!f.keep) std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

absl::Status RunDedup(const Flags& f) {
  constexpr int kRequests = 64;
  std::string dir = f.dir + "/dedup";
  LORADB_ASSIGN_OR_RETURN(AdapterFileSet files, WriteAdapters(dir, "adapter", Qwen3_4B(16), 1, 7));
  (void)DropPageCache();
  LORADB_ASSIGN_OR_RETURN(auto loader, tiers::Loader::Create());
  std::atomic<int> calls{0};
  tiers::AdapterLoadFn inner = FileLoadFn(loader.get(), &files);
  LORADB_ASSIGN_OR_RETURN(auto cache, tiers::CpuCache::Create({}, [&](uint64_t rev) {
                            calls.fetch_add(1);
                            return inner(rev);
                          }));
  std::vector<double> latency(kRequests);
  std::vector<absl::Status> errors(kRequests);
  Mutex mu;
  bool go = false;
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      {
        MutexLock lock(&mu);
        mu.Await([&go] { return go; });
      }
      double t0 = NowSeconds();
      auto lease = cache->Acquire(0);
      latency[i] = NowSeconds() - t0;
      errors[i] = lease.status();
    });
  }
  {
    MutexLock lock(&mu);
    go = true;
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) LORADB_RETURN_IF_ERROR(e);
  tiers::CpuCacheStats cs = cache->stats();
  Emit({{"bench", "tiers"},
        {"case", "dedup"},
        {"requests", kRequests},
        {"bytes", files.bytes},
        {"loads", cs.loads},
        {"load_calls", calls.load()},
        {"joined_waiters", cs.joined_waiters},
        {"hits", cs.hits},
        {"load_s", absl::ToDoubleSeconds(cs.load_latency.max())},
        {"waiter_p50_s", Quantile(latency, 0.5)},
        {"waiter_p95_s", Quantile(latency, 0.95)},
        {"waiter_max_s", *std::max_element(latency.begin(), latency.end())}});
  EmitGoal("tiers", "dedup_loads", calls.load(), "== 1", calls.load() == 1);
  if (!f.keep) std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// moe-load
// ---------------------------------------------------------------------------------------------

// Runs PyPI safetensors on `path` in one python3 subprocess, `reps` times
// (bench/safetensors_read.py says what is timed). `cold`: the script drops the page cache before
// each rep, as our side does. Returns {open_s, read_s (best rep), first_read_s, tensors, dropped
// (whether the page cache could be dropped)}.
absl::StatusOr<nlohmann::json> PythonSafetensors(const std::string& path, int reps, bool cold) {
  const std::string script = absl::StrCat(LORADB_SOURCE_DIR, "/bench/safetensors_read.py");
  std::string cmd = absl::StrCat("python3 ", script, " ", path, " ", reps, " ", cold ? 1 : 0);
  LORADB_ASSIGN_OR_RETURN(JsonCommandResult r, RunJsonCommand(cmd, "read_s"));
  if (r.exit_status != 0) {
    return absl::InternalError(
        absl::StrCat("python3 ", script, " failed (exit status ", r.exit_status, ")"));
  }
  if (r.last_object.is_null()) return absl::InternalError(cmd + " printed no measurement");
  return r.last_object;
}

struct ReadTimes {
  double read_s = 0;   // the file into an aligned buffer (cold, O_DIRECT)
  double parse_s = 0;  // header parse + tensor views (the loader objects)
  double first_s = 0;  // read + parse of the first rep
  size_t tensors = 0;
  Bandwidth hardware;  // the best probes of `path`, taken rep by rep between our reads
  // Per rep: our read's bandwidth over the probe's best taken next to it.
  std::vector<double> read_vs_hardware;
};

// Read + parse of one file, the fastest of `reps` (each rep drops the previous rep's buffer first,
// as Python's reps free theirs); `cold` drops the page cache before each. Each rep also probes the
// hardware on the same file (ProbeBandwidth), before our read on even reps and after it on odd
// ones, so both sides see the same device and cache state however it drifts during the run: the
// device behind this machine's disk delivers anywhere from 1x to 2x its usual rate for a read or
// two, and the probe's figure of a rep is only held against our read of the same rep.
absl::StatusOr<ReadTimes> TimeReadParse(tiers::Loader& loader, const std::string& path, int reps,
                                        bool cold, bool blob) {
  ReadTimes best{1e9, 1e9, 0, 0, {}, {}};
  for (int i = 0; i < reps; ++i) {
    double probe = 0, ours = 0;
    for (int side = 0; side < 2; ++side) {
      if ((side == 0) == (i % 2 == 0)) {
        LORADB_ASSIGN_OR_RETURN(const Bandwidth hw, ProbeBandwidth(path, cold));
        best.hardware.reference = std::max(best.hardware.reference, hw.reference);
        best.hardware.one_thread = std::max(best.hardware.one_thread, hw.one_thread);
        best.hardware.parallel = std::max(best.hardware.parallel, hw.parallel);
        probe = hw.reference;
        continue;
      }
      if (cold) (void)DropPageCache();
      double t0 = NowSeconds();
      LORADB_ASSIGN_OR_RETURN(std::shared_ptr<tiers::HostBuffer> buf, loader.ReadFile(path));
      double t1 = NowSeconds();
      ours = static_cast<double>(buf->size()) / (t1 - t0);
      LORADB_ASSIGN_OR_RETURN(TensorSet set, blob ? ParseBlobStored(buf->bytes(), buf, true)
                                                  : safetensors::Parse(buf->bytes(), buf));
      double t2 = NowSeconds();
      if (i == 0) best.first_s = t2 - t0;
      if (t2 - t0 < best.read_s + best.parse_s) {  // the fastest rep, both parts from it
        best.read_s = t1 - t0;
        best.parse_s = t2 - t1;
      }
      best.tensors = set.size();
    }
    best.read_vs_hardware.push_back(ours / probe);
  }
  return best;
}

// Live load of adapters 0..n-1 into device slots (host backend): one AcquireBatch through a
// fresh CPU cache and a fresh (pre-faulted) arena. `cold`: page cache dropped, O_DIRECT reads;
// warm: files in the page cache, buffered reads. Returns seconds.
struct LiveLoad {
  double total_s = 0;
  double max_cpu_load_s = 0;  // slowest CPU-tier load (read + verify + parse)
  double copy_s = 0;          // the device copy of the batch
  uint64_t arena_pages = 0;
  double page_waste = 0;  // page rounding loss / payload
};

absl::StatusOr<LiveLoad> TimeLiveLoad(const AdapterFileSet& files, int n, bool cold) {
  tiers::LoaderOptions lo;
  lo.o_direct = cold;
  if (cold) {
    (void)DropPageCache();
  } else {
    std::vector<std::string> first(files.paths.begin(), files.paths.begin() + n);
    (void)DropPageCache();
    LORADB_ASSIGN_OR_RETURN(double ignored, SequentialRead(first, /*direct=*/false));
    (void)ignored;
  }
  LORADB_ASSIGN_OR_RETURN(auto loader, tiers::Loader::Create(lo));
  tiers::CpuCacheOptions co;
  co.budget_bytes = files.bytes * 2;
  LORADB_ASSIGN_OR_RETURN(auto cache,
                          tiers::CpuCache::Create(co, FileLoadFn(loader.get(), &files)));
  tiers::DeviceSlotsOptions so;
  so.arena_bytes = files.bytes / files.paths.size() * static_cast<uint64_t>(n) * 5 / 4 + (64 << 20);
  LORADB_ASSIGN_OR_RETURN(auto slots,
                          tiers::DeviceSlots::Create(so, cache.get(), tiers::MakeHostBackend()));
  std::vector<uint64_t> batch;
  for (int i = 0; i < n; ++i) batch.push_back(static_cast<uint64_t>(i));
  double t0 = NowSeconds();
  LORADB_ASSIGN_OR_RETURN(tiers::DeviceBatchLease lease, slots->AcquireBatch(batch));
  LiveLoad r;
  r.total_s = NowSeconds() - t0;
  tiers::DeviceSlotsStats ds = slots->stats();
  r.arena_pages = ds.pages_total - ds.pages_free;
  r.page_waste = static_cast<double>(ds.page_waste_bytes) / static_cast<double>(ds.payload_bytes);
  r.copy_s = absl::ToDoubleSeconds(ds.copy_latency.max());
  r.max_cpu_load_s = absl::ToDoubleSeconds(cache->stats().load_latency.max());
  return r;
}

absl::Status RunMoeLoad(const Flags& f) {
  int max_n = *std::max_element(f.moe.begin(), f.moe.end());
  std::string dir = f.dir + "/qwen3-moe-r1";
  Progress(absl::StrCat("tiers moe-load: writing ", max_n,
                        " unpacked + packed Qwen3-30B-A3B rank-1 adapters to ", dir));
  LORADB_ASSIGN_OR_RETURN(AdapterFileSet unpacked,
                          WriteAdapters(dir, "unpacked", Qwen3MoE(false), max_n, 500));
  // The packed side is a loradb blob written from the same unpacked tensors (SerializeBlob
  // stacks each expert set), loaded as stored: 672 tensors.
  LORADB_ASSIGN_OR_RETURN(AdapterFileSet packed,
                          WriteAdapters(dir, "packed", Qwen3MoE(false), max_n, 500, true));
  uint64_t file_unpacked = unpacked.bytes / unpacked.paths.size();
  uint64_t file_packed = packed.bytes / packed.paths.size();
  // Read + loader objects, and PyPI safetensors, each cold (page cache dropped; our reads
  // O_DIRECT) and warm (file in the page cache; our reads buffered).
  std::map<std::pair<std::string, bool>, std::pair<ReadTimes, nlohmann::json>> reads;
  const bool dropped = DropPageCache();
  for (bool cold : {true, false}) {
    tiers::LoaderOptions lo;
    lo.o_direct = cold;
    LORADB_ASSIGN_OR_RETURN(auto loader, tiers::Loader::Create(lo));
    for (auto [layout, path] : {std::pair<std::string, std::string>{"unpacked", unpacked.paths[0]},
                                {"packed", packed.paths[0]}}) {
      if (!cold) LORADB_RETURN_IF_ERROR(SequentialRead({path}, false).status());
      bool blob = layout == "packed";
      LORADB_ASSIGN_OR_RETURN(ReadTimes rt, TimeReadParse(*loader, path, 7, cold, blob));
      nlohmann::json py = {{"open_s", nullptr},
                           {"read_s", nullptr},
                           {"first_read_s", nullptr},
                           {"tensors", nullptr}};
      if (!blob) {  // PyPI safetensors cannot read a blob
        LORADB_ASSIGN_OR_RETURN(py, PythonSafetensors(path, 3, cold));
      }
      reads[{layout, cold}] = {rt, py};
      const double file_bytes =
          static_cast<double>(layout == "packed" ? file_packed : file_unpacked);
      const double hw = rt.hardware.reference;
      Emit({{"bench", "tiers"},
            {"case", "moe-load-hardware"},
            {"layout", layout},
            {"page_cache", cold ? "cold" : "warm"},
            {"probe", cold ? "O_DIRECT 8 MiB preads, one thread (4 threads beside it)"
                           : "buffered 8 MiB preads into a reused buffer, best of 1 and 2 threads"},
            {"bytes_per_s", hw},
            {"one_thread_bytes_per_s", rt.hardware.one_thread},
            {"parallel_bytes_per_s", rt.hardware.parallel},
            {"page_cache_dropped", dropped}});
      Emit({{"bench", "tiers"},
            {"case", "moe-load"},
            {"layout", layout},
            {"page_cache", cold ? "cold" : "warm"},
            {"file_bytes", layout == "packed" ? file_packed : file_unpacked},
            {"tensors", rt.tensors},
            {"read_s", rt.read_s},
            {"loader_objects_s", rt.parse_s},
            {"read_and_objects_s", rt.read_s + rt.parse_s},
            {"read_and_objects_first_s", rt.first_s},
            {"read_bytes_per_s", file_bytes / rt.read_s},
            {"read_vs_hardware", file_bytes / rt.read_s / hw},
            {"read_vs_hardware_per_rep", rt.read_vs_hardware},
            {"read_and_objects_vs_hardware", file_bytes / (rt.read_s + rt.parse_s) / hw},
            {"python_safetensors_open_s", py["open_s"]},
            {"python_safetensors_read_s", py["read_s"]},
            {"python_safetensors_first_read_s", py["first_read_s"]},
            {"python_tensors", py["tensors"]}});
    }
  }
  std::map<std::pair<int, bool>, std::pair<double, double>> live;  // (n, cold) -> times
  for (int n : f.moe) {
    for (bool cold : {true, false}) {
      LORADB_ASSIGN_OR_RETURN(LiveLoad u, TimeLiveLoad(unpacked, n, cold));
      LORADB_ASSIGN_OR_RETURN(LiveLoad p, TimeLiveLoad(packed, n, cold));
      double tu = u.total_s, tp = p.total_s;
      live[{n, cold}] = {tu, tp};
      Emit({{"bench", "tiers"},
            {"case", "moe-load"},
            {"n", n},
            {"page_cache", cold ? "cold" : "warm"},
            {"device_backend", "host"},
            {"live_load_unpacked_s", tu},
            {"live_load_packed_s", tp},
            {"packed_speedup", tu / tp},
            {"max_cpu_load_unpacked_s", u.max_cpu_load_s},
            {"max_cpu_load_packed_s", p.max_cpu_load_s},
            {"device_copy_unpacked_s", u.copy_s},
            {"device_copy_packed_s", p.copy_s},
            {"arena_pages_unpacked", u.arena_pages},
            {"arena_pages_packed", p.arena_pages},
            {"page_waste_ratio_unpacked", u.page_waste},
            {"page_waste_ratio_packed", p.page_waste}});
    }
  }
  // Live load: packed against unpacked as a ratio, on the warm runs (both sides under the same
  // conditions; the published figures do not include a cold disk read either). Cold figures are
  // printed above.
  int n0 = live.contains({4, false}) ? 4 : f.moe.front();
  auto [wu, wp] = live[{n0, false}];
  EmitGoal("tiers", absl::StrCat("moe_live_load_n", n0, "_packed_speedup_warm"), wu / wp,
           ">= 8.5 (the published packed/unpacked ratio)", wu / wp >= 8.5);
  // Reads against this machine's own limits, probed on the same file rep by rep in this run: the
  // file into an aligned buffer, cold (O_DIRECT after dropping the page cache) against the
  // device's sequential O_DIRECT bandwidth, warm (buffered) against the page cache's.
  for (const std::string layout : {"unpacked", "packed"}) {
    const ReadTimes& cold_rt = reads[{layout, true}].first;
    const ReadTimes& warm_rt = reads[{layout, false}].first;
    const double cold_frac = Quantile(cold_rt.read_vs_hardware, 0.5);
    const double warm_frac = Quantile(warm_rt.read_vs_hardware, 0.5);
    EmitGoal("tiers", absl::StrCat("moe_", layout, "_read_cold_vs_disk"), cold_frac,
             ">= 0.8 (median over reps of our read / the O_DIRECT sequential probe next to it)",
             cold_frac >= 0.8);
    EmitGoal("tiers", absl::StrCat("moe_", layout, "_read_warm_vs_page_cache"), warm_frac,
             ">= 0.5 (median over reps of our read / the page-cache probe next to it)",
             warm_frac >= 0.5);
  }
  const auto& [warm_rt, warm_py] = reads[{"unpacked", false}];
  double ours = warm_rt.read_s + warm_rt.parse_s;
  double py_read = warm_py["read_s"].get<double>();
  EmitGoal("tiers", "moe_unpacked_read_vs_python_safetensors_warm", py_read / ours, ">= 20",
           py_read / ours >= 20);
  if (!f.keep) std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTiersBench(const std::vector<std::string>& args);

absl::Status RunTiersBench(const std::vector<std::string>& args) {
  LORADB_ASSIGN_OR_RETURN(Flags f, ParseTiersFlags(args));
  bool all = f.case_name == "all";
  bool any = false;
  if (all || f.case_name == "cold-burst") {
    any = true;
    LORADB_RETURN_IF_ERROR(RunColdBurst(f));
  }
  if (f.case_name == "fixed-buffers") {  // not part of "all": a measurement behind a default
    any = true;
    LORADB_RETURN_IF_ERROR(RunFixedBuffers(f));
  }
  if (all || f.case_name == "dedup") {
    any = true;
    LORADB_RETURN_IF_ERROR(RunDedup(f));
  }
  if (all || f.case_name == "traces") {
    any = true;
    LORADB_RETURN_IF_ERROR(RunTraces(f));
  }
  if (all || f.case_name == "moe-load") {
    any = true;
    LORADB_RETURN_IF_ERROR(RunMoeLoad(f));
  }
  if (!any) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tiers case \"", f.case_name,
                     "\" (cold-burst, dedup, traces, moe-load, fixed-buffers, all)"));
  }
  return absl::OkStatus();
}

}  // namespace loradb::bench

LORADB_REGISTER_SCENARIO({"tiers",
                          "residency tiers: cold-burst, dedup, traces, moe-load",
                          loradb::bench::RunTiersBench,
                          {"all", "--requests=300000", "--burst=16,64", "--moe=4"}});

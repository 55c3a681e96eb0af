#include "storage/tiers/eviction.h"

#include <algorithm>
#include <bit>
#include <deque>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace loradb::tiers {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class LruPolicy final : public EvictionPolicy {
 public:
  void RecordAccess(uint64_t) override {}
  void Insert(uint64_t key, uint64_t) override {
    order_.push_front(key);
    pos_[key] = order_.begin();
  }
  void Touch(uint64_t key) override {
    auto it = pos_.find(key);
    if (it != pos_.end()) order_.splice(order_.begin(), order_, it->second);
  }
  void Erase(uint64_t key) override {
    auto it = pos_.find(key);
    if (it == pos_.end()) return;
    order_.erase(it->second);
    pos_.erase(it);
  }
  std::optional<uint64_t> EvictOne(const std::function<bool(uint64_t)>& can_evict) override {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      uint64_t key = *it;
      if (!can_evict(key)) continue;
      Erase(key);
      return key;
    }
    return std::nullopt;
  }

 private:
  std::list<uint64_t> order_;  // front: most recent
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> pos_;
};

class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(uint64_t capacity) : small_quota_(std::max<uint64_t>(capacity / 10, 1)) {}

  void RecordAccess(uint64_t) override {}
  void Insert(uint64_t key, uint64_t bytes) override {
    bool was_ghost = false;
    if (auto g = ghost_pos_.find(key); g != ghost_pos_.end()) {
      ghost_.erase(g->second);
      ghost_pos_.erase(g);
      was_ghost = true;
    }
    Queue& q = was_ghost ? main_ : small_;
    q.nodes.push_front({key, bytes, 0, was_ghost});
    q.bytes += bytes;
    pos_[key] = q.nodes.begin();
  }
  void Touch(uint64_t key) override {
    auto it = pos_.find(key);
    if (it != pos_.end())
      it->second->freq = static_cast<uint8_t>(std::min(3, it->second->freq + 1));
  }
  void Erase(uint64_t key) override {
    auto it = pos_.find(key);
    if (it == pos_.end()) return;
    Queue& q = it->second->in_main ? main_ : small_;
    q.bytes -= it->second->bytes;
    q.nodes.erase(it->second);
    pos_.erase(it);
  }
  std::optional<uint64_t> EvictOne(const std::function<bool(uint64_t)>& can_evict) override {
    size_t small_skips = 0, main_skips = 0;
    while (true) {
      bool small_open = !small_.nodes.empty() && small_skips < small_.nodes.size();
      bool main_open = !main_.nodes.empty() && main_skips < main_.nodes.size();
      if (!small_open && !main_open) return std::nullopt;
      bool from_small = small_open && (small_.bytes > small_quota_ || !main_open);
      Queue& q = from_small ? small_ : main_;
      auto tail = std::prev(q.nodes.end());
      if (!can_evict(tail->key)) {  // leased: rotate past it
        q.nodes.splice(q.nodes.begin(), q.nodes, tail);
        ++(from_small ? small_skips : main_skips);
        continue;
      }
      if (from_small && tail->freq > 0) {  // reused while in small: promote
        small_.bytes -= tail->bytes;
        main_.bytes += tail->bytes;
        tail->freq = 0;
        tail->in_main = true;
        main_.nodes.splice(main_.nodes.begin(), small_.nodes, tail);
        continue;
      }
      if (!from_small && tail->freq > 0) {  // second chance in main
        --tail->freq;
        main_.nodes.splice(main_.nodes.begin(), main_.nodes, tail);
        continue;
      }
      uint64_t key = tail->key;
      if (from_small) AddGhost(key);
      Erase(key);
      return key;
    }
  }

 private:
  struct Node {
    uint64_t key;
    uint64_t bytes;
    uint8_t freq;
    bool in_main;
  };
  struct Queue {
    std::list<Node> nodes;  // front: newest
    uint64_t bytes = 0;
  };

  void AddGhost(uint64_t key) {
    ghost_.push_front(key);
    ghost_pos_[key] = ghost_.begin();
    // The ghost remembers about as many keys as main holds (at least a few).
    size_t limit = std::max<size_t>(main_.nodes.size() + small_.nodes.size(), 8);
    while (ghost_.size() > limit) {
      ghost_pos_.erase(ghost_.back());
      ghost_.pop_back();
    }
  }

  uint64_t small_quota_;
  Queue small_, main_;
  absl::flat_hash_map<uint64_t, std::list<Node>::iterator> pos_;
  std::list<uint64_t> ghost_;
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> ghost_pos_;
};

// Count-min sketch with 4 rows of saturating 8-bit counters and conservative update (only the
// counters at the key's current minimum grow, which keeps collisions from inflating estimates),
// halved after a sample period so old popularity fades, and cleared when a popularity shift is
// detected (see ShiftDetector).
class FrequencySketch {
 public:
  // Rows of 16x `expected_entries` counters; halving every 320x `expected_entries` increments.
  // Chosen on the trace benchmark (docs/bench/notes/measurements.md, tiers/traces): 4-bit
  // counters and plain count-min updates could not tell the marginal members of a 512-key Zipf
  // hot set apart; with shifts handled by the detector, a long period (320x; 80x did worse on
  // the traces) counts the marginal keys precisely enough, and rows of 16x (4x did worse) keep
  // the long period from inflating the estimates of fresh keys.
  explicit FrequencySketch(uint64_t expected_entries) {
    uint64_t n = std::max<uint64_t>(expected_entries, 16);
    uint64_t width = std::bit_ceil(n * 16);
    mask_ = width - 1;
    table_.assign(width * 4, 0);
    sample_ = n * 320;
  }
  void Increment(uint64_t key) {
    uint64_t h = Mix(key);
    const int current = Estimate(key);
    bool added = false;
    for (int row = 0; row < 4; ++row) {
      uint8_t& c = table_[Index(h, row)];
      if (c < 255 && c == current) {
        ++c;
        added = true;
      }
    }
    if (added && ++additions_ >= sample_) {
      for (auto& c : table_) c >>= 1;
      additions_ /= 2;
    }
  }
  int Estimate(uint64_t key) const {
    uint64_t h = Mix(key);
    int m = 255;
    for (int row = 0; row < 4; ++row) m = std::min<int>(m, table_[Index(h, row)]);
    return m;
  }
  // Forgets every count.
  void Clear() {
    std::fill(table_.begin(), table_.end(), uint8_t{0});
    additions_ = 0;
  }

 private:
  size_t Index(uint64_t h, int row) const {
    uint64_t x = Mix(h + static_cast<uint64_t>(row) * 0x9e3779b97f4a7c15ULL);
    return static_cast<size_t>(row) * (mask_ + 1) + static_cast<size_t>(x & mask_);
  }
  uint64_t mask_;
  std::vector<uint8_t> table_;
  uint64_t sample_;
  uint64_t additions_ = 0;
};

// Notices when the popular keys change wholesale, so the frequency history can be dropped
// instead of decaying for tens of thousands of requests. The signal is the rate of
// re-reference misses: misses on a key that was already requested within the last 2x
// `entries` requests (an exact, bounded history). After a shift most requests go to new keys
// that come back quickly and miss, because the sketch still favours the old ones; a scan's
// keys are new (no re-reference), and a stationary workload keeps the rate steady. A shift is
// reported when the short-run rate (EWMA over ~entries/2 requests) exceeds twice the long-run
// rate (EWMA over ~32x entries) plus 0.05, at most once per 16x entries requests and not
// before 32x entries requests were seen. Measured on the trace benchmark: it fires on every
// shift of the shifting trace within ~100 requests and never on the other traces.
class ShiftDetector {
 public:
  // `entries` below 256 count as 256: shorter averages are too noisy to tell a shift from
  // chance (a 64-entry cache fired on a stationary workload in the tests).
  explicit ShiftDetector(uint64_t entries)
      : entries_(std::max<uint64_t>(entries, 256)), horizon_(2 * entries_) {}

  // A request for `key` at request number `tick`.
  void Request(uint64_t key, uint64_t tick) {
    auto [it, fresh] = seen_.try_emplace(key, Seen{tick, 0});
    if (!fresh) it->second = {tick, it->second.last};
    history_.push_back({key, tick});
    while (history_.size() > horizon_) {
      auto [k, t] = history_.front();
      history_.pop_front();
      if (auto f = seen_.find(k); f != seen_.end() && f->second.last == t) seen_.erase(f);
    }
  }
  // Whether the latest request for `key` followed an earlier one within the history.
  bool ReRequested(uint64_t key) const {
    auto it = seen_.find(key);
    return it != seen_.end() && it->second.previous != 0;
  }
  // A hit, or a miss that was (`re_reference`) or was not a re-reference; true when a shift is
  // detected now.
  bool Observe(bool re_reference_miss, uint64_t tick) {
    const double x = re_reference_miss ? 1.0 : 0.0;
    const double n = static_cast<double>(entries_);
    short_rate_ += (x - short_rate_) / (n / 2);
    long_rate_ += (x - long_rate_) / (n * 32);
    if (tick < 32 * entries_ || tick - last_shift_ < 16 * entries_) return false;
    if (short_rate_ <= 2 * long_rate_ + 0.05) return false;
    last_shift_ = tick;
    long_rate_ = short_rate_;
    return true;
  }

 private:
  struct Seen {
    uint64_t last;      // tick of the latest request
    uint64_t previous;  // tick of the one before it within the history; 0 if none
  };
  uint64_t entries_, horizon_;
  absl::flat_hash_map<uint64_t, Seen> seen_;
  std::deque<std::pair<uint64_t, uint64_t>> history_;  // (key, tick), oldest first
  double short_rate_ = 0, long_rate_ = 0;
  uint64_t last_shift_ = 0;
};

class WTinyLfuPolicy final : public EvictionPolicy {
 public:
  WTinyLfuPolicy(uint64_t capacity, uint64_t expected_entries)
      : window_quota_(std::max<uint64_t>(capacity / 100, 1)),
        main_quota_(capacity - std::min(capacity, window_quota_)),
        protected_quota_(main_quota_ / 10 * 8),
        idle_period_(std::max<uint64_t>(expected_entries, 1) * 64),
        sketch_(expected_entries),
        detector_(expected_entries) {}

  void RecordAccess(uint64_t key) override {
    sketch_.Increment(key);
    ++tick_;
    detector_.Request(key, tick_);
  }
  void Insert(uint64_t key, uint64_t bytes) override {
    if (detector_.Observe(detector_.ReRequested(key), tick_)) OnShift();
    Push(kWindow, {key, bytes, kWindow, tick_});
  }
  void Touch(uint64_t key) override {
    auto it = pos_.find(key);
    if (it == pos_.end()) return;
    if (detector_.Observe(false, tick_)) OnShift();
    it->second->last_access = tick_;
    Seg s = it->second->seg;
    if (s == kWindow || s == kProtected) {
      q_[s].splice(q_[s].begin(), q_[s], it->second);
      return;
    }
    Move(it->second, kProtected);  // probation hit: promote
    while (bytes_[kProtected] > protected_quota_ && q_[kProtected].size() > 1) {
      Move(std::prev(q_[kProtected].end()), kProbation);
    }
  }
  void Erase(uint64_t key) override {
    auto it = pos_.find(key);
    if (it == pos_.end()) return;
    bytes_[it->second->seg] -= it->second->bytes;
    q_[it->second->seg].erase(it->second);
    pos_.erase(it);
  }
  uint64_t detected_shifts() const override { return shifts_; }
  std::optional<uint64_t> EvictOne(const std::function<bool(uint64_t)>& can_evict) override {
    while (bytes_[kWindow] > window_quota_) {
      auto cand = LastEvictable(kWindow, can_evict);
      if (!cand) break;
      if (bytes_[kProbation] + bytes_[kProtected] + (*cand)->bytes <= main_quota_) {
        Move(*cand, kProbation);  // main has room: admit without a contest
        continue;
      }
      auto victim = LastEvictable(kProbation, can_evict);
      if (!victim) victim = LastEvictable(kProtected, can_evict);
      if (victim) victim = LeastFrequentNear(*victim, can_evict);
      // The candidate must be strictly more frequent (ties keep the resident key: equally
      // popular keys swapping places is a load each time for nothing).
      if (victim && sketch_.Estimate((*cand)->key) > VictimFrequency(*victim)) {
        uint64_t key = (*victim)->key;
        Move(*cand, kProbation);
        Erase(key);
        return key;
      }
      uint64_t key = (*cand)->key;  // the candidate loses (or main is all leased)
      Erase(key);
      return key;
    }
    for (Seg s : {kProbation, kProtected, kWindow}) {
      if (auto v = LastEvictable(s, can_evict)) {
        uint64_t key = (*v)->key;
        Erase(key);
        return key;
      }
    }
    return std::nullopt;
  }

 private:
  enum Seg { kWindow = 0, kProbation = 1, kProtected = 2 };
  struct Node {
    uint64_t key;
    uint64_t bytes;
    Seg seg;
    uint64_t last_access;  // tick_ of its last request
  };
  using Iter = std::list<Node>::iterator;

  // Of the kVictimSample evictable entries at the cold end of `last`'s segment (from `last`
  // towards the front), the one with the lowest VictimFrequency (the coldest on ties).
  static constexpr int kVictimSample = 64;
  Iter LeastFrequentNear(Iter last, const std::function<bool(uint64_t)>& can_evict) const {
    const std::list<Node>& q = q_[last->seg];
    Iter best = last;
    int best_f = VictimFrequency(last);
    int seen = 0;
    for (Iter it = last; best_f > 0 && it != q.begin() && ++seen < kVictimSample;) {
      --it;
      if (!can_evict(it->key)) continue;
      if (int f = VictimFrequency(it); f < best_f) {
        best = it;
        best_f = f;
      }
    }
    return best;
  }

  // The victim's sketch frequency, halved for every idle_period_ (64x entries) requests since it
  // was last requested: a key that was popular before a shift stops blocking the new popular keys
  // before the sketch's global halving catches up.
  int VictimFrequency(Iter it) const {
    const uint64_t halvings = (tick_ - it->last_access) / idle_period_;
    return halvings >= 8 ? 0 : sketch_.Estimate(it->key) >> halvings;
  }

  // A popularity shift: forget the frequency history and put every protected entry back on
  // probation (most recently used first), so the new popular keys are admitted against the old
  // ones on their fresh counts.
  void OnShift() {
    ++shifts_;
    sketch_.Clear();
    while (!q_[kProtected].empty()) Move(std::prev(q_[kProtected].end()), kProbation);
  }

  void Push(Seg s, Node n) {
    n.seg = s;
    bytes_[s] += n.bytes;
    q_[s].push_front(n);
    pos_[n.key] = q_[s].begin();
  }
  void Move(Iter it, Seg to) {
    bytes_[it->seg] -= it->bytes;
    bytes_[to] += it->bytes;
    q_[to].splice(q_[to].begin(), q_[it->seg], it);
    it->seg = to;
  }
  std::optional<Iter> LastEvictable(Seg s, const std::function<bool(uint64_t)>& can_evict) {
    for (auto it = q_[s].end(); it != q_[s].begin();) {
      --it;
      if (can_evict(it->key)) return it;
    }
    return std::nullopt;
  }

  uint64_t window_quota_, main_quota_, protected_quota_;
  uint64_t idle_period_;
  uint64_t tick_ = 0;  // requests seen (RecordAccess calls)
  FrequencySketch sketch_;
  ShiftDetector detector_;
  uint64_t shifts_ = 0;
  std::list<Node> q_[3];  // front: most recent
  uint64_t bytes_[3] = {0, 0, 0};
  absl::flat_hash_map<uint64_t, Iter> pos_;
};

}  // namespace

const char* EvictionPolicyName(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kLru:
      return "lru";
    case EvictionPolicyKind::kS3Fifo:
      return "s3fifo";
    case EvictionPolicyKind::kWTinyLfu:
      return "wtinylfu";
  }
  return "?";
}

absl::StatusOr<EvictionPolicyKind> ParseEvictionPolicy(absl::string_view name) {
  for (auto k :
       {EvictionPolicyKind::kLru, EvictionPolicyKind::kS3Fifo, EvictionPolicyKind::kWTinyLfu}) {
    if (name == EvictionPolicyName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown eviction policy \"", name, "\" (lru, s3fifo, wtinylfu)"));
}

std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(EvictionPolicyKind kind, uint64_t capacity_bytes,
                                                   uint64_t expected_entries) {
  switch (kind) {
    case EvictionPolicyKind::kLru:
      return std::make_unique<LruPolicy>();
    case EvictionPolicyKind::kS3Fifo:
      return std::make_unique<S3FifoPolicy>(capacity_bytes);
    case EvictionPolicyKind::kWTinyLfu:
      return std::make_unique<WTinyLfuPolicy>(capacity_bytes, expected_entries);
  }
  return nullptr;
}

}  // namespace loradb::tiers

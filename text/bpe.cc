#include "text/bpe.h"

#include <queue>

namespace loradb::text {

void MergeTable::Set(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  map_[Key(left, right)] = {rank, merged};
}

const std::pair<int32_t, int32_t>* MergeTable::Find(int32_t left, int32_t right) const {
  auto it = map_.find(Key(left, right));
  return it == map_.end() ? nullptr : &it->second;
}

namespace {

struct Candidate {
  int32_t rank;
  int32_t pos;  // index of the left symbol
  int32_t merged;
  // std::priority_queue pops the greatest: make the lowest rank, then the lowest position,
  // greatest.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

struct Symbol {
  int32_t id;
  int32_t prev;  // -1: none
  int32_t next;  // -1: none
  bool removed;
};

}  // namespace

void ApplyMerges(const MergeTable& merges, std::vector<int32_t>* ids) {
  const int32_t n = static_cast<int32_t>(ids->size());
  if (n < 2) return;
  std::vector<Symbol> sym(n);
  std::vector<Candidate> initial;
  initial.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = {(*ids)[i], i - 1, i + 1 < n ? i + 1 : -1, false};
    if (i + 1 < n) {
      if (const auto* m = merges.Find((*ids)[i], (*ids)[i + 1])) {
        initial.push_back({m->first, i, m->second});
      }
    }
  }
  std::priority_queue<Candidate> queue(std::less<Candidate>(), std::move(initial));
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (left.removed || left.next < 0) continue;
    const int32_t right_pos = left.next;
    const Symbol right = sym[right_pos];
    // Skip entries made stale by an earlier merge on either side.
    const auto* current = merges.Find(left.id, right.id);
    if (current == nullptr || current->second != top.merged) continue;
    left.id = top.merged;
    left.next = right.next;
    sym[right_pos].removed = true;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const auto* m = merges.Find(sym[left.prev].id, left.id)) {
        queue.push({m->first, left.prev, m->second});
      }
    }
    if (left.next >= 0) {
      if (const auto* m = merges.Find(left.id, sym[left.next].id)) {
        queue.push({m->first, top.pos, m->second});
      }
    }
  }
  ids->clear();
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids->push_back(sym[i].id);
}

}  // namespace loradb::text

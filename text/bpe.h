// The BPE merge step: applies a merge table to one word's symbols the way Hugging Face
// tokenizers' BPE model does (a min-heap of candidate merges ordered by rank, then by position;
// stale entries skipped), in O(n log n) for an n-symbol word.
#ifndef LORADB_TEXT_BPE_H_
#define LORADB_TEXT_BPE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace loradb::text {

// Merge table: the pair (left id, right id) -> (rank, merged id). Lower ranks merge first.
class MergeTable {
 public:
  // Adds or replaces (a later rank for the same pair wins, as when tokenizers builds its map).
  void Set(int32_t left, int32_t right, int32_t rank, int32_t merged);
  // The (rank, merged id) of pair (left, right), or nullptr.
  const std::pair<int32_t, int32_t>* Find(int32_t left, int32_t right) const;
  size_t size() const { return map_.size(); }

 private:
  static uint64_t Key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> map_;
};

// Replaces `ids` (a word's initial symbols) by the result of applying `merges` until none
// applies.
void ApplyMerges(const MergeTable& merges, std::vector<int32_t>* ids);

}  // namespace loradb::text

#endif  // LORADB_TEXT_BPE_H_

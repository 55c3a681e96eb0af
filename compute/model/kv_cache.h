// The attention KV cache of a Qwen3Model: one contiguous buffer per sequence,
//   [layers, 2 (K, V), kv_heads, capacity, head_dim]  in the model's dtype,
// grown by doubling when a sequence outgrows it. Contiguous (not paged) because attention over
// one sequence is then a single matmul over a slice, and sequences in this project are short;
// the cost is reallocation on growth and memory reserved up to 2x the live length. A decoder
// that needs tighter packing at high concurrency can swap this for a paged layout without
// changing Qwen3Model's Forward signature (only KvCache's internals and the attention gather).
#ifndef LORADB_COMPUTE_MODEL_KV_CACHE_H_
#define LORADB_COMPUTE_MODEL_KV_CACHE_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loradb::model {

class KvCache {
 public:
  using SeqId = int64_t;

  // A cache for a model with these dimensions. Not thread-safe: one decoder loop owns it.
  KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, at::ScalarType dtype,
          at::Device device);

  // Starts an empty sequence, reserving room for `reserve_tokens` (> 0 avoids regrowth).
  SeqId AddSequence(int64_t reserve_tokens = 0);
  // Starts a sequence holding a copy of `seq`'s cached tokens (e.g. several samples continuing
  // one prefilled prompt), with room for `reserve_tokens` more. NotFound for an unknown id.
  [[nodiscard]] absl::StatusOr<SeqId> Fork(SeqId seq, int64_t reserve_tokens = 0);
  // Frees a sequence's memory. NotFound for an unknown id.
  [[nodiscard]] absl::Status RemoveSequence(SeqId seq);
  // Tokens cached for `seq` (its next token's position). NotFound for an unknown id.
  [[nodiscard]] absl::StatusOr<int64_t> Length(SeqId seq) const;
  // Forgets tokens past `length` (e.g. rejected speculative tokens). InvalidArgument when
  // `length` exceeds the current length or is negative.
  [[nodiscard]] absl::Status Truncate(SeqId seq, int64_t length);
  size_t num_sequences() const { return seqs_.size(); }
  // Bytes currently allocated (capacity, not live length).
  int64_t allocated_bytes() const;

  // --- Used by Qwen3Model::Forward. ---
  // Makes room for `extra` more tokens after the current length of `seq`.
  [[nodiscard]] absl::Status Reserve(SeqId seq, int64_t extra);
  // Writes k, v ([kv_heads, n, head_dim]) of `layer` at [Length(seq), Length(seq) + n) and
  // returns views of all cached K and V of that layer including them, [kv_heads, len + n, hd].
  // The length itself advances only at Commit.
  std::pair<at::Tensor, at::Tensor> Append(SeqId seq, int64_t layer, const at::Tensor& k,
                                           const at::Tensor& v);
  // Advances the length of `seq` by `n` after all layers appended.
  void Commit(SeqId seq, int64_t n);

  // Where `layer` of `seq` keeps its K and V, for a float32 cache on the CPU (the CPU decode
  // attention writes and reads it in place): kv head g's cached token t is at
  // k + g * head_stride + t * head_dim (likewise v); `length` tokens are committed, and room for
  // those Reserve made follows them.
  struct LayerSpan {
    float* k;
    float* v;
    int64_t head_stride;
    int64_t length;
  };
  LayerSpan Span(SeqId seq, int64_t layer);

 private:
  struct Sequence {
    at::Tensor kv;  // [layers, 2, kv_heads, capacity, head_dim]
    int64_t length = 0;
  };
  at::Tensor Allocate(int64_t capacity) const;

  int64_t num_layers_, num_kv_heads_, head_dim_;
  at::ScalarType dtype_;
  at::Device device_;
  SeqId next_id_ = 0;
  absl::flat_hash_map<SeqId, Sequence> seqs_;
};

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_KV_CACHE_H_

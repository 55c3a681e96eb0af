#include "compute/model/kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loradb::model {

KvCache::KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, at::ScalarType dtype,
                 at::Device device)
    : num_layers_(num_layers),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      dtype_(dtype),
      device_(device) {}

at::Tensor KvCache::Allocate(int64_t capacity) const {
  return at::empty({num_layers_, 2, num_kv_heads_, capacity, head_dim_},
                   at::TensorOptions(dtype_).device(device_));
}

KvCache::SeqId KvCache::AddSequence(int64_t reserve_tokens) {
  const SeqId id = next_id_++;
  seqs_[id] = Sequence{Allocate(std::max<int64_t>(reserve_tokens, 16)), 0};
  return id;
}

absl::StatusOr<KvCache::SeqId> KvCache::Fork(SeqId seq, int64_t reserve_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no KV sequence ", seq));
  const int64_t length = it->second.length;
  at::Tensor kv = Allocate(std::max<int64_t>(length + std::max<int64_t>(reserve_tokens, 0), 16));
  if (length > 0) kv.narrow(3, 0, length).copy_(it->second.kv.narrow(3, 0, length));
  const SeqId id = next_id_++;
  seqs_[id] = Sequence{std::move(kv), length};
  return id;
}

absl::Status KvCache::RemoveSequence(SeqId seq) {
  if (seqs_.erase(seq) == 0) return absl::NotFoundError(absl::StrCat("no KV sequence ", seq));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvCache::Length(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no KV sequence ", seq));
  return it->second.length;
}

absl::Status KvCache::Truncate(SeqId seq, int64_t length) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no KV sequence ", seq));
  if (length < 0 || length > it->second.length) {
    return absl::InvalidArgumentError(absl::StrCat("cannot truncate KV sequence ", seq, " of ",
                                                   it->second.length, " tokens to ", length));
  }
  it->second.length = length;
  return absl::OkStatus();
}

int64_t KvCache::allocated_bytes() const {
  int64_t total = 0;
  for (const auto& [id, s] : seqs_) total += static_cast<int64_t>(s.kv.nbytes());
  return total;
}

absl::Status KvCache::Reserve(SeqId seq, int64_t extra) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no KV sequence ", seq));
  Sequence& s = it->second;
  const int64_t need = s.length + extra;
  const int64_t capacity = s.kv.size(3);
  if (need <= capacity) return absl::OkStatus();
  at::Tensor grown = Allocate(std::max(need, 2 * capacity));
  if (s.length > 0) {
    grown.narrow(3, 0, s.length).copy_(s.kv.narrow(3, 0, s.length));
  }
  s.kv = std::move(grown);
  return absl::OkStatus();
}

std::pair<at::Tensor, at::Tensor> KvCache::Append(SeqId seq, int64_t layer, const at::Tensor& k,
                                                  const at::Tensor& v) {
  Sequence& s = seqs_.at(seq);
  const int64_t n = k.size(1);
  at::Tensor kl = s.kv[layer][0];
  at::Tensor vl = s.kv[layer][1];
  kl.narrow(1, s.length, n).copy_(k.detach());
  vl.narrow(1, s.length, n).copy_(v.detach());
  return {kl.narrow(1, 0, s.length + n), vl.narrow(1, 0, s.length + n)};
}

void KvCache::Commit(SeqId seq, int64_t n) { seqs_.at(seq).length += n; }

KvCache::LayerSpan KvCache::Span(SeqId seq, int64_t layer) {
  Sequence& s = seqs_.at(seq);
  const int64_t head_stride = s.kv.size(3) * head_dim_;
  float* k = s.kv.data_ptr<float>() + layer * 2 * num_kv_heads_ * head_stride;
  return {k, k + num_kv_heads_ * head_stride, head_stride, s.length};
}

}  // namespace loradb::model

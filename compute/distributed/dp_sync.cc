#include "compute/distributed/dp_sync.h"

#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/util/status_macros.h"

namespace loradb::dist {

absl::StatusOr<ReducedStep> AllReduceGradients(ProcessGroup* group, trainer::Trainer* trainer,
                                               int policy, double weight, double loss,
                                               double accuracy) {
  if (policy < 0 || policy >= trainer->num_policies()) {
    return absl::InvalidArgumentError(absl::StrCat("no policy index ", policy));
  }
  if (trainer->micro_steps(policy) != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("data-parallel step needs exactly one accumulated micro-step, have ",
                     trainer->micro_steps(policy)));
  }
  if (!(weight > 0)) return absl::InvalidArgumentError("the rank's loss weight must be > 0");
  const std::map<std::string, at::Tensor>& named = trainer->parameters(policy).named();
  // One bucket: [w*g for every factor in name order..., w, w*loss, w*accuracy].
  int64_t total = 3;
  for (const auto& [name, t] : named) total += t.numel();
  at::Tensor bucket = at::empty({total}, at::kFloat);
  int64_t off = 0;
  for (const auto& [name, t] : named) {
    at::Tensor dst = bucket.narrow(0, off, t.numel());
    if (t.grad().defined()) {
      dst.copy_(t.grad().reshape({-1}));
      dst.mul_(weight);
    } else {
      dst.zero_();
    }
    off += t.numel();
  }
  bucket[off] = weight;
  bucket[off + 1] = weight * loss;
  bucket[off + 2] = weight * accuracy;
  LORADB_RETURN_IF_ERROR(group->AllReduce(bucket, ReduceOp::kSum));
  ReducedStep out;
  out.weight = bucket[off].item<double>();
  out.loss = bucket[off + 1].item<double>() / out.weight;
  out.accuracy = bucket[off + 2].item<double>() / out.weight;
  bucket.narrow(0, 0, off).div_(out.weight);
  off = 0;
  for (const auto& [name, t] : named) {
    at::Tensor param = t;  // the same leaf (handles share the TensorImpl)
    param.mutable_grad() = bucket.narrow(0, off, t.numel()).view(t.sizes()).clone();
    off += t.numel();
  }
  return out;
}

namespace {

constexpr char kMagic[] = "LORADB-DP-SNAPSHOT-1";

void PutU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }
void PutStr(std::string* out, const std::string& s) {
  PutU64(out, s.size());
  out->append(s);
}
void PutTensors(std::string* out, const std::map<std::string, at::Tensor>& m) {
  PutU64(out, m.size());
  for (const auto& [name, t0] : m) {
    at::Tensor t = t0.detach().to(at::kCPU).contiguous();
    PutStr(out, name);
    PutU64(out, static_cast<uint64_t>(t.scalar_type()));
    PutU64(out, static_cast<uint64_t>(t.dim()));
    for (int64_t d : t.sizes()) PutU64(out, static_cast<uint64_t>(d));
    const size_t n = t.numel() * t.element_size();
    PutU64(out, n);
    out->append(static_cast<const char*>(t.data_ptr()), n);
  }
}

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  absl::StatusOr<uint64_t> U64() {
    if (pos_ + 8 > s_.size()) return Truncated();
    uint64_t v;
    std::memcpy(&v, s_.data() + pos_, 8);
    pos_ += 8;
    return v;
  }
  absl::StatusOr<std::string> Str() {
    LORADB_ASSIGN_OR_RETURN(uint64_t n, U64());
    if (n > s_.size() - pos_) return Truncated();
    std::string v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  absl::StatusOr<std::map<std::string, at::Tensor>> Tensors() {
    std::map<std::string, at::Tensor> m;
    LORADB_ASSIGN_OR_RETURN(uint64_t count, U64());
    for (uint64_t i = 0; i < count; ++i) {
      LORADB_ASSIGN_OR_RETURN(std::string name, Str());
      LORADB_ASSIGN_OR_RETURN(uint64_t st, U64());
      LORADB_ASSIGN_OR_RETURN(uint64_t dim, U64());
      if (dim > 8) return absl::DataLossError("snapshot: tensor rank > 8");
      std::vector<int64_t> sizes;
      for (uint64_t d = 0; d < dim; ++d) {
        LORADB_ASSIGN_OR_RETURN(uint64_t v, U64());
        sizes.push_back(static_cast<int64_t>(v));
      }
      const auto type = static_cast<at::ScalarType>(st);
      if (type != at::kFloat && type != at::kLong && type != at::kDouble && type != at::kInt) {
        return absl::DataLossError(absl::StrCat("snapshot: tensor ", name, " has dtype ", st));
      }
      at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(type));
      LORADB_ASSIGN_OR_RETURN(uint64_t n, U64());
      if (n != static_cast<uint64_t>(t.numel() * t.element_size()) || n > s_.size() - pos_) {
        return absl::DataLossError(absl::StrCat("snapshot: tensor ", name, " size mismatch"));
      }
      std::memcpy(t.data_ptr(), s_.data() + pos_, n);
      pos_ += n;
      m.emplace(std::move(name), std::move(t));
    }
    return m;
  }
  bool done() const { return pos_ == s_.size(); }

 private:
  static absl::Status Truncated() { return absl::DataLossError("snapshot bytes are truncated"); }
  const std::string& s_;
  size_t pos_ = 0;
};

}  // namespace

std::string EncodeSnapshot(const trainer::PolicySnapshot& s) {
  std::string out = kMagic;
  PutTensors(&out, s.master);
  PutTensors(&out, s.optimizer);
  PutTensors(&out, s.gradients);
  PutU64(&out, static_cast<uint64_t>(s.micro_steps));
  PutStr(&out, s.scheduler_name);
  PutU64(&out, static_cast<uint64_t>(s.scheduler_position));
  PutStr(&out, s.rng_state);
  return out;
}

absl::StatusOr<trainer::PolicySnapshot> DecodeSnapshot(const std::string& bytes) {
  const size_t ml = sizeof(kMagic) - 1;
  if (bytes.size() < ml || bytes.compare(0, ml, kMagic) != 0) {
    return absl::DataLossError("not a data-parallel policy snapshot");
  }
  const std::string body = bytes.substr(ml);
  Reader r(body);
  trainer::PolicySnapshot s;
  LORADB_ASSIGN_OR_RETURN(s.master, r.Tensors());
  LORADB_ASSIGN_OR_RETURN(s.optimizer, r.Tensors());
  LORADB_ASSIGN_OR_RETURN(s.gradients, r.Tensors());
  LORADB_ASSIGN_OR_RETURN(uint64_t micro, r.U64());
  s.micro_steps = static_cast<int64_t>(micro);
  LORADB_ASSIGN_OR_RETURN(s.scheduler_name, r.Str());
  LORADB_ASSIGN_OR_RETURN(uint64_t pos, r.U64());
  s.scheduler_position = static_cast<int64_t>(pos);
  LORADB_ASSIGN_OR_RETURN(s.rng_state, r.Str());
  if (!r.done()) return absl::DataLossError("snapshot bytes have trailing data");
  return s;
}

absl::Status BroadcastPolicy(ProcessGroup* group, trainer::Trainer* trainer, int policy, int root) {
  std::string bytes;
  if (group->rank() == root) {
    LORADB_ASSIGN_OR_RETURN(trainer::PolicySnapshot snap, trainer->Snapshot(policy));
    bytes = EncodeSnapshot(snap);
  }
  LORADB_RETURN_IF_ERROR(group->BroadcastBytes(&bytes, root));
  if (group->rank() == root) return absl::OkStatus();
  LORADB_ASSIGN_OR_RETURN(trainer::PolicySnapshot snap, DecodeSnapshot(bytes));
  return trainer->Restore(policy, snap);
}

}  // namespace loradb::dist

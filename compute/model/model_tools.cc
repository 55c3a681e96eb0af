#include "compute/model/model_tools.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "compute/model/checkpoint.h"
#include "compute/model/qwen3_model.h"
#include "storage/util/status_macros.h"

namespace loradb::model {
namespace {

absl::StatusOr<at::ScalarType> ParseDTypeName(const std::string& dtype) {
  if (dtype == "f32") return at::kFloat;
  if (dtype == "bf16") return at::kBFloat16;
  if (dtype == "f16") return at::kHalf;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype \"", dtype, "\" is not one of f32, bf16, f16"));
}

std::string DTypeShortName(at::ScalarType t) {
  return t == at::kFloat ? "f32" : t == at::kBFloat16 ? "bf16" : t == at::kHalf ? "f16" : "?";
}

}  // namespace

absl::Status CheckDTypeName(const std::string& dtype) { return ParseDTypeName(dtype).status(); }

absl::StatusOr<Hash128> InitRandomCheckpoint(const std::string& config_path,
                                             const std::string& out_dir, uint64_t seed,
                                             const std::string& dtype) {
  LORADB_ASSIGN_OR_RETURN(at::ScalarType st, ParseDTypeName(dtype));
  LORADB_ASSIGN_OR_RETURN(ModelConfig config, ReadModelConfig(config_path));
  try {
    LORADB_RETURN_IF_ERROR(WriteRandomCheckpoint(config, out_dir, seed, st));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("init-random: ", e.what_without_backtrace()));
  }
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3Model> model, Qwen3Model::Load(out_dir));
  return model->fingerprint();
}

absl::StatusOr<ModelSummary> DescribeModel(const std::string& model_dir) {
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3Model> model, Qwen3Model::Load(model_dir));
  ModelSummary s;
  s.config = model->config();
  s.fingerprint = model->fingerprint();
  s.num_parameters = model->num_parameters();
  s.dtype = DTypeShortName(model->dtype());
  return s;
}

absl::StatusOr<std::vector<std::vector<float>>> ComputeLogits(const LogitsRequest& request) {
  if (request.token_ids.empty()) return absl::InvalidArgumentError("no token ids given");
  LoadOptions options;
  if (!request.dtype.empty()) {
    LORADB_ASSIGN_OR_RETURN(at::ScalarType st, ParseDTypeName(request.dtype));
    options.dtype = st;
  }
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3Model> model,
                          Qwen3Model::Load(request.model_dir, options));
  const int64_t n = static_cast<int64_t>(request.token_ids.size());
  std::vector<int64_t> ids = request.token_ids;
  at::Tensor all = at::from_blob(ids.data(), {n}, at::kLong).clone();
  std::vector<at::Tensor> chunks;
  if (request.prefill <= 0 || request.prefill >= n) {
    ForwardInput in;
    in.token_ids = all;
    LORADB_ASSIGN_OR_RETURN(ForwardOutput out, model->Forward(in));
    chunks.push_back(out.logits);
  } else {
    KvCache cache = model->NewKvCache();
    const KvCache::SeqId seq = cache.AddSequence();
    int64_t pos = 0;
    while (pos < n) {
      const int64_t len = pos == 0 ? request.prefill : 1;
      ForwardInput in;
      in.token_ids = all.narrow(0, pos, len);
      in.cache_seqs = {seq};
      LORADB_ASSIGN_OR_RETURN(ForwardOutput out, model->Forward(in, &cache));
      chunks.push_back(out.logits);
      pos += len;
    }
  }
  at::Tensor logits = at::cat(chunks, 0).to(at::kFloat).contiguous();
  std::vector<std::vector<float>> rows(n);
  const int64_t vocab = logits.size(1);
  const float* p = logits.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) rows[i].assign(p + i * vocab, p + (i + 1) * vocab);
  return rows;
}

}  // namespace loradb::model

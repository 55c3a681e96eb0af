// A Qwen3-family decoder-only transformer (dense `qwen3` and MoE `qwen3_moe`) in LibTorch whose
// math follows Hugging Face transformers' Qwen3 / Qwen3-MoE: token embeddings, pre-norm decoder
// layers (RMSNorm; GQA attention with per-head q_norm / k_norm and RoPE; SwiGLU MLP or a top-k
// softmax-routed expert block), final RMSNorm, tied or untied LM head. Weights are fp32, bf16 or
// fp16 and are computed in that dtype, as transformers does.
//
// Weights come from a Hugging Face checkpoint directory (config.json + model.safetensors or a
// sharded index) read through storage's safetensors reader; tensors whose dtype and alignment
// already fit are used in place over the memory map (zero copies), the others are copied once.
//
// Every q/k/v/o, gate/up/down and expert projection takes a per-row multi-LoRA delta (lora.h).
#ifndef LORADB_COMPUTE_MODEL_QWEN3_MODEL_H_
#define LORADB_COMPUTE_MODEL_QWEN3_MODEL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "compute/model/kv_cache.h"
#include "compute/model/lora.h"
#include "storage/formats/model_config.h"
#include "storage/formats/tensor.h"
#include "storage/util/hash.h"

namespace loradb::model {

struct LoadOptions {
  // Compute dtype; default: the dtype of the checkpoint's embedding. Weights of another dtype
  // are converted (one copy).
  std::optional<at::ScalarType> dtype;
  at::Device device = at::kCPU;
};

// One forward pass over a batch of sequences, each contributing a run of new tokens
// (a whole prompt, a prefill chunk, or one decode token). Rows are the concatenation of the
// sequences' tokens in order.
struct ForwardInput {
  // int64 [rows]: token ids.
  at::Tensor token_ids;
  // Tokens per sequence; sums to rows. Empty means one sequence of all rows.
  std::vector<int64_t> seq_lens;
  // With a cache: one cache sequence per entry of seq_lens; the new tokens take positions
  // [Length(seq), Length(seq) + n) and are appended. Empty: no cache, positions start at 0.
  std::vector<KvCache::SeqId> cache_seqs;
  // Per-row adapters; null = base only.
  const LoraBatch* lora = nullptr;
  // Only compute logits for each sequence's last row (what decode needs).
  bool last_row_logits_only = false;
  // Shared prefixes, without a cache (several samples of one prompt in a training batch):
  // continues[s] = the index of the sequence whose tokens sequence s continues, or -1. A
  // continuing sequence's rows take the positions after that sequence's tokens and attend to all
  // of them, then causally to their own; gradients of the shared rows sum over every sequence
  // that continues them. Empty: no sequence continues another. A continued sequence must not
  // itself continue one, and every continuing sequence comes after all the others.
  std::vector<int64_t> continues;
  // Compute logits only for these rows, in this order (e.g. the positions a loss trains).
  // Empty: every row (or each sequence's last, with last_row_logits_only).
  std::vector<int64_t> logit_rows;
};

struct ForwardOutput {
  // [rows or sequences, vocab] in the model dtype.
  at::Tensor logits;
  // Final-norm hidden states of the same rows, [.., hidden].
  at::Tensor hidden;
};

// Tensor-parallel hook (compute/distributed/tp_model.h): sums a row-parallel partial output
// (attention after o_proj, the MLP after down_proj or the whole expert block) across the ranks
// of a TP group, returning the sum. May throw c10::Error (Forward returns it as InternalError).
class PartialSumReducer {
 public:
  virtual ~PartialSumReducer() = default;
  virtual at::Tensor AllReduceSum(at::Tensor partial) const = 0;
};

class Qwen3Model {
 public:
  // Loads `dir` (config.json plus model.safetensors or model.safetensors.index.json).
  // NotFound when files are missing; InvalidArgument when a tensor is missing, has the wrong
  // shape or a non-float dtype, or is not a weight of this architecture (each error names it).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Qwen3Model>> Load(
      const std::string& dir, const LoadOptions& options = {});
  // Builds the model over already-read tensors (HF names); `tensors` is kept alive by the model.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Qwen3Model>> FromTensors(
      const ModelConfig& config, std::shared_ptr<const TensorSet> tensors,
      const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }
  // xxh3-128 of the checkpoint's tensor bytes in name order (WeightsFingerprint).
  const Hash128& fingerprint() const { return fingerprint_; }
  int64_t num_parameters() const { return num_parameters_; }
  // A cache sized for this model.
  KvCache NewKvCache() const;

  // Runs the decoder. InvalidArgument for bad shapes, token ids outside the vocabulary, unknown
  // cache sequences or a malformed LoRA batch; on error the cache is unchanged. Differentiable
  // with respect to LoRA factors (the base weights never require grad) when run without a
  // cache: cached K/V are stored detached, so train without one. Concurrent calls are safe only
  // with a stateless applier (the default) and distinct caches; KernelLoraApplier serialises.
  [[nodiscard]] absl::StatusOr<ForwardOutput> Forward(const ForwardInput& input,
                                                      KvCache* cache = nullptr) const;

  // Readies `adapter` for this model's forward passes: DoRA scales from this model's weights
  // (LoraFactors::dora_scale) and the check that saved base_layer weights equal this model's.
  // OK and nothing done for an adapter already prepared (plain LoRA needs nothing). Errors,
  // with the adapter unchanged: Unimplemented when a base_layer weight differs from the base's
  // (e.g. a resized vocabulary) or when this model is a tensor-parallel slice (DoRA norms and
  // the whole embedding / head need the full weights).
  [[nodiscard]] absl::Status PrepareAdapter(LoraAdapter* adapter) const;

  // Replaces the applier of LoRA deltas (default: TorchLoraApplier). Not owned; must outlive
  // every Forward call.
  void set_lora_applier(const LoraApplier* applier) { applier_ = applier; }
  // Tensor parallelism: a model built over one rank's slice (compute/distributed/tp_shard.h)
  // sums its row-parallel outputs through `reducer` (not owned; null = no TP, the default).
  void set_partial_sum_reducer(const PartialSumReducer* reducer) { reducer_ = reducer; }

 private:
  struct Expert {
    at::Tensor gate, up, down;
  };
  struct Layer {
    at::Tensor input_norm, post_norm;
    at::Tensor q, k, v, o, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm;
    bool moe = false;
    at::Tensor gate, up, down;  // dense MLP
    at::Tensor router;          // [experts, hidden]
    std::vector<Expert> experts;
  };
  struct Context;  // per-forward state

  Qwen3Model() = default;
  absl::StatusOr<ForwardOutput> ForwardImpl(const ForwardInput& input, KvCache* cache) const;
  static absl::StatusOr<std::unique_ptr<Qwen3Model>> FromTensorsImpl(
      const ModelConfig& config, std::shared_ptr<const TensorSet> tensors,
      const LoadOptions& options);
  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w) const;
  at::Tensor ReducePartial(at::Tensor partial) const {
    return reducer_ == nullptr ? partial : reducer_->AllReduceSum(std::move(partial));
  }
  at::Tensor Project(const Context& ctx, const at::Tensor& x, const at::Tensor& w,
                     const at::Tensor& bias, int64_t layer, LoraTarget target) const;
  // DoRA rows of a projection output y (LoRA delta already added): bias + s * (y - bias).
  at::Tensor ApplyDora(const Context& ctx, at::Tensor y, const at::Tensor& bias, int64_t layer,
                       LoraTarget target) const;
  // Rows whose adapter replaces or adds LoRA to embed_tokens: their embeddings of `ids`.
  at::Tensor EmbedAdapters(const Context& ctx, const at::Tensor& ids, at::Tensor h) const;
  // Logits rows (batch rows `out_rows`, empty = all in order) whose adapter replaces or adds
  // LoRA to lm_head.
  at::Tensor HeadAdapters(const Context& ctx, const std::vector<int64_t>& out_rows,
                          const at::Tensor& hidden, at::Tensor logits) const;
  absl::Status PrepareAdapterImpl(LoraAdapter* adapter) const;
  at::Tensor Attention(const Context& ctx, const Layer& l, int64_t layer,
                       const at::Tensor& x) const;
  // Causal attention of sequences that continue none, [rows, heads * head_dim] before o_proj.
  at::Tensor AttendCausal(const Context& ctx, int64_t layer, const at::Tensor& q, at::Tensor k,
                          at::Tensor v) const;
  // Whether the sequences of this forward that add one token attend through the CPU kernel
  // (a float32 model and cache on the CPU, no autograd graph recorded).
  bool UsesCpuDecodeAttention(const Context& ctx, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v) const;
  // Root sequences `seqs` (indices into the batch's sequences) of one token each, at rows `rows`
  // of q, k and v ([rows, heads or kv_heads, head_dim]): writes their K and V into the cache at
  // its current length and their attention output into the same rows of `out`
  // ([rows, heads * head_dim]).
  void CpuDecodeAttention(const Context& ctx, int64_t layer, const at::Tensor& q,
                          const at::Tensor& k, const at::Tensor& v, const std::vector<size_t>& seqs,
                          const std::vector<int64_t>& rows, at::Tensor& out) const;
  // Attention of the continuing sequences' queries `q` over their prefix's keys and their own;
  // `k`, `v` hold every row's keys and values.
  at::Tensor AttendContinuations(const Context& ctx, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v) const;
  at::Tensor DenseMlp(const Context& ctx, const Layer& l, int64_t layer, const at::Tensor& x) const;
  at::Tensor MoeMlp(const Context& ctx, const Layer& l, int64_t layer, const at::Tensor& x) const;

  ModelConfig config_;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
  std::shared_ptr<const TensorSet> tensors_;  // keeps the mmap'd weights alive
  Hash128 fingerprint_;
  int64_t num_parameters_ = 0;
  at::Tensor embed_, final_norm_, lm_head_, inv_freq_;
  std::vector<Layer> layers_;
  TorchLoraApplier reference_applier_;
  const LoraApplier* applier_ = &reference_applier_;
  const PartialSumReducer* reducer_ = nullptr;
};

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_QWEN3_MODEL_H_

// Torch-free harness for `loradb-bench decode`: a random base checkpoint, a store holding
// `max_adapters` random adapters (policies p0.. with alias prod), and two ways to serve a batch
// of requests over them: the store-backed multi-LoRA Decoder (one lease per step, kernels' BGMV
// applier), and the "merge" path a user would otherwise take (per adapter: copy the base, merge
// W += scale B A, serve that adapter's requests on the merged copy).
#ifndef LORADB_COMPUTE_DECODER_DECODE_BENCH_TOOLS_H_
#define LORADB_COMPUTE_DECODER_DECODE_BENCH_TOOLS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace loradb::decoder {

struct DecodeBenchRun {
  int64_t decode_tokens = 0;
  double decode_seconds = 0;   // decode steps only (after every prompt was prefilled)
  double prefill_seconds = 0;  // first steps: prefill, incl. cold adapter loads into the tiers
  double merge_seconds = 0;    // merge path: copying the base and merging adapters
  double decode_tokens_per_s() const {
    return decode_seconds > 0 ? static_cast<double>(decode_tokens) / decode_seconds : 0;
  }
  // Tokens per second including merge time (the merge path's real cost).
  double end_to_end_tokens_per_s() const {
    const double t = decode_seconds + merge_seconds;
    return t > 0 ? static_cast<double>(decode_tokens) / t : 0;
  }
  int64_t steps = 0;
  int64_t deferrals = 0;
  int64_t adapter_builds = 0;
};

// One pass of x @ W^T over every weight matrix a decode step reads (each layer's projections
// and the LM head), timed through model::BaseLinear (the dense kernel in inference; in training,
// the GEMM forward and its dx backward) and LibTorch's at::linear.
struct BaseLinearTiming {
  int64_t rows = 0;
  bool training = false;
  int64_t matrices = 0;
  uint64_t weight_bytes = 0;
  double dense_seconds = 0;  // median over the rounds
  double blas_seconds = 0;   // median over the rounds
  double max_rel_diff = 0;   // largest |ours - blas| / max |blas| over matrices, outputs and dx
};

class DecodeBenchHarness {
 public:
  // Writes a random checkpoint for `config_path` into `work_dir`/model, creates a store in
  // `work_dir`/store and publishes `max_adapters` random rank-`rank` adapters (every
  // q/k/v/o/gate/up/down, fp32), plus two PEFT adapters with the same modules that use features
  // beyond plain LoRA: `kDoraAdapter` (DoRA magnitudes on every module) and `kLmHeadAdapter`
  // (modules_to_save = ["lm_head"]: its own full LM head). `lora_threads`: threads of the kernels'
  // CPU context (decode calls are small: one thread avoids wake-ups on a loaded machine).
  // `torch_threads` > 0 sets LibTorch's intra-op threads for the process (0 leaves LibTorch's
  // default).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DecodeBenchHarness>> Create(
      const std::string& config_path, const std::string& work_dir, int64_t max_adapters,
      int64_t rank, int lora_threads = 1, int torch_threads = 0);
  ~DecodeBenchHarness();

  int64_t num_parameters() const;
  uint64_t adapter_bytes() const;

  static constexpr const char* kDoraAdapter = "dora:prod";
  static constexpr const char* kLmHeadAdapter = "lm_head_mts:prod";

  // `batch` requests with random `prompt_len`-token prompts, greedy, `steps` decode steps after
  // the prefill; request i uses adapter i % distinct (distinct 0: base only), except that request
  // 0 uses `first_adapter` when it is not empty (one row of such an adapter in a batch).
  [[nodiscard]] absl::StatusOr<DecodeBenchRun> RunDecoder(int64_t batch, int64_t distinct,
                                                          int64_t prompt_len, int64_t steps,
                                                          const std::string& first_adapter = "");
  // The base's linear layers on `rows` random input rows, BaseLinear and at::linear in
  // alternation, `rounds` times each (after one untimed pass of both). `training`: the inputs
  // require grad and a pass is forward plus the backward to the inputs (a LoRA step on the frozen
  // base); otherwise forward under inference mode (a decode step).
  [[nodiscard]] absl::StatusOr<BaseLinearTiming> TimeBaseLinears(int64_t rows, int rounds,
                                                                 bool training = false);
  // The same requests served by the merge path, grouped per adapter.
  [[nodiscard]] absl::StatusOr<DecodeBenchRun> RunMerged(int64_t batch, int64_t distinct,
                                                         int64_t prompt_len, int64_t steps);

 private:
  struct State;
  explicit DecodeBenchHarness(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace loradb::decoder

#endif  // LORADB_COMPUTE_DECODER_DECODE_BENCH_TOOLS_H_

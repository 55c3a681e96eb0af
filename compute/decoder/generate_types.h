// LibTorch-free types of decoder results, shared by compute/decoder (decoder.h) and the serving
// layer's LibTorch-free header (compute/serving/completion_service.h).
#ifndef LORADB_COMPUTE_DECODER_GENERATE_TYPES_H_
#define LORADB_COMPUTE_DECODER_GENERATE_TYPES_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace loradb::decoder {

// Why a request ended: max tokens reached, a stop token or stop hook, an error (with its
// status beside it), or a cancel.
enum class FinishReason { kLength, kStop, kError, kCancelled };
// "length", "stop", "error", "cancelled".
const char* FinishReasonName(FinishReason reason);

// Log-probabilities of one position: log-softmax of the model's fp32 logits at that position,
// unscaled (before temperature, top-k and top-p; what vLLM reports by default), computed from the
// same logits row the sampler draws from.
struct TokenLogprob {
  int64_t token = 0;  // the token at this position (sampled, or the prompt's)
  float logprob = 0;  // its log-probability
  // The request's `logprobs` most likely tokens (token, log-prob), most likely first (ties:
  // lower token id first).
  std::vector<std::pair<int64_t, float>> top;
};

}  // namespace loradb::decoder

#endif  // LORADB_COMPUTE_DECODER_GENERATE_TYPES_H_

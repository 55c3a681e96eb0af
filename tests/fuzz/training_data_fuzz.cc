// libFuzzer target for `loradb train --data` files (tools/dev fuzz training_data SECONDS):
// dataset::ParseTrainingData over arbitrary bytes, with a stand-in tokenizer (one id per byte).
// Whatever the bytes it returns a status without crashing; what it accepts satisfies the
// contract the trainer relies on: ids inside the vocabulary, SFT weights one per token with
// weights[0] == 0 and a weighted target, non-empty DPO prompts and completions and GRPO prompts,
// one kind for the whole file.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "storage/formats/training_data.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

constexpr int64_t kVocab = 300;

bool InVocab(const std::vector<int64_t>& ids) {
  for (int64_t id : ids) {
    if (id < 0 || id >= kVocab) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  loradb::dataset::ParseOptions o;
  o.vocab_size = kVocab;
  // Byte b -> id b, except 0xff -> 299 (so the fuzzer can also reach in-vocabulary edge ids).
  o.tokenize = [](const std::string& t) -> absl::StatusOr<std::vector<int64_t>> {
    std::vector<int64_t> ids;
    for (unsigned char c : t) ids.push_back(c == 0xff ? kVocab - 1 : c);
    return ids;
  };
  o.max_errors = 5;
  absl::StatusOr<loradb::dataset::Dataset> d = loradb::dataset::ParseTrainingData(text, "f", o);
  if (!d.ok()) {
    Check(d.status().message().substr(0, 3) == "f: ");
    return 0;
  }
  Check(!d->examples.empty());
  for (const loradb::dataset::Example& ex : d->examples) {
    Check(ex.kind == d->kind && ex.line >= 1);
    switch (ex.kind) {
      case loradb::dataset::Kind::kSft: {
        Check(ex.tokens.size() >= 2 && ex.weights.size() == ex.tokens.size());
        Check(InVocab(ex.tokens) && ex.weights[0] == 0);
        bool target = false;
        for (float w : ex.weights) {
          Check(std::isfinite(w) && w >= 0);
          target = target || w > 0;
        }
        Check(target);
        break;
      }
      case loradb::dataset::Kind::kDpo:
        Check(!ex.prompt.empty() && !ex.chosen.empty() && !ex.rejected.empty());
        Check(InVocab(ex.prompt) && InVocab(ex.chosen) && InVocab(ex.rejected));
        break;
      case loradb::dataset::Kind::kGrpo:
        Check(!ex.prompt.empty() && InVocab(ex.prompt) && !ex.source.empty());
        break;
    }
  }
  return 0;
}

// Scenario `tokenizer`: encode throughput of text/tokenizer.h beside Hugging Face `tokenizers`
// (Python) on the same tokenizer.json and texts. A python3 subprocess trains a byte-level BPE with
// Qwen3's layout (NFC, Qwen's split regex, ByteLevel) on a generated multilingual corpus, writes
// it and a set of test texts, and times tokenizers' `encode_batch` on one thread
// (RAYON_NUM_THREADS=1) and a Python loop of `encode`. loradb encodes the same texts on one
// thread; both report the best of --reps passes over all texts (BPE caches warm after the first).
// The token totals must agree, or the scenario fails.
//
//   loradb-bench tokenizer [--vocab N] [--texts N] [--reps N]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"
#include "text/tokenizer.h"

namespace loradb::bench {
namespace {

constexpr char kBench[] = "tokenizer";

// argv: DIR VOCAB TEXTS REPS. Writes DIR/tokenizer.json and DIR/texts.jsonl; prints one JSON
// object with the reference's timings.
constexpr char kScript[] = R"PY(
import json, os, random, sys, time
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
d, vocab, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(7)
words = ("the of and to in is that for it with as was on be by this are from at or have an "
         "they which one you were her all she there would their we him been has when who will "
         "it's don't I'm We've THEY'LL model token adapter serving batch decode train loss "
         "déjà naïve Straße привет мир Καλημέρα שלום مرحبا नमस्ते 你好 世界 こんにちは 안녕하세요").split()
code = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {", "}\n", "  ", "\t",
        "x = [1, 2, 3]", "\n\n", "// comment", "import numpy as np", "if a == b:"]
def text():
    parts = []
    for _ in range(rng.randint(20, 200)):
        r = rng.random()
        if r < 0.75: parts.append(rng.choice(words))
        elif r < 0.85: parts.append(str(rng.randint(0, 10**rng.randint(1, 7))))
        elif r < 0.93: parts.append(rng.choice(code))
        else: parts.append(rng.choice([".", ",", "!", "?", ";", ":", "(", ")", "'", "\"", "😀"]))
        parts.append(rng.choice([" ", " ", " ", "\n", ""]))
    return "".join(parts)
train = [text() for _ in range(4000)]
texts = [text() for _ in range(n)]
tok = Tokenizer(models.BPE())
tok.normalizer = normalizers.NFC()
pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
       r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(train, trainers.BpeTrainer(
    vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(os.path.join(d, "tokenizer.json"))
with open(os.path.join(d, "texts.jsonl"), "w", encoding="utf-8") as f:
    for t in texts: f.write(json.dumps(t, ensure_ascii=False) + "\n")
tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
batch, loop, tokens = [], [], 0
for _ in range(reps):
    t0 = time.perf_counter(); enc = tok.encode_batch(texts); batch.append(time.perf_counter() - t0)
    tokens = sum(len(e.ids) for e in enc)
    t0 = time.perf_counter()
    for t in texts: tok.encode(t)
    loop.append(time.perf_counter() - t0)
print(json.dumps({"tokens": tokens, "batch_s": min(batch), "loop_s": min(loop),
                  "bytes": sum(len(t.encode()) for t in texts),
                  "vocab": tok.get_vocab_size()}))
)PY";

struct Options {
  int vocab = 8000;
  int texts = 20000;
  int reps = 3;
};

absl::StatusOr<Options> ParseArgs(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    int* target = args[i] == "--vocab"   ? &o.vocab
                  : args[i] == "--texts" ? &o.texts
                  : args[i] == "--reps"  ? &o.reps
                                         : nullptr;
    if (target == nullptr) return absl::InvalidArgumentError("unknown argument " + args[i]);
    if (i + 1 >= args.size() || !absl::SimpleAtoi(args[i + 1], target) || *target <= 0) {
      return absl::InvalidArgumentError(args[i] + " needs a positive number");
    }
    ++i;
  }
  return o;
}

absl::StatusOr<nlohmann::json> RunReference(const std::string& dir, const Options& o) {
  const std::string script = dir + "/reference.py";
  LORADB_RETURN_IF_ERROR(WriteFileAtomic(script, kScript));
  const std::string cmd = absl::StrCat("RAYON_NUM_THREADS=1 python3 ", script, " ", dir, " ",
                                       o.vocab, " ", o.texts, " ", o.reps);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("cannot start python3");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  if (::pclose(pipe) != 0) {
    return absl::FailedPreconditionError(
        "python3 with the tokenizers package failed (is `tokenizers` installed?)");
  }
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded()) return absl::InternalError("bad output from the reference: " + out);
  return j;
}

absl::Status Run(const std::vector<std::string>& args) {
  LORADB_ASSIGN_OR_RETURN(Options o, ParseArgs(args));
  std::string tmpl = (std::filesystem::temp_directory_path() / "loradb-bench-tok-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};

  Progress(absl::StrCat("tokenizer: training a ", o.vocab, "-token BPE and timing tokenizers on ",
                        o.texts, " texts"));
  LORADB_ASSIGN_OR_RETURN(nlohmann::json ref, RunReference(dir, o));

  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<text::Tokenizer> tok,
                          text::Tokenizer::Load(dir + "/tokenizer.json"));
  std::vector<std::string> texts;
  {
    std::ifstream in(dir + "/texts.jsonl");
    std::string line;
    while (std::getline(in, line)) texts.push_back(nlohmann::json::parse(line).get<std::string>());
  }
  double best = 0;
  size_t tokens = 0;
  for (int rep = 0; rep < o.reps; ++rep) {
    tokens = 0;
    const double t0 = NowSeconds();
    for (const std::string& t : texts) {
      LORADB_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(t));
      tokens += ids.size();
    }
    const double s = NowSeconds() - t0;
    best = rep == 0 ? s : std::min(best, s);
  }
  if (tokens != ref["tokens"].get<size_t>()) {
    return absl::InternalError(absl::StrCat("token totals differ: loradb ", tokens, ", tokenizers ",
                                            ref["tokens"].dump()));
  }
  const double ours = static_cast<double>(tokens) / best;
  const double batch = static_cast<double>(tokens) / ref["batch_s"].get<double>();
  const double loop = static_cast<double>(tokens) / ref["loop_s"].get<double>();
  Emit({{"bench", kBench},
        {"case", "encode"},
        {"vocab", ref["vocab"]},
        {"texts", texts.size()},
        {"bytes", ref["bytes"]},
        {"tokens", tokens},
        {"loradb_tokens_per_s", ours},
        {"tokenizers_batch_1thread_tokens_per_s", batch},
        {"tokenizers_encode_loop_tokens_per_s", loop},
        {"ratio_vs_batch_1thread", ours / batch},
        {"ratio_vs_encode_loop", ours / loop}});
  EmitGoal(kBench, "encode_vs_tokenizers_1thread", ours / batch,
           ">= 1 (loradb one thread vs tokenizers encode_batch on one thread)", ours / batch >= 1);
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO({kBench,
                          "tokenizer.json encode throughput beside Hugging Face tokenizers (one "
                          "thread each, same file and texts)",
                          Run,
                          {"--texts", "5000", "--reps", "2"}});

}  // namespace
}  // namespace loradb::bench

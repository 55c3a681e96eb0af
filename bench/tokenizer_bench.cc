// Scenario `tokenizer`: encode throughput of text/tokenizer.h beside Hugging Face `tokenizers`
// (Python) on the same tokenizer.json and texts. A python3 subprocess trains a tokenizer of the
// --kind asked (qwen: byte-level BPE with Qwen3's layout, NFC + Qwen's split regex + ByteLevel;
// or a model family's kind from tests/python/tokenizer_families.py: llama3, mistral, phi3, gemma,
// ...) on a generated multilingual corpus, writes it and a set of test texts, and times
// tokenizers' `encode_batch` on one thread
// (RAYON_NUM_THREADS=1) and a Python loop of `encode`. loradb encodes the same texts on one
// thread; both report the best of --reps passes over all texts (BPE caches warm after the first).
// The token totals must agree, or the scenario fails.
//
//   loradb-bench tokenizer [--kind K] [--vocab N] [--texts N] [--reps N]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"
#include "text/tokenizer.h"

namespace loradb::bench {
namespace {

constexpr char kBench[] = "tokenizer";

struct Options {
  std::string kind = "qwen";
  int vocab = 8000;
  int texts = 20000;
  int reps = 3;
};

absl::StatusOr<Options> ParseArgs(const std::vector<std::string>& args) {
  Options o;
  CLI::App app("tokenizer: loradb's tokenizer beside Hugging Face tokenizers", "tokenizer");
  app.add_option("--kind", o.kind,
                 "qwen, or a family of tests/python/tokenizer_families.py (llama3, mistral, phi3, "
                 "gemma, ...)")
      ->check(CLI::IsMember({"qwen", "llama3", "nemo", "mistral", "mistral-v3", "phi3", "gemma",
                             "spm-eos", "spm-unk", "metaspace"}));
  app.add_option("--vocab", o.vocab, "vocabulary of the trained tokenizer")
      ->check(CLI::PositiveNumber);
  app.add_option("--texts", o.texts, "texts encoded")->check(CLI::PositiveNumber);
  app.add_option("--reps", o.reps, "repetitions (the best is kept)")->check(CLI::PositiveNumber);
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  return o;
}

absl::StatusOr<nlohmann::json> RunReference(const std::string& dir, const Options& o) {
  const std::string script = absl::StrCat(SourceDir(), "/bench/tokenizer_reference.py");
  const std::string cmd = absl::StrCat("RAYON_NUM_THREADS=1 python3 '", script, "' '", dir, "' ",
                                       o.vocab, " ", o.texts, " ", o.reps, " '", o.kind, "'");
  LORADB_ASSIGN_OR_RETURN(JsonCommandResult r, RunJsonCommand(cmd, "tokens"));
  if (r.exit_status != 0) {
    return absl::FailedPreconditionError(
        "python3 with the tokenizers package failed (is `tokenizers` installed?)");
  }
  if (r.last_object.is_null()) return absl::InternalError(cmd + " printed no measurement");
  return r.last_object;
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
        {"kind", o.kind},
        {"vocab", ref["vocab"]},
        {"texts", texts.size()},
        {"bytes", ref["bytes"]},
        {"tokens", tokens},
        {"loradb_tokens_per_s", ours},
        {"tokenizers_batch_1thread_tokens_per_s", batch},
        {"tokenizers_encode_loop_tokens_per_s", loop},
        {"ratio_vs_batch_1thread", ours / batch},
        {"ratio_vs_encode_loop", ours / loop}});
  EmitGoal(kBench,
           o.kind == "qwen" ? std::string("encode_vs_tokenizers_1thread")
                            : absl::StrCat("encode_vs_tokenizers_1thread_", o.kind),
           ours / batch, ">= 1 (loradb one thread vs tokenizers encode_batch on one thread)",
           ours / batch >= 1);
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO({kBench,
                          "tokenizer.json encode throughput beside Hugging Face tokenizers (one "
                          "thread each, same file and texts)",
                          Run,
                          {"--texts", "5000", "--reps", "2"}});

}  // namespace
}  // namespace loradb::bench

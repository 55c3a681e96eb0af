// Text <-> token ids for a base model, read from the Hugging Face `tokenizer.json` in its
// directory, producing the same ids and the same decoded text as the `tokenizers` package.
//
// Supported: byte-level BPE (GPT-2, Llama 3, Qwen2/Qwen3, Mistral Nemo) and SentencePiece-style
// BPE over characters with byte fallback (Llama 2, Mistral, Phi-3, Gemma 2/3):
//   model          BPE (vocab; merges as "a b" strings or ["a", "b"] pairs; unk_token, fuse_unk,
//                  byte_fallback, ignore_merges; dropout null or 0)
//   normalizer     null, NFC, Prepend, Replace (String or Regex pattern), or a Sequence of those
//   pre_tokenizer  null, Split (Regex or String pattern, every behavior, invert), Metaspace, and a
//                  ByteLevel step last (add_prefix_space false; use_regex true adds GPT-2's
//                  split), alone or in a Sequence; with ByteLevel, pieces are BPE'd over GPT-2's
//                  byte alphabet, without it over their characters
//   post_processor null, ByteLevel (adds no tokens), TemplateProcessing (its `single` template
//                  adds tokens when Encode is asked to add special tokens), or a Sequence of those
//   decoder        ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, or a Sequence of those
//   added_tokens   special or not, normalized or not, lstrip / rstrip; matched leftmost-longest
//                  before the pre-tokenizer, as tokenizers does
// Anything else (another model, normalizer, pre-tokenizer, post-processor or decoder; no decoder;
// truncation or padding; single_word added tokens; unknown keys) is refused at load with an error
// naming it, never tokenized differently.
//
// This folder (text/, the `loradb_text` library) depends on Abseil, PCRE2 and utf8proc only: no
// LibTorch and nothing of loradb's beyond the status macros, so tools/, api/ and compute/ can all
// use it. It sits beside kernels/ in DESIGN.md's dependency order.
#ifndef LORADB_TEXT_TOKENIZER_H_
#define LORADB_TEXT_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "text/bpe.h"
#include "text/pipeline.h"
#include "text/split_regex.h"

namespace loradb::text {

// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
};

class Tokenizer {
 public:
  // Reads `path`: a tokenizer.json file, or a directory holding one. Errors: NotFound when there
  // is no such file; InvalidArgument naming the file and what is malformed or unsupported.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  // Builds a tokenizer from the text of a tokenizer.json; `origin` names it in errors.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      absl::string_view json, absl::string_view origin);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`: what tokenizers' `encode(text, add_special_tokens=...).ids` gives.
  // Special tokens written in the text become their ids; `add_special_tokens` adds those of the
  // post-processor's template (e.g. Llama's BOS). InvalidArgument when `text` is not valid UTF-8;
  // Internal if PCRE2 gives up on a regex. Thread-safe. Merging an n-symbol piece costs
  // O(n log n), so a long run of one character stays cheap.
  [[nodiscard]] absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                                            bool add_special_tokens) const;
  // Encode(text, /*add_special_tokens=*/true): tokenizers' default.
  [[nodiscard]] absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const {
    return Encode(text, true);
  }

  // Text of `ids` (what tokenizers' `decode(ids, skip_special_tokens)` gives: byte sequences that
  // do not form valid UTF-8, e.g. a multi-byte character cut between ids, become U+FFFD).
  // InvalidArgument naming an id outside the vocabulary (tokenizers drops those silently).
  [[nodiscard]] absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                                   bool skip_special_tokens) const;

  // One more than the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const { return static_cast<int32_t>(id_token_.size()); }

  // The id of token string `token` (added tokens first, then the model's vocabulary).
  std::optional<int32_t> TokenToId(absl::string_view token) const;

  // The token string of `id`, or nullopt for an id with no token.
  std::optional<std::string> IdToToken(int32_t id) const;

  // True when `id` is an added token marked special (skipped by Decode(.., true)).
  bool IsSpecial(int32_t id) const;

  // The ids the post-processor puts before and after the text when Encode adds special tokens.
  const Template& special_template() const { return template_; }

  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  class Loader;
  Tokenizer();

  struct Segment {
    size_t begin, end;
    int32_t added_id;  // -1: text to tokenize
  };
  // Leftmost-longest matches of the added tokens `which` (normalized or not) in `text`, with
  // their lstrip/rstrip applied; the segments cover `text`.
  void SplitAddedTokens(absl::string_view text, bool normalized_set,
                        std::vector<Segment>* out) const;
  // Appends the ids of normalized text `text` (pre-tokenizer + model) to `ids`; `first` when it
  // starts where the encoded text starts.
  absl::Status EncodeNormalized(absl::string_view text, bool first,
                                std::vector<int32_t>* ids) const;
  // Appends the BPE ids of one pre-tokenized piece to `ids`: over its bytes' byte-level
  // characters with a ByteLevel pre-tokenizer, else over its characters.
  void EncodePiece(absl::string_view piece, std::vector<int32_t>* ids) const;
  // The initial BPE symbols of `piece` (before merges).
  void ByteLevelSymbols(absl::string_view piece, std::vector<int32_t>* word) const;
  void CharSymbols(absl::string_view piece, std::vector<int32_t>* word) const;

  // Model.
  absl::flat_hash_map<std::string, int32_t> vocab_;  // byte-level token string -> id
  MergeTable merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  std::array<int32_t, 256> byte_fallback_id_;  // the id of "<0xXX>" per byte, or -1
  // What each byte contributes before merges: its byte-level character's id, else its byte
  // fallback ids (one per UTF-8 byte of that character), else nothing (unk or dropped).
  std::vector<std::vector<int32_t>> byte_symbols_;
  std::vector<bool> byte_in_vocab_;

  // Normalizer, pre-tokenizer (its steps, and whether it ends with ByteLevel), post-processor.
  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_steps_;
  bool byte_level_ = false;
  bool pre_tokenizer_rewrites_ = false;  // a Metaspace step rewrites the text
  Template template_;

  // Added tokens, and a byte trie over each set (non-normalized, normalized) for matching.
  std::vector<AddedToken> added_;
  absl::flat_hash_map<std::string, int32_t> added_by_content_;
  struct Trie {
    // Edge (node << 8 | byte) -> child node; node 0 is the root.
    absl::flat_hash_map<uint64_t, int32_t> edges;
    // Per node: index into added_ of the token ending here, or -1.
    std::vector<int32_t> terminal{-1};
    void Insert(absl::string_view key, int32_t token_index);
  };
  Trie trie_[2];  // [0]: non-normalized tokens, [1]: normalized (matched after NFC)

  // Decoding: the decoder's steps; with ByteLevel alone, each id's bytes after it (id_bytes_);
  // whether the id names a token, and whether it is special.
  std::vector<DecoderStep> decoder_;
  bool byte_level_decoder_only_ = false;
  std::vector<std::string> id_bytes_;
  std::vector<std::string> id_token_;
  std::vector<bool> id_present_;
  std::vector<bool> id_special_;

  // Per-piece cache of BPE results (pieces up to kMaxCachedPiece bytes); cleared when full.
  static constexpr size_t kMaxCachedPiece = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 16;
  mutable std::mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;  // guarded by cache_mu_
};

// Incremental decoding for streamed output, as tokenizers' `decoders.DecodeStream`: Step() takes
// one more id and returns the text it completes, or nullopt while the ids so far end inside a
// multi-byte character (their decoding ends in U+FFFD) or add no text.
class DecodeStream {
 public:
  // `tokenizer` must outlive this object.
  DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

  // Errors: those of Tokenizer::Decode (an id outside the vocabulary); FailedPrecondition when the
  // text decoded so far no longer starts with what was already returned (tokenizers raises
  // "Invalid prefix" there too: byte-fallback tokens that decoded alone as a character become
  // U+FFFDs once bytes follow that do not complete it). The stream is not usable after an error.
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> Step(int32_t id);

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  std::string prefix_;
  size_t prefix_index_ = 0;
};

}  // namespace loradb::text

#endif  // LORADB_TEXT_TOKENIZER_H_

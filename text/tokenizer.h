// Text <-> token ids for a base model, read from the Hugging Face `tokenizer.json` in its
// directory, producing the same ids and the same decoded text as the `tokenizers` package.
//
// Supported (what Qwen2/Qwen3 and GPT-2-style byte-level BPE tokenizers use):
//   model          BPE (vocab; merges as "a b" strings or ["a", "b"] pairs; unk_token, fuse_unk,
//                  byte_fallback, ignore_merges; dropout null or 0)
//   normalizer     null, NFC, or a Sequence of those
//   pre_tokenizer  Split (Regex or String pattern, behavior Isolated, invert false) steps followed
//                  by ByteLevel (add_prefix_space false; use_regex true adds GPT-2's split), in a
//                  Sequence or ByteLevel alone
//   post_processor null or ByteLevel (which adds no tokens)
//   decoder        ByteLevel
//   added_tokens   special or not, normalized or not, lstrip / rstrip; matched leftmost-longest
//                  before the pre-tokenizer, as tokenizers does
// Anything else (another model, normalizer, pre-tokenizer or decoder; a post-processor that adds
// tokens; truncation or padding; single_word added tokens; unknown keys) is refused at load with
// an error naming it, never tokenized differently.
//
// This folder (text/, the `loradb_text` library) depends on Abseil, PCRE2 and utf8proc only: no
// LibTorch and nothing of loradb's beyond the status macros, so tools/, api/ and compute/ can all
// use it. It sits beside kernels/ in DESIGN.md's dependency order.
#ifndef LORADB_TEXT_TOKENIZER_H_
#define LORADB_TEXT_TOKENIZER_H_

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

  // Token ids of `text` (what tokenizers' `encode(text).ids` gives; special tokens written in the
  // text become their ids). InvalidArgument when `text` is not valid UTF-8; Internal if PCRE2
  // gives up on the split regex. Thread-safe. Merging an n-byte piece costs O(n log n), so a long
  // run of one character stays cheap.
  [[nodiscard]] absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;

  // Text of `ids` (what tokenizers' `decode(ids, skip_special_tokens)` gives: byte sequences that
  // do not form valid UTF-8, e.g. a multi-byte character cut between ids, become U+FFFD).
  // InvalidArgument naming an id outside the vocabulary (tokenizers drops those silently).
  [[nodiscard]] absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                                   bool skip_special_tokens) const;

  // One more than the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const { return static_cast<int32_t>(id_bytes_.size()); }

  // The id of token string `token` (added tokens first, then the model's vocabulary).
  std::optional<int32_t> TokenToId(absl::string_view token) const;

  // The token string of `id`, or nullopt for an id with no token.
  std::optional<std::string> IdToToken(int32_t id) const;

  // True when `id` is an added token marked special (skipped by Decode(.., true)).
  bool IsSpecial(int32_t id) const;

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
  // Appends the ids of normalized text `text` (pre-tokenizer + model) to `ids`.
  absl::Status EncodeNormalized(absl::string_view text, std::vector<int32_t>* ids) const;
  // Appends the BPE ids of one pre-tokenized piece (its original bytes) to `ids`.
  void EncodePiece(absl::string_view piece, std::vector<int32_t>* ids) const;

  // Model.
  absl::flat_hash_map<std::string, int32_t> vocab_;  // byte-level token string -> id
  MergeTable merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  // What each byte contributes before merges: its byte-level character's id, else its byte
  // fallback ids (one per UTF-8 byte of that character), else nothing (unk or dropped).
  std::vector<std::vector<int32_t>> byte_symbols_;
  std::vector<bool> byte_in_vocab_;

  // Normalizer and pre-tokenizer.
  bool nfc_ = false;
  std::vector<std::unique_ptr<SplitRegex>> splits_;

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

  // Decoding: each id's bytes after the ByteLevel decoder, whether the id names a token, and
  // whether it is special.
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

  // Errors: those of Tokenizer::Decode (an id outside the vocabulary).
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

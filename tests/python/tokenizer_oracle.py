#!/usr/bin/env python3
# loradb-test: args=loradb_cli timeout=900
"""Oracle test: loradb's tokenizer (text/tokenizer.h, driven through `loradb tokenize`) against
the Hugging Face `tokenizers` package.

usage: tokenizer_oracle.py LORADB_CLI

Tokenizers are trained here with `tokenizers` on a generated multilingual corpus (no downloads):
  qwen      Qwen3's layout: NFC, Split(Qwen's regex, Isolated) + ByteLevel(use_regex=false),
            ByteLevel decoder and post-processor; special tokens, non-special added tokens (not
            normalized, as Qwen ships them), one normalized added token, one lstrip/rstrip token
  qwen-str  the same file with merges written as "a b" strings (older tokenizers versions)
  qwen-im   the same with ignore_merges=true
  gpt2      GPT-2's layout: no normalizer, ByteLevel(use_regex=true)
  fallback  qwen with three byte characters taken out of the vocabulary: one reachable through
            byte_fallback tokens, two becoming the unknown token (fuse_unk off and on)
and the model families' kinds of tokenizers.json (tokenizer_families.py: llama3, nemo, mistral,
mistral-v3, phi3, gemma and variants: byte-level BPE with a TemplateProcessing post-processor,
SentencePiece-style BPE with byte fallback, Prepend/Replace normalizers, Metaspace and Split
pre-tokenizers, Replace/ByteFallback/Fuse/Strip/Metaspace decoders).
For each, a few thousand varied strings (scripts, emoji and ZWJ sequences, combining marks that NFC
composes, whitespace runs, leading/trailing/multiple spaces, CR/LF mixes, numbers, code,
contractions in both cases, added tokens in and next to text, long runs, the empty string) must
encode to the same ids, with and without the post-processor's special tokens
(add_special_tokens); the ids, random id sequences and cut sequences (partial UTF-8) must decode
to the same text with skip_special_tokens true and false, and streaming decoding
(decoders.DecodeStream) must emit the same chunks.
LORADB_SLOW_TESTS=1 multiplies the string count by 10. Exit status 77 (skipped) without
`tokenizers`.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

import tokenizer_families  # noqa: E402  (beside this file)

CLI = sys.argv[1]
SLOW = os.environ.get("LORADB_SLOW_TESTS") == "1"
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    if len(FAILURES) <= 30:
        print("FAIL:", msg)


# ---------------------------------------------------------------------------------------------
# Text generation
# ---------------------------------------------------------------------------------------------
WORDS = {
    "en": "the quick brown fox jumps over lazy dog tokenizer model adapter serving batch "
          "Hello World THE Quick it's don't I'm we've you'll she'd they're IT'S DON'T WE'VE "
          "You'LL She'D THEY'RE o'clock rock'n'roll".split(),
    "fr": "déjà vu où être garçon naïve cœur élève Noël français".split(),
    "de": "Straße Größe Übermut fünf Äpfel schön".split(),
    "ru": "привет мир Москва ёжик съешь ещё этих мягких".split(),
    "el": "Καλημέρα κόσμε ψυχή ΑΘΗΝΑ".split(),
    "he": "שלום עולם תודה".split(),
    "ar": "مرحبا بالعالم شكرا جزيلا ١٢٣".split(),
    "hi": "नमस्ते दुनिया हिन्दी भाषा".split(),
    "th": "สวัสดีครับ ภาษาไทย".split(),
    "zh": "你好世界 分词器 模型 训练 数据库 中华人民共和国".split(),
    "ja": "こんにちは 世界 カタカナ ひらがな 東京タワー".split(),
    "ko": "안녕하세요 세계 한국어 토크나이저".split(),
}
EMOJI = ["😀", "👍", "👍🏽", "🇯🇵", "🇺🇸", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "1️⃣", "🧑🏿‍💻", "✨",
         "🎉🎉🎉", "©", "™", "☃"]
# Decomposed sequences that NFC composes (e + acute, A + ring, Hangul jamo, ...), and one that
# stays decomposed (q + acute).
COMBINING = ["e\u0301", "A\u030a", "o\u0308", "n\u0303", "\u1100\u1161", "\u1112\u1161\u11ab",
             "c\u0327a", "q\u0301", "\u0915\u093c", "a\u0301\u0302", "\u03b9\u0308\u0301"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n ", "\n \n", " \t\n",
          "\u00a0", "\u3000", "\u2009", "\u2028", "\u0085", "\x0b", "\x0c", "\u200b", "\u180e",
          " " * 9, "\n" * 5, "\r\n\r\n", "\t \t"]
NUMBERS = ["0", "7", "42", "123456", "3.14159", "1,000,000", "-17", "1e10", "2024-06-01",
           "０１２", "²³", "½", "Ⅻ", "٣٤٥", "१२३", "0x1F"]
CODE = ["def f(x):\n    return x ** 2\n", "if (a && b) { c++; }", "for i in range(10):",
        "#include <stdio.h>", "x = {'k': [1, 2, 3]}", "SELECT * FROM t WHERE id=1;",
        "fn main() -> Result<(), E> {}", "a->b", "i++;", "/* comment */", "    indented",
        "\tret = self._cache.get(key, None)", "!==", "...", "$$", "``` python"]
PUNCT = [".", ",", "!", "?", ":", ";", "'", "\"", "(", ")", "[", "]", "-", "—", "…", "«»", "¿",
         "'s", "'S", "'ſ", "'LL", "'Re", "'vE", "'M", "'d", "' s"]
SPECIAL_IN_TEXT = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
                   "<|im_start|>user\n", "<|im_sta", "<|im_end|", "<think", "<<think>>",
                   "Ma\u0301rk!", "Márk!", " <lsr> ", "<lsr>", "\t<lsr>\n"]
RANGES = [(0x20, 0x7e), (0xa1, 0x17f), (0x370, 0x3ff), (0x400, 0x4ff), (0x5d0, 0x5ea),
          (0x620, 0x64a), (0x900, 0x97f), (0xe01, 0xe5b), (0x3041, 0x3096), (0x30a1, 0x30fa),
          (0x4e00, 0x9fa5), (0xac00, 0xd7a3), (0x2000, 0x206f), (0x2190, 0x22ff),
          (0x2500, 0x257f), (0x1f300, 0x1f64f), (0x300, 0x36f), (0x0, 0x1f)]


def random_chars(rng):
    lo, hi = rng.choice(RANGES)
    return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6)))


# (weight, source of one fragment)
FRAGMENTS = [(35, lambda rng: rng.choice(WORDS[rng.choice(list(WORDS))])),
             (10, lambda rng: rng.choice(SPACES)),
             (8, lambda rng: rng.choice(NUMBERS)),
             (8, lambda rng: rng.choice(PUNCT)),
             (7, lambda rng: rng.choice(EMOJI)),
             (7, lambda rng: rng.choice(COMBINING)),
             (6, lambda rng: rng.choice(CODE)),
             (5, lambda rng: rng.choice(SPECIAL_IN_TEXT)),
             (14, random_chars)]


def fragment(rng):
    source = rng.choices([f for _, f in FRAGMENTS], weights=[w for w, _ in FRAGMENTS])[0]
    return source(rng)


def sentence(rng, max_fragments=24):
    parts = []
    for _ in range(rng.randint(1, max_fragments)):
        parts.append(fragment(rng))
        if rng.random() < 0.6:
            parts.append(" ")
    return "".join(parts)


def corpus(rng, n):
    out = []
    for _ in range(n):
        s = sentence(rng)
        for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
                      "<lsr>", "Márk!"):
            s = s.replace(token, " ")
        # Bytes 1..3 never occur in training, so the fallback variant can take them out.
        out.append(s.translate({1: None, 2: None, 3: None}))
    return out


def test_strings(rng, n):
    strings = ["", " ", "a", "\n", "\r\n", "  \n\n  ", "'s", "'S", "DON'T", "don't",
               "<|im_start|>", "<|im_start|><|im_end|>", "<think></think>", "<|im_start",
               "a" * 5000, " " * 3000, "\n" * 1000, " \n" * 500, "1" * 2000, "!" * 2000,
               "é" * 1000, "e\u0301" * 500, "😀" * 500, "ab " * 2000, "\t" * 700 + "x",
               " " * 100 + "word", "word" + " " * 100, "\r" * 50 + "\n" * 50]
    while len(strings) < n:
        strings.append(sentence(rng, max_fragments=rng.choice([3, 10, 40])))
    return strings


# ---------------------------------------------------------------------------------------------
# Tokenizers under test
# ---------------------------------------------------------------------------------------------
def train_qwen(texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True, normalized=False),
                            AddedToken("<|im_end|>", special=True, normalized=False),
                            AddedToken("<lsr>", special=True, normalized=False, lstrip=True,
                                       rstrip=True)])
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False),
                    AddedToken("Márk!", special=False, normalized=True)])
    return json.loads(tok.to_str())


def train_gpt2(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return json.loads(tok.to_str())


def fallback_variant(qwen, fuse_unk):
    """Byte 0x01's character replaced by byte-fallback tokens, 0x02's and 0x03's made unknown."""
    j = json.loads(json.dumps(qwen))
    vocab = j["model"]["vocab"]
    byte_char = {b: c for b, c in zip(range(256), byte_alphabet())}
    # 0x01 -> U+0101 (UTF-8 C4 81): its entry becomes "<0xC4>", 0x02's "<0x81>", 0x03's "<unk>".
    for b, new in ((1, "<0xC4>"), (2, "<0x81>"), (3, "<unk>")):
        vocab[new] = vocab.pop(byte_char[b])
    j["model"]["byte_fallback"] = True
    j["model"]["unk_token"] = "<unk>"
    j["model"]["fuse_unk"] = fuse_unk
    return j


def byte_alphabet():
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xa1, 0xad)) + \
        list(range(0xae, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------
def run_cli(args, lines):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
        path = f.name
    try:
        r = subprocess.run([CLI, "tokenize", *args, "--jsonl", path], capture_output=True)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        raise RuntimeError(f"loradb tokenize {' '.join(args)} failed: "
                           f"{r.stderr.decode(errors='replace')}")
    return [json.loads(l) for l in r.stdout.decode("utf-8").split("\n") if l]


def stream_chunks(tok, ids, skip):
    """DecodeStream's chunks; a step that raises (an invalid prefix) ends them with "error"."""
    stream = decoders.DecodeStream(skip_special_tokens=skip)
    chunks = []
    for i in ids:
        try:
            chunks.append(stream.step(tok, i))
        except Exception:  # noqa: BLE001  (tokenizers raises a plain Exception)
            chunks.append("error")
            break
    return chunks


def compare(name, tj, strings, rng, workdir, must_use=()):
    """Compares on `strings`; the tokens `must_use` must occur in their encodings (so that the
    strings exercise those paths)."""
    path = os.path.join(workdir, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    tok = Tokenizer.from_file(path)
    expected = [tok.encode(s).ids for s in strings]
    used = {i for e in expected for i in e}
    for token in must_use:
        if tok.token_to_id(token) not in used:
            fail(f"{name}: no test string encodes to {token!r}")
    for args, want in ((["encode", path], expected),
                       (["encode", path, "--no-special"],
                        [tok.encode(s, add_special_tokens=False).ids for s in strings])):
        got = [r["ids"] for r in run_cli(args, strings)]
        bad = 0
        for s, e, g in zip(strings, want, got):
            if e != g:
                bad += 1
                fail(f"{name}: {' '.join(args[2:])} encode {s[:80]!r}: tokenizers {e[:20]} "
                     f"loradb {g[:20]}")
        print(f"{name}: encode {' '.join(args[2:])} {len(strings)} strings, "
              f"{len(strings) - bad} identical")

    # Decoding: the encodings, cut sequences (partial UTF-8 at both ends), random ids.
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    valid_ids = [i for i in range(vocab_size + 8) if tok.id_to_token(i) is not None]
    seqs = list(expected)
    for e in expected[: len(expected) // 2]:
        if len(e) > 2:
            a = rng.randrange(len(e))
            b = rng.randrange(a, len(e) + 1)
            seqs.append(e[a:b])
    for _ in range(len(expected) // 4):
        seqs.append([rng.choice(valid_ids) for _ in range(rng.randint(1, 12))])
    for keep in (False, True):
        args = ["decode", path, "--stream"] + (["--keep-special"] if keep else [])
        results = run_cli(args, seqs)
        bad = 0
        for ids, r in zip(seqs, results):
            want = tok.decode(ids, skip_special_tokens=not keep)
            chunks = stream_chunks(tok, ids, not keep)
            got_chunks = ["error" if isinstance(c, dict) else c for c in r["chunks"]]
            if r["text"] != want or got_chunks != chunks:
                bad += 1
                fail(f"{name}: decode {ids[:20]} keep_special={keep}: tokenizers {want[:60]!r} "
                     f"{chunks[:8]} loradb {r['text'][:60]!r} {got_chunks[:8]}")
        print(f"{name}: decode {len(seqs)} id sequences (keep_special={keep}, streaming too), "
              f"{len(seqs) - bad} identical")


def check_cli_errors(qwen, workdir):
    """The CLI's refusals: no tokenizer.json, text that is not UTF-8, a post-processor loradb
    does not implement (written by tokenizers itself), a truncated file."""
    def expect_error(args, needle):
        r = subprocess.run([CLI, "tokenize", *args], capture_output=True)
        err = r.stderr.decode(errors="replace")
        if r.returncode == 0 or needle not in err:
            fail(f"loradb tokenize {args[:2]}: rc {r.returncode}, stderr {err!r} lacks {needle!r}")

    empty = os.path.join(workdir, "empty")
    os.mkdir(empty)
    expect_error(["encode", empty, "hi"], "tokenizer.json")
    path = os.path.join(workdir, "cli.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(qwen, f, ensure_ascii=False)
    expect_error(["encode", path, b"caf\xc3"], "UTF-8")
    expect_error(["decode", path, "5", str(10 ** 6)], "1000000")
    tok = Tokenizer.from_file(path)
    tok.post_processor = processors.BertProcessing(
        ("<|im_end|>", tok.token_to_id("<|im_end|>")),
        ("<|im_start|>", tok.token_to_id("<|im_start|>")))
    templated = os.path.join(workdir, "bert.json")
    tok.save(templated)
    expect_error(["encode", templated, "hi"], "BertProcessing")
    truncated = os.path.join(workdir, "truncated.json")
    with open(path, "rb") as f, open(truncated, "wb") as g:
        g.write(f.read()[:5000])
    expect_error(["encode", truncated, "hi"], "not valid JSON")


# Strings on the edges the SentencePiece-style pipelines treat specially: spaces at either end and
# in runs, the replacement character "▁" and byte-token spellings written in the text, characters
# outside the vocabulary, newline runs (Gemma's added tokens), and added tokens next to text.
EDGE_STRINGS = [" ", "  ", "   x", "x   ", " x ", "a  b   c", "\u2581", "\u2581x", "x\u2581\u2581y",
                " \u2581 ", "<0x41>", "<0xZZ>", "\n", "\n\n\n\n", " \n \n", "\t x", "\U0001F600",
                "\u00e9\U0001F600\u00e9", "\u0e01\u0e34", "a\u0301", "\uffff", "\U0010FFFF"]


def family_strings(rng, base, tj):
    """`base` plus the edge strings, each also with the family's added tokens put next to text,
    between spaces and at either end."""
    added = [t["content"] for t in tj["added_tokens"]]
    out = list(base) + EDGE_STRINGS
    for s in list(base[: len(base) // 2]) + EDGE_STRINGS:
        parts = [s[:len(s) // 2], s[len(s) // 2:]]
        token = rng.choice(added)
        glue = rng.choice(["", " ", "  ", "\n", " \n "])
        out.append(parts[0] + glue + token + rng.choice(["", " ", "  ", "\n"]) + parts[1])
        out.append(token + s)
        out.append(s + rng.choice(["", " "]) + token)
    out += [" ".join(added), "".join(added), "  ".join(added) + "  "]
    return out


# Tokens each family's strings must reach, beside its template's.
FAMILY_MUST_USE = {
    "llama3": ["<|eot_id|>", "<|start_header_id|>"],
    "nemo": ["[INST]"],
    "mistral": ["<0xF0>", "<unk>", "<s>"],
    "mistral-v3": ["<0xF0>", "[INST]"],
    "phi3": ["<|assistant|>", "<|end|>", "<0xF0>"],
    "gemma": ["<start_of_turn>", "\n\n", "\u2581\u2581", "<0xF0>"],
    "spm-eos": ["</s>"],
    "spm-unk": ["<unk>"],
    "metaspace": ["<0xF0>"],
}


def main():
    rng = random.Random(20260601)
    n = 3000 * (10 if SLOW else 1)
    texts = corpus(rng, 4000)
    qwen = train_qwen(texts)
    gpt2 = train_gpt2(texts)
    assert isinstance(qwen["model"]["merges"][0], list), "tokenizers now writes pair merges"
    qwen_str = json.loads(json.dumps(qwen))
    qwen_str["model"]["merges"] = [" ".join(m) for m in qwen["model"]["merges"]]
    qwen_im = json.loads(json.dumps(qwen))
    qwen_im["model"]["ignore_merges"] = True
    strings = test_strings(rng, n)
    controls = [s + "\x01\x02\x03\x02\x02x\x01" + s for s in strings[: n // 6]]
    with tempfile.TemporaryDirectory() as workdir:
        check_cli_errors(qwen, workdir)
        added = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<lsr>",
                 "Márk!"]
        compare("qwen", qwen, strings, rng, workdir, must_use=added)
        compare("qwen-str", qwen_str, strings[: n // 3], rng, workdir)
        compare("qwen-im", qwen_im, strings[: n // 3], rng, workdir)
        compare("gpt2", gpt2, strings[: n // 3], rng, workdir)
        for fused in (False, True):
            compare("fallback-fused" if fused else "fallback", fallback_variant(qwen, fused),
                    controls, rng, workdir, must_use=["<0xC4>", "<0x81>", "<unk>"])
        for name, build in tokenizer_families.FAMILIES.items():
            tj = build(texts)
            compare(name, tj, family_strings(rng, strings[: n // 3], tj), rng, workdir,
                    must_use=FAMILY_MUST_USE[name])
    if FAILURES:
        print(f"{len(FAILURES)} failures")
        return 1
    print("all identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())

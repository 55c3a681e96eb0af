# The Hugging Face `tokenizers` side of `loradb-bench tokenizer` (bench/tokenizer_bench.cc).
# argv: DIR VOCAB TEXTS REPS [KIND]. Trains a tokenizer of KIND on a generated multilingual corpus
# (qwen, the default: byte-level BPE with Qwen3's layout; or a family of
# tests/python/tokenizer_families.py: llama3, mistral, phi3, gemma, ...), writes DIR/tokenizer.json
# and DIR/texts.jsonl, and prints one JSON object with the reference's timings.
import json, os, random, sys, time
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
d, vocab, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
kind = sys.argv[5] if len(sys.argv) > 5 else "qwen"
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
if kind == "qwen":
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
else:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                    "python"))
    import tokenizer_families
    tok = Tokenizer.from_str(json.dumps(tokenizer_families.FAMILIES[kind](train, vocab)))
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

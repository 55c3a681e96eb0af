#!/usr/bin/env python3
"""Writes mini_tokenizer.json: a byte-level BPE tokenizer in Qwen3's layout (NFC, Qwen's split
regex + ByteLevel, ByteLevel decoder and post-processor) trained with the Hugging Face
`tokenizers` package on a small generated English corpus: 364 tokens (the corpus stops the
trainer before its limit of 600), then <|im_start|> (364) and <|im_end|> (365), so every id fits
the tiny test bases' vocabulary of 1024. Deterministic:
rerunning it with tokenizers 0.23.3 rewrites the same file.

With a KIND (llama3, mistral, mistral-v3, phi3, gemma, nemo), it writes instead a tokenizer of
that model family's layout (tests/python/tokenizer_families.py) trained on the same corpus with a
limit of 600 tokens, so every id, the added tokens' included, fits a vocabulary of 1024: the
mini_<KIND>.json files beside this script.

usage: make_mini_tokenizer.py OUT.json [KIND]
"""
import json
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, \
    pre_tokenizers, processors, trainers

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
COLOURS = "red green blue yellow purple orange black white brown grey".split()
THINGS = "apple grass sky sun plum carrot night snow bread stone".split()


def corpus():
    for c in COLOURS:
        for t in THINGS:
            yield f"The {t} is {c}. What colour is the {t}? It is {c}."
            yield f"Question: name a {c} thing.\nAnswer: the {t}!"


def main():
    if len(sys.argv) > 2:
        import os
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "python"))
        import tokenizer_families
        j = tokenizer_families.FAMILIES[sys.argv[2]](list(corpus()), 600)
        with open(sys.argv[1], "w") as f:
            json.dump(j, f, ensure_ascii=False, indent=1)
            f.write("\n")
        return
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(corpus()), trainer)
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True, normalized=False),
                            AddedToken("<|im_end|>", special=True, normalized=False)])
    with open(sys.argv[1], "w") as f:
        json.dump(json.loads(tok.to_str()), f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

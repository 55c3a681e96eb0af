"""Tokenizers of each model family's kind, trained here with the Hugging Face `tokenizers` package
(no downloads), with the normalizer / pre-tokenizer / model options / post-processor / decoder
pipelines that the families' published tokenizer.json files declare:

  llama3      byte-level BPE: Split(Llama 3's regex, digits in runs of 1-3) + ByteLevel, no
              normalizer, ignore_merges; post-processor Sequence[ByteLevel, TemplateProcessing
              adding <|begin_of_text|>]; ByteLevel decoder; Llama 3's header/turn special tokens
  nemo        byte-level BPE with Tekken's split regex (case classes \\p{Lu}\\p{Lt}..., as Mistral
              Nemo ships); TemplateProcessing adding <s>
  mistral     SentencePiece-style BPE over characters with byte_fallback, fuse_unk and <unk>, the
              legacy Llama 2 / Mistral v0.1 layout: normalizer Sequence[Prepend("▁"),
              Replace(" ", "▁")], no pre-tokenizer, TemplateProcessing adding <s>, decoder
              Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)]
  mistral-v3  the same model in the newer layout (Mistral v0.3 and later Llama 2-style
              conversions): no normalizer, Metaspace(prepend_scheme "first", split false)
  phi3        the legacy layout with Phi-3's chat tokens (<|assistant|>, <|user|>, <|end|>, ...:
              special, rstrip) and <|endoftext|>
  gemma       Gemma 2/3: normalizer Replace(" ", "▁"), pre-tokenizer Split(" ",
              MergedWithPrevious), TemplateProcessing adding <bos>, decoder Sequence[Replace,
              ByteFallback, Fuse]; <start_of_turn>/<end_of_turn> and Gemma's non-special added
              tokens for newline runs and "▁▁"
Variants for the paths the families do not all take:
  spm-eos     mistral with a template adding </s> after the text too (add_eos_token)
  spm-unk     mistral with the byte tokens <0xF0>..<0xF4> taken out, so characters of four UTF-8
              bytes become <unk> (fused)
  metaspace   Metaspace(prepend_scheme "always", split true) and the Metaspace decoder

Each builder takes the training texts and returns the tokenizer.json as a dict.
"""
import json

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                  r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
                  r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPIECE = "\u2581"
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
                   "<|finetune_right_pad_id|>", "<|reserved_special_token_0|>"]
PHI3_RSTRIP = ["<|assistant|>", "<|placeholder1|>", "<|system|>", "<|end|>", "<|user|>"]


def _special(content, **kw):
    return AddedToken(content, special=True, normalized=False, **kw)


def _byte_level(texts, pattern, vocab_size, specials, ignore_merges):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([_special(s) for s in specials])
    return tok


def llama3(texts, vocab_size=3000):
    tok = _byte_level(texts, LLAMA3_PATTERN, vocab_size, LLAMA3_SPECIALS, ignore_merges=True)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", bos)])])
    return json.loads(tok.to_str())


def nemo(texts, vocab_size=3000):
    tok = _byte_level(texts, TEKKEN_PATTERN, vocab_size, ["<unk>", "<s>", "</s>", "[INST]",
                                                         "[/INST]"], ignore_merges=False)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.decoder = decoders.ByteLevel()
    return json.loads(tok.to_str())


def _spm_model(texts, vocab_size, specials, limit_alphabet):
    """A character-level BPE with byte fallback: `specials` first, then the 256 byte tokens (as
    Llama 2 and Gemma number them), then the learned pieces. Trained on words split at "▁"."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", SPIECE)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme="always",
                                                 split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials + BYTE_TOKENS,
                                  limit_alphabet=limit_alphabet, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    j = json.loads(tok.to_str())
    # The byte tokens are vocabulary entries, not added tokens, in the published files.
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] not in BYTE_TOKENS]
    return j


def _finish(j, normalizer, pre_tokenizer, decoder, template, added=(), special_added=()):
    tok = Tokenizer.from_str(json.dumps(j))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    if template is not None:
        single, names = template
        pair = single + " " + " ".join(p + ":1" for p in single.replace("$A", "$B").split())
        tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=[(n, tok.token_to_id(n)) for n in names])
    if special_added:
        tok.add_special_tokens(list(special_added))
    if added:
        tok.add_tokens(list(added))
    return json.loads(tok.to_str())


LEGACY_NORMALIZER = lambda: normalizers.Sequence([normalizers.Prepend(SPIECE),  # noqa: E731
                                                  normalizers.Replace(" ", SPIECE)])
LLAMA2_DECODER = lambda: decoders.Sequence([  # noqa: E731
    decoders.Replace(SPIECE, " "), decoders.ByteFallback(), decoders.Fuse(),
    decoders.Strip(content=" ", left=1, right=0)])


def mistral(texts, vocab_size=3000):
    j = _spm_model(texts, vocab_size, ["<unk>", "<s>", "</s>"], limit_alphabet=200)
    return _finish(j, LEGACY_NORMALIZER(), None, LLAMA2_DECODER(), ("<s> $A", ["<s>"]))


def mistral_v3(texts, vocab_size=3000):
    j = _spm_model(texts, vocab_size, ["<unk>", "<s>", "</s>"], limit_alphabet=200)
    return _finish(j, None, pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme="first",
                                                     split=False),
                   LLAMA2_DECODER(), ("<s> $A", ["<s>"]),
                   special_added=[_special("[INST]"), _special("[/INST]")])


def phi3(texts, vocab_size=3000):
    j = _spm_model(texts, vocab_size, ["<unk>", "<s>", "</s>"], limit_alphabet=200)
    specials = [_special("<|endoftext|>")] + [_special(s, rstrip=True) for s in PHI3_RSTRIP]
    return _finish(j, LEGACY_NORMALIZER(), None, LLAMA2_DECODER(), ("<s> $A", ["<s>"]),
                   special_added=specials)


def gemma(texts, vocab_size=3000):
    j = _spm_model(texts, vocab_size, ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"],
                   limit_alphabet=200)
    added = [AddedToken(s, special=False, normalized=False)
             for s in ["\n", "\n\n", "\n\n\n", SPIECE * 2, "<table>"]]
    return _finish(j, normalizers.Replace(" ", SPIECE),
                   pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False),
                   decoders.Sequence([decoders.Replace(SPIECE, " "), decoders.ByteFallback(),
                                      decoders.Fuse()]),
                   ("<bos> $A", ["<bos>"]),
                   special_added=[_special("<start_of_turn>"), _special("<end_of_turn>")],
                   added=added)


def spm_eos(texts, vocab_size=3000):
    j = _spm_model(texts, vocab_size, ["<unk>", "<s>", "</s>"], limit_alphabet=200)
    return _finish(j, LEGACY_NORMALIZER(), None, LLAMA2_DECODER(),
                   ("<s> $A </s>", ["<s>", "</s>"]))


def spm_unk(texts, vocab_size=3000):
    j = mistral(texts, vocab_size)
    vocab = j["model"]["vocab"]
    for b in range(0xF0, 0xF5):
        del vocab[f"<0x{b:02X}>"]
    return j


def metaspace(texts, vocab_size=3000):
    j = _spm_model(texts, vocab_size, ["<unk>", "<s>", "</s>"], limit_alphabet=200)
    return _finish(j, None, pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme="always",
                                                     split=True),
                   decoders.Metaspace(replacement=SPIECE, prepend_scheme="always", split=True),
                   None)


FAMILIES = {"llama3": llama3, "nemo": nemo, "mistral": mistral, "mistral-v3": mistral_v3,
            "phi3": phi3, "gemma": gemma, "spm-eos": spm_eos, "spm-unk": spm_unk,
            "metaspace": metaspace}

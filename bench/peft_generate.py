"""The transformers + peft arm of `loradb-bench serve peft` (bench/serve_bench.cc).

Usage: python3 bench/peft_generate.py SPEC

SPEC is a JSON file the C++ side writes:
  model_dir    the base checkpoint loradb serves (config.json + model.safetensors)
  adapters     [{"name": ..., "dir": ...}]: PEFT directories exported from loradb's store
  rows         [{"adapter": NAME, "prompt": [ids], "tokens": [ids]}]: one batch row each, with
               the greedy tokens loradb generated for it
  max_tokens   tokens generated per row
  threads      torch.set_num_threads (loradb's LibTorch and kernel thread count)
  rounds       timed generate calls; the median time is reported

The base loads with transformers (fp32, its default attention), the adapters with peft
(PeftModelForCausalLM.from_pretrained, then load_adapter for each further one). Every tensor of
each adapter file must have landed in the model (peft silently keeps only the modules its
config targets), else exit 1. A warm-up generate of two
tokens on the same batch is not timed; then `rounds` timed `generate` calls each decode the
whole batch greedily with peft's mixed-adapter batching (`adapter_names`, one per row), the way
a CPU user serves several adapters in one batch without loradb. Timed: each call (prefill
included); reported: the median.

The check that both sides did the same work (on every round's output): every row must produce
max_tokens tokens, equal to
loradb's up to the first position where the two disagree and this side's logits there are a
near-tie (loradb's token scores within TIE_REL of the best, relative to the row's largest
|logit|: fp32 sums in another order may flip such an argmax; the row is compared no further).
Any other difference exits 1 with the row and position on stderr.

Prints one JSON object: seconds (the median), round_seconds, completion_tokens, tokens_per_s,
rows, rows_compared_whole, tokens_compared, near_ties (of the last round), versions. Exit status
77: torch, transformers or peft is not installed.
"""
import json
import os
import statistics
import sys
import time
import warnings

try:
    import torch
    import peft
    import transformers
    from peft import PeftModelForCausalLM
    from peft.utils import get_peft_model_state_dict
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"skipped: {e}", file=sys.stderr)
    sys.exit(77)

TIE_REL = 1e-4  # the oracle tests' fp32 bound on max |loradb - transformers| / max |logit|


def compare(row_index, ours, theirs, scores):
    """Compares one row; returns (tokens compared, near-tie or None), or exits on a mismatch."""
    for t, (a, b) in enumerate(zip(ours, theirs)):
        if a == b:
            continue
        logits = scores[t]
        gap = (logits[b] - logits[a]).item()
        scale = logits.abs().max().item()
        if gap <= TIE_REL * scale:
            return t, t
        print(f"peft_generate: row {row_index} differs from loradb at token {t}: loradb {a}, "
              f"transformers+peft {b} (logit gap {gap:.6g}, max |logit| {scale:.6g}); "
              f"loradb {ours}, transformers+peft {theirs}", file=sys.stderr)
        sys.exit(1)
    return len(ours), None


def check_round(rows, max_tokens, out, prompt_len):
    """Compares one generate output with loradb's rows; returns (rows compared whole, tokens
    compared, near-ties), or exits 1."""
    whole, compared, ties = 0, 0, 0
    for i, (row, theirs) in enumerate(zip(rows, out.sequences[:, prompt_len:].tolist())):
        if len(theirs) != max_tokens:
            print(f"peft_generate: row {i} generated {len(theirs)} tokens, not {max_tokens}",
                  file=sys.stderr)
            sys.exit(1)
        n, tie = compare(i, row["tokens"], theirs, [s[i] for s in out.logits])
        compared += n
        if tie is None:
            whole += 1
        else:
            ties += 1
    return whole, compared, ties


def check_loaded(model, name, adapter_dir):
    """Exits 1 when a tensor of adapter_dir's file is not part of adapter `name` in the model."""
    with safe_open(os.path.join(adapter_dir, "adapter_model.safetensors"), framework="pt") as f:
        in_file = set(f.keys())
    loaded = set(get_peft_model_state_dict(model, adapter_name=name).keys())
    dropped = sorted(in_file - loaded)
    if dropped:
        print(f"peft_generate: peft loaded adapter {name} without {len(dropped)} of its "
              f"{len(in_file)} tensors (e.g. {dropped[0]}); its adapter_config.json targets "
              f"{model.peft_config[name].target_modules}", file=sys.stderr)
        sys.exit(1)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    threads = int(spec["threads"])
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecation notes
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    base = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    adapters = spec["adapters"]
    model = PeftModelForCausalLM.from_pretrained(base, adapters[0]["dir"],
                                                 adapter_name=adapters[0]["name"])
    for a in adapters[1:]:
        model.load_adapter(a["dir"], adapter_name=a["name"])
    model.eval()
    for a in adapters:
        check_loaded(model, a["name"], a["dir"])

    rows = spec["rows"]
    max_tokens = int(spec["max_tokens"])
    ids = torch.tensor([r["prompt"] for r in rows], dtype=torch.long)
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                  adapter_names=[r["adapter"] for r in rows], do_sample=False, pad_token_id=0)
    times = []
    with torch.inference_mode():
        model.generate(max_new_tokens=2, **kwargs)
        for _ in range(int(spec["rounds"])):
            t0 = time.perf_counter()
            out = model.generate(max_new_tokens=max_tokens, output_logits=True,
                                 return_dict_in_generate=True, **kwargs)
            times.append(time.perf_counter() - t0)
            whole, compared, ties = check_round(rows, max_tokens, out, ids.shape[1])
    seconds = statistics.median(times)
    completion = len(rows) * max_tokens
    print(json.dumps({"seconds": seconds, "round_seconds": times,
                      "completion_tokens": completion,
                      "tokens_per_s": completion / seconds if seconds > 0 else 0,
                      "rows": len(rows), "rows_compared_whole": whole,
                      "tokens_compared": compared, "near_ties": ties,
                      "versions": {"torch": torch.__version__,
                                   "transformers": transformers.__version__,
                                   "peft": peft.__version__}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

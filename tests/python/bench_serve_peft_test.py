#!/usr/bin/env python3
# loradb-test: args=loradb_bench timeout=600 requires=loradb_openai
"""`loradb-bench serve peft` runs its transformers + peft peer, and the peer's checks can fail.

usage: bench_serve_peft_test.py LORADB_BENCH

1. The real case at tiny sizes (tiny-dense config, 2 rows, 3 tokens, 2 rounds, at 1 and at 2
   threads; about 30 s on an idle machine): exit 0; at each thread count a measurement line for
   loradb and one for transformers + peft, each with both rounds' times, rows x tokens
   completion tokens and tokens_per_s = completion_tokens / seconds, loradb's vs_peer the ratio
   of the two; the peer compared at least one token with loradb's; one goal line
   vs_transformers_peft whose value is the last thread count's ratio, target ">= 5", met exactly
   when value >= 5. No figure is judged.
2. bench/peft_generate.py alone (its passing path is step 1's), on a base and two adapters made
   by transformers and peft here, with the greedy tokens transformers + peft produce for the
   batch, except one token of row 1 replaced by the least likely one: exit 1 naming row 1 and
   that position; with the right tokens but an adapter_config.json that targets fewer modules
   than its file holds (peft would drop the other tensors without an error): exit 1 naming the
   adapter.
Exit status 77 (ctest: skipped) when torch, transformers or peft is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from peft import LoraConfig, PeftModelForCausalLM, get_peft_model
    import transformers
    from transformers import AutoModelForCausalLM, Qwen3Config
except ImportError as e:
    print(f"skipped: {e} (tools/dev setup installs torch, transformers and peft)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DRIVER = os.path.join(ROOT, "bench", "peft_generate.py")
ROWS, PROMPT, TOKENS, ROUNDS = 2, 4, 3, 2
THREADS = [1, 2]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def close(a, b):
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-12)


def check_bench(bench):
    p = subprocess.run([bench, "serve", "peft", f"--peft-rows={ROWS}", f"--prompt={PROMPT}",
                        f"--tokens={TOKENS}", f"--peft-rounds={ROUNDS}",
                        "--peft-threads=" + ",".join(map(str, THREADS)),
                        "--config=" + os.path.join(ROOT, "compute", "configs", "tiny-dense.json")],
                       capture_output=True, text=True, timeout=540)
    check(p.returncode == 0, f"loradb-bench serve peft: exit {p.returncode}: {p.stderr[-3000:]}")
    if "skipped" in p.stderr:
        check(False, "the peer ran (the test imports torch, transformers and peft itself)")
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    goals = [l for l in lines if l.get("goal") == "vs_transformers_peft"]
    check(len(goals) == 1, f"one vs_transformers_peft goal line: {goals}")
    ratios = {}
    for threads in THREADS:
        by_case = {l["case"]: l for l in lines if "case" in l and l.get("threads") == threads}
        ours = by_case.get("peft_batch_loradb")
        peer = by_case.get("peft_batch_transformers_peft")
        check(ours is not None and peer is not None,
              f"both measurement lines at {threads} thread(s): {sorted(by_case)}")
        if ours is None or peer is None:
            continue
        for line in (ours, peer):
            check(line["bench"] == "serve" and line["rows"] == ROWS
                  and line["max_tokens"] == TOKENS, f"{line['case']}: its sizes")
            check(line["rounds"] == ROUNDS and len(line["round_seconds"]) == ROUNDS
                  and min(line["round_seconds"]) <= line["seconds"] <= max(line["round_seconds"]),
                  f"{line['case']}: {ROUNDS} rounds, seconds between their times")
            check(line["completion_tokens"] == ROWS * TOKENS,
                  f"{line['case']}: {line['completion_tokens']} completion tokens")
            check(line["seconds"] > 0 and
                  close(line["tokens_per_s"], line["completion_tokens"] / line["seconds"]),
                  f"{line['case']}: tokens_per_s is completion_tokens / seconds")
        check(1 <= peer["tokens_compared"] <= ROWS * TOKENS,
              f"the peer compared tokens with loradb's: {peer['tokens_compared']}")
        check(set(peer["versions"]) == {"torch", "transformers", "peft"}, "the peer's versions")
        ratios[threads] = ours["tokens_per_s"] / peer["tokens_per_s"]
        check(close(ours["vs_peer"], ratios[threads]),
              f"vs_peer at {threads} thread(s) is loradb's tokens/s over the peer's")
    if len(goals) != 1 or THREADS[-1] not in ratios:
        return
    g = goals[0]
    check(g["bench"] == "serve" and g["target"] == ">= 5", f"goal line fields: {g}")
    check(close(g["value"], ratios[THREADS[-1]]),
          f"goal value {g['value']} is the ratio at {THREADS[-1]} threads")
    check(g["met"] == (g["value"] >= 5), "met agrees with the value")


def run_driver(spec, path):
    with open(path, "w") as f:
        json.dump(spec, f)
    return subprocess.run([sys.executable, DRIVER, path], capture_output=True, text=True,
                          timeout=240)


def check_driver(tmp):
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(3)
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, max_position_embeddings=64, tie_word_embeddings=False)
    model_dir = os.path.join(tmp, "model")
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    adapters = []
    for i in range(2):
        d = os.path.join(tmp, f"a{i}")
        m = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS,
                                      init_lora_weights=False))
        m.save_pretrained(d)
        adapters.append({"name": f"a{i}", "dir": d})
    prompts = [[(5 * r + 3 * k) % 64 for k in range(PROMPT)] for r in range(ROWS)]
    names = [a["name"] for a in adapters]

    # The greedy tokens and logits of the batch, as transformers + peft produce them.
    model = PeftModelForCausalLM.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir),
                                                 adapters[0]["dir"], adapter_name="a0")
    model.load_adapter(adapters[1]["dir"], adapter_name="a1")
    model.eval()
    ids = torch.tensor(prompts)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             adapter_names=names, max_new_tokens=TOKENS, do_sample=False,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[:, PROMPT:].tolist()
    spec = {"model_dir": model_dir, "max_tokens": TOKENS, "threads": 1, "rounds": 1,
            "adapters": adapters,
            "rows": [{"adapter": names[r], "prompt": prompts[r], "tokens": tokens[r]}
                     for r in range(ROWS)]}
    path = os.path.join(tmp, "spec.json")

    wrong = json.loads(json.dumps(spec))
    wrong["rows"][1]["tokens"][1] = int(out.logits[1][1].argmin())
    p = run_driver(wrong, path)
    check(p.returncode == 1 and "row 1 differs from loradb at token 1" in p.stderr,
          f"driver on a changed token: exit {p.returncode}: {p.stderr[-2000:]}")

    cfg_path = os.path.join(adapters[1]["dir"], "adapter_config.json")
    cfg = json.load(open(cfg_path))
    cfg["target_modules"] = ["q_proj"]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    p = run_driver(spec, path)
    check(p.returncode == 1 and "peft loaded adapter a1 without" in p.stderr,
          f"driver on an adapter peft loads partly: exit {p.returncode}: {p.stderr[-2000:]}")


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    check_bench(os.path.abspath(sys.argv[1]))
    with tempfile.TemporaryDirectory() as tmp:
        check_driver(tmp)
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("loradb-bench serve peft: both lines and the goal line; the peer's checks fail when "
          "they should")
    return 0


if __name__ == "__main__":
    sys.exit(main())

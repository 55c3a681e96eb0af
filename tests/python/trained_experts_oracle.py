#!/usr/bin/env python3
# loradb-test: args=loradb_cli timeout=900 requires=loradb_compute
"""Oracle test: LoRA trained by loradb on fused MoE expert parameters is a PEFT adapter.

usage: trained_experts_oracle.py LORADB_CLI

A Qwen3-MoE base (with one dense layer) is made by transformers itself. `loradb train --data`
trains a policy with --target-parameters gate_up_proj,down_proj (plus q_proj through
--target-modules); `loradb export` writes the published revision. The checks:
- adapter_config.json keeps target_parameters and the tensors are in PEFT's fused layout (one A
  [r * experts, in] and one B [out, r * experts] per layer and parameter);
- peft itself loads the directory onto the transformers base (no missing or unexpected keys),
  and its logits equal `loradb generate --logits` on the revision (max relative error < 1e-4,
  greedy tokens equal), for a batch of prompts;
- the trained adapter changes the logits (else the comparison is vacuous);
- `loradb import` of the exported directory reproduces the tensors byte for byte on export.
Exit status 77 (ctest: skipped) when torch / transformers / peft are missing.
"""
import json
import os
import sys
import tempfile
import warnings

try:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import Qwen3MoeConfig
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

warnings.filterwarnings("ignore")
from config_oracle import make_base, max_rel_err  # noqa: E402
from peft_cli_util import fail, finish, loradb_runner  # noqa: E402
from peft_serving_oracle import load_base, ref_logits as logits  # noqa: E402

BOUND = 1e-4
VOCAB = 96
RANK = 4
EXPERTS = 4
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
              initializer_range=0.2, num_hidden_layers=3, num_experts=EXPERTS,
              num_experts_per_tok=2, moe_intermediate_size=24, mlp_only_layers=[1],
              tie_word_embeddings=False)


def prompt(i):
    return [(5 * i + 11 * t + 2) % VOCAB for t in range(4 + i % 3)]


def main():
    loradb = loradb_runner(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="loradb-trained-experts-") as tmp:
        model_dir = os.path.join(tmp, "moe")
        make_base(model_dir, Qwen3MoeConfig, CONFIG, [], 7)
        store = os.path.join(tmp, "store")
        data = os.path.join(tmp, "sft.jsonl")
        with open(data, "w") as f:
            for i in range(32):
                toks = [(3 * i + 7 * t + 1) % VOCAB for t in range(8)]
                f.write(json.dumps({"tokens": toks}) + "\n")
        loradb(store, "train", "--model", model_dir, "--policy", "acme/experts", "--data", data,
               "--steps", "4", "--batch", "8", "--lr", "5e-2", "--rank", str(RANK),
               "--target-modules", "q_proj",
               "--target-parameters", "gate_up_proj,down_proj", "--threads", "1", "--json")
        out = os.path.join(tmp, "exported")
        loradb(store, "export", "acme/experts:latest", out)

        with open(os.path.join(out, "adapter_config.json")) as f:
            cfg = json.load(f)
        print(json.dumps({"target_parameters": cfg.get("target_parameters"),
                          "target_modules": cfg.get("target_modules")}))
        if sorted(cfg.get("target_parameters") or []) != ["down_proj", "gate_up_proj"]:
            fail(f"adapter_config.json target_parameters: {cfg.get('target_parameters')}")
        tensors = load_file(os.path.join(out, "adapter_model.safetensors"))
        for layer in (0, 2):
            key = f"base_model.model.model.layers.{layer}.mlp.experts"
            want = {f"{key}.base_layer.lora_A.weight": (RANK * EXPERTS, 32),
                    f"{key}.base_layer.lora_B.weight": (2 * 24, RANK * EXPERTS),
                    f"{key}.lora_A.weight": (RANK * EXPERTS, 24),
                    f"{key}.lora_B.weight": (32, RANK * EXPERTS)}
            for name, shape in want.items():
                got = tuple(tensors[name].shape) if name in tensors else None
                if got != shape:
                    fail(f"{name}: shape {got}, want {shape}")
        if any(".experts.0." in n for n in tensors):
            fail("per-expert tensors in the fused export")

        base = load_base(model_dir)
        model = PeftModel.from_pretrained(load_base(model_dir), out).eval()
        # Every saved tensor was loaded into the model (a silently skipped one would leave zeros).
        loaded = {n: p for n, p in model.named_parameters() if "lora_" in n}
        for name, t in tensors.items():
            inner = name.replace(".weight", ".default.weight")
            if inner not in loaded or not torch.equal(loaded[inner].float(), t.float()):
                fail(f"peft did not load {name}")

        rows = [prompt(i) for i in range(4)]
        args = ["generate", "--model", model_dir, "--max-tokens", "4", "--logits", "--json"]
        for p in rows:
            args += ["--prompt-ids", ",".join(map(str, p)), "--adapter", "acme/experts:latest"]
        results = json.loads(loradb(store, *args).stdout)["results"]
        for i, (p, res) in enumerate(zip(rows, results)):
            toks = res["tokens"]
            seq = p + toks[:-1]
            ours = torch.tensor(res["logits"], dtype=torch.float64)
            want = logits(model, seq)
            err = max_rel_err(ours, want) if ours.shape == want.shape else float("inf")
            effect = max_rel_err(want, logits(base, seq))
            agree = toks == want[len(p) - 1:].argmax(-1).tolist()
            print(json.dumps({"row": i, "max_rel_err": err, "bound": BOUND,
                              "adapter_effect": effect, "tokens_agree": agree}))
            if not (err < BOUND and agree and effect > 1e-3):
                fail(f"row {i}: max rel err {err:.3g}, tokens agree {agree}, effect {effect:.3g}")

        # The exported directory imports and exports back byte for byte.
        loradb(store, "import", "--policy", "acme/reimported", "--base", "moe", out, "--json")
        again = os.path.join(tmp, "again")
        loradb(store, "export", "acme/reimported:latest", again)
        second = load_file(os.path.join(again, "adapter_model.safetensors"))
        if sorted(second) != sorted(tensors) or any(
                not torch.equal(second[n], tensors[n]) for n in tensors):
            fail("import of the exported adapter does not export the same tensors")
    finish("trained_experts_oracle")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# loradb-test: args=st_tool timeout=600
"""Oracle test: loradb's PEFT directory reader/writer against Hugging Face PEFT itself.

usage: peft_oracle.py ST_TOOL

A tiny Qwen3 model gets LoRA adapters from PEFT (rank/alpha patterns, rsLoRA, an embedding
LoRA), saved with save_pretrained. loradb must (1) compute, for every LoRA module, the rank and
scaling PEFT's own layers use; (2) re-export the directory byte-identically, and PEFT must load
the re-export to the same outputs; (3) do the same for adapters with features beyond plain
LoRA (the full embedding weights peft saves beside an embedding LoRA, DoRA magnitudes): read,
kept and re-exported byte-identically.
Exit status 77 (ctest: skipped) when torch / transformers / peft are missing.
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

TOOL = sys.argv[1]
FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    print("FAIL:", msg)


def tiny_model():
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      max_position_embeddings=64, tie_word_embeddings=False)
    return Qwen3ForCausalLM(cfg).eval()


CASES = {
    "patterns": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                        "gate_proj", "up_proj", "down_proj"],
                     rank_pattern={"q_proj": 2, "layers.1.self_attn.v_proj": 3},
                     alpha_pattern={"k_proj": 5, "model.layers.0.mlp.down_proj": 1.5}),
    "rslora": dict(r=8, lora_alpha=16, use_rslora=True, target_modules=["q_proj", "down_proj"],
                   rank_pattern={"model.layers.0.mlp.down_proj": 2}),
    "embedding": dict(r=2, lora_alpha=4, target_modules=["embed_tokens", "v_proj"]),
    "regex_targets": dict(r=3, lora_alpha=3, target_modules=r".*\.(q|v)_proj"),
}


def peft_scales(model):
    out = {}
    for name, module in model.named_modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and "default" in scaling:
            key = name[len("base_model.model."):] if name.startswith("base_model.model.") else name
            out[key] = (module.r["default"], float(scaling["default"]))
    return out


def loradb_scales(path):
    r = subprocess.run([TOOL, "peft-scales", path], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    out = {}
    for line in r.stdout.splitlines():
        key, rank, scale = line.split()
        out[key] = (int(rank), float(scale))
    return out, ""


def check_case(tmp, case, model, **save_kwargs):
    """Scales agree with PEFT's; the re-export is byte-identical and PEFT loads it to the same
    outputs."""
    path = os.path.join(tmp, case)
    model.save_pretrained(path, **save_kwargs)
    want = peft_scales(model)
    got, err = loradb_scales(path)
    if got is None:
        fail(f"{case}: loradb could not read the PEFT dir: {err}")
        return
    if set(got) != set(want):
        fail(f"{case}: modules differ: loradb {sorted(got)} vs PEFT {sorted(want)}")
    for key, (rank, scale) in want.items():
        if key in got and (got[key][0] != rank or abs(got[key][1] - scale) > 1e-12):
            fail(f"{case}: {key}: loradb rank/scale {got[key]} vs PEFT {(rank, scale)}")

    out = os.path.join(tmp, case + ".out")
    r = subprocess.run([TOOL, "peft-rewrite", path, out], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{case}: rewrite failed: {r.stderr.strip()}")
        return
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        a = open(os.path.join(path, f), "rb").read()
        b = open(os.path.join(out, f), "rb").read()
        if a != b:
            fail(f"{case}: re-exported {f} differs from PEFT's")
    ids = torch.arange(10).reshape(1, 10)
    with torch.no_grad():
        expected = model.eval()(ids).logits
        reloaded = PeftModel.from_pretrained(tiny_model(), out).eval()
        actual = reloaded(ids).logits
    if not torch.equal(expected, actual):
        fail(f"{case}: PEFT output differs after loradb's re-export")
    print(f"{case}: {len(want)} modules agree")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for case, kwargs in CASES.items():
            model = get_peft_model(tiny_model(), LoraConfig(init_lora_weights=False, **kwargs))
            check_case(tmp, case, model, save_embedding_layers=False)
        # Features beyond plain LoRA are kept too: the full embedding weights PEFT saves beside
        # an embedding LoRA, and DoRA magnitudes.
        check_case(tmp, "embedding_with_base", get_peft_model(
            tiny_model(), LoraConfig(init_lora_weights=False, **CASES["embedding"])))
        check_case(tmp, "dora", get_peft_model(tiny_model(), LoraConfig(
            r=2, target_modules=["q_proj", "v_proj"], use_dora=True, init_lora_weights=False)))
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("all PEFT oracle checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

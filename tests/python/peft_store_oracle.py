#!/usr/bin/env python3
# loradb-test: args=loradb_cli timeout=600
"""Oracle test: PEFT adapters through the loradb store and back, checked by Hugging Face PEFT.

usage: peft_store_oracle.py LORADB_CLI

A tiny Qwen3 (built with transformers, saved with its config.json) gets PEFT LoRA adapters:
F32 with rank/alpha patterns, rsLoRA and an embedding LoRA; and a BF16 one. Each goes through
`loradb import` into a fresh store and `loradb export` out again. Checks: every tensor of the
export is bit-identical to the original; `peft` loads the export onto the same base and the
model's logits equal the original adapter's exactly; `show --json` reports the import; a
mismatched base is refused and leaves the store unchanged; `verify` passes.
Exit status 77 (ctest: skipped) when torch / transformers / peft / safetensors are missing.
"""
import json
import os
import sys
import tempfile

try:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import Qwen3Config, Qwen3ForCausalLM
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

from peft_cli_util import fail, finish, loradb_runner  # noqa: E402

loradb = loradb_runner(sys.argv[1])


def tiny_base(tmp, name, hidden=32):
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=hidden, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      max_position_embeddings=64, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).eval()
    path = os.path.join(tmp, name)
    model.save_pretrained(path)
    return path


def load_base(path, dtype):
    return Qwen3ForCausalLM.from_pretrained(path, torch_dtype=dtype).eval()


def make_adapter(base_path, out, dtype, lora_cfg, seed):
    model = load_base(base_path, dtype)
    pm = get_peft_model(model, lora_cfg)
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.05)
    # A targeted embedding makes PEFT also save the full embedding weights unless told not to;
    # loradb stores LoRA weights only (and refuses the full weights by name).
    pm.save_pretrained(out, save_embedding_layers=False)
    return pm.eval()


def logits(model):
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def check_case(tmp, store, base_path, name, dtype, lora_cfg, seed):
    src = os.path.join(tmp, f"{name}-src")
    original = make_adapter(base_path, src, dtype, lora_cfg, seed)
    ref_logits = logits(original)
    policy = f"oracle/{name}"
    p = loradb(store, "import", "--policy", policy, "--base", "qwen3-tiny", "--alias", "serving",
               src, "--json")
    info = json.loads(p.stdout)
    st = load_file(os.path.join(src, "adapter_model.safetensors"))
    for key, want in (("policy", policy), ("seq", 1), ("base", "qwen3-tiny"),
                      ("tensors", len(st))):
        if info.get(key) != want:
            fail(f"{name}: import --json {key} = {info.get(key)!r}, want {want!r}")
    shown = json.loads(loradb(store, "show", "--json", f"{policy}:serving").stdout)
    if shown.get("id") != info.get("id") or "serving" not in shown.get("aliases", []):
        fail(f"{name}: show {policy}:serving = {shown}")

    out = os.path.join(tmp, f"{name}-export")
    loradb(store, "export", f"{policy}:serving", out)
    back = load_file(os.path.join(out, "adapter_model.safetensors"))
    if sorted(back) != sorted(st):
        fail(f"{name}: exported tensor names differ: {sorted(set(back) ^ set(st))}")
    for k, v in st.items():
        w = back.get(k)
        if w is None:
            continue
        if w.dtype != v.dtype or w.shape != v.shape or not torch.equal(
                w.view(torch.uint8) if w.dtype != torch.bool else w,
                v.view(torch.uint8) if v.dtype != torch.bool else v):
            fail(f"{name}: tensor {k} is not bit-identical after the round trip")
    with open(os.path.join(src, "adapter_config.json")) as a, \
            open(os.path.join(out, "adapter_config.json")) as b:
        if json.load(a) != json.load(b):
            fail(f"{name}: adapter_config.json changed in the round trip")

    reloaded = PeftModel.from_pretrained(load_base(base_path, dtype), out).eval()
    got = logits(reloaded)
    if not torch.equal(got, ref_logits):
        fail(f"{name}: logits of the exported adapter differ from the original "
             f"(max abs diff {(got.float() - ref_logits.float()).abs().max().item()})")
    # A LoRA that changes nothing would make the logits check vacuous.
    plain = logits(load_base(base_path, dtype))
    if torch.equal(plain, ref_logits):
        fail(f"{name}: the adapter does not change the base's logits (test is vacuous)")
    print(f"ok: {name}: {len(st)} tensors bit-exact, logits identical")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        base_path = tiny_base(tmp, "base")
        store = os.path.join(tmp, "store")
        loradb(store, "init")
        loradb(store, "base", "add", "qwen3-tiny", "--config",
               os.path.join(base_path, "config.json"), "--weights",
               os.path.join(base_path, "model.safetensors"))

        check_case(tmp, store, base_path, "f32-patterns", torch.float32,
                   LoraConfig(r=8, lora_alpha=16, use_rslora=True,
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                              "gate_proj", "up_proj", "down_proj",
                                              "embed_tokens"],
                              rank_pattern={"v_proj": 4, "layers.1.mlp.down_proj": 2},
                              alpha_pattern={"k_proj": 3}), seed=1)
        check_case(tmp, store, base_path, "bf16", torch.bfloat16,
                   LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]), seed=2)

        # An adapter for a wider base is refused (compatibility rule) and changes nothing.
        wide_path = tiny_base(tmp, "wide", hidden=48)
        wide_src = os.path.join(tmp, "wide-src")
        make_adapter(wide_path, wide_src, torch.float32,
                     LoraConfig(r=2, lora_alpha=2, target_modules=["q_proj"]), seed=3)
        before = loradb(store, "ls", "--json", "--limit", "0").stdout
        p = loradb(store, "import", "--policy", "oracle/wide", "--base", "qwen3-tiny", wide_src,
                   ok=False)
        if p.returncode != 1 or not p.stderr.startswith("error:"):
            fail(f"mismatched import: rc {p.returncode}, stderr {p.stderr!r}")
        if loradb(store, "ls", "--json", "--limit", "0").stdout != before:
            fail("mismatched import changed the revision list")
        if loradb(store, "show", "oracle/wide:latest", ok=False).returncode != 1:
            fail("mismatched import created its policy")

        v = json.loads(loradb(store, "verify", "--json").stdout)
        if not v.get("ok") or v.get("live_revisions") != 2:
            fail(f"verify: {v}")

    finish("peft_store_oracle")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# loradb-test: args=loradb_cli timeout=900
"""Oracle test: every PEFT LoRA feature through `loradb import` / `export`, checked by peft.

usage: peft_features_oracle.py LORADB_CLI

Adapters are made with peft itself on tiny models made with transformers (no downloads):
GPT-2 (Conv1D, fan_in_fan_out), a DistilBERT classifier (modules_to_save), and a Qwen3 with
DoRA, lora_bias, embedding + lm_head LoRA (full base_layer weights saved too),
trainable_token_indices and modules_to_save on lm_head; and a Qwen3-MoE with target_parameters
on the fused experts (gate_up_proj, down_proj) with rank and alpha patterns. Checks:
- `inspect DIR --json` reads each and names its features;
- import then export reproduces every tensor byte for byte (names, dtypes, shapes, bytes) and
  adapter_config.json field for field; `show --json` describes the revision;
- peft loads each Qwen3 export and gives the original adapter's logits exactly;
- target_parameters: stored in the packed layout; `export --layout per-expert` writes
  experts.{e}.gate_proj/up_proj/down_proj LoRA whose delta weights equal peft's fused deltas;
- bad inputs (a target parameter the base lacks, an expert count that disagrees with the base,
  a DoRA magnitude of the wrong shape) fail with one `error:` line and change nothing;
- the decoder (`loradb generate`, when built with compute) refuses a lora_bias revision naming
  lora_bias (DoRA and the other features it applies are checked by peft_serving_oracle.py).
Exit status 77 (ctest: skipped) when torch / transformers / peft / safetensors are missing.
"""
import json
import os
import shutil
import sys
import tempfile
import warnings

try:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from peft.utils.other import get_pattern_key
    from safetensors.torch import load_file, save_file
    from transformers import (AutoConfig, AutoModelForCausalLM, DistilBertConfig,
                              DistilBertForSequenceClassification, GPT2Config, GPT2LMHeadModel,
                              Qwen3Config, Qwen3ForCausalLM)
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

warnings.filterwarnings("ignore")
from peft_cli_util import fail, finish, loradb_runner  # noqa: E402

loradb = loradb_runner(sys.argv[1])


def randomize(pm, seed):
    """Non-zero LoRA weights (peft initialises B to zero), so every tensor matters."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p) * 0.05 + (1.0 if "magnitude" in n else 0.0))


def module_table(model, family, prefix_strip="", extra=None):
    """The base's module table: every nn.Linear / Conv1D / Embedding with its in and out."""
    mods = []
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        if w is None or w.dim() != 2:
            continue
        kind = type(m).__name__
        if kind == "Conv1D":
            inf, outf = w.shape  # Conv1D stores [in, out]
        elif kind == "Embedding":
            inf, outf = w.shape  # lora_embedding_A is [r, vocab], B [dim, r]
        else:
            outf, inf = w.shape
        if prefix_strip and name.startswith(prefix_strip):
            name = name[len(prefix_strip):]
        mods.append({"name": name, "in": int(inf), "out": int(outf)})
    mods.extend(extra or [])
    mods.sort(key=lambda m: m["name"])
    return {"modules": mods, "architecture": {"family": family}}


def add_table_base(tmp, store, name, table):
    path = os.path.join(tmp, f"{name}-modules.json")
    with open(path, "w") as f:
        json.dump(table, f)
    loradb(store, "base", "add", name, "--modules", path)


def tensors_equal(a_dir, b_dir):
    """Byte-for-byte equality of two adapter_model.safetensors: names, dtypes, shapes, bytes."""
    a = load_file(os.path.join(a_dir, "adapter_model.safetensors"))
    b = load_file(os.path.join(b_dir, "adapter_model.safetensors"))
    problems = []
    if sorted(a) != sorted(b):
        problems.append(f"names differ: {sorted(set(a) ^ set(b))}")
    for k, v in a.items():
        w = b.get(k)
        if w is None:
            continue
        if w.dtype != v.dtype or w.shape != v.shape or not torch.equal(
                w.contiguous().view(torch.uint8), v.contiguous().view(torch.uint8)):
            problems.append(f"{k} differs")
    return problems


def configs_equal(a_dir, b_dir):
    with open(os.path.join(a_dir, "adapter_config.json")) as a, \
            open(os.path.join(b_dir, "adapter_config.json")) as b:
        return json.load(a) == json.load(b)


def round_trip(tmp, store, base, name, src, want_features):
    """inspect, import, show, export; returns the export directory."""
    info = json.loads(loradb(store, "inspect", src, "--json").stdout)
    feats = " ".join(info.get("features", []))
    for f in want_features:
        if f not in feats:
            fail(f"{name}: inspect features {info.get('features')} lack {f!r}")
    policy = f"feat/{name}"
    rev = json.loads(loradb(store, "import", "--policy", policy, "--base", base, "--alias",
                            "prod", src, "--json").stdout)
    n = len(load_file(os.path.join(src, "adapter_model.safetensors")))
    shown = json.loads(loradb(store, "show", "--json", f"{policy}:prod").stdout)
    if shown.get("id") != rev.get("id") or shown.get("base") != base:
        fail(f"{name}: show = {shown}")
    out = os.path.join(tmp, f"{name}-export")
    loradb(store, "export", f"{policy}:prod", out)
    for p in tensors_equal(src, out):
        fail(f"{name}: round trip: {p}")
    if not configs_equal(src, out):
        fail(f"{name}: adapter_config.json changed in the round trip")
    # The stored blob inspects too, with the same features (a target_parameters adapter is
    # stored per expert, so it no longer uses that feature).
    blob = json.loads(loradb(store, "inspect", shown["blob_path"], "--json").stdout)
    stored = [f for f in info.get("features", []) if not f.startswith("target_parameters")]
    if blob.get("features") != stored:
        fail(f"{name}: blob features {blob.get('features')} != dir {info.get('features')}")
    print(f"ok: {name}: {n} tensors bit-exact, config equal, features {info.get('features')}")
    return out, rev


def expect_refused(store, what, args, needle):
    before = loradb(store, "ls", "--json", "--limit", "0").stdout
    p = loradb(store, *args, ok=False)
    lines = p.stderr.strip().splitlines()
    if p.returncode != 1 or len(lines) != 1 or not lines[0].startswith("error:") \
            or needle not in lines[0]:
        fail(f"{what}: rc {p.returncode}, stderr {p.stderr!r} (want one error line naming "
             f"{needle!r})")
    else:
        print(f"ok: {what}: {lines[0]}")
    if loradb(store, "ls", "--json", "--limit", "0").stdout != before:
        fail(f"{what}: the refused import changed the revision list")


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


# ---- dense / encoder bases


def gpt2_case(tmp, store):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64,
                                       n_positions=32, bos_token_id=0, eos_token_id=0))
    add_table_base(tmp, store, "gpt2-tiny", module_table(model, "gpt2"))
    pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"],
                                          fan_in_fan_out=True))
    randomize(pm, 1)
    src = os.path.join(tmp, "gpt2-src")
    pm.save_pretrained(src)
    round_trip(tmp, store, "gpt2-tiny", "gpt2", src, [])


def distilbert_case(tmp, store):
    torch.manual_seed(0)
    model = DistilBertForSequenceClassification(DistilBertConfig(
        vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_position_embeddings=32,
        num_labels=3))
    add_table_base(tmp, store, "distilbert-tiny", module_table(model, "distilbert"))
    pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_lin", "v_lin"],
                                          task_type="SEQ_CLS"))
    randomize(pm, 2)
    src = os.path.join(tmp, "distilbert-src")
    pm.save_pretrained(src)
    round_trip(tmp, store, "distilbert-tiny", "distilbert", src, ["modules_to_save"])


def qwen3_cases(tmp, store):
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      max_position_embeddings=64, tie_word_embeddings=False)
    base_dir = os.path.join(tmp, "qwen3")
    Qwen3ForCausalLM(cfg).save_pretrained(base_dir)
    loradb(store, "base", "add", "qwen3-tiny", "--config", os.path.join(base_dir, "config.json"),
           "--weights", os.path.join(base_dir, "model.safetensors"))
    ids = [1, 5, 9, 13, 17, 21]
    plain = logits(Qwen3ForCausalLM.from_pretrained(base_dir).eval(), ids)
    cases = {
        "dora": (dict(target_modules=["q_proj", "v_proj", "embed_tokens"], use_dora=True),
                 ["DoRA", "embedding LoRA", "base_layer"]),
        "lora-bias": (dict(target_modules=["q_proj", "o_proj"], lora_bias=True), ["lora_bias"]),
        "embedding": (dict(target_modules=["q_proj", "embed_tokens", "lm_head"]),
                      ["embedding LoRA", "base_layer"]),
        "tokens": (dict(target_modules=["q_proj"], trainable_token_indices=[1, 5, 7]),
                   ["trainable_token_indices"]),
        "mts-lm-head": (dict(target_modules=["q_proj"], modules_to_save=["lm_head"]),
                        ["modules_to_save"]),
    }
    exports = {}
    for i, (name, (kwargs, feats)) in enumerate(cases.items()):
        pm = get_peft_model(Qwen3ForCausalLM.from_pretrained(base_dir),
                            LoraConfig(r=4, lora_alpha=8, **kwargs))
        randomize(pm, 10 + i)
        src = os.path.join(tmp, f"{name}-src")
        pm.save_pretrained(src)
        want = logits(pm.eval(), ids)
        out, rev = round_trip(tmp, store, "qwen3-tiny", name, src, feats)
        exports[name] = (out, rev)
        got = logits(PeftModel.from_pretrained(Qwen3ForCausalLM.from_pretrained(base_dir),
                                               out).eval(), ids)
        if not torch.equal(got, want):
            fail(f"{name}: peft on the export gives other logits "
                 f"(max abs diff {(got - want).abs().max().item()})")
        if torch.equal(want, plain):
            fail(f"{name}: the adapter does not change the logits (test is vacuous)")

    # A DoRA magnitude of the wrong shape is refused by name; nothing is stored.
    bad = os.path.join(tmp, "dora-bad")
    shutil.copytree(os.path.join(tmp, "dora-src"), bad)
    st = load_file(os.path.join(bad, "adapter_model.safetensors"))
    key = next(k for k in st if k.endswith("q_proj.lora_magnitude_vector"))
    st[key] = st[key][:-3].clone()
    save_file(st, os.path.join(bad, "adapter_model.safetensors"), metadata={"format": "pt"})
    expect_refused(store, "DoRA magnitude of the wrong shape",
                   ["import", "--policy", "feat/dora-bad", "--base", "qwen3-tiny", bad],
                   "DoRA magnitude")

    # The decoder cannot apply lora_bias: it refuses the revision, naming it.
    if " generate " in loradb(store, "--help", ok=False).stdout:
        p = loradb(store, "generate", "--model", base_dir, "--prompt-ids", "1,2,3",
                   "--max-tokens", "2", "--adapter", "feat/lora-bias:prod", "--json", ok=False)
        text = p.stdout + p.stderr
        if "lora_bias" not in text or "decoder" not in text:
            fail(f"decoder on a lora_bias revision: rc {p.returncode}, output {text!r}")
        else:
            print("ok: the decoder refuses the lora_bias revision naming lora_bias")
    else:
        print("note: loradb built without compute; decoder refusal not checked")


# ---- MoE: target_parameters on the fused experts

E, H, I = 4, 32, 24  # experts, hidden, moe_intermediate (distinct so shapes tell params apart)


def moe_model(experts, seed):
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model("qwen3_moe", vocab_size=64, hidden_size=H, intermediate_size=40,
                               moe_intermediate_size=I, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=8, num_experts=experts,
                               num_experts_per_tok=2, max_position_embeddings=64)
    return AutoModelForCausalLM.from_config(cfg)


def moe_table(model, experts):
    """The module table loradb derives for a qwen3_moe base (per-expert modules)."""
    nl = model.config.num_hidden_layers
    extra = []
    for layer in range(nl):
        for e in range(experts):
            p = f"layers.{layer}.mlp.experts.{e}."
            extra += [{"name": p + "gate_proj", "in": H, "out": I},
                      {"name": p + "up_proj", "in": H, "out": I},
                      {"name": p + "down_proj", "in": I, "out": H}]
    t = module_table(model, "qwen3_moe", prefix_strip="model.", extra=extra)
    t["architecture"].update({"hidden_size": H, "intermediate_size": I, "num_experts": experts,
                              "num_layers": nl})
    return t


def delta(a, b, scale):
    return scale * (b.double() @ a.double())


def moe_case(tmp, store):
    model = moe_model(E, 0)
    add_table_base(tmp, store, "moe-tiny", moe_table(model, E))
    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"],
                      target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
                      rank_pattern={"down_proj": 2}, alpha_pattern={"gate_up_proj": 12})
    pm = get_peft_model(model, lcfg)
    randomize(pm, 3)
    src = os.path.join(tmp, "moe-src")
    pm.save_pretrained(src)
    st = load_file(os.path.join(src, "adapter_model.safetensors"))
    print("target_parameters tensors:", {k: tuple(v.shape) for k, v in st.items()
                                         if "experts" in k and "layers.0." in k})
    out, rev = round_trip(tmp, store, "moe-tiny", "moe", src, [])
    if rev.get("layout") != "packed":
        fail(f"moe: stored layout {rev.get('layout')!r}, want packed")

    # The per-expert layout: delta weights equal peft's fused ones.
    per = os.path.join(tmp, "moe-per-expert")
    loradb(store, "export", "--layout", "per-expert", "feat/moe:prod", per)
    with open(os.path.join(per, "adapter_config.json")) as f:
        pcfg = json.load(f)
    if pcfg.get("target_parameters"):
        fail(f"moe per-expert: target_parameters still set: {pcfg.get('target_parameters')}")
    for m in ("gate_proj", "up_proj", "down_proj", "q_proj"):
        if m not in pcfg.get("target_modules", []):
            fail(f"moe per-expert: target_modules {pcfg.get('target_modules')} lack {m}")
    pst = load_file(os.path.join(per, "adapter_model.safetensors"))

    def per_expert_scale(key):
        r = pcfg["r"]
        alpha = pcfg["lora_alpha"]
        k = get_pattern_key(pcfg.get("rank_pattern", {}).keys(), key)
        r = pcfg["rank_pattern"].get(k, r)
        k = get_pattern_key(pcfg.get("alpha_pattern", {}).keys(), key)
        alpha = pcfg["alpha_pattern"].get(k, alpha)
        return alpha / r, r

    worst = 0.0
    checked = 0
    for name, mod in pm.named_modules():
        if type(mod).__name__ != "ParamWrapper":
            continue
        fused = mod.get_delta_weight("default").double()  # [E, out, in]
        layer_key = name[len("base_model.model."):].replace(".base_layer", "")
        parts = ([("gate_proj", 0, I), ("up_proj", I, 2 * I)] if mod.parameter_name ==
                 "gate_up_proj" else [("down_proj", 0, H)])
        for e in range(E):
            for part, lo, hi in parts:
                key = f"{layer_key}.{e}.{part}"
                scale, r = per_expert_scale(key)
                a = pst[f"base_model.model.{key}.lora_A.weight"]
                b = pst[f"base_model.model.{key}.lora_B.weight"]
                if a.shape[0] != r:
                    fail(f"moe per-expert {key}: rank {a.shape[0]}, config gives {r}")
                d = delta(a, b, scale)
                want = fused[e, lo:hi]
                err = ((d - want).abs().max() / want.abs().max()).item()
                worst = max(worst, err)
                checked += 1
    if checked != 2 * E * 3 or worst > 1e-6:
        fail(f"moe per-expert: {checked} deltas checked, max rel err {worst:.3g}")
    else:
        print(f"ok: moe per-expert: {checked} per-expert deltas equal peft's fused deltas "
              f"(max rel err {worst:.2g})")
    # Non-expert tensors pass through unchanged.
    for k, v in st.items():
        if "experts" not in k and not torch.equal(v, pst.get(k, torch.empty(0))):
            fail(f"moe per-expert: {k} changed")

    # A parameter the base lacks.
    bad = os.path.join(tmp, "moe-bad-param")
    shutil.copytree(src, bad)
    with open(os.path.join(bad, "adapter_config.json")) as f:
        c = json.load(f)
    c["target_parameters"] = c["target_parameters"] + ["mlp.experts.gate_proj_fused"]
    with open(os.path.join(bad, "adapter_config.json"), "w") as f:
        json.dump(c, f)
    expect_refused(store, "target_parameters naming a parameter the base lacks",
                   ["import", "--policy", "feat/moe-bad", "--base", "moe-tiny", bad],
                   "mlp.experts.gate_proj_fused")
    # An adapter for 3 experts into the 4-expert base.
    src3 = os.path.join(tmp, "moe3-src")
    pm3 = get_peft_model(moe_model(3, 1), LoraConfig(
        r=4, lora_alpha=8, target_modules=[], target_parameters=["mlp.experts.down_proj"]))
    randomize(pm3, 4)
    pm3.save_pretrained(src3)
    expect_refused(store, "expert count that disagrees with the base",
                   ["import", "--policy", "feat/moe3", "--base", "moe-tiny", src3], "experts")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        loradb(store, "init")
        gpt2_case(tmp, store)
        distilbert_case(tmp, store)
        qwen3_cases(tmp, store)
        moe_case(tmp, store)
        v = json.loads(loradb(store, "verify", "--json").stdout)
        if not v.get("ok"):
            fail(f"verify: {v}")
    finish("peft_features_oracle")


if __name__ == "__main__":
    main()

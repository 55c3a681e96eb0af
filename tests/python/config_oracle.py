#!/usr/bin/env python3
# loradb-test: args=loradb_cli timeout=900 requires=loradb_compute
"""Oracle test for config.json reading (storage/formats/model_config) against transformers.

Bases are made by transformers itself: `AutoModelForCausalLM.from_config(cfg)` with a seeded
generator, weights perturbed so every parameter (biases and norms included) matters, then
`save_pretrained`. Dense and MoE, a non-default rope theta, explicit and default head_dim
(qwen3's default is 128, qwen3_moe's hidden_size // num_attention_heads), default rope theta,
tied and untied heads, attention biases. For each: `loradb base add` registers it, `loradb
generate --json --logits` decodes two prompts in one batch, and transformers (fp32, eager)
computes the logits of prompt + generated tokens: max relative error (max |ours - ref| /
max |ref| per position) < 1e-4 and the greedy tokens equal the reference's argmax (where its
top-2 gap is not a tie). The same config rewritten in the transformers 4 layout (top-level
rope_theta, rope_scaling, torch_dtype, num_experts) gives identical logits in loradb and the
same logits in transformers. A negative control shows the comparison would catch a wrong
theta (the original bug: transformers 5's rope_parameters ignored).

Settings loradb does not compute, each saved by transformers (scaled RoPE types, an unknown
rope_type, sliding-window layers, another activation, partial rotary factor, quantized
weights), are refused by `loradb base add` and `loradb model info` with one error line naming
the key and its value, and leave the store's base list unchanged.

usage: config_oracle.py LORADB_CLI
Exit code 77 (ctest: skipped) when torch or transformers cannot be imported.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (tools/dev setup installs torch and transformers)")
    sys.exit(77)

BOUND = 1e-4
MAX_TOKENS = 4
VOCAB = 96
PROMPTS = [[3, 17, 95, 42, 0, 51, 7], [5, 6, 7, 8, 90, 64]]
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2)
MOE = dict(SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)

# name -> (config class, kwargs, config.json keys to drop after saving)
BASES = {
    # rope theta 123456 in rope_parameters, explicit head_dim (not hidden / heads), untied head,
    # q/k/v/o biases.
    "dense-theta": (Qwen3Config, dict(SMALL, num_hidden_layers=2, head_dim=16,
                                      rope_parameters={"rope_type": "default",
                                                       "rope_theta": 123456.0},
                                      attention_bias=True, tie_word_embeddings=False), []),
    # No head_dim and no RoPE keys in the file: transformers' qwen3 defaults (head_dim 128,
    # theta 10000) apply; tied head.
    "dense-defaults": (Qwen3Config, dict(SMALL, num_hidden_layers=2, tie_word_embeddings=True),
                       ["head_dim", "rope_parameters"]),
    # MoE with a dense layer between sparse ones, normalised top-k, default head_dim (8).
    "moe-theta": (Qwen3MoeConfig, dict(MOE, num_hidden_layers=3, mlp_only_layers=[1],
                                       norm_topk_prob=True,
                                       rope_parameters={"rope_type": "default",
                                                        "rope_theta": 250000.0}), []),
    # MoE with an explicit head_dim, tied head, un-normalised top-k.
    "moe-head-dim": (Qwen3MoeConfig, dict(MOE, num_hidden_layers=2, head_dim=12,
                                          tie_word_embeddings=True, norm_topk_prob=False), []),
}

# Configs loradb must refuse: (name, config class, kwargs, config.json patch, wanted substrings).
REFUSED = [
    ("rope-yarn", Qwen3Config,
     dict(rope_parameters={"rope_type": "yarn", "factor": 4.0,
                           "original_max_position_embeddings": 16}), {},
     ["rope_parameters.rope_type", '"yarn"']),
    ("rope-linear-v4", Qwen3Config, {}, {"rope_parameters": None, "rope_theta": 10000.0,
                                         "rope_scaling": {"type": "linear", "factor": 2.0}},
     ["rope_scaling.type", '"linear"']),
    ("rope-unknown", Qwen3Config, dict(rope_parameters={"rope_type": "nonsense"}), {},
     ["rope_parameters.rope_type", '"nonsense"']),
    ("sliding", Qwen3Config, dict(use_sliding_window=True, sliding_window=8,
                                  max_window_layers=1), {},
     ["layer_types[1]", '"sliding_attention"']),
    ("sliding-v4", Qwen3Config, dict(use_sliding_window=True, sliding_window=8,
                                     max_window_layers=1), {"layer_types": None},
     ["use_sliding_window", "sliding_window 8", "max_window_layers 1"]),
    ("sliding-moe", Qwen3MoeConfig, dict(use_sliding_window=True, sliding_window=8), {},
     ["use_sliding_window", "sliding_window 8"]),
    ("gelu", Qwen3Config, dict(hidden_act="gelu_pytorch_tanh"), {},
     ["hidden_act", '"gelu_pytorch_tanh"']),
    ("partial-rotary", Qwen3Config, {}, {"partial_rotary_factor": 0.5},
     ["partial_rotary_factor", "0.5"]),
    ("quantized", Qwen3Config, {}, {"quantization_config": {"quant_method": "fp8"}},
     ["quantization_config", "fp8"]),
]


def run(*args, ok=True):
    out = subprocess.run(list(args), capture_output=True, text=True)
    if ok and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {out.stderr.strip()}")
    return out


def make_base(out_dir, cls, kwargs, drop, seed):
    """A transformers checkpoint with seeded random weights (biases and norms included)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cls(**kwargs), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.5)
            elif "norm" in name:
                p.copy_(1 + torch.randn_like(p) * 0.2)
    model.save_pretrained(out_dir)
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    for key in drop:
        del cfg[key]
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return cfg


def as_transformers4(src, dst):
    """The same checkpoint with config.json in the layout transformers 4 writes."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters", None)
    if rope is not None:
        cfg["rope_theta"] = rope["rope_theta"]
    cfg["rope_scaling"] = None
    cfg["torch_dtype"] = cfg.pop("dtype")
    if "num_local_experts" in cfg:
        cfg["num_experts"] = cfg.pop("num_local_experts")
    cfg.pop("layer_types", None)
    cfg["transformers_version"] = "4.57.1"
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return cfg


def ref_logits(model_dir, ids, **overrides):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager", **overrides)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].to(torch.float64)


def max_rel_err(ours, ref):
    return ((ours - ref).abs().amax(dim=-1) / ref.abs().amax(dim=-1)).max().item()


def generate(cli, store, model_dir):
    args = [cli, "--store", store, "generate", "--model", model_dir, "--max-tokens",
            str(MAX_TOKENS), "--logits", "--json"]
    for p in PROMPTS:
        args += ["--prompt-ids", ",".join(map(str, p))]
    return json.loads(run(*args).stdout)["results"]


def check_base(cli, tmp, name, cls, kwargs, drop, seed, failures):
    model_dir = os.path.join(tmp, name)
    cfg = make_base(model_dir, cls, kwargs, drop, seed)
    v4_dir = os.path.join(tmp, name + "-v4")
    as_transformers4(model_dir, v4_dir)
    store = os.path.join(tmp, name + "-store")
    run(cli, "--store", store, "init")
    for base, d in ((name, model_dir), (name + "-v4", v4_dir)):
        run(cli, "--store", store, "base", "add", base, "--config", os.path.join(d, "config.json"),
            "--weights", os.path.join(d, "model.safetensors"))
    bases = {b["name"]: b for b in json.loads(run(cli, "--store", store, "base", "ls",
                                                  "--json").stdout)}
    arch5, arch4 = ({k: v for k, v in bases[b].items() if k not in ("name", "created_us")}
                    for b in (name, name + "-v4"))
    if arch5 != arch4:
        failures.append(f"{name}: base records differ between layouts: {arch5} vs {arch4}")
    hf = transformers.AutoConfig.from_pretrained(model_dir)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    ours_head_dim = arch5["architecture"]["head_dim"]
    if ours_head_dim != head_dim:
        failures.append(f"{name}: base head_dim {ours_head_dim}, transformers {head_dim}")
    results = generate(cli, store, model_dir)
    results4 = generate(cli, store, v4_dir)
    if results4 != results:
        failures.append(f"{name}: transformers 4 and 5 layouts give different loradb output")
    for p, res in zip(PROMPTS, results):
        toks = res["tokens"]
        ours = torch.tensor(res["logits"], dtype=torch.float64)
        seq = p + toks[:-1]
        want = ref_logits(model_dir, seq)
        want4 = ref_logits(v4_dir, seq)
        err, err4 = max_rel_err(ours, want), max_rel_err(ours, want4)
        top2 = want[len(p) - 1:].topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 1e-3 * want.abs().amax()
        agree = (torch.tensor(toks) == want[len(p) - 1:].argmax(-1)) | ~clear
        ok = (err < BOUND and err4 < BOUND and ours.shape == want.shape and bool(agree.all()))
        print(json.dumps({"base": name, "prompt": p, "positions": ours.shape[0],
                          "max_rel_err": err, "max_rel_err_v4_layout": err4, "bound": BOUND,
                          "tokens": toks, "ok": ok}))
        if not ok:
            failures.append(f"{name} prompt {p}: max rel err {err:.3g} (v4 layout {err4:.3g}), "
                            f"tokens agree {bool(agree.all())}")
    # Negative control: transformers with RoPE's theta at 1/100 of the value disagrees with loradb by
    # far more than the bound, so a theta loradb failed to read would be caught.
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    other = Qwen3Config if cls is Qwen3Config else Qwen3MoeConfig
    wrong = other.from_pretrained(model_dir)
    wrong.rope_parameters = {"rope_type": "default", "rope_theta": theta / 100}
    seq = PROMPTS[0] + results[0]["tokens"][:-1]
    ctrl = max_rel_err(torch.tensor(results[0]["logits"], dtype=torch.float64),
                       ref_logits(model_dir, seq, config=wrong))
    print(json.dumps({"base": name, "case": "control (transformers with another theta)",
                      "max_rel_err": ctrl}))
    if not ctrl > 100 * BOUND:
        failures.append(f"{name}: a wrong rope theta changes the logits by only {ctrl:.3g}")


def check_refused(cli, tmp, failures):
    store = os.path.join(tmp, "refused-store")
    run(cli, "--store", store, "init")
    run(cli, "--store", store, "base", "add", "good", "--config",
        os.path.join(tmp, "dense-theta", "config.json"))
    before = run(cli, "--store", store, "base", "ls", "--json").stdout
    for name, cls, kwargs, patch, want in REFUSED:
        d = os.path.join(tmp, "refused-" + name)
        base_kwargs = MOE if cls is Qwen3MoeConfig else SMALL
        cls(**dict(base_kwargs, num_hidden_layers=2, **kwargs)).save_pretrained(d)
        path = os.path.join(d, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        for k, v in patch.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)
        for what, args in (("base add", ["--store", store, "base", "add", name, "--config",
                                         path]),
                           ("model info", ["model", "info", "--model", d])):
            p = run(cli, *args, ok=False)
            lines = p.stderr.strip().splitlines()
            ok = (p.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:") and
                  all(w in lines[0] for w in want))
            print(json.dumps({"refused": name, "command": what, "rc": p.returncode,
                              "stderr": p.stderr.strip(), "ok": ok}))
            if not ok:
                failures.append(f"{name}: `loradb {what}` rc {p.returncode}, stderr "
                                f"{p.stderr.strip()!r}, want one error line naming {want}")
    if run(cli, "--store", store, "base", "ls", "--json").stdout != before:
        failures.append("a refused config changed the store's base list")


def main():
    cli = sys.argv[1]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    failures = []
    with tempfile.TemporaryDirectory(prefix="loradb-config-oracle-") as tmp:
        for i, (name, (cls, kwargs, drop)) in enumerate(BASES.items()):
            check_base(cli, tmp, name, cls, kwargs, drop, 70 + i, failures)
        check_refused(cli, tmp, failures)
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

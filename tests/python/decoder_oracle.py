#!/usr/bin/env python3
# loradb-test: args=loradb_cli,decoder_oracle_tool timeout=900 requires=loradb_compute
"""Oracle test for loradb's store-backed multi-LoRA decoder against transformers + peft.

For the tiny dense and MoE configs: `loradb model init-random` writes a base checkpoint; peft
makes two LoRA adapters on it with random non-zero A and B (one with rank/alpha patterns, one
rsLoRA); each is imported into a store (`loradb import`) and exported back (`loradb export`).
Then `loradb generate` decodes three prompts in one batch (adapter 1, adapter 2, base only)
with --logits, and transformers + peft, loading the base and the *exported* adapter, computes
the full-sequence logits of prompt + generated tokens. fp32 max relative error
(max |ours - ref| / max |ref| per position) must be < 1e-4 at every position, and the greedy
tokens must be the reference's argmax wherever its top-2 gap is clear.

On transformers >= 5 peft turns MLP targets of a qwen3_moe model into `target_parameters` on
the fused expert tensors (a feature loradb's import refuses), so the MoE adapters cover the
attention projections; expert LoRA is checked against merged weights in
tests/compute/decoder_test.cc (MoeDecoderTest).

usage: decoder_oracle.py LORADB_CLI STORE_TOOL
STORE_TOOL (tests/python/decoder_oracle_tool) stands in for `loradb base add / import /
export` when this build's CLI lacks them. Exit code 77 (skipped) when torch, transformers or
peft cannot be imported.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    import peft
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (tools/dev setup installs torch, transformers and peft)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BOUND = 1e-4
MAX_TOKENS = 6
PROMPTS = [[3, 17, 999, 42, 0, 511, 7], [5, 6, 7, 8, 900, 64], [1, 2, 1023, 5, 77]]


def run(*args):
    out = subprocess.run(list(args), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


class StoreSteps:
    """`loradb` store subcommands when the CLI has them, else the stand-in tool."""

    def __init__(self, cli, tool, store):
        self.cli, self.tool, self.store = cli, tool, store
        helptext = subprocess.run([cli, "--help"], capture_output=True, text=True).stdout
        self.native = " import " in helptext and " export " in helptext
        print(f"store steps through {'loradb CLI' if self.native else 'decoder_oracle_tool'}")

    def base_add(self, name, model_dir):
        cfg, weights = os.path.join(model_dir, "config.json"), os.path.join(model_dir,
                                                                             "model.safetensors")
        if self.native:
            run(self.cli, "--store", self.store, "init")
            run(self.cli, "--store", self.store, "base", "add", name, "--config", cfg,
                "--weights", weights)
        else:
            run(self.tool, self.store, "base-add", name, cfg, weights)

    def import_dir(self, policy, base, alias, peft_dir):
        if self.native:
            run(self.cli, "--store", self.store, "import", "--policy", policy, "--base", base,
                "--alias", alias, peft_dir)
        else:
            run(self.tool, self.store, "import", policy, base, alias, peft_dir)

    def export(self, ref, out_dir):
        if self.native:
            run(self.cli, "--store", self.store, "export", ref, out_dir)
        else:
            run(self.tool, self.store, "export", ref, out_dir)


def make_adapter(model_dir, out_dir, kwargs, seed):
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    model = get_peft_model(base, LoraConfig(init_lora_weights=False, **kwargs))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out_dir)


def ref_logits(model_dir, peft_dir, ids):
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                attn_implementation="eager")
    model = PeftModel.from_pretrained(base, peft_dir) if peft_dir else base
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].to(torch.float64)


def max_rel_err(ours, ref):
    return ((ours - ref).abs().amax(dim=-1) / ref.abs().amax(dim=-1)).max().item()


def main():
    cli, tool = sys.argv[1], sys.argv[2]
    print(f"transformers {transformers.__version__}, peft {peft.__version__}, "
          f"torch {torch.__version__}")
    failures = []
    mlp = ["gate_proj", "up_proj", "down_proj"]
    attn = ["q_proj", "k_proj", "v_proj", "o_proj"]
    with tempfile.TemporaryDirectory(prefix="loradb-decoder-oracle-") as tmp:
        for name in ("tiny-dense", "tiny-moe"):
            store = os.path.join(tmp, name + "-store")
            steps = StoreSteps(cli, tool, store)
            model_dir = os.path.join(tmp, name)
            run(cli, "model", "init-random", "--config",
                os.path.join(ROOT, "compute", "configs", name + ".json"), model_dir, "--seed",
                "31")
            steps.base_add(name, model_dir)
            targets = attn + mlp
            if name == "tiny-moe":
                # peft (0.18+, transformers >= 5) turns MLP targets of a qwen3_moe model into
                # target_parameters on the fused experts, which loradb refuses: attention only.
                targets = attn
            adapters = {
                "plain": dict(r=4, lora_alpha=8, target_modules=targets,
                              rank_pattern={"q_proj": 2}, alpha_pattern={"down_proj": 3}),
                "rs": dict(r=8, lora_alpha=4, use_rslora=True, target_modules=targets),
            }
            exported = {}
            for i, (aname, kwargs) in enumerate(adapters.items()):
                src = os.path.join(tmp, f"{name}-{aname}-peft")
                make_adapter(model_dir, src, kwargs, seed=40 + i)
                steps.import_dir(aname, name, "prod", src)
                out = os.path.join(tmp, f"{name}-{aname}-exported")
                steps.export(f"{aname}:prod", out)
                exported[aname] = out
            refs = ["plain:prod", "rs:prod", ""]
            args = [cli, "--store", store, "generate", "--model", model_dir, "--max-tokens",
                    str(MAX_TOKENS), "--logits", "--json"]
            for p, ref in zip(PROMPTS, refs):
                args += ["--prompt-ids", ",".join(map(str, p)), "--adapter", ref]
            results = json.loads(run(*args))["results"]
            base_logits = None
            for p, ref, res in zip(PROMPTS, refs, results):
                toks = res["tokens"]
                ours = torch.tensor(res["logits"], dtype=torch.float64)
                seq = p + toks[:-1]
                peft_dir = exported[ref.split(":")[0]] if ref else None
                want = ref_logits(model_dir, peft_dir, seq)
                err = max_rel_err(ours, want)
                ok = err < BOUND and ours.shape == want.shape
                # Greedy tokens: the reference's argmax wherever its top-2 gap is clear.
                top2 = want[len(p) - 1:].topk(2, dim=-1).values
                clear = (top2[:, 0] - top2[:, 1]) > 1e-3 * want.abs().amax()
                agree = (torch.tensor(toks) == want[len(p) - 1:].argmax(-1)) | ~clear
                ok = ok and bool(agree.all())
                print(json.dumps({"model": name, "adapter": ref or "base",
                                  "positions": ours.shape[0], "max_rel_err": err,
                                  "bound": BOUND, "ok": ok}))
                if not ok:
                    failures.append(f"{name} {ref or 'base'}: max rel err {err:.3g}, "
                                    f"tokens agree {bool(agree.all())}")
                if not ref:
                    base_logits = ref_logits(model_dir, None, PROMPTS[0])
            # Negative control: the adapter must matter (base logits differ from adapter 1's).
            plain = torch.tensor(results[0]["logits"], dtype=torch.float64)[:len(PROMPTS[0])]
            ctrl = max_rel_err(plain, base_logits)
            print(json.dumps({"model": name, "case": "control (adapter vs base)",
                              "max_rel_err": ctrl}))
            if not ctrl > 100 * BOUND:
                failures.append(f"{name}: adapter logits equal the base's ({ctrl:.3g})")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

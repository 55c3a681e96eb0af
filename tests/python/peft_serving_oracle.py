#!/usr/bin/env python3
# loradb-test: args=loradb_cli timeout=1200 requires=loradb_compute
"""Oracle test: the decoder serves PEFT adapters beyond plain LoRA, per row, in one mixed batch.

usage: peft_serving_oracle.py LORADB_CLI

Bases are made by transformers itself (`AutoModelForCausalLM.from_config(...).save_pretrained`):
a Qwen3 with an untied head, a Qwen3 with a tied head, and a Qwen3-MoE. Adapters are made by
peft itself on those bases (every trainable tensor randomized so each one matters): plain LoRA
on every projection, DoRA, modules_to_save=["lm_head"], modules_to_save=["embed_tokens"],
embedding LoRA (lora_embedding_A/B, with the base_layer weights peft saves beside it), DoRA on
the embedding, LoRA on lm_head (lm_head in target_modules), and on the MoE base LoRA on the
fused experts (target_parameters gate_up_proj / down_proj). `loradb import` stores each;
then ONE `loradb generate --json --logits` per base decodes every prompt with its own adapter,
plus base-only prompts, in one batch. transformers + peft (fp32, eager attention) compute the
logits of each prompt followed by the tokens loradb generated: max relative error (max |ours -
ref| / max |ref| per position) < 1e-4, and each greedy token is the reference's argmax (where
its top-2 gap is not a tie). Each adapter must change the logits (else the test is vacuous).
Exit status 77 (ctest: skipped) when torch / transformers / peft are missing.
"""
import json
import os
import sys
import tempfile
import warnings

try:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

warnings.filterwarnings("ignore")
from config_oracle import make_base, max_rel_err  # noqa: E402
from peft_cli_util import fail, finish, loradb_runner  # noqa: E402
from peft_features_oracle import randomize  # noqa: E402

BOUND = 1e-4
MAX_TOKENS = 5
VOCAB = 96
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
             initializer_range=0.2)
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]

DENSE_ADAPTERS = {
    "plain": dict(r=4, lora_alpha=8, target_modules=ALL_LINEAR, rank_pattern={"v_proj": 2}),
    "dora": dict(r=4, lora_alpha=8, target_modules=ALL_LINEAR, use_dora=True),
    "mts-lm-head": dict(r=4, lora_alpha=8, target_modules=["q_proj"],
                        modules_to_save=["lm_head"]),
    "mts-embed": dict(r=2, lora_alpha=4, target_modules=["v_proj"],
                      modules_to_save=["embed_tokens"]),
    "embed-lora": dict(r=4, lora_alpha=16, target_modules=["embed_tokens", "o_proj"]),
    "embed-dora": dict(r=2, lora_alpha=4, target_modules=["embed_tokens", "q_proj"],
                       use_dora=True),
    "lm-head-lora": dict(r=4, lora_alpha=8, target_modules=["lm_head", "k_proj"]),
    "lm-head-dora": dict(r=2, lora_alpha=2, target_modules=["lm_head", "up_proj"],
                         use_dora=True, use_rslora=True),
}
MOE_ADAPTERS = {
    "experts": dict(r=4, lora_alpha=8, target_modules=["q_proj"],
                    target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
                    rank_pattern={"down_proj": 2}, alpha_pattern={"gate_up_proj": 12}),
    "dora": dict(r=4, lora_alpha=8, target_modules=ATTENTION, use_dora=True),
    "mts-lm-head": dict(r=4, lora_alpha=8, target_modules=["o_proj"],
                        modules_to_save=["lm_head"]),
    "embed-lora": dict(r=4, lora_alpha=16, target_modules=["embed_tokens", "lm_head"]),
}
BASES = {
    # name -> (config class, config kwargs, adapters)
    "dense-untied": (Qwen3Config, dict(SMALL, num_hidden_layers=2, tie_word_embeddings=False),
                     DENSE_ADAPTERS),
    "dense-tied": (Qwen3Config, dict(SMALL, num_hidden_layers=2, tie_word_embeddings=True),
                   {k: DENSE_ADAPTERS[k] for k in
                    ("dora", "mts-lm-head", "embed-lora", "lm-head-lora", "lm-head-dora")}),
    "moe": (Qwen3MoeConfig, dict(SMALL, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=24, tie_word_embeddings=False),
            MOE_ADAPTERS),
}


def prompt(i):
    return [(7 * i + 3 * t + 1) % VOCAB for t in range(5 + i % 3)]


def load_base(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def ref_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].to(torch.float64)


def check_base(loradb, tmp, name, cls, kwargs, adapters, seed, worst):
    model_dir = os.path.join(tmp, name)
    make_base(model_dir, cls, kwargs, [], seed)
    store = os.path.join(tmp, name + "-store")
    loradb(store, "init")
    loradb(store, "base", "add", name, "--config", os.path.join(model_dir, "config.json"),
           "--weights", os.path.join(model_dir, "model.safetensors"))
    dirs = {}
    for i, (aname, akw) in enumerate(adapters.items()):
        pm = get_peft_model(load_base(model_dir), LoraConfig(**akw))
        randomize(pm, seed * 100 + i)
        src = os.path.join(tmp, f"{name}-{aname}")
        pm.save_pretrained(src)
        dirs[aname] = src
        loradb(store, "import", "--policy", f"{name}/{aname}", "--base", name, "--alias", "prod",
               src, "--json")
    # One batch: every adapter, and base-only rows first, between and last.
    rows = [""] + [f"{name}/{a}:prod" for a in adapters] + [""]
    rows.insert(len(rows) // 2, "")
    args = ["generate", "--model", model_dir, "--max-tokens", str(MAX_TOKENS), "--logits",
            "--json"]
    for i, ref in enumerate(rows):
        args += ["--prompt-ids", ",".join(map(str, prompt(i))), "--adapter", ref]
    results = json.loads(loradb(store, *args).stdout)["results"]
    base_model = load_base(model_dir)
    for i, (ref, res) in enumerate(zip(rows, results)):
        aname = ref.split("/")[1].split(":")[0] if ref else "(base only)"
        p = prompt(i)
        toks = res["tokens"]
        seq = p + toks[:-1]
        ours = torch.tensor(res["logits"], dtype=torch.float64)
        plain = ref_logits(base_model, seq)
        if ref:
            model = PeftModel.from_pretrained(load_base(model_dir), dirs[aname]).eval()
            want = ref_logits(model, seq)
        else:
            want = plain
        err = max_rel_err(ours, want) if ours.shape == want.shape else float("inf")
        top2 = want[len(p) - 1:].topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 1e-3 * want.abs().amax()
        agree = bool(((torch.tensor(toks) == want[len(p) - 1:].argmax(-1)) | ~clear).all())
        changed = max_rel_err(want, plain) if ref else None
        ok = err < BOUND and agree and (changed is None or changed > 1e-3)
        worst[aname] = max(worst.get(aname, 0.0), err)
        print(json.dumps({"base": name, "row": i, "adapter": aname, "max_rel_err": err,
                          "bound": BOUND, "adapter_effect": changed, "tokens": toks,
                          "tokens_agree": agree, "ok": ok}))
        if not ok:
            fail(f"{name} row {i} ({aname}): max rel err {err:.3g}, tokens agree {agree}, "
                 f"adapter effect {changed}")


def main():
    loradb = loradb_runner(sys.argv[1])
    worst = {}
    with tempfile.TemporaryDirectory(prefix="loradb-peft-serving-") as tmp:
        for i, (name, (cls, kwargs, adapters)) in enumerate(BASES.items()):
            check_base(loradb, tmp, name, cls, kwargs, adapters, 90 + i, worst)
    print(json.dumps({"max_rel_err_by_adapter": worst}))
    finish("peft_serving_oracle")


if __name__ == "__main__":
    main()

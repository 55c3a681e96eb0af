# The peer arm of `loradb-bench tinker peer` (bench/tinker_bench.cc): what a CPU user without
# loradb would run to train the same LoRA. Loads the bench's base checkpoint (MODEL_DIR, a
# Hugging Face Qwen3 directory) in transformers (float32, default attention), wraps it with peft
# (rank, alpha, the seven projections q/k/v/o/gate/up/down, no dropout, no bias), and times
# forward + backward + torch.optim.AdamW step on the batch loradb's arm trains (the same
# sequences, summed token cross-entropy, the same Adam parameters), with torch.set_num_threads
# THREADS. Prints {"step_s": [...], "first_loss": L}: each timed step's seconds and the loss of
# the first step (before any update), which the bench compares with loradb's.
# Exit status 77: torch, transformers or peft is not installed.
import argparse
import json
import sys
import time

try:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
except ImportError:
    sys.exit(77)

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    for name in ["rank", "batch", "length", "vocab", "warmup", "steps", "threads"]:
        ap.add_argument("--" + name, type=int, required=True)
    for name in ["alpha", "lr", "beta1", "beta2", "eps"]:
        ap.add_argument("--" + name, type=float, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=args.alpha,
                                             target_modules=MODULES, lora_dropout=0.0,
                                             bias="none"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                            weight_decay=0.0)
    # The same sequences as loradb's in-process arm: position k predicts token k + 1.
    seqs = torch.tensor([[(7 * i + 3 * k) % (args.vocab - 1) + 1 for k in range(args.length + 1)]
                         for i in range(args.batch)])
    inputs, targets = seqs[:, :-1], seqs[:, 1:]
    times, first_loss = [], None
    for i in range(args.warmup + args.steps):
        t = time.perf_counter()
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1), reduction="sum")
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i == 0:
            first_loss = loss.item()
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    print(json.dumps({"step_s": times, "first_loss": first_loss}))


if __name__ == "__main__":
    main()

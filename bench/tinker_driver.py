# The SDK arms of `loradb-bench tinker` (bench/tinker_bench.cc): LoRA training clients of the
# real `tinker` SDK against the Tinker routes served at URL, each step a forward_backward with
# cross_entropy on BATCH sequences of LENGTH tokens followed by an Adam step. Prints one JSON
# line with the measurement. Exit status 77: the SDK is not installed.
#
#   overhead URL ...: one client; {"step_s": [...]}, one entry per timed step.
#   clients URL ... --clients K --schedule parallel|sequential: K client processes, each training
#     its own run (policy) with its own data. Every client first creates its run and takes the
#     untimed warm-up steps; then the timed loops run all at once (parallel) or one after another
#     (sequential). {"wall_s": ..., "client_s": [...], "first_loss": [...], "last_loss": [...]}:
#     wall time of the timed loops, each client's loop time, and its loss:sum on its first and
#     last timed step.
import argparse
import json
import multiprocessing
import sys
import time

try:
    import tinker
    from tinker import types
except ImportError:
    sys.exit(77)


def batch_data(batch, length, vocab, offset):
    # Client `offset` trains on its own sequences: a different stride per client.
    data = []
    for i in range(batch):
        seq = [((7 + 2 * offset) * i + 3 * k + offset) % (vocab - 1) + 1 for k in range(length + 1)]
        data.append(types.Datum(model_input=types.ModelInput.from_ints(seq[:-1]),
                                loss_fn_inputs={"target_tokens": seq[1:],
                                                "weights": [1.0] * length}))
    return data


def training_client(args, seed):
    sc = tinker.ServiceClient(base_url=args.url, api_key="tml-loradb-bench")
    tc = sc.create_lora_training_client(base_model=args.base, rank=args.rank, seed=seed,
                                        train_unembed=False)
    return tc.result() if hasattr(tc, "result") else tc


def step(tc, data):
    fb = tc.forward_backward(data, "cross_entropy")
    op = tc.optim_step(types.AdamParams(learning_rate=1e-4))
    out = fb.result()
    op.result()
    return out.metrics["loss:sum"]


def overhead(args):
    tc = training_client(args, 0)
    data = batch_data(args.batch, args.length, args.vocab, 0)
    times = []
    for i in range(args.warmup + args.steps):
        t = time.perf_counter()
        step(tc, data)
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    print(json.dumps({"step_s": times}))


def client_process(args, index, ready, start, results):
    tc = training_client(args, index + 1)
    data = batch_data(args.batch, args.length, args.vocab, index)
    for _ in range(args.warmup):
        step(tc, data)
    ready.put(index)
    start.wait()
    t = time.perf_counter()
    losses = [step(tc, data) for _ in range(args.steps)]
    results.put((index, time.perf_counter() - t, losses[0], losses[-1]))


def clients(args):
    # Processes, not threads: K independent clients, as K researchers' loops would be.
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    starts = [ctx.Event() for _ in range(args.clients)]
    procs = [ctx.Process(target=client_process, args=(args, i, ready, starts[i], results))
             for i in range(args.clients)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=600)
    out = {}
    t = time.perf_counter()
    if args.schedule == "parallel":
        for s in starts:
            s.set()
        for _ in procs:
            r = results.get(timeout=3600)
            out[r[0]] = r
    else:
        for i, s in enumerate(starts):
            s.set()
            r = results.get(timeout=3600)
            out[r[0]] = r
    wall = time.perf_counter() - t
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"client process exited with status {p.exitcode}")
    order = [out[i] for i in range(args.clients)]
    print(json.dumps({"wall_s": wall, "client_s": [r[1] for r in order],
                      "first_loss": [r[2] for r in order], "last_loss": [r[3] for r in order]}))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("mode", choices=["overhead", "clients"])
    ap.add_argument("url")
    ap.add_argument("--base", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--schedule", choices=["parallel", "sequential"], default="parallel")
    args = ap.parse_args()
    if args.mode == "overhead":
        overhead(args)
    else:
        clients(args)


if __name__ == "__main__":
    main()

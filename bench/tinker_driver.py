# The SDK arm of `loradb-bench tinker` (bench/tinker_bench.cc): steps a LoRA training client of
# the real `tinker` SDK against the routes served at URL and prints {"step_s": [...]}, one entry
# per timed step. argv: URL BASE RANK BATCH LENGTH WARMUP STEPS VOCAB. Exit status 77: the SDK
# is not installed.
import json, sys, time
try:
    import tinker
    from tinker import types
except ImportError:
    sys.exit(77)
url, base = sys.argv[1], sys.argv[2]
rank, batch, length, warmup, steps, vocab = map(int, sys.argv[3:9])
sc = tinker.ServiceClient(base_url=url, api_key="tml-loradb-bench")
tc = sc.create_lora_training_client(base_model=base, rank=rank, seed=0, train_unembed=False)
tc = tc.result() if hasattr(tc, "result") else tc
data = []
for i in range(batch):
    seq = [(7 * i + 3 * k) % (vocab - 1) + 1 for k in range(length + 1)]
    data.append(types.Datum(model_input=types.ModelInput.from_ints(seq[:-1]),
                            loss_fn_inputs={"target_tokens": seq[1:], "weights": [1.0] * length}))
times = []
for i in range(warmup + steps):
    t = time.perf_counter()
    fb = tc.forward_backward(data, "cross_entropy")
    op = tc.optim_step(types.AdamParams(learning_rate=1e-4))
    fb.result()
    op.result()
    if i >= warmup:
        times.append(time.perf_counter() - t)
print(json.dumps({"step_s": times}))

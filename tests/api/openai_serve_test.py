#!/usr/bin/env python3
"""`loradb serve --model` driven by the real `openai` SDK (pinned in
tools/python-constraints.txt) on loopback, every reply checked against `loradb generate`.

Setup, with the repository's own tooling: `loradb model init-random` writes a tiny Qwen3 base
(compute/configs/tiny-dense.json); a byte-level BPE tokenizer.json is trained here with the
`tokenizers` package (Qwen's layout, vocabulary within the model's); 16 LoRA adapters (random
A and B, written as PEFT directories with numpy + safetensors) are imported as policies p0..p15
(alias `prod`), p0 with a second revision.

Checks (each failure is printed; exit 1 at the end):
- /v1/models lists the base and every alias with its revision.
- token-id and text prompts, greedy and sampled (seed), n > 1 (choice i = seed + i), a stop
  string (text cut before it, finish "stop"), stop token ids, logprobs, echo, usage: tokens equal
  `loradb generate`'s for the same prompt, adapter and seed; text equals the tokenizers package's
  decoding of them.
- streaming: one event per token, ending with `data: [DONE]`; the concatenated text and the
  token ids equal the non-streamed reply.
- 16 concurrent clients each naming a different adapter plus 4 base-only clients: each reply
  equals `loradb generate`'s.
- an alias moved while 8 clients stream: those finish on the old revision (and match generate on
  it), requests after the move use the new one; a rollback likewise.
- a client process killed mid-stream: its sequence leaves the decoder (GET /v1/serving/stats:
  running and kv_sequences go to 0) while another client's stream continues to the end.
- bad input (unknown model, negative and >= vocab ids, max_tokens over the context, oversize
  body, invalid UTF-8, an unknown field): 4xx with the admin API's error shape; server stays up.
- auth: with --token-file the routes need the bearer token; without one, on loopback, they are
  open. Past the queue limit: 429 with Retry-After. An adapter whose blob is corrupt fails its
  request alone.

usage: openai_serve_test.py --cli LORADB_CLI --seed SEED_TOOL
Exit status 77 (skipped) when openai, tokenizers, numpy or safetensors cannot be imported.
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import http_harness  # noqa: E402

try:
    import numpy as np
    import openai
    import requests
    from safetensors.numpy import save_file
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (tools/dev setup installs the pinned packages)")
    sys.exit(77)

FAILURES = []
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
VOCAB = 1024  # tiny-dense.json
CONTEXT = 512
LAYERS, HIDDEN, Q_OUT, V_OUT = 4, 128, 4 * 48, 2 * 48
ADAPTERS = 16


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL:", msg, flush=True)
    return cond


def run(*args):
    p = subprocess.run(list(args), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {p.stderr.strip()}")
    return p.stdout


def train_tokenizer(path):
    """Qwen's layout (NFC, Qwen's split regex, byte-level), trained on generated text to exactly
    the model's 1024 ids, so every id the model emits has text."""
    rng = random.Random(5)
    letters = "abcdefghijklmnopqrstuvwxyzéàüö"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    words += "the quick brown fox jumps over lazy dog hello world 東京 🙂 def return".split()
    texts = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    tok.save(path)
    return Tokenizer.from_file(path)


def write_adapter(out_dir, seed, rank=4):
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(LAYERS):
        for proj, out in (("q_proj", Q_OUT), ("v_proj", V_OUT)):
            key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, HIDDEN)) *
                                               0.2).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((out, rank)) *
                                               0.2).astype(np.float32)
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"))
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                   "target_modules": ["q_proj", "v_proj"], "bias": "none",
                   "task_type": "CAUSAL_LM", "base_model_name_or_path": "tiny"}, f)


class Env:
    def __init__(self, cli, tmp):
        self.cli = cli
        self.model = os.path.join(tmp, "model")
        self.store = os.path.join(tmp, "store")
        run(cli, "model", "init-random", "--config",
            os.path.join(ROOT, "compute", "configs", "tiny-dense.json"), self.model, "--seed", "7")
        self.tok = train_tokenizer(os.path.join(self.model, "tokenizer.json"))
        run(cli, "--store", self.store, "init")
        run(cli, "--store", self.store, "base", "add", "tiny", "--config",
            os.path.join(self.model, "config.json"), "--weights",
            os.path.join(self.model, "model.safetensors"))
        for i in range(ADAPTERS):
            d = os.path.join(tmp, f"adapter{i}")
            write_adapter(d, seed=100 + i)
            run(cli, "--store", self.store, "import", "--policy", f"p{i}", "--base", "tiny",
                "--alias", "prod", d)
        d = os.path.join(tmp, "adapter-broken")
        write_adapter(d, seed=555)
        run(cli, "--store", self.store, "import", "--policy", "broken", "--base", "tiny",
            "--alias", "prod", d)
        d = os.path.join(tmp, "adapter0b")
        write_adapter(d, seed=999)
        run(cli, "--store", self.store, "import", "--policy", "p0", "--base", "tiny", d)
        self.token_file = os.path.join(tmp, "token")
        with open(self.token_file, "w") as f:
            f.write(http_harness.TOKEN + "\n")
        os.chmod(self.token_file, 0o600)
        self.cache = {}

    def generate(self, ids, adapter="", seed=0, temperature=0.0, max_tokens=8, top_k=0,
                 top_p=1.0, stop_ids=()):
        """`loradb generate`'s tokens for one prompt (cached)."""
        key = (tuple(ids), adapter, seed, temperature, max_tokens, top_k, top_p, tuple(stop_ids))
        if key not in self.cache:
            args = [self.cli, "--store", self.store, "generate", "--model", self.model,
                    "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(max_tokens),
                    "--temperature", str(temperature), "--seed", str(seed), "--top-k",
                    str(top_k), "--top-p", str(top_p), "--json"]
            if adapter:
                args += ["--adapter", adapter]
            if stop_ids:
                args += ["--stop-ids", ",".join(map(str, stop_ids))]
            self.cache[key] = json.loads(run(*args))["tokens"]
        return self.cache[key]


def extra(obj, name):
    v = getattr(obj, name, None)
    if v is None and getattr(obj, "model_extra", None):
        v = obj.model_extra.get(name)
    return v


def completion_ids(choice):
    return extra(choice, "token_ids")


def api_error(server, path, body, headers=None, raw=None):
    h = {"Authorization": f"Bearer {http_harness.TOKEN}", "Content-Type": "application/json"}
    h.update(headers or {})
    data = raw if raw is not None else json.dumps(body).encode()
    return requests.post(server.url(path), data=data, headers=h, timeout=60)


def stats(server):
    r = requests.get(server.url("/v1/serving/stats"),
                     headers={"Authorization": f"Bearer {http_harness.TOKEN}"}, timeout=30)
    return r.json()


def test_models(env, client):
    models = client.models.list()
    ids = {m.id: m for m in models.data}
    check("tiny" in ids, f"base missing from /v1/models: {sorted(ids)}")
    for i in range(ADAPTERS):
        check(f"p{i}:prod" in ids, f"p{i}:prod missing from /v1/models")
    check(extra(ids.get("p0:prod"), "revision") not in (None, 0), "p0:prod has no revision")


def test_basic(env, client, server):
    prompt = [3, 17, 999, 42, 0, 511, 7]
    # Greedy, base and adapters, with usage.
    for model, adapter in (("tiny", ""), ("p1:prod", "p1:prod"), ("p2@1", "p2@1")):
        r = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                      extra_body={"return_token_ids": True})
        want = env.generate(prompt, adapter)
        check(completion_ids(r.choices[0]) == want,
              f"{model} greedy: {completion_ids(r.choices[0])} != generate {want}")
        check(r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(want),
              f"{model} usage {r.usage}")
        check(r.choices[0].text == env.tok.decode(want), f"{model}: text != decode(tokens)")
        check(r.choices[0].finish_reason == "length", f"{model}: finish {r.choices[0]}")
    # A revision id names the adapter too.
    rev_id = alias_revision(server, "p3", "prod")
    r = client.completions.create(model=str(rev_id), prompt=prompt, max_tokens=8, temperature=0,
                                  extra_body={"return_token_ids": True})
    check(completion_ids(r.choices[0]) == env.generate(prompt, "p3:prod"), "revision id model")
    # Sampled, with a seed, top-k and top-p; and n = 3 (choice i samples with seed + i).
    r = client.completions.create(model="p4:prod", prompt=prompt, max_tokens=10,
                                  temperature=0.9, top_p=0.95, seed=11, n=3,
                                  extra_body={"top_k": 50, "return_token_ids": True})
    check(len(r.choices) == 3, f"n=3 gave {len(r.choices)} choices")
    for c in r.choices:
        want = env.generate(prompt, "p4:prod", seed=11 + c.index, temperature=0.9,
                            max_tokens=10, top_k=50, top_p=0.95)
        check(completion_ids(c) == want, f"n=3 choice {c.index}: {completion_ids(c)} != {want}")
    check(r.usage.completion_tokens == sum(len(completion_ids(c)) for c in r.choices),
          "n=3 usage counts every choice")
    # A list of prompts: choices numbered prompt * n + sample.
    r = client.completions.create(model="tiny", prompt=[prompt, [5, 6, 7]], max_tokens=4,
                                  temperature=0, extra_body={"return_token_ids": True})
    check([c.index for c in r.choices] == [0, 1], "two prompts: choice indices")
    check(completion_ids(r.choices[1]) == env.generate([5, 6, 7], max_tokens=4),
          "second prompt of a list")


def test_text_and_stop(env, client):
    text = "the quick brown fox jumps over"
    ids = env.tok.encode(text).ids
    r = client.completions.create(model="p5:prod", prompt=text, max_tokens=12, temperature=0,
                                  extra_body={"return_token_ids": True})
    want = env.generate(ids, "p5:prod", max_tokens=12)
    check(completion_ids(r.choices[0]) == want, f"text prompt: {completion_ids(r.choices[0])}")
    check(r.choices[0].text == env.tok.decode(want), "text prompt: text != decode(tokens)")
    check(r.usage.prompt_tokens == len(ids), "text prompt: usage counts the tokenizer's ids")
    # echo: the prompt text in front.
    r = client.completions.create(model="p5:prod", prompt=text, max_tokens=12, temperature=0,
                                  echo=True)
    check(r.choices[0].text == text + env.tok.decode(want), f"echo: {r.choices[0].text!r}")
    # A stop string taken from inside the greedy text: cut before it, finish "stop".
    full = env.tok.decode(want)
    stop = full[len(full) // 2:len(full) // 2 + 3]
    if check(len(stop.strip()) > 0, f"greedy text too short for a stop string: {full!r}"):
        r = client.completions.create(model="p5:prod", prompt=text, max_tokens=12,
                                      temperature=0, stop=[stop])
        cut = full[:full.find(stop)]
        check(r.choices[0].text == cut, f"stop {stop!r}: {r.choices[0].text!r} != {cut!r}")
        check(r.choices[0].finish_reason == "stop", f"stop string: {r.choices[0].finish_reason}")
        check(extra(r.choices[0], "stop_reason") == stop, "stop_reason names the string")
    # A stop token id: generation ends at it (generate --stop-ids likewise).
    stop_id = want[3]
    r = client.completions.create(model="p5:prod", prompt=text, max_tokens=12, temperature=0,
                                  extra_body={"stop_token_ids": [stop_id],
                                              "return_token_ids": True})
    want_stop = env.generate(ids, "p5:prod", max_tokens=12, stop_ids=[stop_id])
    check(completion_ids(r.choices[0]) == want_stop, "stop token id: tokens")
    check(r.choices[0].finish_reason == "stop", "stop token id: finish")
    check(extra(r.choices[0], "stop_reason") == stop_id, "stop token id: stop_reason")
    # logprobs: one entry per token, the greedy token the most likely.
    r = client.completions.create(model="p5:prod", prompt=text, max_tokens=6, temperature=0,
                                  logprobs=3, extra_body={"return_token_ids": True})
    lp = r.choices[0].logprobs
    check(len(lp.token_logprobs) == 6 and len(lp.top_logprobs) == 6, "logprobs: 6 entries")
    for k, (tok_lp, top) in enumerate(zip(lp.token_logprobs, lp.top_logprobs)):
        check(0 < len(top) <= 3, f"logprobs: top {k} has {len(top)} entries")
        check(abs(max(top.values()) - tok_lp) < 1e-5, f"logprobs: greedy token {k} not the top")
        check(tok_lp <= 0, "logprobs are log-probabilities")
    check(lp.tokens == [env.tok.decode([t], skip_special_tokens=False)
                        for t in completion_ids(r.choices[0])],
          "logprobs tokens are the decoded token strings")


def test_stream(env, client):
    prompt = [9, 8, 7, 6, 5]
    for model, adapter in (("tiny", ""), ("p6:prod", "p6:prod")):
        want = env.generate(prompt, adapter, max_tokens=10, temperature=0.8, seed=3)
        events = list(client.completions.create(
            model=model, prompt=prompt, max_tokens=10, temperature=0.8, seed=3, stream=True,
            stream_options={"include_usage": True}, extra_body={"return_token_ids": True}))
        token_events = [e for e in events if e.choices and completion_ids(e.choices[0])]
        got = [completion_ids(e.choices[0])[0] for e in token_events]
        check(got == want, f"stream {model}: {got} != {want}")
        check(len(token_events) == len(want), "stream: one event per token")
        text = "".join(e.choices[0].text for e in events if e.choices)
        check(text == env.tok.decode(want), f"stream {model}: text {text!r}")
        finals = [e.choices[0].finish_reason for e in events if e.choices and
                  e.choices[0].finish_reason]
        check(finals == ["length"], f"stream: finish reasons {finals}")
        check(events[-1].usage is not None and events[-1].usage.completion_tokens == len(want),
              "stream: usage chunk last")
    # The raw stream ends with data: [DONE].
    r = requests.post(client.base_url.__str__() + "completions", stream=True, timeout=60,
                      headers={"Authorization": f"Bearer {http_harness.TOKEN}"},
                      json={"model": "tiny", "prompt": prompt, "max_tokens": 5, "stream": True,
                            "temperature": 0})
    check(r.headers.get("content-type", "").startswith("text/event-stream"), "SSE content type")
    lines = [ln for ln in r.iter_lines(decode_unicode=True) if ln]
    check(lines[-1] == "data: [DONE]", f"stream ends with {lines[-1]!r}")
    check(len(lines) == 5 + 1 + 1, f"5 token events + final + [DONE]: {len(lines)} lines")


def test_concurrent(env, client):
    prompt = [4, 44, 444, 4]
    jobs = [(f"p{i}:prod", f"p{i}:prod", 20 + i) for i in range(ADAPTERS)]
    jobs += [("tiny", "", 50 + i) for i in range(4)]
    wants = [env.generate(prompt, a, seed=s, temperature=0.7, max_tokens=12) for _, a, s in jobs]
    results = [None] * len(jobs)

    def one(k):
        model, _, seed = jobs[k]
        stream = k % 2 == 0
        r = client.completions.create(model=model, prompt=prompt, max_tokens=12,
                                      temperature=0.7, seed=seed, stream=stream,
                                      extra_body={"return_token_ids": True})
        if stream:
            results[k] = [completion_ids(e.choices[0])[0] for e in r
                          if e.choices and completion_ids(e.choices[0])]
        else:
            results[k] = completion_ids(r.choices[0])

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, (model, _, seed) in enumerate(jobs):
        check(results[k] == wants[k], f"concurrent {model} seed {seed}: {results[k]} != "
                                      f"{wants[k]}")


def set_alias(server, policy, alias, revision):
    r = requests.put(server.url(f"/v1/policies/{policy}/aliases/{alias}"),
                     json={"revision": revision},
                     headers={"Authorization": f"Bearer {http_harness.TOKEN}"}, timeout=30)
    check(r.status_code == 200, f"alias move: {r.status_code} {r.text}")


def alias_revision(server, policy, alias):
    r = requests.get(server.url(f"/v1/policies/{policy}/aliases/{alias}"), timeout=30)
    return r.json()["revision"]["id"]


def test_alias_move(env, client, server):
    prompt = [12, 13, 14]
    old = alias_revision(server, "p0", "prod")
    revs = requests.get(server.url("/v1/policies/p0/revisions"), timeout=30).json()
    new = max(item["id"] for item in revs["revisions"])
    check(new != old, "p0 has a second revision")
    started = threading.Barrier(9)
    results = [None] * 8

    def streamer(k):
        stream = client.completions.create(model="p0:prod", prompt=prompt, max_tokens=24,
                                           temperature=0, stream=True,
                                           extra_body={"return_token_ids": True})
        toks, revision, first = [], None, True
        for e in stream:
            if e.choices and completion_ids(e.choices[0]):
                toks.append(completion_ids(e.choices[0])[0])
                if first:
                    first = False
                    started.wait()
            if extra(e, "revision") is not None:
                revision = extra(e, "revision")
        results[k] = (toks, revision)

    threads = [threading.Thread(target=streamer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    started.wait()  # all 8 have their first token: they run on the old revision
    set_alias(server, "p0", "prod", new)
    after = client.completions.create(model="p0:prod", prompt=prompt, max_tokens=24,
                                      temperature=0, extra_body={"return_token_ids": True})
    for t in threads:
        t.join()
    want_old = env.generate(prompt, f"{old}", max_tokens=24)
    want_new = env.generate(prompt, f"{new}", max_tokens=24)
    check(want_old != want_new, "the two revisions generate differently")
    for k, (toks, revision) in enumerate(results):
        check(revision == old and toks == want_old,
              f"stream {k} started before the move: revision {revision}, tokens {toks}")
    check(extra(after, "revision") == new and completion_ids(after.choices[0]) == want_new,
          f"request after the move: revision {extra(after, 'revision')}")
    # Rollback: the next request is on the old revision again.
    r = requests.post(server.url("/v1/policies/p0/aliases/prod/rollback"),
                      headers={"Authorization": f"Bearer {http_harness.TOKEN}"}, timeout=30)
    check(r.status_code == 200, f"rollback: {r.status_code} {r.text}")
    back = client.completions.create(model="p0:prod", prompt=prompt, max_tokens=24,
                                     temperature=0, extra_body={"return_token_ids": True})
    check(extra(back, "revision") == old and completion_ids(back.choices[0]) == want_old,
          "request after the rollback")


KILLED_CLIENT = r"""
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
for e in client.completions.create(model="p7:prod", prompt=[1, 2, 3], max_tokens=400,
                                   temperature=0, stream=True):
    print("token", flush=True)
"""


def test_killed_client(env, client, server):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, str(client.base_url),
                             http_harness.TOKEN], stdout=subprocess.PIPE, text=True)
    check(proc.stdout.readline().strip() == "token", "killed client streamed a token")
    # Another client streams alongside.
    other = client.completions.create(model="p8:prod", prompt=[5, 5, 5], max_tokens=60,
                                      temperature=0, stream=True,
                                      extra_body={"return_token_ids": True})
    got = []
    it = iter(other)
    for e in it:
        if e.choices and completion_ids(e.choices[0]):
            got.append(completion_ids(e.choices[0])[0])
            break
    s = stats(server)
    check(s["running"] == 2, f"both sequences run: {s}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    # The killed client's sequence leaves the batch while the other one goes on.
    left = False
    for e in it:
        if e.choices and completion_ids(e.choices[0]):
            got.append(completion_ids(e.choices[0])[0])
        if not left and stats(server)["running"] == 1:
            left = True
    check(left, "the killed client's sequence left the batch while the other streamed")
    check(got == env.generate([5, 5, 5], "p8:prod", max_tokens=60), "the other client finished")
    for _ in range(200):
        s = stats(server)
        if s["running"] == 0 and s["kv_sequences"] == 0:
            break
        time.sleep(0.05)
    check(s["running"] == 0 and s["kv_sequences"] == 0 and s["leased_adapters"] == 0,
          f"nothing left in the decoder: {s}")


def test_bad_input(env, server):
    def expect(status, body=None, raw=None, what=""):
        r = api_error(server, "/v1/completions", body, raw=raw)
        ok = check(r.status_code == status, f"{what}: {r.status_code} {r.text[:200]}")
        if ok:
            err = r.json().get("error", {})
            check(isinstance(err.get("code"), str) and isinstance(err.get("message"), str),
                  f"{what}: error shape {r.text[:200]}")
        return r

    base = {"model": "tiny", "max_tokens": 4}
    expect(404, dict(base, model="nope:prod", prompt=[1, 2]), what="unknown policy")
    expect(404, dict(base, model="nosuchmodel", prompt=[1, 2]), what="unknown model name")
    expect(400, dict(base, prompt=[1, -2]), what="negative id")
    expect(400, dict(base, prompt=[1, VOCAB]), what="id == vocab")
    expect(400, dict(base, prompt=[1, 2], max_tokens=CONTEXT), what="max_tokens over the context")
    expect(400, dict(base, prompt=[1.5]), what="float id")
    expect(400, dict(base, prompt=[]), what="empty prompt")
    expect(400, dict(base, prompt=[1], frequency_penalty=0.5), what="frequency_penalty")
    expect(400, dict(base, prompt=[1], bogus=1), what="unknown field")
    expect(413, raw=b'{"prompt": [' + b"1," * 600000 + b"1]}", what="oversize body")
    expect(400, raw=b'{"model": "tiny", "prompt": "caf\xc3\x28"}', what="invalid UTF-8")
    expect(400, raw=b'{"model": "tiny", "prompt": [1, 2', what="malformed JSON")
    r = requests.get(server.url("/healthz"), timeout=10)
    check(r.status_code == 200, "server up after bad input")


def test_auth_and_queue(env):
    # --token-file set: no token, no service.
    with_token = http_harness.Server(env.cli, env.store, "--model", env.model, "--token-file",
                                     env.token_file, "--threads", "1")
    try:
        r = requests.post(with_token.url("/v1/completions"),
                          json={"model": "tiny", "prompt": [1], "max_tokens": 1}, timeout=30)
        check(r.status_code == 401, f"no bearer token: {r.status_code}")
        r = requests.get(with_token.url("/v1/models"), timeout=30)
        check(r.status_code == 401, f"/v1/models without a token: {r.status_code}")
    finally:
        with_token.stop()
    # No token file, loopback: open; one running and none queued: the second request gets 429.
    server = http_harness.Server(env.cli, env.store, "--model", env.model, "--max-running", "1",
                                 "--max-queued", "0", "--threads", "1")
    try:
        client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)
        r = client.completions.create(model="tiny", prompt=[1, 2], max_tokens=2, temperature=0)
        check(len(r.choices) == 1, "open on loopback without a token")
        stream = client.completions.create(model="tiny", prompt=[1, 2], max_tokens=300,
                                           temperature=0, stream=True)
        next(iter(stream))
        r = requests.post(server.url("/v1/completions"),
                          json={"model": "tiny", "prompt": [1], "max_tokens": 1}, timeout=30)
        check(r.status_code == 429 and int(r.headers.get("Retry-After", "0")) >= 1,
              f"past the queue limit: {r.status_code} {r.headers}")
        check(r.json().get("error", {}).get("code") == "resource_exhausted", "429 error shape")
        stream.close()
    finally:
        server.stop()


def test_corrupt_adapter(env, client, server):
    # Flip bytes in the blob of a policy never served before (so no tier holds it): a request
    # naming it fails alone, the others are served.
    loc = requests.get(server.url("/v1/policies/broken/aliases/prod/locate"), timeout=30).json()
    blob = loc["location"]["blob_path"]
    if not check(os.path.isfile(blob), f"the broken policy's blob not found: {loc}"):
        return
    with open(blob, "r+b") as f:
        f.seek(-64, os.SEEK_END)
        data = f.read(64)
        f.seek(-64, os.SEEK_END)
        f.write(bytes(b ^ 0xFF for b in data))
    results = {}

    def one(model):
        try:
            r = client.completions.create(model=model, prompt=[1, 2, 3], max_tokens=6,
                                          temperature=0, extra_body={"return_token_ids": True})
            results[model] = completion_ids(r.choices[0])
        except openai.APIStatusError as e:
            results[model] = e

    threads = [threading.Thread(target=one, args=(m,)) for m in ("broken:prod", "p9:prod", "tiny")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(isinstance(results["broken:prod"], openai.APIStatusError),
          f"corrupt adapter: {results['broken:prod']}")
    check(results["p9:prod"] == env.generate([1, 2, 3], "p9:prod", max_tokens=6),
          "another adapter in the same batch is served")
    check(results["tiny"] == env.generate([1, 2, 3], "", max_tokens=6), "the base is served")


def main():
    args = http_harness.parse_args()
    print(f"openai {openai.__version__}", flush=True)
    with tempfile.TemporaryDirectory(prefix="loradb-openai-test-") as tmp:
        env = Env(args.cli, tmp)
        server = http_harness.Server(args.cli, env.store, "--model", env.model, "--token-file",
                                     env.token_file, "--threads", "1")
        try:
            client = openai.OpenAI(base_url=server.url("/v1"), api_key=http_harness.TOKEN,
                                   max_retries=0, timeout=300)
            for name, fn, fargs in (
                    ("models", test_models, (env, client)),
                    ("basic", test_basic, (env, client, server)),
                    ("text_and_stop", test_text_and_stop, (env, client)),
                    ("stream", test_stream, (env, client)),
                    ("concurrent", test_concurrent, (env, client)),
                    ("alias_move", test_alias_move, (env, client, server)),
                    ("killed_client", test_killed_client, (env, client, server)),
                    ("bad_input", test_bad_input, (env, server)),
                    ("corrupt_adapter", test_corrupt_adapter, (env, client, server))):
                print(f"-- {name}", flush=True)
                try:
                    fn(*fargs)
                except Exception as e:  # a crash in one part is a failure, the rest still run
                    check(False, f"{name} raised {type(e).__name__}: {e}")
            check(server.proc.poll() is None, "server still running")
        finally:
            status = server.stop()
            check(status == 0, f"server exit status {status}")
        print("-- auth_and_queue", flush=True)
        try:
            test_auth_and_queue(env)
        except Exception as e:
            check(False, f"auth_and_queue raised {type(e).__name__}: {e}")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        sys.exit(1)
    print("openai_serve_test: all checks passed")


if __name__ == "__main__":
    main()

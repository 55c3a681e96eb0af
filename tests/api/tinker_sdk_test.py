"""The Tinker-compatible service driven by the real `tinker` SDK (pinned in
tools/python-constraints.txt) against a real `loradb serve --model DIR --train` on an ephemeral
loopback port, on a tiny base the repository generates (compute/configs/tiny-dense.json).

Covers: a supervised loop whose loss falls by half; sampling from published weights, with
log-probs checked against `loradb generate --logits`; save_state, a server restart and
create_training_client_from_state_with_optimizer continuing with the uninterrupted run's losses
bit for bit; two clients training two runs at once; an importance-sampling RL loop whose reward
rises; bad input through the SDK and raw HTTP (clear errors, server up, other runs unaffected)."""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_harness  # noqa: E402

try:
    import numpy as np
    import requests
    import tinker
    import zstandard
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto
except ImportError as e:  # pragma: no cover
    print(f"SKIP: the tinker SDK or its dependencies are not installed ({e})")
    sys.exit(77)

ARGS = None
API_KEY = "tml-loradb-loopback-test-key"  # without --token-file any key is accepted on loopback
BASE = "tiny"  # the base's name: the model directory's last component
VOCAB = 1024
LR = 3e-3


def run_cli(*args):
    out = subprocess.run([ARGS.cli, *args], check=True, capture_output=True, text=True)
    return out.stdout


class Env:
    """A store and a tiny base model in a temporary directory, and the server over them."""

    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="loradb-tinker-test-")
        self.model = os.path.join(self.tmp.name, BASE)
        self.store = os.path.join(self.tmp.name, "store")
        run_cli("model", "init-random", "--config", os.path.join(ARGS.configs, "tiny-dense.json"),
                self.model, "--seed", "7")
        run_cli("--store", self.store, "init")
        self.server = None

    def start(self):
        self.server = http_harness.Server(ARGS.cli, self.store, "--model", self.model, "--train")
        return self.server

    def stop(self):
        if self.server is not None:
            status = self.server.stop()
            self.server = None
            return status
        return 0

    def client(self):
        return tinker.ServiceClient(base_url=self.server.base_url, api_key=API_KEY)

    def close(self):
        self.stop()
        self.tmp.cleanup()


def resolve(f):
    """The SDK's create_* calls return futures that also proxy the client; take the client."""
    return f.result() if hasattr(f, "result") else f


def datum(seq, weights=None):
    seq = list(seq)
    return types.Datum(
        model_input=types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={"target_tokens": seq[1:],
                        "weights": weights if weights is not None else [1.0] * (len(seq) - 1)})


def dataset(stride, count=8, length=12, offset=0):
    """Sequences x, x+stride, x+2*stride, ... (mod 97, shifted into the vocabulary)."""
    return [datum([(offset + 11 * i + stride * k) % 97 + 100 for k in range(length)])
            for i in range(count)]


def supervised(tc, data, steps, lr=LR):
    losses = []
    for _ in range(steps):
        fb = tc.forward_backward(data, "cross_entropy")
        step = tc.optim_step(types.AdamParams(learning_rate=lr))
        losses.append(fb.result().metrics["loss:sum"])
        step.result()
    return losses


def new_run(service, seed=0, rank=8):
    return resolve(service.create_lora_training_client(base_model=BASE, rank=rank, seed=seed,
                                                       train_unembed=False))


def log_softmax(row):
    row = np.asarray(row, np.float64)
    m = row.max()
    return row - m - math.log(np.exp(row - m).sum())


class SupervisedAndSampling(unittest.TestCase):
    """One server: SFT, sampling vs `loradb generate`, then save_state / restart / resume."""

    @classmethod
    def setUpClass(cls):
        cls.env = Env()
        cls.env.start()

    @classmethod
    def tearDownClass(cls):
        cls.env.close()

    def test_supervised_sampling_and_resume(self):
        env = self.env
        service = env.client()
        caps = service.get_server_capabilities()
        self.assertEqual([m.model_name for m in caps.supported_models], [BASE])
        tc = new_run(service, seed=1)
        data = dataset(stride=3)
        losses = supervised(tc, data, 30)
        print(f"supervised loss {losses[0]:.3f} -> {losses[-1]:.3f}", file=sys.stderr)
        self.assertTrue(all(math.isfinite(x) for x in losses))
        self.assertLessEqual(losses[-1], losses[0] / 2, losses)

        # forward (no gradient) reports per-token logprobs whose sum is minus the loss.
        fwd = tc.forward(data[:2], "cross_entropy").result()
        self.assertEqual(len(fwd.loss_fn_outputs), 2)
        lp = [float(x) for o in fwd.loss_fn_outputs for x in o["logprobs"].data]
        self.assertAlmostEqual(-sum(lp), fwd.metrics["loss:sum"], delta=1e-3)

        # Sampling from the weights just trained: greedy, then checked against `loradb generate`.
        prompt = [100 + (3 * k) % 97 for k in range(4)]
        params = types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])
        sc = resolve(tc.save_weights_and_get_sampling_client())
        quick = sc.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                          sampling_params=params).result()
        saved = tc.save_weights_for_sampler(name="sft-final").result()
        self.assertTrue(saved.path.startswith("tinker://") and saved.path.endswith(
            "/sampler_weights/sft-final"), saved.path)
        sampler = resolve(service.create_sampling_client(model_path=saved.path))
        res = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=2,
                             sampling_params=params).result()
        self.assertEqual(len(res.sequences), 2)
        seq = res.sequences[0]
        self.assertEqual(len(seq.tokens), 6)
        self.assertEqual(seq.stop_reason, "length")
        self.assertEqual(seq.tokens, res.sequences[1].tokens)
        self.assertEqual(seq.tokens, quick.sequences[0].tokens)
        self.assertEqual(len(seq.logprobs), len(seq.tokens))

        # A stop token ends the sequence (included), with stop_reason "stop".
        stopped = sampler.sample(
            prompt=types.ModelInput.from_ints(prompt), num_samples=1,
            sampling_params=types.SamplingParams(max_tokens=6, temperature=0.0,
                                                 stop=[seq.tokens[1]])).result().sequences[0]
        self.assertEqual(stopped.tokens, seq.tokens[:2])
        self.assertEqual(stopped.stop_reason, "stop")

        # The resume check: state saved after 3 more steps, then 4 steps recorded.
        supervised(tc, data, 3)
        ckpt = tc.save_state("resume-point").result().path
        self.assertTrue(ckpt.endswith("/weights/resume-point"), ckpt)
        uninterrupted = supervised(tc, data, 4)
        run_id = ckpt[len("tinker://"):].split("/")[0]
        policy = "tinker/{}/train-{}".format(*run_id.split(":train:"))
        self.assertEqual(env.stop(), 0)

        # `loradb generate` on the published revision: same tokens, same log-probs.
        gen = json.loads(run_cli("--store", env.store, "generate", "--model", env.model,
                                 "--prompt-ids", ",".join(map(str, prompt)), "--adapter",
                                 f"{policy}:sampler-sft-final", "--max-tokens", "6", "--json",
                                 "--logits"))
        self.assertEqual(gen["tokens"], seq.tokens)
        rows = gen["logits"]
        first = len(rows) - len(seq.tokens)  # the row that predicts the first generated token
        self.assertIn(first, (len(prompt) - 1, len(prompt)))
        if first == len(prompt):
            first -= 1
        for k, tok in enumerate(seq.tokens):
            want = log_softmax(rows[first + k])[tok]
            self.assertAlmostEqual(seq.logprobs[k], want, delta=1e-4, msg=f"token {k}")

        # Restart: the checkpoint survives, and the resumed run repeats the same losses exactly.
        env.start()
        service = env.client()
        info = service.create_rest_client().get_weights_info_by_tinker_path(ckpt).result()
        self.assertEqual(info.lora_rank, 8)
        resumed = resolve(service.create_training_client_from_state_with_optimizer(ckpt))
        again = supervised(resumed, data, 4)
        self.assertEqual(again, uninterrupted)
        # The sampler path still resolves after the restart.
        sampler = resolve(service.create_sampling_client(model_path=saved.path))
        res2 = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                              sampling_params=params).result()
        self.assertEqual(res2.sequences[0].tokens, seq.tokens)
        runs = service.create_rest_client().list_training_runs().result()
        self.assertIn(run_id, [r.training_run_id for r in runs.training_runs])
        cps = service.create_rest_client().list_checkpoints(run_id).result()
        ids = {c.checkpoint_id for c in cps.checkpoints}
        self.assertIn("weights/resume-point", ids)
        self.assertIn("sampler_weights/sft-final", ids)


class Concurrent(unittest.TestCase):
    """Two SDK clients train two runs at the same time; both learn; an RL loop learns too."""

    @classmethod
    def setUpClass(cls):
        cls.env = Env()
        cls.env.start()

    @classmethod
    def tearDownClass(cls):
        cls.env.close()

    def test_two_clients_train_at_once(self):
        results, errors = {}, []

        def train(name, stride, seed):
            try:
                tc = new_run(self.env.client(), seed=seed)
                losses = supervised(tc, dataset(stride=stride, offset=seed), 30)
                path = tc.save_weights_for_sampler(name=name).result().path
                results[name] = (losses, path)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=train, args=("a", 3, 1)),
                   threading.Thread(target=train, args=("b", 5, 2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for name, (losses, _) in results.items():
            print(f"client {name}: loss {losses[0]:.3f} -> {losses[-1]:.3f}", file=sys.stderr)
            self.assertLessEqual(losses[-1], losses[0] / 2, (name, losses))
        pa, pb = results["a"][1], results["b"][1]
        self.assertNotEqual(pa.split("/")[2], pb.split("/")[2])  # two runs, two policies
        # Each published revision continues its own pattern (greedy).
        service = self.env.client()
        for path, stride, offset in ((pa, 3, 1), (pb, 5, 2)):
            sampler = resolve(service.create_sampling_client(model_path=path))
            start = [(offset + stride * k) % 97 + 100 for k in range(6)]  # the first sequence
            out = sampler.sample(prompt=types.ModelInput.from_ints(start[:-1]), num_samples=1,
                                 sampling_params=types.SamplingParams(
                                     max_tokens=1, temperature=0.0, stop=[])).result()
            self.assertEqual(out.sequences[0].tokens, [start[-1]], path)

    def test_rl_importance_sampling_reward_rises(self):
        """Reward: the fraction of sampled tokens in the target set [200, 216); the policy
        samples with its own current weights (published each round) and trains on
        importance_sampling with advantages reward - mean."""
        service = self.env.client()
        tc = new_run(service, seed=3)
        prompt = [150, 151, 152, 153]
        target = set(range(200, 216))
        rewards = []
        # Seeded samples: the run is the same whatever else the server is doing (a fresh seed
        # per request made whether learning took off within 12 rounds a matter of luck).
        for round_ in range(12):
            sampler = resolve(tc.save_weights_and_get_sampling_client())
            res = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=16,
                                 sampling_params=types.SamplingParams(max_tokens=4,
                                                                      temperature=1.0,
                                                                      seed=1000 + 16 * round_,
                                                                      stop=[])).result()
            r = [sum(t in target for t in s.tokens) / len(s.tokens) for s in res.sequences]
            rewards.append(sum(r) / len(r))
            mean = sum(r) / len(r)
            data = []
            for s, ri in zip(res.sequences, r):
                full = prompt + list(s.tokens)
                n = len(full) - 1
                p = len(prompt) - 1
                data.append(types.Datum(
                    model_input=types.ModelInput.from_ints(full[:-1]),
                    loss_fn_inputs={
                        "target_tokens": full[1:],
                        "logprobs": [0.0] * p + list(s.logprobs),
                        "advantages": [0.0] * p + [ri - mean] * (n - p),
                    }))
            fb = tc.forward_backward(data, "importance_sampling").result()
            self.assertTrue(math.isfinite(fb.metrics["loss:sum"]))
            tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        print(f"rl reward {rewards}", file=sys.stderr)
        self.assertGreater(sum(rewards[-3:]) / 3, sum(rewards[:3]) / 3 + 0.1, rewards)


class BadInput(unittest.TestCase):
    """Refused input: one clear error of the SDK's expected shape, the server keeps serving and
    another session's run is unaffected."""

    @classmethod
    def setUpClass(cls):
        cls.env = Env()
        cls.env.start()
        cls.good = new_run(cls.env.client(), seed=5)
        cls.good_data = dataset(stride=3)

    @classmethod
    def tearDownClass(cls):
        cls.env.close()

    def post(self, path, body, headers=None):
        h = {"X-API-Key": API_KEY}
        h.update(headers or {})
        return requests.post(self.env.server.url(path), data=body, headers=h, timeout=60)

    def assert_error(self, resp, status, *words):
        self.assertEqual(resp.status_code, status, resp.text)
        err = resp.json()["error"]
        self.assertIsInstance(err["code"], str)
        for w in words:
            self.assertIn(w, err["message"])
        return err

    def assert_still_serving(self):
        self.assertEqual(requests.get(self.env.server.url("/api/v1/healthz"), timeout=10).json(),
                         {"status": "ok"})
        losses = supervised(self.good, self.good_data, 1)
        self.assertTrue(math.isfinite(losses[0]))

    def fb_body(self, model_id, data, loss="cross_entropy"):
        req = types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss),
            model_id=model_id, seq_id=0)
        return forward_backward_request_to_proto(req).SerializeToString()

    def sdk_error(self, data, loss="cross_entropy"):
        tc = new_run(self.env.client(), seed=9)
        with self.assertRaises(Exception) as cm:
            tc.forward_backward(data, loss).result()
        return str(cm.exception)

    def test_token_id_outside_vocab(self):
        msg = self.sdk_error([datum([1, 2, VOCAB + 5, 3])])
        self.assertIn("outside the vocabulary", msg)
        self.assertIn("400", msg)
        self.assert_still_serving()

    def test_mismatched_loss_fn_inputs(self):
        bad = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
                          loss_fn_inputs={"target_tokens": [2, 3, 4, 5],
                                          "weights": [1.0, 1.0, 1.0]})
        msg = self.sdk_error([bad])
        self.assertIn("has 3 values for 4 model_input tokens", msg)
        self.assert_still_serving()

    def test_unsupported_loss(self):
        msg = self.sdk_error(dataset(stride=3)[:1], loss="cispo")
        self.assertIn("loss_fn 'cispo' is not supported", msg)
        body = self.fb_body(self.good.model_id, dataset(stride=3)[:1], loss="dro")
        self.assert_error(self.post("/api/v1/forward_backward", body,
                                    {"Content-Type": "application/x-protobuf"}),
                          400, "loss_fn 'dro' is not supported")
        self.assert_still_serving()

    def test_unknown_model(self):
        body = self.fb_body("nosuch:train:0", dataset(stride=3)[:1])
        self.assert_error(self.post("/api/v1/forward_backward", body,
                                    {"Content-Type": "application/x-protobuf"}),
                          404, "nosuch:train:0")
        self.assert_error(self.post("/api/v1/optim_step", json.dumps(
            {"model_id": "nosuch:train:0", "seq_id": 1,
             "adam_params": {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12,
                             "weight_decay": 0.0, "grad_clip_norm": 0.0}})), 404)
        with self.assertRaises(Exception) as cm:
            resolve(self.env.client().create_sampling_client(
                model_path="tinker://nosuch:train:0/sampler_weights/x")).sample(
                    prompt=types.ModelInput.from_ints([1, 2]), num_samples=1,
                    sampling_params=types.SamplingParams(max_tokens=2)).result()
        self.assertIn("404", str(cm.exception))
        self.assert_still_serving()

    def test_corrupt_bodies(self):
        body = self.fb_body(self.good.model_id, dataset(stride=3)[:1])
        pb = {"Content-Type": "application/x-protobuf"}
        self.assert_error(self.post("/api/v1/forward_backward", b"\xff\xff\xff\x07garbage", pb),
                          400, "not a valid ForwardBackwardRequest protobuf")
        self.assert_error(self.post("/api/v1/forward_backward", body[: len(body) // 2], pb), 400)
        z = dict(pb, **{"Content-Encoding": "zstd"})
        self.assert_error(self.post("/api/v1/forward_backward", b"not zstd at all", z), 400,
                          "zstd")
        frame = zstandard.ZstdCompressor().compress(body)
        self.assert_error(self.post("/api/v1/forward_backward", frame[:-6], z), 400, "zstd")
        self.assertEqual(self.post("/api/v1/forward_backward", b"{}", {
            "Content-Type": "application/json"}).status_code, 400)
        self.assert_error(self.post("/api/v1/create_model", b"{not json"), 400, "JSON")
        self.assert_still_serving()

    def test_zstd_body_accepted(self):
        service = self.env.client()
        tc = new_run(service, seed=11)
        data = dataset(stride=3)[:2]
        plain = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
        msg = forward_backward_request_to_proto(types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"),
            model_id=tc.model_id, seq_id=0))
        msg.forward_only = True
        body = msg.SerializeToString()
        resp = self.post("/api/v1/forward_backward", zstandard.ZstdCompressor().compress(body),
                         {"Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"})
        self.assertEqual(resp.status_code, 200, resp.text)
        fut = resp.json()["request_id"]
        while True:
            r = self.post("/api/v1/retrieve_future", json.dumps({"request_id": fut}),
                          {"Accept": "application/x-protobuf"})
            self.assertEqual(r.status_code, 200, r.text)
            if r.headers["Content-Type"].startswith("application/x-protobuf"):
                break
            self.assertEqual(r.json().get("type"), "try_again", r.text)
        from tinker.proto.response_conv import deserialize_forward_backward_output
        out = deserialize_forward_backward_output(r.content)
        self.assertEqual(out.metrics["loss:sum"], plain)

    def test_train_unembed_refused(self):
        with self.assertRaises(Exception) as cm:
            resolve(self.env.client().create_lora_training_client(base_model=BASE, rank=4))
        self.assertIn("train_unembed", str(cm.exception))
        self.assert_still_serving()


class TokenFile(unittest.TestCase):
    """With --token-file the SDK's X-API-Key must be that token."""

    def test_api_key_checked(self):
        env = Env()
        try:
            token = "tml-" + "0123456789abcdef" * 2
            token_file = os.path.join(env.tmp.name, "token")
            with open(token_file, "w") as f:
                f.write(token + "\n")
            os.chmod(token_file, 0o600)
            env.server = http_harness.Server(ARGS.cli, env.store, "--model", env.model, "--train",
                                             "--token-file", token_file)
            url = env.server.url("/api/v1/create_session")
            body = json.dumps({"tags": [], "sdk_version": "x", "type": "create_session"})
            r = requests.post(url, data=body, timeout=30)
            self.assertEqual(r.status_code, 401, r.text)
            r = requests.post(url, data=body, headers={"X-API-Key": "tml-wrong"}, timeout=30)
            self.assertEqual(r.status_code, 403, r.text)
            r = requests.get(env.server.url("/api/v1/get_server_capabilities"), timeout=30)
            self.assertEqual(r.status_code, 401, r.text)
            service = tinker.ServiceClient(base_url=env.server.base_url, api_key=token)
            tc = new_run(service, seed=1)
            self.assertTrue(math.isfinite(supervised(tc, dataset(stride=3)[:2], 1)[0]))
        finally:
            env.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--cli", required=True)
    p.add_argument("--configs", required=True)
    ARGS, rest = p.parse_known_args()
    sys.argv = [sys.argv[0]] + rest
    unittest.main(verbosity=2)

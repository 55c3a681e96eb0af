"""Regression tests of `loradb serve` against hostile `POST /v1/bases` bodies: a real server
process on an ephemeral loopback port. A 258-byte config whose sizes would need terabytes, a
module table with 2^62 features, and a config nested 100,000 levels deep each get 400 at once,
the server keeps answering, and no base is registered."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_harness  # noqa: E402

try:
    import requests
except ImportError:  # pragma: no cover
    print("SKIP: Python 'requests' is not installed")
    sys.exit(77)

ARGS = None
AUTH = {"Authorization": "Bearer " + http_harness.TOKEN}

# A body of a few hundred bytes whose sizes would make the module table enormous.
HUGE_CONFIG = (b'{"name":"x","config":{"model_type":"qwen3","hidden_size":1099511627776,'
               b'"num_hidden_layers":2147483647,"num_attention_heads":1,"num_key_value_heads":1,'
               b'"head_dim":1099511627776,"intermediate_size":1099511627776,'
               b'"vocab_size":1099511627776}}')

TINY = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8}


class BaseLimitsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.store = http_harness.Store(ARGS.seed, policies=1, revisions=1)
        # The default body limit (1 MiB): the deep body below must reach the JSON layer.
        cls.server = http_harness.Server(ARGS.cli, cls.store.dir, "--token-file",
                                         cls.store.token_file)
        cls.s = requests.Session()

    @classmethod
    def tearDownClass(cls):
        cls.s.close()
        rc = cls.server.stop()
        cls.store.close()
        assert rc == 0, f"server exited with {rc}"

    def post(self, body):
        headers = dict(AUTH, **{"Content-Type": "application/json"})
        return self.s.post(self.server.url("/v1/bases"), data=body, headers=headers, timeout=60)

    def bases(self):
        r = self.s.get(self.server.url("/v1/bases"), timeout=30)
        self.assertEqual(r.status_code, 200, r.text)
        return [b["name"] for b in r.json()["bases"]]

    def assert_refused(self, body, *words):
        before = self.bases()
        r = self.post(body)
        self.assertEqual(r.status_code, 400, r.text[:300])
        err = r.json()["error"]
        for w in words:
            self.assertIn(w, err["message"])
        # Still answering, and nothing was registered.
        self.assertEqual(self.s.get(self.server.url("/healthz"), timeout=30).status_code, 200)
        self.assertEqual(self.bases(), before)
        return err

    def test_huge_config_is_refused(self):
        err = self.assert_refused(HUGE_CONFIG, "outside loradb's bounds")
        self.assertEqual(err["code"], "invalid_argument")

    def test_each_size_is_bounded(self):
        for key, value in (("num_hidden_layers", 1025), ("hidden_size", 1 << 20),
                           ("vocab_size", 1 << 30), ("head_dim", 4096),
                           ("intermediate_size", 1 << 24)):
            with self.subTest(key=key):
                cfg = dict(TINY, **{key: value})
                self.assert_refused(json.dumps({"name": "big", "config": cfg}), key)
        moe = dict(TINY, model_type="qwen3_moe", num_local_experts=1 << 20,
                   num_experts_per_tok=2, moe_intermediate_size=16)
        self.assert_refused(json.dumps({"name": "big", "config": moe}), "num_experts")

    def test_module_table_is_bounded(self):
        for module in ({"name": "m", "in": 1 << 62, "out": 16},
                       {"name": "m", "in": 16, "out": 1 << 40},
                       {"name": "m", "in": 1 << 24, "out": 1 << 24}):
            with self.subTest(module=module):
                self.assert_refused(json.dumps({"name": "t", "modules": [module]}),
                                    "module table")

    def test_deep_json_is_refused(self):
        depth = 100000
        body = (b'{"name":"deep","config":{"model_type":"qwen3","junk":' + b"[" * depth +
                b"]" * depth + b"}}")
        self.assertLess(len(body), 1 << 20)
        self.assert_refused(body, "deeper than 128")
        # A deep module table and a deep unrelated field are refused the same way.
        self.assert_refused(b'{"name":"deep","modules":' + b"[" * depth + b"]" * depth + b"}",
                            "deeper than 128")
        self.assert_refused(b'{"name":' + b"{" * 200 + b"}" * 200 + b"}", "deeper than 128")

    def test_a_real_config_is_still_accepted(self):
        r = self.post(json.dumps({"name": "tiny", "config": TINY}))
        self.assertEqual(r.status_code, 201, r.text)
        self.assertIn("tiny", self.bases())


if __name__ == "__main__":
    ARGS = http_harness.parse_args()
    unittest.main(verbosity=2)

"""Integration tests of `loradb serve`: a real server process on an ephemeral loopback port,
driven with a real HTTP client (requests) and raw sockets for hostile input."""
import concurrent.futures
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_harness  # noqa: E402

try:
    import requests
except ImportError:  # pragma: no cover
    print("SKIP: Python 'requests' is not installed")
    sys.exit(77)

ARGS = None
AUTH = {"Authorization": "Bearer " + http_harness.TOKEN}


def pol(name):
    return urllib.parse.quote(name, safe="")


def assert_error(tc, resp, status, code=None):
    tc.assertEqual(resp.status_code, status, resp.text)
    body = resp.json()
    tc.assertIn("error", body)
    tc.assertIsInstance(body["error"]["message"], str)
    if code is not None:
        tc.assertEqual(body["error"]["code"], code)
    return body["error"]


def raw_request(port, data, timeout=10):
    """Sends raw bytes on a fresh connection and returns everything read until close/timeout."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
                if b"\r\n\r\n" in b"".join(chunks):
                    head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            if len(rest) >= int(line.split(b":")[1]):
                                return b"".join(chunks)
        except socket.timeout:
            pass
        return b"".join(chunks)


def raw_to_close(port, data, timeout=30):
    """Sends raw bytes on a fresh connection; returns (everything read, closed by the server)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        chunks = []
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    return b"".join(chunks), True
                chunks.append(b)
        except ConnectionResetError:
            return b"".join(chunks), True
        except socket.timeout:
            return b"".join(chunks), False


def metric(text, name):
    return int([x for x in text.splitlines() if x.startswith(name + " ")][0].split()[1])


class ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.store = http_harness.Store(ARGS.seed, policies=3, revisions=4)
        cls.server = http_harness.Server(ARGS.cli, cls.store.dir, "--token-file",
                                         cls.store.token_file, "--max-body-bytes", "65536")
        cls.s = requests.Session()

    @classmethod
    def tearDownClass(cls):
        cls.s.close()
        rc = cls.server.stop()
        cls.store.close()
        assert rc == 0, f"server exited with {rc}"

    def get(self, path, **kw):
        return self.s.get(self.server.url(path), timeout=30, **kw)

    def call(self, method, path, auth=True, **kw):
        headers = dict(kw.pop("headers", {}))
        if auth:
            headers.update(AUTH)
        return self.s.request(method, self.server.url(path), headers=headers, timeout=30, **kw)

    # ---- system routes
    def test_healthz_metrics_openapi(self):
        r = self.get("/healthz")
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.json(), {"status": "ok"})
        r = self.get("/metrics")
        self.assertEqual(r.status_code, 200)
        self.assertTrue(r.headers["Content-Type"].startswith("text/plain"))
        self.assertIn('loradb_http_requests_total{route="/healthz",method="GET",code="200"}', r.text)
        self.assertIn("# TYPE loradb_http_request_duration_seconds histogram", r.text)
        doc = self.get("/openapi.json").json()
        self.assertEqual(doc["openapi"], "3.1.0")
        for path, method in [("/healthz", "get"), ("/metrics", "get"), ("/openapi.json", "get"),
                             ("/", "get"), ("/v1/bases", "post"), ("/v1/policies", "get"),
                             ("/v1/policies", "post"), ("/v1/policies/{policy}/archive", "post"),
                             ("/v1/policies/{policy}/revisions", "get"),
                             ("/v1/revisions/{id}", "get"), ("/v1/revisions/{id}", "delete"),
                             ("/v1/revisions/{id}/tensors", "get"),
                             ("/v1/revisions/{id}/tier", "get"),
                             ("/v1/policies/{policy}/aliases/{alias}/locate", "get"),
                             ("/v1/policies/{policy}/aliases/{alias}", "put"),
                             ("/v1/policies/{policy}/aliases/{alias}/rollback", "post"),
                             ("/v1/policies/{policy}/aliases/{alias}/history", "get"),
                             ("/v1/policies/{policy}/checkpoints", "get"),
                             ("/v1/checkpoints/{id}", "get"), ("/v1/residency", "get"),
                             ("/v1/stats", "get"), ("/v1/revisions/{id}/residency", "get"),
                             ("/v1/revisions/{id}/prefetch", "post"),
                             ("/v1/revisions/{id}/evict", "post"),
                             ("/v1/revisions/{id}/pin", "post"),
                             ("/v1/revisions/{id}/pin", "delete")]:
            self.assertIn(method, doc["paths"].get(path, {}), f"{method} {path} not documented")
        r = self.get("/")
        self.assertEqual(r.status_code, 200)
        self.assertIn("<title>loradb status</title>", r.text)

    # ---- reads
    def test_bases_and_policies(self):
        bases = self.get("/v1/bases").json()["bases"]
        self.assertEqual([b["name"] for b in bases], ["qwen3-tiny"])
        base = self.get("/v1/bases/qwen3-tiny").json()
        self.assertEqual(len(base["modules"]), 4)
        assert_error(self, self.get("/v1/bases/nope"), 404, "not_found")
        page1 = self.get("/v1/policies?limit=2").json()
        self.assertEqual(len(page1["policies"]), 2)
        self.assertIsNotNone(page1["next_cursor"])
        page2 = self.get("/v1/policies", params={"limit": 2, "cursor": page1["next_cursor"]}).json()
        names = [p["name"] for p in page1["policies"] + page2["policies"]]
        self.assertEqual(len(set(names)), len(names))
        self.assertTrue({"team/p0", "team/p1", "team/p2"} <= set(names))
        p = self.get("/v1/policies/" + pol("team/p0")).json()
        self.assertEqual(p["base"], "qwen3-tiny")
        self.assertEqual(p["labels"], {"owner": "tests"})
        self.assertIn("serving", p["aliases"])
        self.assertEqual(p["revision_count"], 4)
        for bad in ["?limit=0", "?limit=1001", "?limit=x", "?cursor=-1", "?limit=%ff"]:
            assert_error(self, self.get("/v1/policies" + bad), 400)

    def test_revisions_pagination_and_metadata(self):
        path = "/v1/policies/" + pol("team/p0") + "/revisions"
        seen, cursor = [], None
        while True:
            params = {"limit": 3}
            if cursor is not None:
                params["cursor"] = cursor
            page = self.get(path, params=params).json()
            seen += page["revisions"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        self.assertEqual([r["seq"] for r in seen], [1, 2, 3, 4])
        rev = self.get(f"/v1/revisions/{seen[0]['id']}").json()
        self.assertEqual(rev["policy"], "team/p0")
        self.assertEqual(rev["lora"]["r"], 2)
        tensors = self.get(f"/v1/revisions/{rev['id']}/tensors").json()
        self.assertEqual(len(tensors["tensors"]), 8)
        self.assertEqual(tensors["total_bytes"], 8 * 2 * 16 * 4)
        t0 = tensors["tensors"][0]
        self.assertEqual(t0["dtype"], "F32")
        self.assertIn(t0["shape"], ([2, 16], [16, 2]))
        tier = self.get(f"/v1/revisions/{rev['id']}/tier").json()["location"]
        self.assertEqual(tier["tier"], "storage")
        self.assertTrue(tier["blob_present"])
        loc = self.get("/v1/policies/" + pol("team/p0") + "/aliases/serving/locate").json()
        self.assertEqual(loc["base"]["name"], "qwen3-tiny")
        self.assertEqual(loc["revision"]["id"], seen[0]["id"])
        self.assertEqual(loc["location"]["tier"], "storage")
        assert_error(self, self.get("/v1/revisions/999999/tensors"), 404)
        assert_error(self, self.get("/v1/policies/" + pol("team/p0") + "/aliases/nope/locate"),
                     404)
        self.assertEqual(rev["state"], "live")
        assert_error(self, self.get("/v1/revisions/999999"), 404, "not_found")
        assert_error(self, self.get("/v1/revisions/abc"), 400, "invalid_argument")
        assert_error(self, self.get("/v1/revisions/99999999999999999999999"), 400)
        ckpts = self.get("/v1/policies/" + pol("team/p2") + "/checkpoints").json()["checkpoints"]
        self.assertEqual(len(ckpts), 1)
        c = self.get(f"/v1/checkpoints/{ckpts[0]['id']}").json()
        self.assertEqual(c["step"], 100)
        self.assertEqual(c["scheduler"], {"name": "cosine", "position": 100})

    # ---- auth
    def test_mutations_need_the_token(self):
        path = "/v1/policies/" + pol("team/p0") + "/aliases/canary"
        rev = self.store.seeded["revisions"][1]
        r = self.call("PUT", path, auth=False, json={"revision": rev})
        assert_error(self, r, 401, "unauthenticated")
        self.assertEqual(r.headers.get("WWW-Authenticate"), "Bearer")
        r = self.call("PUT", path, auth=False, json={"revision": rev},
                      headers={"Authorization": "Bearer wrong-token-000000000"})
        assert_error(self, r, 403, "permission_denied")
        r = self.call("PUT", path, auth=False, json={"revision": rev},
                      headers={"Authorization": "Basic " + http_harness.TOKEN})
        assert_error(self, r, 401)
        # Nothing changed.
        assert_error(self, self.get(path), 404)
        r = self.call("PUT", path, json={"revision": rev, "reason": "test"})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(self.get(path).json()["revision"]["id"], rev)
        # The auth scheme is case-insensitive (RFC 9110 11.1); the token is not.
        for scheme in ("bearer", "BEARER", "bEaReR"):
            r = self.call("PUT", path, auth=False, json={"revision": rev},
                          headers={"Authorization": scheme + " " + http_harness.TOKEN})
            self.assertEqual(r.status_code, 200, (scheme, r.text))
        r = self.call("PUT", path, auth=False, json={"revision": rev},
                      headers={"Authorization": "bearer " + http_harness.TOKEN.upper()})
        assert_error(self, r, 403)

    def test_host_header_must_be_loopback(self):
        assert_error(self, self.get("/healthz", headers={"Host": "evil.example:80"}), 403)
        self.assertEqual(self.get("/healthz", headers={"Host": "localhost"}).status_code, 200)

    # ---- aliases, rollback, delete
    def test_alias_promote_rollback_history_and_delete_conflict(self):
        pname = pol("team/p1")
        revs = self.get(f"/v1/policies/{pname}/revisions").json()["revisions"]
        ids = [r["id"] for r in revs]
        alias = f"/v1/policies/{pname}/aliases/serving"
        self.assertEqual(self.get(alias).json()["revision"]["id"], ids[0])
        r = self.call("PUT", alias, json={"revision": ids[2], "reason": "promote"})
        self.assertEqual(r.json(), {"policy": "team/p1", "alias": "serving", "revision": ids[2]})
        hist = self.get(alias + "/history").json()["entries"]
        self.assertEqual(hist[-1]["from_revision"], ids[0])
        self.assertEqual(hist[-1]["to_revision"], ids[2])
        self.assertEqual(hist[-1]["reason"], "promote")
        err = assert_error(self, self.call("DELETE", f"/v1/revisions/{ids[2]}"), 409)
        self.assertEqual(err["code"], "failed_precondition")
        r = self.call("POST", alias + "/rollback")
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["revision"], ids[0])
        r = self.call("DELETE", f"/v1/revisions/{ids[2]}")
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["state"], "deleted")
        assert_error(self, self.call("DELETE", f"/v1/revisions/{ids[2]}"), 409)
        # Promoting to a deleted revision or another policy's revision is refused.
        self.assertIn(self.call("PUT", alias, json={"revision": ids[2]}).status_code, (404, 409))
        other = self.store.seeded["revisions"][0]
        self.assertIn(self.call("PUT", alias, json={"revision": other}).status_code,
                      (400, 404, 409))
        self.assertEqual(self.get(alias).json()["revision"]["id"], ids[0])
        assert_error(self, self.call("PUT", f"/v1/policies/{pname}/aliases/latest",
                                     json={"revision": ids[0]}), 400)
        listed = self.get(f"/v1/policies/{pname}/revisions?include_deleted=true").json()
        self.assertEqual(len(listed["revisions"]), 4)
        self.assertEqual(len(self.get(f"/v1/policies/{pname}/revisions").json()["revisions"]), 3)

    def test_create_and_archive_policy(self):
        r = self.call("POST", "/v1/policies", json={"name": "acme/new", "base": "qwen3-tiny",
                                                    "labels": {"tier": "gold"}})
        self.assertEqual(r.status_code, 201, r.text)
        self.assertEqual(r.json()["name"], "acme/new")
        assert_error(self, self.call("POST", "/v1/policies",
                                     json={"name": "acme/new", "base": "qwen3-tiny"}), 409)
        assert_error(self, self.call("POST", "/v1/policies",
                                     json={"name": "acme/x", "base": "missing"}), 404)
        r = self.call("POST", "/v1/policies/" + pol("acme/new") + "/archive")
        self.assertEqual(r.status_code, 200, r.text)
        self.assertTrue(r.json()["archived"])
        r = self.call("POST", "/v1/policies/" + pol("acme/new") + "/archive",
                      json={"archived": False})
        self.assertFalse(r.json()["archived"])

    def test_create_base(self):
        r = self.call("POST", "/v1/bases", json={
            "name": "custom-1", "modules": [{"name": "layers.0.q_proj", "in": 8, "out": 8}]})
        self.assertEqual(r.status_code, 201, r.text)
        self.assertEqual(r.json()["module_count"], 1)
        for body in [{"name": "b2"}, {"name": "b2", "modules": []},
                     {"name": "b2", "modules": [{"name": "x", "in": 0, "out": 1}]},
                     {"name": "b2", "modules": [{"name": "x", "in": 1, "out": 1, "z": 1}]},
                     {"name": "b2", "config": {"model_type": "llama"}},
                     {"name": "b2", "config": "x"},
                     {"name": "../b2", "modules": [{"name": "x", "in": 1, "out": 1}]}]:
            assert_error(self, self.call("POST", "/v1/bases", json=body), 400)
        assert_error(self, self.get("/v1/bases/b2"), 404)

    # ---- tiers
    def wait_for_tier(self, rid, tier):
        # Ordering only (prefetch loads in the background): poll until the state is reached.
        for _ in range(300):
            place = self.get(f"/v1/revisions/{rid}/residency").json()
            if place["tier"] == tier:
                return place
            time.sleep(0.05)
        self.fail(f"revision {rid} never reached tier {tier}: {place}")

    def test_tiers_prefetch_pin_evict_and_stats(self):
        rid = self.store.seeded["revisions"][1]  # team/p0: no test deletes its revisions
        place = self.get(f"/v1/revisions/{rid}/residency").json()
        self.assertEqual(place["tier"], "storage")
        self.assertFalse(place["pinned"])
        assert_error(self, self.call("POST", f"/v1/revisions/{rid}/prefetch", auth=False), 401)
        r = self.call("POST", f"/v1/revisions/{rid}/prefetch")
        self.assertEqual(r.status_code, 202, r.text)
        self.wait_for_tier(rid, "cpu")
        r = self.call("POST", f"/v1/revisions/{rid}/pin")
        self.assertEqual(r.status_code, 200, r.text)
        self.assertTrue(r.json()["pinned"])
        self.assertEqual(r.json()["cpu_leases"], 1)
        # The Store owns the tiers: its own routes report the live tier too.
        self.assertEqual(self.get(f"/v1/revisions/{rid}/tier").json()["location"]["tier"], "cpu")
        assert_error(self, self.call("POST", f"/v1/revisions/{rid}/evict"), 409)
        self.assertEqual(self.call("DELETE", f"/v1/revisions/{rid}/pin").status_code, 200)
        assert_error(self, self.call("DELETE", f"/v1/revisions/{rid}/pin"), 404)
        r = self.call("POST", f"/v1/revisions/{rid}/evict")
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["tier"], "storage")
        self.assertEqual(self.get(f"/v1/revisions/{rid}/tier").json()["location"]["tier"],
                         "storage")
        assert_error(self, self.call("POST", f"/v1/revisions/{rid}/evict"), 404)
        assert_error(self, self.call("POST", "/v1/revisions/999999/pin"), 404)
        assert_error(self, self.get("/v1/revisions/999999/residency"), 404, "not_found")
        assert_error(self, self.call("POST", "/v1/revisions/abc/prefetch"), 400)
        residency = self.get("/v1/residency").json()["tiers"]
        cpu = [t for t in residency if t["tier"] == "cpu"][0]
        self.assertEqual(cpu["budget_bytes"], 1 << 30)
        stats = self.get("/v1/stats").json()
        cpu = [t for t in stats["tiers"] if t["tier"] == "cpu"][0]
        self.assertGreaterEqual(cpu["loads"], 1)
        self.assertGreaterEqual(cpu["hits"] + cpu["misses"], 1)
        self.assertIn(stats["loader"]["backend"], ("io_uring", "pread"))
        metrics = self.get("/metrics").text
        self.assertIn("loradb_cpu_cache_loads_total", metrics)

    # ---- hostile input
    def test_malformed_unknown_and_wrongly_typed_bodies(self):
        path = "/v1/policies"
        for body in [b"{", b"[]", b"\"x\"", b"{\"name\": \"a\", \"base\": 3}",
                     b"{\"name\": \"a\", \"base\": \"qwen3-tiny\", \"extra\": 1}",
                     b"{\"name\": \"\xff\xfe\", \"base\": \"qwen3-tiny\"}",
                     b"{\"name\": \"a\x00b\", \"base\": \"qwen3-tiny\"}",
                     b"{\"name\": \"a\", \"base\": \"qwen3-tiny\", \"labels\": [1]}"]:
            r = self.call("POST", path, data=body, headers={"Content-Type": "application/json"})
            err = assert_error(self, r, 400)
            if b"extra" in body:
                self.assertIn("unknown field 'extra'", err["message"])
        alias = "/v1/policies/" + pol("team/p0") + "/aliases/serving"
        for body in [{"revision": -1}, {"revision": "1"}, {"revision": 1.5}, {},
                     {"revision": 1, "reason": "x" * 300}, {"revision": 1, "force": True}]:
            assert_error(self, self.call("PUT", alias, json=body), 400)

    def test_huge_body_is_413(self):
        r = self.call("POST", "/v1/policies", data=b"{" + b" " * (1 << 20) + b"}",
                      headers={"Content-Type": "application/json"})
        assert_error(self, r, 413, "payload_too_large")

    def test_chunked_bodies_are_refused_before_reading(self):
        # Bodies are bounded by Content-Length only: chunked ones are refused (411) unread.
        head = (b"POST /v1/policies HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer " + http_harness.TOKEN.encode() + b"\r\n"
                b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n")
        chunk = b"a" * 65536
        body = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(40)) + b"0\r\n\r\n"
        try:
            resp = raw_request(self.server.port, head + body)
        except (ConnectionResetError, BrokenPipeError):
            resp = b""
        if resp:
            self.assertTrue(resp.startswith(b"HTTP/1.1 411"), resp[:200])
            self.assertIn(b"length_required", resp)
        self.assertEqual(self.get("/healthz").status_code, 200)
        resp = raw_request(self.server.port, head)
        self.assertTrue(resp.startswith(b"HTTP/1.1 411"), resp[:200])

    def test_path_traversal_and_invalid_utf8_in_names(self):
        for name in [b"..", b".", b"%2e%2e", b"..%2F..%2Fetc%2Fpasswd", b"%ff", b"a%00b",
                     b"%c0%ae", b"-bad", b"a%20b", b"%zz"]:
            # Raw bytes: HTTP clients would normalise the dot segments away.
            resp = raw_request(self.server.port, b"GET /v1/policies/" + name +
                               b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            self.assertTrue(resp.startswith(b"HTTP/1.1 400"), (name, resp[:200]))
            self.assertIn(b'"error"', resp)
        r = self.get("/v1/policies/" + pol("team/p0") + "/aliases/..%2Fx")
        assert_error(self, r, 400)
        # A traversal attempt through the raw path never escapes the route table.
        resp = raw_request(self.server.port, b"GET /v1/../../etc/passwd HTTP/1.1\r\n"
                                             b"Host: 127.0.0.1\r\n\r\n")
        self.assertTrue(resp.startswith(b"HTTP/1.1 4"), resp[:80])
        self.assertIn(b'"error"', resp)

    def test_unknown_route_and_method(self):
        assert_error(self, self.get("/v2/anything"), 404, "not_found")
        assert_error(self, self.call("PATCH", "/v1/policies"), 405, "method_not_allowed")

    def test_oversized_headers_rejected(self):
        resp = raw_request(self.server.port,
                           b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " +
                           b"a" * 20000 + b"\r\n\r\n")
        self.assertTrue(resp == b"" or resp.startswith(b"HTTP/1.1 4"), resp[:80])

    def test_concurrent_conflicting_mutations(self):
        pname = pol("team/p2")
        ids = [r["id"] for r in self.get(f"/v1/policies/{pname}/revisions").json()["revisions"]]
        alias = f"/v1/policies/{pname}/aliases/race"
        rng = random.Random(7)
        ops = []
        for _ in range(200):
            k = rng.random()
            if k < 0.6:
                ops.append(("PUT", alias, {"revision": rng.choice(ids)}))
            elif k < 0.8:
                ops.append(("POST", alias + "/rollback", None))
            else:
                ops.append(("DELETE", f"/v1/revisions/{rng.choice(ids[1:])}", None))

        def run(op):
            method, path, body = op
            with requests.Session() as s:
                r = s.request(method, self.server.url(path), headers=AUTH, json=body, timeout=30)
                return method, path, r.status_code, r.json()

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(run, ops))
        for method, path, status, body in results:
            self.assertIn(status, (200, 404, 409), f"{method} {path}: {status} {body}")
            if status != 200:
                self.assertIn("error", body)
        deleted = {int(p.rsplit("/", 1)[1]) for m, p, st, _ in results if m == "DELETE" and st == 200}
        current = self.get(alias)
        if current.status_code == 200:
            cur = current.json()["revision"]
            self.assertEqual(cur["state"], "live")
            self.assertNotIn(cur["id"], deleted)
            hist = self.get(alias + "/history").json()["entries"]
            self.assertEqual(hist[-1]["to_revision"], cur["id"])
            for a, b in zip(hist, hist[1:]):
                self.assertEqual(a["to_revision"], b["from_revision"])
        for rid in deleted:
            self.assertEqual(self.get(f"/v1/revisions/{rid}").json()["state"], "deleted")


class LifecycleTest(unittest.TestCase):
    def setUp(self):
        self.store = http_harness.Store(ARGS.seed, policies=1, revisions=2)

    def tearDown(self):
        self.store.close()

    def test_refuses_non_loopback_without_token_and_bad_token_files(self):
        for extra in (["--listen", "0.0.0.0:0"], ["--auth-reads"]):
            r = subprocess.run([ARGS.cli, "--store", self.store.dir, "serve", *extra],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("error:", r.stderr)
        short = os.path.join(self.store.tmp.name, "short")
        with open(short, "w") as f:
            f.write("abc\n")
        r = subprocess.run([ARGS.cli, "--store", self.store.dir, "serve", "--listen",
                            "127.0.0.1:0", "--token-file", short], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("shorter than 16", r.stderr)
        r = subprocess.run([ARGS.cli, "--store", os.path.join(self.store.tmp.name, "none"),
                            "serve", "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot open store", r.stderr)

    def test_without_token_mutations_are_refused_and_auth_reads(self):
        srv = http_harness.Server(ARGS.cli, self.store.dir)
        try:
            r = requests.post(srv.url("/v1/policies"), json={"name": "x", "base": "qwen3-tiny"},
                              timeout=30)
            assert_error(self, r, 401)
            self.assertEqual(requests.get(srv.url("/v1/policies"), timeout=30).status_code, 200)
        finally:
            self.assertEqual(srv.stop(), 0)
        srv = http_harness.Server(ARGS.cli, self.store.dir, "--token-file", self.store.token_file,
                                  "--auth-reads")
        try:
            assert_error(self, requests.get(srv.url("/v1/policies"), timeout=30), 401)
            r = requests.get(srv.url("/v1/policies"), headers=AUTH, timeout=30)
            self.assertEqual(r.status_code, 200)
            self.assertEqual(requests.get(srv.url("/healthz"), timeout=30).status_code, 200)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_graceful_shutdown_answers_a_request_in_progress(self):
        srv = http_harness.Server(ARGS.cli, self.store.dir, "--token-file", self.store.token_file)
        body = json.dumps({"name": "late/policy", "base": "qwen3-tiny"}).encode()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        try:
            s.sendall(b"POST /v1/policies HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Authorization: Bearer " + http_harness.TOKEN.encode() + b"\r\n"
                      b"Content-Type: application/json\r\nContent-Length: " +
                      str(len(body)).encode() + b"\r\n\r\n" + body[:5])
            time.sleep(0.3)  # ordering only: the server has accepted and is reading the body
            srv.proc.send_signal(15)
            time.sleep(0.3)
            s.sendall(body[5:])
            resp = b""
            while b"\r\n\r\n" not in resp or not resp.rstrip().endswith(b"}"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                resp += chunk
        finally:
            s.close()
        self.assertEqual(srv.stop(), 0)
        # The head arrived before SIGTERM: the request had started, so it finishes (its body
        # arriving after the signal) instead of getting 503.
        self.assertTrue(resp.startswith(b"HTTP/1.1 201"), resp[:300])
        self.assertIn(b"Connection: close", resp)
        self.assertIn(b"late/policy", resp)

    def test_slow_clients_are_cut_off_and_a_full_budget_makes_room(self):
        srv = http_harness.Server(ARGS.cli, self.store.dir, "--max-connections", "3",
                                  "--read-timeout-ms", "1500")
        idle = []
        try:
            # Three silent connections fill the budget.
            for _ in range(3):
                idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=30))
                time.sleep(0.1)
            # A new client is answered: the oldest silent connection made room for it.
            resp = raw_request(srv.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            self.assertTrue(resp.startswith(b"HTTP/1.1 200"), resp[:100])
            # The silent clients are disconnected (evicted or by the read timeout: EOF).
            for c in idle:
                c.settimeout(30)
                try:
                    self.assertEqual(c.recv(100), b"")
                except ConnectionResetError:
                    pass
            ok = requests.get(srv.url("/healthz"), timeout=30)
            self.assertEqual(ok.status_code, 200)
            metrics = requests.get(srv.url("/metrics"), timeout=30).text
            self.assertGreaterEqual(metric(metrics, "loradb_http_connections_evicted_total"), 1)
        finally:
            for c in idle:
                c.close()
            self.assertEqual(srv.stop(), 0)


class HostileClientTest(unittest.TestCase):
    """The attacks of a hostile client against a real server: ambiguous request heads (RFC 9112),
    slowloris over many connections, heads and bodies that never finish."""

    def setUp(self):
        self.store = http_harness.Store(ARGS.seed, policies=1, revisions=2)
        self.servers = []

    def tearDown(self):
        for srv in self.servers:
            self.assertEqual(srv.stop(), 0)
        self.store.close()

    def start(self, *extra):
        srv = http_harness.Server(ARGS.cli, self.store.dir, "--token-file", self.store.token_file,
                                  *extra)
        self.servers.append(srv)
        return srv

    def test_rfc9112_violations_get_400_and_a_closed_connection(self):
        srv = self.start()
        auth = b"Authorization: Bearer " + http_harness.TOKEN.encode() + b"\r\n"
        policy = b"/v1/policies/" + pol("team/p0").encode() + b"/aliases/canary"
        body = b'{"revision": %d}' % self.store.seeded["revisions"][0]
        cases = {
            # A bare LF hides a Content-Length: answered as two requests by a lenient parser.
            "bare LF in a header line": b"PUT " + policy + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
            auth + b"X-A: x\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body,
            "bare LF after the request line": b"GET /healthz HTTP/1.1\nHost: 127.0.0.1\r\n\r\n",
            "CR in a value": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\rb\r\n\r\n",
            "NUL in a value": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\x00b\r\n\r\n",
            "obs-fold": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\r\n b\r\n\r\n",
            "obs-fold with a tab": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\r\n\tb\r\n\r\n",
            "CL + TE": b"POST /v1/policies HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "TE + CL": b"POST /v1/policies HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
            b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
            "duplicate Host": b"GET /healthz HTTP/1.1\r\nHost: evil.com\r\nHost: 127.0.0.1\r\n\r\n",
            "missing Host": b"GET /healthz HTTP/1.1\r\n\r\n",
            "empty Host": b"GET /healthz HTTP/1.1\r\nHost:\r\n\r\n",
            "NUL in Host": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\x00.evil.com\r\n\r\n",
            "junk after an IPv6 literal": b"GET /healthz HTTP/1.1\r\nHost: [::1]evil.com\r\n\r\n",
            "duplicate Content-Length": b"POST /v1/policies HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
            auth + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        }
        for name, data in cases.items():
            resp, closed = raw_to_close(srv.port, data)
            self.assertTrue(resp.startswith(b"HTTP/1.1 400"), (name, resp[:200]))
            self.assertEqual(len(re.findall(rb"(?:^|\r\n)HTTP/1\.1 \d{3} ", resp)), 1, (name, resp))
            self.assertIn(b"Connection: close", resp, name)
            self.assertIn(b'"bad_request"', resp, name)
            self.assertTrue(closed, f"{name}: the connection stayed open")
        # Nothing was smuggled through: the alias the first case hid a PUT for does not exist.
        r = requests.get(srv.url("/v1/policies/" + pol("team/p0") + "/aliases/canary"),
                         timeout=30)
        self.assertEqual(r.status_code, 404, r.text)
        self.assertEqual(requests.get(srv.url("/healthz"), timeout=30).status_code, 200)

    def test_slowloris_leaves_healthz_and_authorised_calls_answered(self):
        # The budget (128) is smaller than the attack (130 connections from one address, each
        # sending one header byte every 2 s): without eviction every newcomer would get 503. The
        # head and read timeouts are far past the test's length and every probe keeps its
        # connection open (idle, keep-alive) until the end, so the budget stays full and each
        # probe makes its own room by an eviction: 2 for the attack's overflow plus one per probe.
        # (A probe that closed its connection could free the slot before the next one came,
        # and a loaded machine's head timeout could close attackers first.)
        srv = self.start("--max-connections", "128", "--max-connections-per-client", "128",
                         "--header-timeout-ms", "300000", "--read-timeout-ms", "300000")
        attack = []
        for _ in range(130):
            c = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
            c.sendall(b"G")
            attack.append(c)
        stop = threading.Event()
        dropped = [0]

        def trickle():
            head = b"ET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 1000
            for i in range(len(head)):
                for c in list(attack):
                    try:
                        c.sendall(head[i:i + 1])
                    except OSError:
                        attack.remove(c)
                        c.close()
                        dropped[0] += 1
                if stop.wait(2.0):
                    return

        t = threading.Thread(target=trickle)
        t.start()
        latencies = []
        probes = []  # one session (one connection) per probe, kept open
        try:
            time.sleep(0.5)  # ordering only: the attack's connections are in
            alias = srv.url("/v1/policies/" + pol("team/p0") + "/aliases/canary")
            rev = self.store.seeded["revisions"][1]
            for _ in range(5):
                probes.append(requests.Session())
                t0 = time.monotonic()
                r = probes[-1].get(srv.url("/healthz"), timeout=10)
                latencies.append(time.monotonic() - t0)
                self.assertEqual(r.status_code, 200, r.text)
                probes.append(requests.Session())
                t0 = time.monotonic()
                r = probes[-1].put(alias, json={"revision": rev}, headers=AUTH, timeout=10)
                latencies.append(time.monotonic() - t0)
                self.assertEqual(r.status_code, 200, r.text)
                time.sleep(0.5)
        finally:
            stop.set()
            t.join()
            for c in attack:
                c.close()
            for p in probes:
                p.close()
        metrics = requests.get(srv.url("/metrics"), timeout=30).text
        evicted = metric(metrics, "loradb_http_connections_evicted_total")
        print(f"slowloris: {len(latencies)} probes answered, max {max(latencies):.3f} s, "
              f"{dropped[0]} attack connections seen closed, {evicted} evicted", file=sys.stderr)
        self.assertGreaterEqual(evicted, 2 + len(latencies))
        self.assertEqual(metric(metrics, "loradb_http_connections_rejected_total"), 0)

    def test_heads_and_bodies_that_never_finish_time_out(self):
        srv = self.start("--header-timeout-ms", "1000", "--body-timeout-ms", "1000",
                         "--read-timeout-ms", "30000")

        def trickle(prefix, rest):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
            s.sendall(prefix)
            resp = b""
            try:
                for i in range(len(rest)):  # one byte every 50 ms: progress, but no end
                    s.sendall(rest[i:i + 1])
                    time.sleep(0.05)
                    s.setblocking(False)
                    try:
                        resp += s.recv(65536)
                    except BlockingIOError:
                        pass
                    finally:
                        s.setblocking(True)
                    if resp:
                        break
                s.settimeout(30)
                while True:
                    b = s.recv(65536)
                    if not b:
                        break
                    resp += b
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                s.close()
            return resp

        resp = trickle(b"GET /healthz HTTP/1.1\r\n", b"X-Slow: " + b"a" * 2000 + b"\r\n\r\n")
        self.assertTrue(resp.startswith(b"HTTP/1.1 408"), resp[:200])
        self.assertIn(b"request head not received", resp)
        head = (b"POST /v1/policies HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " +
                http_harness.TOKEN.encode() + b"\r\nContent-Length: 2000\r\n\r\n")
        resp = trickle(head, b" " * 2000)
        self.assertTrue(resp.startswith(b"HTTP/1.1 408"), resp[:200])
        self.assertIn(b"request body not received", resp)
        metrics = requests.get(srv.url("/metrics"), timeout=30).text
        self.assertEqual(metric(metrics, "loradb_http_requests_timed_out_total"), 2)


if __name__ == "__main__":
    ARGS = http_harness.parse_args()
    unittest.main(verbosity=2)

"""Soak of `loradb serve`: 64 clients for 5 minutes against a real server process on an
ephemeral loopback port, mixing reads, alias moves, publishes (`loradb import` into the served
store from another process) and slow clients (heads and bodies trickled, silent connections).
Passes when no response is a 5xx other than a deliberate 503, the server exits 0 on SIGTERM,
`loradb verify` passes afterwards, and the server's memory (RssAnon: VmRSS without the pages of
the LMDB map, which grow with the catalog) stays within 20% of its value after the first minute.
Prints the figures as one JSON line.

Slow: runs only with LORADB_SLOW_TESTS=1 (`tools/dev test --all`), else exits 77 (skipped).
LORADB_SOAK_SECONDS overrides the 300 s duration (the RSS check needs more than 60 s)."""
import collections
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_harness  # noqa: E402

try:
    import requests
except ImportError:  # pragma: no cover
    print("SKIP: Python 'requests' is not installed")
    sys.exit(77)

CLIENTS = {"reader": 40, "mover": 12, "publisher": 4, "slow": 8}  # 64 in all
AUTH = {"Authorization": "Bearer " + http_harness.TOKEN}


def rss_kib(pid):
    """(VmRSS, RssAnon) in KiB. VmRSS also counts the pages of the LMDB map the process has
    touched, which grow with the catalog (every publish and alias move adds records); RssAnon is
    the process's own memory, where a leak would show."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon"):
                out[key] = int(line.split()[1])
    return out.get("VmRSS", 0), out.get("RssAnon", 0)


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.status = collections.Counter()  # (kind, status) -> count
        self.errors = collections.Counter()  # (kind, exception name) -> count
        self.bad = []  # unexpected 5xx

    def add(self, kind, status, body=""):
        with self.lock:
            self.status[(kind, status)] += 1
            if status >= 500 and status != 503:
                self.bad.append((kind, status, body[:200]))

    def error(self, kind, exc):
        with self.lock:
            self.errors[(kind, type(exc).__name__)] += 1


def main():
    args = http_harness.parse_args()
    if os.environ.get("LORADB_SLOW_TESTS") != "1":
        print("SKIP: the soak runs with LORADB_SLOW_TESTS=1 (tools/dev test --all)")
        return 77
    seconds = float(os.environ.get("LORADB_SOAK_SECONDS", "300"))
    store = http_harness.Store(args.seed, policies=8, revisions=4)
    export_dir = os.path.join(store.tmp.name, "export")
    subprocess.run([args.cli, "--store", store.dir, "export", "team/p0:serving", export_dir],
                   check=True, capture_output=True, timeout=120)
    srv = http_harness.Server(args.cli, store.dir, "--token-file", store.token_file,
                              "--max-connections", "256", "--max-connections-per-client", "256",
                              "--header-timeout-ms", "5000", "--body-timeout-ms", "5000")
    policies = store.seeded["policies"]
    tally = Tally()
    stop = threading.Event()
    ids = {p: [] for p in policies}
    for p in policies:
        revs = requests.get(srv.url("/v1/policies/" + urllib.parse.quote(p, safe="") +
                                    "/revisions"), timeout=30).json()["revisions"]
        ids[p] = [r["id"] for r in revs]
    ids_lock = threading.Lock()
    counts = collections.Counter()

    def reader(rng):
        s = requests.Session()
        while not stop.is_set():
            p = rng.choice(policies)
            with ids_lock:
                rid = rng.choice(ids[p])
            path = rng.choice([f"/v1/revisions/{rid}", f"/v1/revisions/{rid}/residency",
                               "/v1/policies?limit=5",
                               "/v1/policies/" + urllib.parse.quote(p, safe="") +
                               "/aliases/serving", "/healthz", "/metrics", "/v1/stats"])
            r = s.get(srv.url(path), timeout=30)
            tally.add("read", r.status_code, r.text)
            counts["read"] += 1

    def mover(rng):
        s = requests.Session()
        while not stop.is_set():
            p = rng.choice(policies[:4])
            alias = "/v1/policies/" + urllib.parse.quote(p, safe="") + "/aliases/serving"
            if rng.random() < 0.8:
                with ids_lock:
                    rid = rng.choice(ids[p])
                r = s.put(srv.url(alias), json={"revision": rid, "reason": "soak"},
                          headers=AUTH, timeout=30)
            else:
                r = s.post(srv.url(alias + "/rollback"), headers=AUTH, timeout=30)
            tally.add("move", r.status_code, r.text)
            counts["move"] += 1

    def publisher(rng):
        while not stop.is_set():
            p = rng.choice(policies[4:])
            out = subprocess.run([args.cli, "--store", store.dir, "import", "--json", "--policy", p,
                                  export_dir], capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                tally.add("publish", 599, out.stderr)  # a failed publish fails the soak
                continue
            rid = json.loads(out.stdout)["id"]
            with ids_lock:
                ids[p].append(rid)
            counts["publish"] += 1
            # The served store sees the new revision.
            r = requests.get(srv.url(f"/v1/revisions/{rid}"), timeout=30)
            tally.add("read", r.status_code, r.text)

    def slow(rng):
        while not stop.is_set():
            mode = rng.choice(["head", "body", "silent"])
            try:
                c = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
            except OSError as e:
                tally.error("slow", e)
                continue
            try:
                if mode == "head":
                    data = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 400
                elif mode == "body":
                    c.sendall(b"POST /v1/policies HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
                              b"Bearer " + http_harness.TOKEN.encode() +
                              b"\r\nContent-Length: 400\r\n\r\n")
                    data = b" " * 400
                else:
                    data = b""
                c.settimeout(0.25)
                resp = b""
                for i in range(max(len(data), 40)):
                    if stop.is_set():
                        break
                    if i < len(data):
                        c.sendall(data[i:i + 1])
                    try:
                        b = c.recv(65536)
                        resp += b
                        if not b or resp:
                            break
                    except socket.timeout:
                        pass
                if resp:
                    tally.add("slow", int(resp.split(b" ", 2)[1]))
                counts["slow"] += 1
            except OSError as e:
                tally.error("slow", e)
            finally:
                c.close()

    threads = []
    seed = 0
    for kind, n in CLIENTS.items():
        for _ in range(n):
            seed += 1
            rng = random.Random(seed)
            fn = {"reader": reader, "mover": mover, "publisher": publisher, "slow": slow}[kind]

            def run(fn=fn, rng=rng, kind=kind):
                while not stop.is_set():
                    try:
                        fn(rng)
                    except (requests.RequestException, OSError, ValueError) as e:
                        tally.error(kind, e)

            threads.append(threading.Thread(target=run, daemon=True))
    start = time.monotonic()
    for t in threads:
        t.start()
    rss = []
    while time.monotonic() - start < seconds:
        time.sleep(5)
        rss.append((round(time.monotonic() - start), *rss_kib(srv.proc.pid)))
    stop.set()
    for t in threads:
        t.join(timeout=60)
    metrics = requests.get(srv.url("/metrics"), timeout=30).text
    rc = srv.stop()
    verify = subprocess.run([args.cli, "--store", store.dir, "verify"], capture_output=True,
                            text=True, timeout=600)
    after_first_minute = [anon for t, _, anon in rss if t >= 60]
    base = after_first_minute[0] if after_first_minute else 0
    worst = max((abs(v - base) / base for v in after_first_minute), default=0.0) if base else 0.0

    def metric(name):
        lines = [x for x in metrics.splitlines() if x.startswith(name + " ")]
        return int(lines[0].split()[1]) if lines else None

    report = {
        "soak": "http", "seconds": seconds, "clients": CLIENTS,
        "requests": dict(counts),
        "status": {f"{k}:{s}": n for (k, s), n in sorted(tally.status.items())},
        "client_errors": {f"{k}:{e}": n for (k, e), n in sorted(tally.errors.items())},
        "unexpected_5xx": len(tally.bad),
        "rss_anon_kib_at_60s": base,
        "rss_anon_kib_max": max((a for t, _, a in rss if t >= 60), default=0),
        "rss_anon_kib_last": rss[-1][2] if rss else 0, "rss_anon_max_deviation": round(worst, 3),
        "vmrss_kib_at_60s": next((v for t, v, _ in rss if t >= 60), 0),
        "vmrss_kib_last": rss[-1][1] if rss else 0,
        "evicted": metric("loradb_http_connections_evicted_total"),
        "timed_out": metric("loradb_http_requests_timed_out_total"),
        "rejected": metric("loradb_http_connections_rejected_total"),
        "server_exit": rc, "verify_exit": verify.returncode,
    }
    print(json.dumps(report))
    store.close()
    ok = True
    if tally.bad:
        print("unexpected 5xx:", tally.bad[:10], file=sys.stderr)
        ok = False
    if rc != 0:
        print(f"server exited {rc}", file=sys.stderr)
        ok = False
    if verify.returncode != 0:
        print("verify failed:", verify.stdout[-2000:], verify.stderr[-2000:], file=sys.stderr)
        ok = False
    if seconds > 60 and worst > 0.2:
        print(f"RssAnon moved {worst:.0%} from its value after the first minute: {rss}",
              file=sys.stderr)
        ok = False
    if counts["read"] == 0 or counts["move"] == 0 or counts["publish"] == 0:
        print(f"a client kind made no progress: {dict(counts)}", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# loradb-test: args=loradb_cli,loradb_api_seed,loradb_c timeout=300 requires=loradb_api_seed
"""One JSON shape per record (docs/json.md): the HTTP admin endpoint, `loradb ... --json` and the
C API's JSON print the same objects for the same records of one store.

usage: record_shapes_test.py LORADB_CLI LORADB_API_SEED LIBLORADB

A store seeded by loradb_api_seed (a base, two policies with revisions, an alias and a
checkpoint each) is read through all three surfaces: bases, policies, revisions, alias log
entries, aliases as set and rolled back, and the base / revision / checkpoint inside a locate
answer must be equal, field for field (the extra fields a CLI command documents, such as
`show`'s `aliases`, aside). Exit status 0 when every check passes, 1 otherwise.
"""
import ctypes
import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "api"))
import http_harness  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def check_equal(a, b, what):
    if a != b:
        failures.append(what)
        print(f"FAIL: {what}:\n  {json.dumps(a, sort_keys=True)}\n  {json.dumps(b, sort_keys=True)}",
              file=sys.stderr)


class Http:
    def __init__(self, server):
        self.server = server

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server.url(path), data=data, method=method, headers={
            "Authorization": "Bearer " + http_harness.TOKEN, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def get(self, path):
        return self.call("GET", path)


def quote(name):
    return urllib.parse.quote(name, safe="")


class Cli:
    def __init__(self, cli, store_dir):
        self.cli, self.store_dir = cli, store_dir

    def json(self, *args):
        p = subprocess.run([self.cli, "--store", self.store_dir, *args, "--json"],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"loradb {' '.join(args)}: exit {p.returncode}: {p.stderr}")
        return json.loads(p.stdout)


class CApi:
    """The JSON-returning calls of libloradb, through ctypes."""

    def __init__(self, lib_path, store_dir):
        self.lib = ctypes.CDLL(lib_path)
        self.lib.loradb_free.argtypes = [ctypes.c_void_p]
        self.store = ctypes.c_void_p()
        err = ctypes.c_void_p()
        d = store_dir.encode()
        rc = self.lib.loradb_open(d, ctypes.c_size_t(len(d)), None, ctypes.byref(self.store),
                                  ctypes.byref(err))
        if rc != 0:
            raise RuntimeError(f"loradb_open: status {rc}: {self.message(err)}")

    def message(self, err):
        if not err.value:
            return ""
        text = ctypes.string_at(err.value).decode()
        self.lib.loradb_free(err)
        return text

    def returned_json(self, name, *args):
        out, length, err = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_void_p()
        rc = getattr(self.lib, name)(self.store, *args, ctypes.byref(out), ctypes.byref(length),
                                     *([ctypes.byref(ctypes.c_uint64())]
                                       if name == "loradb_policy_list" else []),
                                     ctypes.byref(err))
        if rc != 0:
            raise RuntimeError(f"{name}: status {rc}: {self.message(err)}")
        text = ctypes.string_at(out.value, length.value).decode()
        self.lib.loradb_free(out)
        return json.loads(text)

    def base_list(self):
        return self.returned_json("loradb_base_list")

    def policy_list(self):
        return self.returned_json("loradb_policy_list", ctypes.c_uint64(0), ctypes.c_size_t(1000))

    def alias_history(self, policy, alias):
        p, a = policy.encode(), alias.encode()
        return self.returned_json("loradb_alias_history", p, ctypes.c_size_t(len(p)), a,
                                  ctypes.c_size_t(len(a)))

    def close(self):
        self.lib.loradb_close(ctypes.byref(self.store))


def without(obj, *keys):
    return {k: v for k, v in obj.items() if k not in keys}


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    cli_bin, seed_bin, lib_path = sys.argv[1:]
    store = http_harness.Store(seed_bin, policies=2, revisions=2)
    server = http_harness.Server(cli_bin, store.dir, "--token-file", store.token_file)
    capi = CApi(lib_path, store.dir)
    http, cli = Http(server), Cli(cli_bin, store.dir)
    try:
        # Bases: HTTP list, CLI list, C API list.
        bases = http.get("/v1/bases")["bases"]
        check(len(bases) == 1, f"one base ({len(bases)})")
        check_equal(cli.json("base", "ls"), bases, "base: CLI vs HTTP")
        check_equal(capi.base_list(), bases, "base: C API vs HTTP")
        with_modules = http.get("/v1/bases/" + quote(bases[0]["name"]))
        check_equal(without(with_modules, "modules"), bases[0], "base: with and without modules")

        # Policies: each from HTTP, the CLI list, the C API list.
        cli_policies = cli.json("policy", "ls")
        check(len(cli_policies) == 2, f"two policies ({len(cli_policies)})")
        # GET /v1/policies/{policy} adds the policy's aliases and revision count (docs/json.md).
        http_policies = [without(http.get("/v1/policies/" + quote(p["name"])), "aliases",
                                 "revision_count") for p in cli_policies]
        check_equal(cli_policies, http_policies, "policy: CLI vs HTTP")
        check_equal(capi.policy_list(), http_policies, "policy: C API vs HTTP")

        # Revisions: HTTP by id, CLI ls (less its cursor) and show (less aliases and blob path).
        revisions = cli.json("ls", "--limit", "0")
        check(len(revisions) == 4, f"four revisions ({len(revisions)})")
        for r in revisions:
            one = http.get(f"/v1/revisions/{r['id']}")
            check_equal(without(r, "cursor"), one, f"revision {r['id']}: CLI ls vs HTTP")
            show = cli.json("show", str(r["id"]))
            check_equal(without(show, "aliases", "blob_path"), one,
                        f"revision {r['id']}: CLI show vs HTTP")
        p0 = cli_policies[0]["name"]
        listed = http.get(f"/v1/policies/{quote(p0)}/revisions")["revisions"]
        check_equal(listed, [without(r, "cursor") for r in revisions if r["policy"] == p0],
                    "revision: HTTP policy list vs CLI ls")

        # Aliases as moved: HTTP set and rollback, CLI alias and rollback.
        second = [r["id"] for r in revisions if r["policy"] == p0][1]
        set_http = http.call("PUT", f"/v1/policies/{quote(p0)}/aliases/serving",
                             {"revision": second, "reason": "promote"})
        check_equal(set_http, {"policy": p0, "alias": "serving", "revision": second},
                    "alias: HTTP set")
        check_equal(cli.json("alias", p0, "canary", str(second)),
                    {"policy": p0, "alias": "canary", "revision": second}, "alias: CLI set")
        back_http = http.call("POST", f"/v1/policies/{quote(p0)}/aliases/serving/rollback", {})
        back_cli = cli.json("rollback", p0, "serving")
        check_equal(sorted(back_http), sorted(back_cli), "alias: rollback fields")
        check_equal(back_http["alias"], "serving", "alias: HTTP rollback names the alias")

        # Alias log entries: HTTP history, C API history.
        entries = http.get(f"/v1/policies/{quote(p0)}/aliases/serving/history")["entries"]
        check(len(entries) >= 3, f"alias log has the seed's, the set's and the rollbacks' moves "
                                 f"({len(entries)})")
        check_equal(capi.alias_history(p0, "serving"), entries, "alias log: C API vs HTTP")

        # Inside a locate answer: the same base, revision and checkpoint objects.
        located = http.get(f"/v1/policies/{quote(p0)}/aliases/serving/locate")
        check_equal(located["base"], bases[0], "locate: base")
        check_equal(located["revision"], http.get(f"/v1/revisions/{located['revision']['id']}"),
                    "locate: revision")
        checkpoints = http.get(f"/v1/policies/{quote(p0)}/checkpoints")["checkpoints"]
        check(len(checkpoints) >= 1, "the seeded policy has a checkpoint")
        for c in checkpoints:
            check_equal(http.get(f"/v1/checkpoints/{c['id']}"), c, f"checkpoint {c['id']}")
        if located["checkpoint"] is not None:
            check(located["checkpoint"] in checkpoints, "locate: checkpoint")
    finally:
        capi.close()
        stop_rc = server.stop()
        store.close()
    check(stop_rc == 0, f"server exit {stop_rc}")
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("record shapes: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared helpers for the HTTP admin endpoint tests: seed a store, start `loradb serve` on an
ephemeral loopback port, stop it with SIGTERM. Loopback addresses only."""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

TOKEN = "test-token-0123456789abcdef"


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--cli", required=True)
    p.add_argument("--seed", required=True)
    args, rest = p.parse_known_args()
    sys.argv = [sys.argv[0]] + rest
    return args


class Store:
    """A temporary store seeded by loradb_api_seed."""

    def __init__(self, seed_bin, policies=3, revisions=4):
        self.tmp = tempfile.TemporaryDirectory(prefix="loradb-http-test-")
        self.dir = os.path.join(self.tmp.name, "store")
        out = subprocess.run([seed_bin, self.dir, str(policies), str(revisions)], check=True,
                             capture_output=True, text=True)
        self.seeded = json.loads(out.stdout)
        self.token_file = os.path.join(self.tmp.name, "token")
        with open(self.token_file, "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(self.token_file, 0o600)

    def close(self):
        self.tmp.cleanup()


class Server:
    """`loradb --store DIR serve --listen 127.0.0.1:0 ...`; base_url once started."""

    def __init__(self, cli, store_dir, *extra):
        self.proc = subprocess.Popen([cli, "--store", store_dir, "serve", "--listen", "127.0.0.1:0",
                                      *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            err = self.proc.stderr.read()
            self.proc.wait(timeout=30)
            raise RuntimeError(f"server did not start: {line!r} {err!r}")
        self.base_url = line.split()[-1].strip()
        self.port = int(self.base_url.rsplit(":", 1)[1])

    def url(self, path):
        return self.base_url + path

    def stop(self, timeout=60):
        """SIGTERM, then wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.proc.stderr.close()

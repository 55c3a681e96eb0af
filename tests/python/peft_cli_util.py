"""Helpers shared by the oracle scripts that drive the `loradb` CLI on PEFT adapters."""
import subprocess
import sys

FAILURES = []


def fail(msg):
    """Records a failed check (the script exits 1 at the end) and prints it."""
    FAILURES.append(msg)
    print("FAIL:", msg)


def loradb_runner(cli):
    """Returns loradb(store, *args, ok=True): runs `cli --store STORE ARGS...`, raising when it
    fails and `ok` is set."""
    def loradb(store, *args, ok=True):
        p = subprocess.run([cli, "--store", store, *args], capture_output=True, text=True)
        if ok and p.returncode != 0:
            raise RuntimeError(f"loradb {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p
    return loradb


def finish(name):
    """Exits 1 when a check failed, else prints that all passed."""
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        sys.exit(1)
    print(f"{name}: all checks passed")

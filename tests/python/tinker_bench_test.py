#!/usr/bin/env python3
# loradb-test: args=loradb_bench,loradb_cli timeout=600 requires=loradb_compute
"""`loradb-bench tinker` runs its three cases end to end at tiny sizes and prints their lines.

usage: tinker_bench_test.py LORADB_BENCH LORADB

Runs `loradb-bench tinker all` on the tiny dense base (batch 2 x 8 tokens, one timed step, one
thread): the in-process arm, the SDK arm (bench/tinker_driver.py overhead), the
transformers + peft peer (bench/peft_peer_driver.py), and three SDK client processes against two
`loradb serve --model --train` processes (bench/tinker_driver.py clients). Checks that it exits
0 and prints every measurement line with its fields (the peer's first-step loss equal to
loradb's, each concurrent arm's per-client times and losses and the server's peak RSS) and the
four goal lines with a numeric value and a met flag. Times are not judged (speed belongs in the
benchmark). Exit status 77 (ctest: skipped) when the tinker SDK, transformers or peft is missing
or loradb-bench was built without the tinker scenario.
"""
import json
import subprocess
import sys

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    bench, loradb = sys.argv[1], sys.argv[2]
    try:
        import peft  # noqa: F401
        import tinker  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e.name} is not installed (tools/dev setup installs it)")
        return 77
    if subprocess.run([bench, "tinker", "--help"], capture_output=True).returncode != 0:
        print("skipped: this loradb-bench has no tinker scenario (built without LibTorch)")
        return 77
    cmd = [bench, "tinker", "all", "--config", "tiny-dense", "--batch", "2", "--length", "8",
           "--warmup", "0", "--steps", "1", "--threads", "1", "--loradb", loradb]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=540)
    if run.returncode != 0:
        print(run.stdout, run.stderr, sep="\n")
        print("FAIL:", " ".join(cmd), "exited", run.returncode)
        return 1
    lines = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
    cases = {}
    for l in lines:
        check(l.get("bench") == "tinker", f"line of another bench: {l}")
        if "case" in l:
            cases.setdefault(l["case"], []).append(l)
    for case in ["step_in_process", "step_sdk_loopback"]:
        check(len(cases.get(case, [])) == 1 and cases[case][0]["median_step_s"] > 0,
              f"one {case} line with a median_step_s")
    peer = cases.get("peer_transformers_peft", [])
    check(len(peer) == 1, "one peer_transformers_peft line")
    if peer:
        p = peer[0]
        check(abs(p["first_loss"] - p["loradb_first_loss"]) <= 1e-4 * abs(p["loradb_first_loss"]),
              f"peer first-step loss {p['first_loss']} equals loradb's {p['loradb_first_loss']}")
        check(p["median_step_s"] > 0 and p["threads"] == 1, "peer step time and thread count")
    arms = cases.get("concurrent", [])
    check(sorted(a["schedule"] for a in arms) == ["parallel", "sequential"],
          "one concurrent line per schedule")
    for a in arms:
        check(len(a["client_s"]) == 3 and all(t > 0 for t in a["client_s"]),
              f"{a['schedule']}: three clients' loop times")
        check(len(a["first_loss"]) == 3 and len(a["last_loss"]) == 3,
              f"{a['schedule']}: three clients' losses")
        check(a["server_peak_rss_bytes"] > 0, f"{a['schedule']}: the server's peak RSS")
        check(a["wall_s"] > 0, f"{a['schedule']}: wall time")
    if len(arms) == 2:
        # The same clients, data and seeds train the same policies in either schedule.
        seq, par = sorted(arms, key=lambda a: a["schedule"] != "sequential")
        for s, p in zip(seq["first_loss"], par["first_loss"]):
            check(abs(s - p) <= 1e-4 * abs(s), f"first-step losses agree across schedules: {s} {p}")
    check(len(cases.get("concurrent_summary", [])) == 1, "one concurrent_summary line")
    goals = {l["goal"]: l for l in lines if "goal" in l}
    for g in ["sdk_step_overhead", "peer_step_ratio", "concurrent_speedup",
              "concurrent_peak_rss_ratio"]:
        check(g in goals and isinstance(goals[g]["value"], (int, float)) and
              isinstance(goals[g]["met"], bool), f"goal line {g}")
    if failures:
        print(run.stderr)
        return 1
    print("ok:", len(lines), "lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())

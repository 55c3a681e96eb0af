#!/usr/bin/env python3
# loradb-test: args=loradb_bench timeout=300 requires=loradb_bench
"""Test of the benchmark report generator (tools/bench_report.py) and of `loradb-bench all`.

usage: bench_report_test.py LORADB_BENCH

1. The generator on a committed results file (tests/python/testdata/bench_all_quick.jsonl, the
   output of a real `loradb-bench all --quick --out ...` run): the section lands between the
   markers, text outside them is kept, a second run replaces the section instead of adding one,
   every published figure has a row carrying this run's numbers, every goal line is in the goal
   table, and the PNGs are valid PNG files.
2. Bad input: a results file without JSON, a markdown file with one marker only: exit 1, and the
   markdown file is left as it was.
3. `loradb-bench all --quick --only formats --out FILE` for real: the machine facts, the
   scenario's line and the end line are in FILE, and the generator reads it.
Exit status 77 (ctest: skipped) when matplotlib is missing (`tools/dev setup` installs it).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GENERATOR = os.path.join(ROOT, "tools", "bench_report.py")
FIXTURE = os.path.join(HERE, "testdata", "bench_all_quick.jsonl")
BEGIN, END = "<!-- bench-all:begin -->", "<!-- bench-all:end -->"

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def generate(results, markdown, plots):
    return subprocess.run([sys.executable, GENERATOR, results, "--markdown", markdown, "--plots",
                           plots], capture_output=True, text=True)


def png_size(path):
    """(width, height) of a PNG file, or None when it is not one."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def load_lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


def check_fixture(tmp):
    sys.path.insert(0, os.path.dirname(GENERATOR))
    import bench_report  # noqa: E402  (tools/ is not a package)

    lines = load_lines(FIXTURE)
    goals = [l for l in lines if "goal" in l]
    check(len(goals) >= 20, f"fixture has {len(goals)} goal lines (want a full quick run)")
    md = os.path.join(tmp, "BENCH.md")
    with open(md, "w") as f:
        f.write("# Benchmarks\n\nhand-written text above\n")
    plots = os.path.join(tmp, "plots")
    p = generate(FIXTURE, md, plots)
    check(p.returncode == 0, f"generator exit {p.returncode}: {p.stderr}")
    text = open(md).read()
    check(text.startswith("# Benchmarks\n\nhand-written text above\n"), "text outside kept")
    check(text.count(BEGIN) == 1 and text.count(END) == 1, "one pair of markers")
    section = text[text.find(BEGIN):text.find(END)]
    for heading in ("### Published figures side by side", "### Scenarios", "### Goal lines",
                    "### Plots"):
        check(heading in section, f"section has '{heading}'")
    for figure in ("hand-off", "concurrent training", "MoE packing: live load",
                   "MoE packing: tensor read", "catalog at 1,000 revisions",
                   "cache loads vs Belady: skewed-hot", "cold load per adapter",
                   "cold burst p95", "distinct adapters in a batch of"):
        rows = [l for l in section.splitlines() if figure in l.split(" | ")[0]]
        check(len(rows) >= 1, f"a published-figure row for '{figure}'")
        check(all("not measured" not in r for r in rows), f"'{figure}' measured in the fixture")
    # This run's numbers, formatted as the generator formats them, are in the rows.
    handoff = next(l for l in lines if l.get("bench") == "train" and l.get("case") == "handoff")
    check(f"{bench_report.num(handoff['speedup'])}x" in section, "hand-off speedup shown")
    machine = next(l for l in lines if l.get("case") == "machine")
    check(machine["cpu_model"] in section, "CPU model shown")
    check(machine["git_commit"] in section, "commit shown")
    # Every goal line, with its value, in the goal table.
    goal_block = section[section.find("### Goal lines"):]
    goal_block = goal_block[:goal_block.find("\n### ", 1)]
    goal_rows = [l for l in goal_block.splitlines() if l.startswith("| ") and "| `" in l]
    check(len(goal_rows) == len(goals), f"{len(goal_rows)} goal rows for {len(goals)} goal lines")
    for g in goals:
        want = (f"| {g['bench']} | `{g['goal']}` | {bench_report.num(g['value'])} | "
                f"{g['target']} | {'met' if g['met'] else '**NOT met**'} |")
        check(want in goal_block, f"goal row {want}")
    met = sum(1 for g in goals if g["met"])
    check(f"({met} of {len(goals)} met)" in section, "goal count in the heading")
    scenarios = [l for l in lines if l.get("case") == "scenario"]
    for s in scenarios:
        check(f"`{s['command']}`" in section, f"scenario command {s['command']}")
    # Plots: referenced, present, valid PNGs of a sensible size.
    for name in ("catalog_cost.png", "cache_vs_belady.png", "decode_distinct.png",
                 "cold_burst.png"):
        path = os.path.join(plots, name)
        check(os.path.exists(path), f"{name} written")
        if os.path.exists(path):
            size = png_size(path)
            check(size is not None and size[0] >= 300 and size[1] >= 200,
                  f"{name} is a PNG of a plot's size ({size})")
            check(f"](plots/{name})" in section, f"{name} referenced relative to the markdown")
    # A second run replaces the section (same content, one pair of markers).
    p = generate(FIXTURE, md, plots)
    check(p.returncode == 0, "second run")
    again = open(md).read()
    check(again == text, "second run gives the same file")


def check_bad_input(tmp):
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write("not json\n[1, 2]\n")
    md = os.path.join(tmp, "bad.md")
    with open(md, "w") as f:
        f.write("x\n")
    p = generate(bad, md, os.path.join(tmp, "bad-plots"))
    check(p.returncode == 1 and "no JSON line" in p.stderr, f"no JSON: exit 1 ({p.stderr})")
    check(open(md).read() == "x\n", "markdown untouched after a bad results file")
    half = os.path.join(tmp, "half.md")
    with open(half, "w") as f:
        f.write(f"a\n{BEGIN}\nold\n")
    p = generate(FIXTURE, half, os.path.join(tmp, "half-plots"))
    check(p.returncode == 1 and "markers" in p.stderr, f"one marker: exit 1 ({p.stderr})")
    check(open(half).read() == f"a\n{BEGIN}\nold\n", "markdown untouched with one marker")
    p = generate(os.path.join(tmp, "missing.jsonl"), md, os.path.join(tmp, "p"))
    check(p.returncode == 1, "missing results file: exit 1")


def check_live(tmp, bench):
    out = os.path.join(tmp, "live", "results.jsonl")
    p = subprocess.run([bench, "all", "--quick", "--only", "formats", "--out", out],
                       capture_output=True, text=True, timeout=240)
    check(p.returncode == 0, f"all --quick --only formats: exit {p.returncode}: {p.stderr[-2000:]}")
    lines = load_lines(out)
    machine = [l for l in lines if l.get("bench") == "all" and l.get("case") == "machine"]
    check(len(machine) == 1, "one machine line")
    if machine:
        m = machine[0]
        for key in ("cpu_model", "cores", "memory_bytes", "kernel", "git_commit", "date_utc",
                    "loadavg_start", "scratch_dir"):
            check(key in m, f"machine fact {key}")
        check(m.get("cores", 0) >= 1 and m.get("memory_bytes", 0) > 0, "cores and memory")
        check(m.get("quick") is True, "quick recorded")
    scen = [l for l in lines if l.get("case") == "scenario"]
    check([s.get("scenario") for s in scen] == ["formats"], "only the formats scenario ran")
    check(scen and scen[0].get("ok") is True, "formats scenario ok")
    check(any(l.get("bench") == "formats" and "goal" in l for l in lines), "formats goal lines")
    end = [l for l in lines if l.get("case") == "end"]
    check(len(end) == 1 and end[0].get("failures") == 0, "end line, no failure")
    # The child's stdout was teed: the same lines on stdout as in the file.
    check([json.loads(x) for x in p.stdout.splitlines() if x.strip()] == lines,
          "stdout carries the same lines as the file")
    md = os.path.join(tmp, "live.md")
    g = generate(out, md, os.path.join(tmp, "live-plots"))
    check(g.returncode == 0, f"generator on the live run: {g.stderr}")
    size_rows = [l for l in open(md).read().splitlines() if l.startswith("| MoE packing: file size")]
    check(len(size_rows) == 1 and "not measured" not in size_rows[0], "live file-size row")
    if machine:
        scratch = machine[0].get("scratch_dir", "")
        check(scratch and not os.path.exists(scratch), f"scratch dir {scratch} removed")
    # Bad arguments to all are refused before anything runs.
    p = subprocess.run([bench, "all", "--only", "nosuch"], capture_output=True, text=True)
    check(p.returncode == 2 and "unknown scenario 'nosuch'" in p.stderr, "unknown --only")
    p = subprocess.run([bench, "all", "--timeout-s", "0"], capture_output=True, text=True)
    check(p.returncode == 2, "bad --timeout-s")


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("skipped: matplotlib is not installed (tools/dev setup installs it)")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        check_fixture(tmp)
        check_bad_input(tmp)
        check_live(tmp, sys.argv[1])
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("bench report: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

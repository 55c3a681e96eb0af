#!/usr/bin/env python3
"""The summary of `tools/dev gpu-check`: one screen from the files its run left in one folder.

usage: gpu_check_report.py DIR

DIR holds what `tools/dev gpu-check` wrote:
  steps.jsonl       one line per step: {"step", "exit_code", "seconds", "allowed_to_fail"}
                    (allowed_to_fail: why a failure is expected on this machine, or "")
  STEP.gtest.json   GoogleTest's --gtest_output=json of each gtest step
  STEP.log          each step's output; those of steps named bench-* carry loradb-bench's JSON
                    lines (stdout) among its progress lines (stderr)
  gpus.txt          nvidia-smi's `name, compute_cap, memory.total` lines

Printed: each test's result (gtest tests one by one, other steps by name), then the figures:
  - kernel bandwidth as a fraction of the device's peak: kernels bench lines with
    "case": "gpu_bgmv_decode" ("fused_fraction_of_peak", "shrink_expand_fraction_of_peak");
  - H2D adapter admission time: lines with "device_backend": "cuda" and an "admission_p50_s"
    (or "device_copy_*_s") figure;
  - decoder tokens/s with 64 distinct adapters on the device: "bench": "decode" lines with
    "device": "cuda", "adapters": 64 and "decode_tokens_per_s".
A figure no line carries is printed as "not measured" with what would measure it.
Exit status: 0 when every step passed (a step marked allowed_to_fail may fail), 1 otherwise.
"""
import json
import os
import sys


def load_jsonl(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def gtest_results(path):
    """[(test name, "PASS" | "FAIL" | "SKIP", detail)] of one gtest JSON report."""
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    rows = []
    for suite in report.get("testsuites", []):
        for t in suite.get("testsuite", []):
            name = f"{suite.get('name', '?')}.{t.get('name', '?')}"
            failures = t.get("failures", [])
            if t.get("status") == "NOTRUN":
                continue  # filtered out or disabled
            if failures:
                first = failures[0].get("failure", "").strip().splitlines()
                rows.append((name, "FAIL", first[0] if first else ""))
            elif t.get("result") == "SKIPPED":
                # Newer GoogleTest versions put the skip message in "skipped".
                why = t.get("skipped", [{}])
                why = why[0].get("message", "") if isinstance(why, list) and why else ""
                rows.append((name, "SKIP", why.strip().splitlines()[-1] if why.strip() else ""))
            else:
                rows.append((name, "PASS", ""))
    return rows


def fmt(v, digits=3):
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def kernel_bandwidth(bench):
    lines = [l for l in bench if l.get("bench") == "kernels" and l.get("case") == "gpu_bgmv_decode"]
    if not lines:
        return ["kernel bandwidth: not measured (no `loradb-bench kernels gpu` line; see its step)"]
    best = max(lines, key=lambda l: l.get("fused_fraction_of_peak", 0))
    out = [f"kernel bandwidth (BGMV decode, bf16, {len(lines)} shapes x batches, "
           f"device {best.get('device', '?')}, peak {best.get('peak_gbs', 0):.0f} GB/s):"]
    for l in lines:
        out.append(f"  {l.get('shape', '?'):>10} batch {l.get('batch', '?'):>4} "
                   f"distinct {l.get('distinct_adapters', '?'):>3}: fused "
                   f"{100 * l.get('fused_fraction_of_peak', 0):5.1f}% of peak "
                   f"({l.get('fused_gbs', 0):.0f} GB/s), shrink+expand "
                   f"{100 * l.get('shrink_expand_fraction_of_peak', 0):5.1f}%")
    out.append(f"  best: {100 * best.get('fused_fraction_of_peak', 0):.1f}% of peak")
    return out


def h2d_admission(bench):
    lines = [l for l in bench if l.get("device_backend") == "cuda" and
             any(k == "admission_p50_s" or (k.startswith("device_copy_") and k.endswith("_s"))
                 for k in l)]
    if not lines:
        return ["H2D adapter admission: not measured (no benchmark case runs the device tier on "
                "the CUDA backend: bench/tiers_bench.cc's device cases use the host backend)"]
    out = ["H2D adapter admission (device tier on the CUDA backend):"]
    for l in lines:
        figures = ", ".join(f"{k} {fmt(v)}" for k, v in l.items()
                            if k.endswith("_s") and isinstance(v, (int, float)))
        out.append(f"  {l.get('bench')}/{l.get('case', '?')}: {figures}")
    return out


def decoder_tokens(bench):
    lines = [l for l in bench if l.get("bench") == "decode" and l.get("device") == "cuda" and
             l.get("adapters") == 64 and "decode_tokens_per_s" in l]
    if not lines:
        return ["decoder tokens/s with 64 distinct adapters on the device: not measured (the "
                "decode scenario runs the model on the CPU; no case decodes on the GPU)"]
    return ["decoder tokens/s with 64 distinct adapters on the device:"] + [
        f"  batch {l.get('batch', '?')}: {fmt(l['decode_tokens_per_s'])} tokens/s "
        f"({l.get('case', '?')})" for l in lines]


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    steps = load_jsonl(os.path.join(d, "steps.jsonl"))
    bench = []
    for name in sorted(os.listdir(d)):
        if name.startswith("bench-") and name.endswith(".log"):
            bench += load_jsonl(os.path.join(d, name))
    ok = bool(steps)
    print("== gpu-check summary")
    gpus = os.path.join(d, "gpus.txt")
    if os.path.exists(gpus):
        for g in open(gpus, encoding="utf-8").read().splitlines():
            if g.strip():
                print(f"GPU: {g.strip()}")
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    print("\ntests:")
    for s in steps:
        name, rc = s.get("step", "?"), s.get("exit_code", 1)
        report = os.path.join(d, f"{name}.gtest.json")
        tolerated = s.get("allowed_to_fail", "")
        if rc != 0 and not tolerated:
            ok = False
        if os.path.exists(report):
            rows = gtest_results(report)
            for test, result, detail in rows:
                counts[result] += 1
                print(f"  {result:4}  {test}" + (f"  ({detail})" if detail else ""))
            if rc != 0 and not any(r == "FAIL" for _, r, _ in rows):
                counts["FAIL"] += 1
                print(f"  FAIL  {name}: exit {rc} (see {name}.log)")
        else:
            if rc == 0:
                result = "PASS"
            elif tolerated:
                result = "SKIP"
            else:
                result = "FAIL"
            counts[result] += 1
            detail = f"exit {rc}, {tolerated}" if rc != 0 and tolerated else (
                f"exit {rc} (see {name}.log)" if rc != 0 else "")
            print(f"  {result:4}  {name}" + (f"  ({detail})" if detail else "") +
                  f"  [{fmt(s.get('seconds', 0), 2)} s]")
    if not steps:
        print("  (no step ran)")
    print(f"  {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    print("\nfigures:")
    for line in kernel_bandwidth(bench) + h2d_admission(bench) + decoder_tokens(bench):
        print(f"  {line}")
    total = sum(s.get("seconds", 0) for s in steps)
    print(f"\ngpu-check: {'all steps passed' if ok else 'FAILED'} "
          f"({fmt(total, 3)} s in the steps; logs in {d})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

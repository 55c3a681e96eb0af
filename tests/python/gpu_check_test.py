#!/usr/bin/env python3
# loradb-test: args=loradb_storage_tests timeout=120
"""`tools/dev gpu-check` without a GPU, and its summary (tools/gpu_check_report.py) on a run's files.

usage: gpu_check_test.py LORADB_STORAGE_TESTS

1. No GPU: with nvidia-smi missing from PATH, and with an nvidia-smi that lists no device (exit
   6, "No devices were found", as the real one does), `tools/dev gpu-check` says so and exits 0
   without installing or building anything (no var/gpu-check/ written).
2. The summary on a folder laid out as gpu-check leaves it: a real GoogleTest JSON report
   (loradb_storage_tests: a passing test, and DeviceSlotsTest.CudaBackend, which skips without
   a CUDA device), one test turned into a failure, plain steps (passed, failed, allowed to
   fail), and a benchmark log mixing progress lines with `kernels gpu` lines. Checks each
   test's line, the counts, the bandwidth fractions, "not measured" for the figures no line
   carries, and the exit status (1 with a failure, 0 once it is gone; an allowed failure is
   shown as skipped and does not fail the run).
"""
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEV = os.path.join(ROOT, "tools", "dev")
REPORT = os.path.join(ROOT, "tools", "gpu_check_report.py")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def path_without_nvidia_smi():
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and not os.path.exists(os.path.join(d,
                                                                                    "nvidia-smi")))


def check_no_gpu(tmp):
    fake = os.path.join(tmp, "fakebin")
    os.makedirs(fake)
    smi = os.path.join(fake, "nvidia-smi")
    with open(smi, "w") as f:
        f.write("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    os.chmod(smi, os.stat(smi).st_mode | stat.S_IXUSR)
    out_dir = os.path.join(ROOT, "var", "gpu-check")
    before = os.path.getmtime(out_dir) if os.path.exists(out_dir) else None
    for label, path in (("no nvidia-smi", path_without_nvidia_smi()),
                        ("nvidia-smi lists no device", fake + os.pathsep +
                         path_without_nvidia_smi())):
        p = subprocess.run([DEV, "gpu-check"], env=dict(os.environ, PATH=path),
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, f"{label}: exit {p.returncode} ({p.stderr})")
        check("no NVIDIA GPU on this machine" in p.stdout, f"{label}: says so ({p.stdout!r})")
        check("[dev]" not in p.stderr, f"{label}: no setup or build ({p.stderr!r})")
    after = os.path.getmtime(out_dir) if os.path.exists(out_dir) else None
    check(before == after, "var/gpu-check/ left as it was")


def write_steps(d, steps):
    with open(os.path.join(d, "steps.jsonl"), "w") as f:
        for s in steps:
            f.write(json.dumps(s) + "\n")


def summary(d):
    return subprocess.run([sys.executable, REPORT, d], capture_output=True, text=True, timeout=60)


def check_summary(tmp, storage_tests):
    d = os.path.join(tmp, "run")
    os.makedirs(d)
    gtest = os.path.join(d, "cuda-device-tier.gtest.json")
    p = subprocess.run([storage_tests, "--gtest_filter=DeviceSlotsTest.CudaBackend:"
                        "DeviceSlotsTest.BadOptions", f"--gtest_output=json:{gtest}"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and os.path.exists(gtest), f"gtest report written ({p.stdout[-500:]})")
    if failures:
        return
    report = json.load(open(gtest))
    tests = {f"{s['name']}.{t['name']}": t for s in report["testsuites"] for t in s["testsuite"]}
    check(set(tests) == {"DeviceSlotsTest.CudaBackend", "DeviceSlotsTest.BadOptions"},
          f"the two tests ran: {sorted(tests)}")
    cuda_ran = tests.get("DeviceSlotsTest.CudaBackend", {}).get("result") != "SKIPPED"
    with open(os.path.join(d, "gpus.txt"), "w") as f:
        f.write("NVIDIA H200, 9.0, 143771 MiB\n")
    bench_lines = [
        "[bench] kernels gpu: shape qkv",
        json.dumps({"bench": "kernels", "case": "gpu_bgmv_decode", "device": "NVIDIA H200",
                    "shape": "qkv", "batch": 64, "distinct_adapters": 64, "peak_gbs": 4800.0,
                    "fused_gbs": 3600.0, "fused_fraction_of_peak": 0.75,
                    "shrink_expand_fraction_of_peak": 0.5}),
        json.dumps({"bench": "kernels", "case": "gpu_bgmv_decode", "device": "NVIDIA H200",
                    "shape": "mlp", "batch": 1, "distinct_adapters": 1, "peak_gbs": 4800.0,
                    "fused_gbs": 960.0, "fused_fraction_of_peak": 0.2,
                    "shrink_expand_fraction_of_peak": 0.1}),
        "not json {",
    ]
    with open(os.path.join(d, "bench-kernels-gpu.log"), "w") as f:
        f.write("\n".join(bench_lines) + "\n")
    steps = [
        {"step": "build", "exit_code": 0, "seconds": 100, "allowed_to_fail": ""},
        {"step": "cuda-device-tier", "exit_code": 0, "seconds": 3, "allowed_to_fail": ""},
        {"step": "nccl-world1", "exit_code": 0, "seconds": 2, "allowed_to_fail": ""},
        {"step": "nccl-world2", "exit_code": 1, "seconds": 2,
         "allowed_to_fail": "one GPU: NCCL refuses two ranks on one device on some versions"},
        {"step": "bench-kernels-gpu", "exit_code": 0, "seconds": 20, "allowed_to_fail": ""},
    ]
    write_steps(d, steps)
    p = summary(d)
    out = p.stdout
    check(p.returncode == 0, f"all steps passed: exit 0 ({out}{p.stderr})")
    check("GPU: NVIDIA H200, 9.0, 143771 MiB" in out, "GPU named")
    check("PASS  DeviceSlotsTest.BadOptions" in out, "passing gtest test listed")
    if cuda_ran:
        check("PASS  DeviceSlotsTest.CudaBackend" in out, "CUDA test passed on this machine")
    else:
        check("SKIP  DeviceSlotsTest.CudaBackend" in out, "skipped gtest test listed as SKIP")
    check("PASS  nccl-world1" in out, "plain step listed")
    check("SKIP  nccl-world2  (exit 1, one GPU: NCCL refuses" in out,
          "allowed failure shown as skipped with its reason")
    check(" 75.0% of peak" in out and " 20.0% of peak" in out, "bandwidth fraction per line")
    check("best: 75.0% of peak" in out, "best bandwidth fraction")
    check("H2D adapter admission: not measured" in out, "admission not measured")
    check("64 distinct adapters on the device: not measured" in out, "decoder not measured")
    check("gpu-check: all steps passed" in out, "final line")

    # One gtest test failing (exit status 1 from the step), and one plain step failing.
    for s in report["testsuites"]:
        for t in s["testsuite"]:
            if t["name"] == "BadOptions":
                t["failures"] = [{"failure": "tiers_device_slots_test.cc:10\nExpected ...",
                                  "type": ""}]
    with open(gtest, "w") as f:
        json.dump(report, f)
    steps[1]["exit_code"] = 1
    steps.append({"step": "gloo-cuda-world2", "exit_code": 2, "seconds": 1,
                  "allowed_to_fail": ""})
    write_steps(d, steps)
    p = summary(d)
    out = p.stdout
    check(p.returncode == 1, f"a failure: exit 1 ({out})")
    check("FAIL  DeviceSlotsTest.BadOptions  (tiers_device_slots_test.cc:10)" in out,
          "failing gtest test listed with its first failure line")
    check("FAIL  gloo-cuda-world2  (exit 2 (see gloo-cuda-world2.log))" in out,
          "failing plain step listed")
    check("2 failed" in out, "failure count")
    check("gpu-check: FAILED" in out, "final line says FAILED")

    # A gtest step that crashed (non-zero exit, no failure in its report) is a failure too.
    steps[1]["exit_code"] = 134
    report["testsuites"][0]["testsuite"] = [t for t in report["testsuites"][0]["testsuite"]
                                            if not t.get("failures")]
    with open(gtest, "w") as f:
        json.dump(report, f)
    write_steps(d, steps[:-1])
    p = summary(d)
    check(p.returncode == 1 and "FAIL  cuda-device-tier: exit 134" in p.stdout,
          f"crashed gtest step is a failure ({p.stdout})")

    # No benchmark lines: the bandwidth is not measured either; no steps: nothing passed.
    os.remove(os.path.join(d, "bench-kernels-gpu.log"))
    write_steps(d, [])
    p = summary(d)
    check(p.returncode == 1 and "kernel bandwidth: not measured" in p.stdout,
          f"empty run: exit 1, bandwidth not measured ({p.stdout})")
    shutil.rmtree(d)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        check_no_gpu(tmp)
        check_summary(tmp, sys.argv[1])
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("gpu-check: no-GPU path and summary checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The status page at `/` in headless Chromium: the DOM after its scripts ran shows the policies
and tiers, and a screenshot is a real, non-blank PNG. Skips (exit 77) when chromium is absent."""
import os
import shutil
import struct
import subprocess
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_harness  # noqa: E402


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def png_info(path):
    """(width, height, distinct byte values in the decoded image data)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


def main():
    args = http_harness.parse_args()
    browser = chromium()
    if browser is None:
        print("SKIP: chromium is not installed (Debian package 'chromium'; tools/dev setup)")
        return 77
    store = http_harness.Store(args.seed, policies=2, revisions=2)
    server = http_harness.Server(args.cli, store.dir)
    failures = []
    try:
        common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-dev-shm-usage", "--user-data-dir=" + os.path.join(store.tmp.name, "ud"),
                  "--virtual-time-budget=5000", "--window-size=1200,900"]
        dom = subprocess.run(common + ["--dump-dom", server.url("/")], capture_output=True,
                             text=True, timeout=120)
        if dom.returncode != 0:
            failures.append(f"chromium --dump-dom failed: {dom.stderr[-2000:]}")
        for needle in ("team/p0", "team/p1", "qwen3-tiny", "<table"):
            if needle not in dom.stdout:
                failures.append(f"rendered page lacks {needle!r}")
        if "loading..." in dom.stdout:
            failures.append("a section never left 'loading...'")
        shot = os.path.join(store.tmp.name, "status.png")
        r = subprocess.run(common + ["--screenshot=" + shot, server.url("/")],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0 or not os.path.exists(shot):
            failures.append(f"no screenshot: {r.stderr[-2000:]}")
        else:
            width, height, distinct = png_info(shot)
            print(f"screenshot {width}x{height}, {distinct} distinct byte values")
            if (width, height) != (1200, 900):
                failures.append(f"screenshot is {width}x{height}")
            if distinct < 8:
                failures.append("screenshot looks blank")
            keep = os.environ.get("LORADB_SCREENSHOT_OUT")
            if keep:
                shutil.copy(shot, keep)
    finally:
        rc = server.stop()
        store.close()
    if rc != 0:
        failures.append(f"server exited with {rc}")
    for f in failures:
        print("FAIL:", f)
    print("status page screenshot test:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

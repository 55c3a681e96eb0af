#!/usr/bin/env python3
# loradb-test: args=st_tool timeout=300
"""Oracle test: loradb's safetensors reader/writer against the reference `safetensors` package.

usage: safetensors_oracle.py ST_TOOL

1. Files written by the reference are re-written by loradb (st_tool rewrite) and must come out
   byte-identical whenever the reference itself is deterministic (at most one metadata key: the
   reference keeps metadata in a hash map), and must load back in the reference bit-exact.
2. Differential acceptance: malformed files (hand-written and seeded random mutations of valid
   files) must be accepted by loradb exactly when the reference accepts them. The one intended
   difference is a name repeated in the header, which loradb rejects and the reference folds.
Exit status 77 (ctest: skipped) when the reference package or numpy is missing.
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load as ref_load
    from safetensors.numpy import save as ref_save
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

try:
    import torch
    from safetensors.torch import save as torch_save
except ImportError:  # torch is optional: BF16 / F8 cases need it
    torch = None

TOOL = sys.argv[1]
FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    print("FAIL:", msg)


def run_tool(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True)


def numpy_cases(rng):
    dtypes = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
              np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]
    names = ["a", "b", "weight", "model.layers.0.q_proj", "é-ü", 'quo"te', "tab\there",
             "ctl\x01", "back\\slash", "z" * 40, "0", "__meta"]
    for case in range(40):
        d = {}
        for _ in range(rng.randint(0, 8)):
            name = rng.choice(names) + str(rng.randint(0, 3))
            dt = rng.choice(dtypes)
            ndim = rng.randint(0, 3)
            shape = tuple(rng.randint(0, 4) for _ in range(ndim))
            arr = (np.arange(int(np.prod(shape)), dtype=np.float64) * 1.5 - 3).astype(dt)
            d[name] = arr.reshape(shape)
        meta = rng.choice([None, {}, {"format": "np"}, {"a": "1", "b": "é", "c": "x\ny"}])
        yield f"numpy{case}", d, meta
    # MoE-shaped adapters, so the blob round trip exercises expert packing.
    for case in range(4):
        d = {}
        experts = rng.randint(2, 5)
        for layer in range(2):
            for e in range(experts):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    pre = f"base_model.model.model.layers.{layer}.mlp.experts.{e}.{proj}"
                    d[pre + ".lora_A.weight"] = np.full((1, 6), e + layer, np.float16)
                    d[pre + ".lora_B.weight"] = np.full((4, 1), -e, np.float16)
            d[f"base_model.model.model.layers.{layer}.self_attn.q_proj.lora_A.weight"] = \
                np.arange(12, dtype=np.float32).reshape(2, 6)
        if case % 2:
            del d["base_model.model.model.layers.1.mlp.experts.1.up_proj.lora_B.weight"]
        yield f"moe{case}", d, {"format": "pt"}


def write_ref(tmp, name, d, meta, saver):
    path = os.path.join(tmp, f"{name}.ref.safetensors")
    with open(path, "wb") as f:
        f.write(saver(d, metadata=meta))
    return path


def check_rewrite(tmp, name, ref_path, meta, loader):
    ours = os.path.join(tmp, f"{name}.ours.safetensors")
    r = run_tool("rewrite", ref_path, ours)
    if r.returncode != 0:
        fail(f"{name}: loradb could not rewrite a reference file: {r.stderr.strip()}")
        return
    ref_bytes = open(ref_path, "rb").read()
    our_bytes = open(ours, "rb").read()
    # safetensors -> blob (packed and not) -> safetensors gives loradb's rewrite, byte for byte.
    for flags in ([], ["--no-pack"]):
        blob = os.path.join(tmp, f"{name}.blob")
        back = os.path.join(tmp, f"{name}.back.safetensors")
        r1 = run_tool("to-blob", ref_path, blob, *flags)
        r2 = run_tool("from-blob", blob, back) if r1.returncode == 0 else r1
        if r2.returncode != 0:
            fail(f"{name}: blob round trip {flags} failed: {r2.stderr.strip()}")
        elif open(back, "rb").read() != our_bytes:
            fail(f"{name}: blob round trip {flags} changed the bytes")
    # The reference writes `"__metadata__":{}` for an empty dict; loradb's map cannot tell an
    # empty map from none and writes what the reference writes for None.
    if meta is None or len(meta) == 1:
        if ref_bytes != our_bytes:
            fail(f"{name}: bytes differ from the reference writer's")
    # Our file must load in the reference, bit-exact, with the same metadata.
    original = loader(ref_bytes)
    try:
        back = loader(our_bytes)
    except Exception as e:  # noqa: BLE001
        fail(f"{name}: reference cannot load loradb's file: {e}")
        return
    if sorted(back) != sorted(original):
        fail(f"{name}: names differ")
    for k in original:
        a, b = original[k], back[k]
        if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape) or bytes_of(a) != bytes_of(b):
            fail(f"{name}: tensor {k!r} differs")
    with safe_open(ours, "np" if torch is None else "pt") as f:
        got_meta = f.metadata()
    want = meta if meta else None
    if (got_meta or None) != want:
        fail(f"{name}: metadata {got_meta} != {want}")


def bytes_of(t):
    if torch is not None and isinstance(t, torch.Tensor):
        return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return t.tobytes()


def torch_cases(rng):
    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn,
              torch.float8_e5m2, torch.int64, torch.bool]
    for case in range(15):
        d = {}
        for i in range(rng.randint(1, 8)):
            dt = rng.choice(dtypes)
            shape = tuple(rng.randint(0, 5) for _ in range(rng.randint(0, 3)))
            d[f"t{i}.{rng.randint(0, 9)}"] = (torch.arange(int(np.prod(shape)) if shape else 1,
                                                           dtype=torch.float32)
                                              .reshape(shape) * 0.37).to(dt)
        meta = rng.choice([None, {"format": "pt"}])
        yield f"torch{case}", d, meta


def header_file(header, data=b""):
    hb = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(hb)) + hb + data


def ref_accepts(buf):
    try:
        ref_load(buf)
        return True, ""
    except Exception as e:  # noqa: BLE001
        return False, str(e)


def has_duplicate_names(buf):
    if len(buf) < 8:
        return False
    n = struct.unpack("<Q", buf[:8])[0]
    try:
        pairs = json.loads(buf[8:8 + n].decode("utf-8"), object_pairs_hook=lambda p: p)
    except Exception:  # noqa: BLE001
        return False
    if not isinstance(pairs, list):
        return False
    keys = [k for k, _ in pairs]
    return len(keys) != len(set(keys))


def differential(tmp, rng):
    t = '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
    cases = [
        b"", b"1234567", header_file("{}"), header_file("", b""), header_file(" {} "),
        header_file(t, b"ab"), header_file(t, b"abc"), header_file(t, b"a"),
        header_file("\n" + t + "\r\n", b"ab"), header_file("[]"), header_file("null"),
        header_file('{"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', b"xab"),
        header_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', b"abcd"),
        header_file('{"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}}', b"ab"),
        header_file('{"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}', b""),
        header_file('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":[1]}}', b"ab"),
        header_file('{"__metadata__":{"k":1}}'), header_file('{"__metadata__":null}'),
        header_file('{"__metadata__":{"k":"v"}}'), header_file('{"\\ud800":1}'),
        header_file('{"\\ud800":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'),
        header_file('{"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,0]}}'),
        header_file('{"a":{"dtype":"F64","shape":[4294967296,4294967296],'
                    '"data_offsets":[0,8]}}', b"12345678"),
        header_file(b'{"\xc3\x28":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'),
        header_file("{}" + "\x00"), struct.pack("<Q", 100_000_001) + b"{}",
    ]
    valid = []
    for _, d, meta in numpy_cases(random.Random(7)):
        valid.append(ref_save(d, metadata=meta))
        if len(valid) > 10:
            break
    for i in range(300):
        buf = bytearray(rng.choice(valid))
        op = rng.randint(0, 4)
        if op == 0 and len(buf) > 1:
            del buf[rng.randrange(len(buf)):]
        elif op == 1:
            buf += bytes(rng.randint(1, 9))
        elif op == 2:
            n = struct.unpack("<Q", buf[:8])[0]
            for _ in range(rng.randint(1, 3)):
                pos = rng.randrange(8, 8 + n) if n else 0
                buf[pos] = rng.choice(b'{}[]",:0123456789-. \x00\xffUFab')
        elif op == 3:
            buf[rng.randrange(8)] = rng.randrange(256)
        else:
            # Re-number one offset or dimension digit in the header text.
            n = struct.unpack("<Q", buf[:8])[0]
            digits = [i for i in range(8, 8 + n) if 48 <= buf[i] <= 57]
            if digits:
                buf[rng.choice(digits)] = rng.choice(b"0123456789")
        cases.append(bytes(buf))

    disagreements = 0
    for i, buf in enumerate(cases):
        path = os.path.join(tmp, f"diff{i}.safetensors")
        with open(path, "wb") as f:
            f.write(buf)
        ours = run_tool("check", path)
        ours_ok = ours.returncode == 0
        if ours.returncode not in (0, 1):
            fail(f"diff case {i}: st_tool crashed (rc {ours.returncode}): {ours.stderr}")
            continue
        if not ours_ok and not ours.stderr.startswith("error: "):
            fail(f"diff case {i}: no error message")
        theirs_ok, why = ref_accepts(buf)
        if ours_ok != theirs_ok:
            if theirs_ok and not ours_ok and has_duplicate_names(buf):
                continue  # intended: loradb rejects repeated names
            disagreements += 1
            fail(f"diff case {i}: loradb {'accepts' if ours_ok else 'rejects'} "
                 f"({ours.stderr.strip()}), reference {'accepts' if theirs_ok else 'rejects'} "
                 f"({why}); header={buf[:200]!r}")
    print(f"differential: {len(cases)} files, {disagreements} disagreements")


def main():
    rng = random.Random(1234)
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for name, d, meta in numpy_cases(rng):
            path = write_ref(tmp, name, d, meta, ref_save)
            check_rewrite(tmp, name, path, meta, ref_load)
            n += 1
        if torch is not None:
            from safetensors.torch import load as torch_load
            for name, d, meta in torch_cases(rng):
                path = write_ref(tmp, name, d, meta, torch_save)
                check_rewrite(tmp, name, path, meta, torch_load)
                n += 1
        print(f"rewrite: {n} reference files")
        differential(tmp, rng)
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("all oracle checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

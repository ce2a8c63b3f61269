#!/usr/bin/env python3
"""Interop of ztrain's safetensors code with the reference Python library (safetensors + numpy).

usage: st_interop.py PATH/TO/st_tool

(a) st_tool writes files; the reference library (its Rust deserializer and safetensors.numpy.load_file)
    must read them and find the values given by the formulas below (the same as in st_tool.c).
(b) the reference library writes files; st_tool dump (ztrain's reader) must report the same names,
    dtypes, shapes, bytes and metadata, in data-offset order.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import safetensors
from safetensors.numpy import load_file, save_file

# Keep in step with g_tensors in st_tool.c: (name, dtype, shape).
TENSORS = [
    ("h.0.attn.weight", "F32", [3, 4]),
    ("h.0.mlp.bias", "F64", [5]),
    ("wte.half", "F16", [2, 3, 2]),
    ("wte.bf16", "BF16", [1, 7]),
    ("i8", "I8", [10]),
    ("u8", "U8", [2, 5]),
    ("i16", "I16", [3, 3]),
    ("u16", "U16", [4]),
    ("i32", "I32", [2, 2]),
    ("u32", "U32", [6]),
    ("i64", "I64", [3]),
    ("u64", "U64", [3]),
    ("mask", "BOOL", [2, 3]),
    ("scalar", "F32", []),
    ("empty", "F32", [0, 4]),
]
METADATA = {"format": "pt", "note": 'quote " backslash \\ \u00fcn\u00efcode'}

NP_DTYPES = {
    "F32": np.float32, "F64": np.float64, "F16": np.float16, "I8": np.int8, "U8": np.uint8,
    "I16": np.int16, "U16": np.uint16, "I32": np.int32, "U32": np.uint32, "I64": np.int64,
    "U64": np.uint64, "BOOL": np.bool_,
}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def expected_array(t, dtype, shape):
    """The values st_tool writes for tensor index t; BF16 comes back as uint16 bit patterns."""
    n = int(np.prod(shape)) if shape else 1
    j = np.arange(n, dtype=np.int64)
    f = (j - 5) * 0.25 + t
    s = (j * 37 + t) % 200 - 100
    u = ((j * 53 + t) % 250).astype(np.uint64)
    if dtype == "F32":
        a = f.astype(np.float32)
    elif dtype == "F64":
        a = f.astype(np.float64)
    elif dtype == "F16":
        a = f.astype(np.float16)
    elif dtype == "BF16":
        a = (f.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    elif dtype == "I8":
        a = s.astype(np.int8)
    elif dtype == "U8":
        a = u.astype(np.uint8)
    elif dtype == "I16":
        a = (s * 300).astype(np.int16)
    elif dtype == "U16":
        a = (u * 260).astype(np.uint16)
    elif dtype == "I32":
        a = (s * 20000000).astype(np.int32)
    elif dtype == "U32":
        a = (u * 17000000).astype(np.uint32)
    elif dtype == "I64":
        a = (s * 90000000000000000).astype(np.int64)
    elif dtype == "U64":
        a = u * np.uint64(73000000000000000)
    elif dtype == "BOOL":
        a = (j + t) % 3 == 0
    else:
        raise ValueError(dtype)
    return a.reshape(shape)


def run_tool(tool, *args):
    res = subprocess.run([tool, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"st_tool {' '.join(args)} failed ({res.returncode}): {res.stderr}")
    return res.stdout


def check_padding(path):
    with open(path, "rb") as fh:
        raw = fh.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = raw[8:8 + n].decode("utf-8")
    check(n % 8 == 0, f"{path}: header length {n} is not a multiple of 8")
    check(header.rstrip(" ").endswith("}") and len(header) - len(header.rstrip(" ")) < 8,
          f"{path}: header is not padded with fewer than 8 spaces")
    return json.loads(header)


def part_a(tool, tmp):
    """Files written by ztrain, read by the reference library."""
    full = os.path.join(tmp, "c_all.safetensors")
    run_tool(tool, "write", full)
    header = check_padding(full)
    check(list(header.keys())[0] == "__metadata__", "ztrain writes __metadata__ first")
    check(header["__metadata__"] == METADATA, f"header metadata {header['__metadata__']!r}")

    with open(full, "rb") as fh:
        parsed = safetensors.deserialize(fh.read())  # the Rust validator: rejects any malformed file
    got = {name: info for name, info in parsed}
    check(sorted(got) == sorted(n for n, _, _ in TENSORS), f"tensor names {sorted(got)}")
    for t, (name, dtype, shape) in enumerate(TENSORS):
        info = got.get(name)
        if info is None:
            continue
        check(info["dtype"] == dtype, f"{name}: dtype {info['dtype']} != {dtype}")
        check(list(info["shape"]) == shape, f"{name}: shape {info['shape']} != {shape}")
        want = expected_array(t, dtype, shape).astype(expected_array(t, dtype, shape).dtype.newbyteorder("<"))
        check(bytes(info["data"]) == want.tobytes(), f"{name}: bytes differ")

    # numpy has no bfloat16: load_file reads the file without it.
    nobf = os.path.join(tmp, "c_numpy.safetensors")
    run_tool(tool, "write", nobf, "--no-bf16")
    check_padding(nobf)
    arrays = load_file(nobf)
    for t, (name, dtype, shape) in enumerate(TENSORS):
        if dtype == "BF16":
            check(name not in arrays, f"{name} written despite --no-bf16")
            continue
        a = arrays.get(name)
        check(a is not None, f"{name}: missing from load_file")
        if a is None:
            continue
        want = expected_array(t, dtype, shape)
        check(a.dtype == want.dtype, f"{name}: numpy dtype {a.dtype} != {want.dtype}")
        check(a.shape == want.shape, f"{name}: numpy shape {a.shape} != {want.shape}")
        check(np.array_equal(a, want), f"{name}: values differ:\n{a}\n{want}")
    with safetensors.safe_open(nobf, framework="numpy") as fh:
        check(fh.metadata() == METADATA, f"metadata via safe_open: {fh.metadata()!r}")


def reference_order(path):
    """Tensor names of path in data-offset order, read straight from the header."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return [k for k, _ in sorted(header.items(), key=lambda kv: (kv[1]["data_offsets"], kv[0]))]


def compare_dump(tool, path, want_arrays, want_meta):
    keys = list(want_meta) + ["absent.key"]
    dump = json.loads(run_tool(tool, "dump", path, *keys))
    names = [t["name"] for t in dump["tensors"]]
    check(names == reference_order(path), f"{path}: order {names} is not data-offset order")
    for t in dump["tensors"]:
        name = t["name"]
        want_dtype, want_shape, want_bytes = want_arrays[name]
        check(t["dtype"] == want_dtype, f"{name}: dtype {t['dtype']} != {want_dtype}")
        check(t["shape"] == want_shape, f"{name}: shape {t['shape']} != {want_shape}")
        check(bytes.fromhex(t["hex"]) == want_bytes, f"{name}: bytes differ")
    check(sorted(names) == sorted(want_arrays), f"{path}: names {sorted(names)}")
    want_dump_meta = dict(want_meta)
    want_dump_meta["absent.key"] = None
    check(dump["metadata"] == want_dump_meta, f"{path}: metadata {dump['metadata']!r}")


def part_b(tool, tmp):
    """Files written by the reference library, read by ztrain."""
    rng = np.random.default_rng(0)
    arrays = {
        "model.embed": rng.standard_normal((7, 5)).astype(np.float32),
        "model.f64": rng.standard_normal(9),
        "model.f16": rng.standard_normal((2, 2, 2, 3)).astype(np.float16),
        "ints.i8": rng.integers(-128, 128, size=13, dtype=np.int8),
        "ints.u8": rng.integers(0, 256, size=(3, 1), dtype=np.uint8),
        "ints.i16": rng.integers(-2**15, 2**15, size=5, dtype=np.int16),
        "ints.u16": rng.integers(0, 2**16, size=5, dtype=np.uint16),
        "ints.i32": rng.integers(-2**31, 2**31, size=(2, 3), dtype=np.int32),
        "ints.u32": rng.integers(0, 2**32, size=4, dtype=np.uint32),
        "ints.i64": np.array([-2**63, -1, 0, 2**63 - 1], dtype=np.int64),
        "ints.u64": np.array([0, 1, 2**64 - 1], dtype=np.uint64),
        "flags": rng.integers(0, 2, size=(4, 2)).astype(np.bool_),
        "specials": np.array([np.nan, np.inf, -np.inf, -0.0], dtype=np.float32),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((3, 0), dtype=np.int32),
        "deep": np.arange(2 * 1 * 2 * 1 * 2 * 1 * 2 * 1, dtype=np.uint8).reshape(2, 1, 2, 1, 2, 1, 2, 1),
    }
    meta = {"format": "np", "quoted \"key\"": "value with \\ and \u00e9\u00e8"}
    path = os.path.join(tmp, "py_numpy.safetensors")
    save_file(arrays, path, metadata=meta)
    rev = {v: k for k, v in NP_DTYPES.items()}
    want = {name: (rev[a.dtype.type], list(a.shape), a.astype(a.dtype.newbyteorder("<")).tobytes())
            for name, a in arrays.items()}
    compare_dump(tool, path, want, meta)

    # bfloat16 through the library's raw serializer (numpy has no such dtype).
    bits = np.array([0x3F80, 0x4000, 0xBF80, 0x7F80, 0x0000, 0x8000, 0x7FC0], dtype="<u2")
    path = os.path.join(tmp, "py_bf16.safetensors")
    raw = {
        "bf.weight": {"dtype": "bfloat16", "shape": [7], "data": bits.tobytes()},
        "bf.matrix": {"dtype": "bfloat16", "shape": [2, 2], "data": bits[:4].tobytes()},
        "f32.after": {"dtype": "float32", "shape": [1], "data": np.array([1.25], dtype="<f4").tobytes()},
    }
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8 takes each tensor's bytes by address
        keep = {name: np.frombuffer(t["data"], dtype=np.uint8) for name, t in raw.items()}
        raw = {name: safetensors.TensorSpec(dtype=t["dtype"], shape=t["shape"], data_ptr=keep[name].ctypes.data,
                                            data_len=len(t["data"]))
               for name, t in raw.items()}
    safetensors.serialize_file(raw, path)
    want = {
        "bf.weight": ("BF16", [7], bits.tobytes()),
        "bf.matrix": ("BF16", [2, 2], bits[:4].tobytes()),
        "f32.after": ("F32", [1], np.array([1.25], dtype="<f4").tobytes()),
    }
    compare_dump(tool, path, want, {})

    # An empty file (no tensors) from the library.
    path = os.path.join(tmp, "py_empty.safetensors")
    save_file({}, path)
    compare_dump(tool, path, {}, {})


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="zt_st_interop_") as tmp:
        part_a(tool, tmp)
        part_b(tool, tmp)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("safetensors interop: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checks token shards written by `ztrain tokenize` with an independent reader (numpy).

Usage: shard_interop.py TOKENIZE_COMMAND...
  e.g. shard_interop.py build/tests/worker/zt_tokenize_tool
       shard_interop.py build/worker/ztrain tokenize

The command is run on a text made here (every byte value, UTF-8 and the demo corpus when it is found) and
every shard it writes is read back with numpy: header fields (magic 20240520, version 1, token count),
exact file size, uint16 little-endian tokens, and the concatenation of train then validation shards equals
the input bytes. Exits 0 when everything matches, 1 otherwise.
"""
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256


def read_shard(path):
    """Reads one shard the way llm.c's Python code does, checking every header field and the size."""
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    assert header.size == HEADER_INTS, f"{path}: shorter than the header"
    assert header[0] == MAGIC, f"{path}: magic {header[0]}"
    assert header[1] == VERSION, f"{path}: version {header[1]}"
    n = int(header[2])
    assert np.all(header[3:] == 0), f"{path}: header[3:] is not zero"
    size = os.path.getsize(path)
    assert size == HEADER_INTS * 4 + 2 * n, f"{path}: {size} bytes for {n} tokens"
    tokens = np.fromfile(path, dtype="<u2", offset=HEADER_INTS * 4)
    assert tokens.size == n
    return tokens


def check_run(cmd, workdir, name, text_parts, val_fraction, shard_tokens):
    inputs = []
    for i, part in enumerate(text_parts):
        p = os.path.join(workdir, f"{name}_in{i}.txt")
        with open(p, "wb") as f:
            f.write(part)
        inputs.append(p)
    out_dir = os.path.join(workdir, name)
    args = list(cmd)
    for p in inputs:
        args += ["--input", p]
    args += ["--out-dir", out_dir, "--name", name, "--val-fraction", str(val_fraction),
             "--shard-tokens", str(shard_tokens)]
    res = subprocess.run(args, capture_output=True, text=True)
    assert res.returncode == 0, f"{args} exited {res.returncode}: {res.stderr}"

    data = np.frombuffer(b"".join(text_parts), dtype=np.uint8).astype(np.uint16)
    n = data.size
    n_val = 0 if val_fraction == 0 else max(1, int(np.floor(n * val_fraction + 0.5)))
    train_files = sorted(glob.glob(os.path.join(out_dir, f"{name}_train_*.bin")))
    val_files = sorted(glob.glob(os.path.join(out_dir, f"{name}_val_*.bin")))
    assert len(train_files) == -(-(n - n_val) // shard_tokens), train_files
    assert len(val_files) == -(-n_val // shard_tokens), val_files
    train = [read_shard(p) for p in train_files]
    val = [read_shard(p) for p in val_files]
    for shards in (train, val):
        for t in shards[:-1]:
            assert t.size == shard_tokens, "every shard but the last is full"
    got_train = np.concatenate(train)
    assert np.array_equal(got_train, data[: n - n_val]), "train tokens differ from the input bytes"
    if val:
        assert np.array_equal(np.concatenate(val), data[n - n_val:]), "val tokens differ from the input bytes"
    for p in train_files + val_files:
        assert p in res.stdout, f"{p} not reported on stdout"
    assert sorted(os.listdir(out_dir)) == sorted(os.path.basename(p) for p in train_files + val_files)
    print(f"ok {name}: {n} tokens, {len(train_files)} train and {len(val_files)} val shard(s)")


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd = sys.argv[1:]
    all_bytes = bytes(range(256)) * 9
    utf8 = "Grüße, καλημέρα, 你好 — ✓\n".encode("utf-8") * 50
    runs = [
        ("bytes", [all_bytes, utf8], 0.1, 1000),
        ("novalid", [utf8], 0.0, 333),
        ("halves", [all_bytes], 0.5, 256),
    ]
    src = os.environ.get("ZT_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    corpus = os.path.join(src, "data", "corpus.txt")
    if os.path.exists(corpus):
        with open(corpus, "rb") as f:
            runs.append(("corpus", [f.read()], 0.1, 500000))
    failed = 0
    with tempfile.TemporaryDirectory(prefix="zt_shard_interop_") as workdir:
        for name, parts, frac, shard_tokens in runs:
            try:
                check_run(cmd, workdir, name, parts, frac, shard_tokens)
            except AssertionError as e:
                failed += 1
                print(f"FAIL {name}: {e}")
    print(f"{len(runs) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

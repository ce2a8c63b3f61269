#!/usr/bin/env python3
"""Writes random GPT-2 token shards in llm.c's format (256 int32 header: magic 20240520, version 1,
token count; then uint16 tokens) for the benchmarks: make_shards.py OUT_PREFIX NTOKENS [VOCAB]."""
import sys

import numpy as np


def main():
    prefix, n = sys.argv[1], int(sys.argv[2])
    vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 50257
    rng = np.random.default_rng(1234)
    for name, count in (("train_000.bin", n), ("val_000.bin", max(n // 16, 1 << 16))):
        header = np.zeros(256, dtype=np.int32)
        header[0], header[1], header[2] = 20240520, 1, count
        tokens = rng.integers(0, vocab, size=count, dtype=np.uint16)
        with open(f"{prefix}_{name}", "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.tobytes())


if __name__ == "__main__":
    main()

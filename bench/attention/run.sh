#!/usr/bin/env bash
# Attention on one GPU, in one go: builds the CUDA kernels, checks every feature of the attention descriptor
# against the CPU reference (tests/gpu/test_attention, and the attention tests of test_cuda_kernels, which
# cover every kernel family), then prints attention TFLOP/s per shape and kernel family (bench_attention)
# beside PyTorch's scaled_dot_product_attention with its flash, cuDNN and memory-efficient backends, in the
# same run:
#   bench/attention/run.sh [BUILD_DIR]        (from the repository root; default build-attention)
#   ZT_CUDA_ARCHS=90                          architectures to build (default 90)
#   SKIP_TESTS=1                              only the benchmark
#   SKIP_BUILD=1                              run the programs already in BUILD_DIR/tests/gpu
#   PYTHON=python3                            the interpreter with torch (the PyTorch rows are skipped without)
# Shapes: GPT-2 1558M (25 heads of 64, T 1024, causal, batch 8), TinyLlama (32 heads of 64, 4 key/value
# heads, T 2048, causal, batch 4), BERT-Large (16 heads of 64, T 512, bidirectional, a padded batch of 32
# with lengths 128..512), T5 (16 heads of 64, Tq 128, Tk 512, bidirectional relative position bias, scale 1,
# batch 8); the descriptor's features on its tensor-core kernels beside its general kernels: packed documents
# (varlen by cu_seqlens), sliding windows, T5's encoder and decoder self-attention with the bias, cross-attention. bf16. TFLOP/s count the unmasked (query, key) pairs for every implementation: forward 4 HS FLOPs
# per pair, backward 10 HS (PyTorch with a padding mask computes the padded pairs too; its "no mask" rows
# run the full T x T and count it).
set -u
BUILD="${1:-build-attention}"
ARCHS="${ZT_CUDA_ARCHS:-90}"
PY="${PYTHON:-python3}"
status=0

if [ "${SKIP_BUILD:-0}" != 1 ]; then  # SKIP_BUILD=1: BUILD_DIR already holds the three programs
    mkdir -p "$BUILD"
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DZT_CUDA=ON -DZT_CUDA_ARCHS="$ARCHS" -DZT_BUILD_TESTS=ON \
        > "$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log"; exit 1; }
    cmake --build "$BUILD" -j"$(nproc)" --target test_attention test_cuda_kernels bench_attention || exit 1
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
    echo "== tests/gpu/test_attention: the descriptor against the CPU reference"
    "$BUILD/tests/gpu/test_attention" || status=1
    echo "== tests/gpu/test_cuda_kernels: the packed-qkv entry points, every kernel family"
    ZT_TEST_FILTER='test_attention*' "$BUILD/tests/gpu/test_cuda_kernels" || status=1
fi

echo "== attention TFLOP/s, ztrain (bf16)"
"$BUILD/tests/gpu/bench_attention" || status=1

echo "== attention TFLOP/s, PyTorch scaled_dot_product_attention (bf16, same shapes)"
"$PY" - <<'PY' || echo "(PyTorch rows skipped: $PY has no working torch on the GPU)"
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

dev, dt = "cuda", torch.bfloat16
lens = [128 + (i * 97) % 385 for i in range(32)]
docs = [2048, 1024, 512, 1536, 128, 768, 1152, 1024]  # bench_attention's packed documents (8192 rows)
# name, B, Tq, Tk, NH, NKV, HS, causal, kind (None, "pad", "nopad", "bias", "varlen", ("window", W))
shapes = [
    ("GPT-2 1558M: 25x64, T 1024, causal, B 8", 8, 1024, 1024, 25, 25, 64, True, None),
    ("TinyLlama: 32x64, 4 kv, T 2048, causal, B 4", 4, 2048, 2048, 32, 4, 64, True, None),
    ("LLaMA-7B: 32x128, T 2048, causal, B 2", 2, 2048, 2048, 32, 32, 128, True, None),
    ("BERT-Large: 16x64, T 512, padded, B 32", 32, 512, 512, 16, 16, 64, False, "pad"),
    ("BERT-Large: 16x64, T 512, no mask, B 32", 32, 512, 512, 16, 16, 64, False, "nopad"),
    ("T5: 16x64, Tq 128, Tk 512, bias, B 8", 8, 128, 512, 16, 16, 64, False, "bias"),
    ("varlen: 32x64, 4 kv, 8 docs in 8192, causal", 1, 8192, 8192, 32, 4, 64, True, "varlen"),
    ("varlen: 32x128, 8 kv, 8 docs in 8192, causal", 1, 8192, 8192, 32, 8, 128, True, "varlen"),
    ("window 256: 32x64, 8 kv, T 4096, causal, B 2", 2, 4096, 4096, 32, 8, 64, True, ("window", 256)),
    ("window 1024: 32x128, 8 kv, T 4096, causal, B 2", 2, 4096, 4096, 32, 8, 128, True, ("window", 1024)),
    ("T5 encoder: 16x64, T 512, bias, B 8", 8, 512, 512, 16, 16, 64, False, "bias"),
    ("T5 decoder: 16x64, T 512, causal bias, B 8", 8, 512, 512, 16, 16, 64, True, "bias"),
    ("cross: 16x64, Tq 128, Tk 512, B 8", 8, 128, 512, 16, 16, 64, False, None),
]
# The baselines for what SDPA cannot say directly: varlen is one sequence of 8192 rows with a block-diagonal
# causal boolean mask, a window a causal band mask, a T5 bias an fp32-rounded-to-bf16 additive mask (-inf
# above the diagonal for the decoder); SDPA computes every masked pair too, the TFLOP/s count the kept ones.
backends = [("torch flash", SDPBackend.FLASH_ATTENTION), ("torch cuDNN", SDPBackend.CUDNN_ATTENTION),
            ("torch mem-efficient", SDPBackend.EFFICIENT_ATTENTION)]


def ms(fn, iters=20):
    fn(); fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


for name, B, Tq, Tk, NH, NKV, HS, causal, kind in shapes:
    if kind == "pad":
        pairs = NH * sum(l * l for l in lens)
    elif kind == "varlen":
        pairs = NH * sum(l * (l + 1) / 2 for l in docs)
    elif isinstance(kind, tuple):
        W = kind[1]
        pairs = B * NH * sum(min(t, W) + 1 for t in range(Tq))
    elif causal:
        pairs = B * NH * Tq * (Tq + 1) / 2
    else:
        pairs = B * NH * Tq * Tk
    q = torch.randn(B, NH, Tq, HS, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(B, NKV, Tk, HS, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(B, NKV, Tk, HS, device=dev, dtype=dt, requires_grad=True)
    mask, scale = None, None
    if kind == "pad":
        keep = torch.arange(Tk, device=dev)[None, :] < torch.tensor(lens, device=dev)[:, None]
        mask = keep[:, None, None, :].expand(B, 1, Tq, Tk)
    elif kind == "bias":
        mask = torch.randn(1, NH, Tq, Tk, device=dev, dtype=dt)
        scale = 1.0
        if causal:
            mask = mask.masked_fill(torch.ones(Tq, Tk, device=dev, dtype=torch.bool).triu(1), float("-inf"))
            causal = False
    elif kind == "varlen":
        doc = torch.repeat_interleave(torch.arange(len(docs), device=dev), torch.tensor(docs, device=dev))
        mask = (doc[:, None] == doc[None, :]) & torch.ones(Tq, Tk, device=dev, dtype=torch.bool).tril()
        causal = False
    elif isinstance(kind, tuple):
        i = torch.arange(Tq, device=dev)
        mask = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - kind[1])
        causal = False
    for bname, be in backends:
        try:
            kw = dict(attn_mask=mask, is_causal=causal, scale=scale)
            if NKV != NH:
                kw["enable_gqa"] = True
            with sdpa_kernel(be):
                with torch.no_grad():
                    fms = ms(lambda: F.scaled_dot_product_attention(q, k, v, **kw))
                o = F.scaled_dot_product_attention(q, k, v, **kw)
                g = torch.randn_like(o)
                bms = ms(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))
            print(f"| {name:<34} | {bname:<22} | torch   | {fms:8.3f} | {4 * pairs * HS / fms / 1e9:7.1f} "
                  f"| {bms:8.3f} | {10 * pairs * HS / bms / 1e9:7.1f} |", flush=True)
        except Exception as e:  # a backend that does not take this shape
            msg = str(e).strip().splitlines()[0][:60] if str(e).strip() else type(e).__name__
            print(f"| {name:<34} | {bname:<22} | n/a     | {msg} | | | |", flush=True)
PY
exit $status

#!/usr/bin/env python3
"""PyTorch baseline for bench/gpt2_gpu.sh: Hugging Face GPT2LMHeadModel built from a config (random init,
no download), bf16 autocast, SDPA attention, fused AdamW, gradient clipping at 1.0 (as ztrain), eager or
torch.compile, on random tokens. Prints one JSON line: tokens/s over the timed steps and peak memory.

    torch_gpt2.py --layers 12 --heads 12 --embd 768 --batch 16 --seq 1024 --mode eager
"""
import argparse
import json
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--embd", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = GPT2Config(n_layer=a.layers, n_head=a.heads, n_embd=a.embd, n_positions=a.seq, vocab_size=a.vocab,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cfg._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(cfg).cuda()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=True)
    fwd = torch.compile(model) if a.mode == "compile" else model

    def step():
        x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=x[:, :-1], labels=x[:, :-1]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    loss.item()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({
        "impl": f"pytorch {a.mode}", "params": n_params, "tokens_per_s": a.batch * a.seq * a.steps / dt,
        "peak_mem_gib": torch.cuda.max_memory_reserved() / 2**30, "loss": float(loss),
        "torch": torch.__version__,
    }), flush=True)


if __name__ == "__main__":
    main()

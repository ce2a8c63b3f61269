#!/usr/bin/env python3
"""PyTorch baseline for bench/llama_gpu.sh: Hugging Face LlamaForCausalLM built from a config.json (random
init, no download), bf16 autocast over fp32 weights, SDPA attention, fused AdamW, gradient clipping at 1.0
(as ztrain), eager or torch.compile, on random tokens. Prints one JSON line: tokens/s over the timed steps
and peak memory.

    torch_llama.py --config bench/tinyllama-1.1b.json --batch 8 --seq 2048 --mode compile
"""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    fields = json.load(open(a.config))
    fields.pop("model_type", None)
    fields.pop("architectures", None)
    cfg = LlamaConfig(**fields)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).cuda()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if a.mode == "compile" else model
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step():
        x = torch.randint(0, cfg.vocab_size, (a.batch, a.seq + 1), device="cuda", generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fwd(input_ids=x[:, :-1], labels=x[:, 1:].contiguous())
        # transformers shifts labels itself; passing x[:, 1:] and x[:, :-1] costs one position, as in ztrain's
        # loss over T targets (the FLOPs are the same).
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": f"PyTorch {torch.__version__} {a.mode}", "params": n_params,
                      "tokens_per_s": a.batch * a.seq * a.steps / dt,
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, "loss": float(loss)}))


if __name__ == "__main__":
    main()

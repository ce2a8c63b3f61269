#!/usr/bin/env python3
"""PyTorch baseline for bench/t5/run.sh: Hugging Face T5ForConditionalGeneration built from a config.json
(random init, no download), bf16 autocast over fp32 weights, fused AdamW, gradient clipping at 1.0 (as
ztrain), no dropout, eager or torch.compile, on random token ids with every input and target position filled.
Prints one JSON line: examples/s and tokens/s (input + target tokens) over the timed steps, peak memory.

    torch_t5.py --config bench/t5/t5-v1_1-large.json --batch 16 --input-len 512 --target-len 128 --mode eager
"""
import argparse
import json
import time

import torch
from transformers import T5Config, T5ForConditionalGeneration


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--target-len", type=int, default=128)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    fields = json.load(open(a.config))
    fields.pop("model_type", None)
    fields.pop("architectures", None)
    cfg = T5Config(**fields)
    model = T5ForConditionalGeneration(cfg).cuda()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if a.mode == "compile" else model
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step():
        # ids 2.. so that no position is padding (0) or end of sequence (1): every position trains
        x = torch.randint(2, cfg.vocab_size, (a.batch, a.input_len), device="cuda", generator=gen)
        y = torch.randint(2, cfg.vocab_size, (a.batch, a.target_len), device="cuda", generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fwd(input_ids=x, labels=y)
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
    ex = a.batch * a.steps / dt
    print(json.dumps({"impl": f"PyTorch {torch.__version__} {a.mode}", "params": n_params, "examples_per_s": ex,
                      "tokens_per_s": ex * (a.input_len + a.target_len),
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, "loss": float(loss)}))


if __name__ == "__main__":
    main()

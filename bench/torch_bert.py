#!/usr/bin/env python3
"""PyTorch baseline for bench/bert_gpu.sh: Hugging Face BertForSequenceClassification built from a config.json
(random init, no download), sequence length 512 of random tokens, bf16 autocast over fp32 weights, fused
AdamW, gradient clipping at 1.0, optional gradient checkpointing, GPU memory capped with
torch.cuda.set_per_process_memory_fraction. Prints one JSON line: examples/s over the timed steps and peak
memory, or {"oom": true} when the batch does not fit under the cap.

    torch_bert.py --config bench/bert-large-cls.json --batch 79 --cap-gib 11 --checkpointing
"""
import argparse
import json
import time

import torch
from transformers import BertConfig, BertForSequenceClassification


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--cap-gib", type=float, required=True)
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()

    torch.manual_seed(0)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, a.cap_gib * 2**30 / total))
    fields = json.load(open(a.config))
    fields.pop("model_type", None)
    fields.pop("architectures", None)
    cfg = BertConfig(**fields, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg._attn_implementation = "sdpa"
    model = BertForSequenceClassification(cfg).cuda()
    if a.checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step():
        x = torch.randint(1000, cfg.vocab_size, (a.batch, a.seq), device="cuda", generator=gen)
        y = torch.randint(0, cfg.num_labels, (a.batch,), device="cuda", generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, labels=y)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    try:
        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    except torch.OutOfMemoryError:
        print(json.dumps({"impl": f"PyTorch {torch.__version__}", "batch": a.batch, "cap_gib": a.cap_gib,
                          "checkpointing": a.checkpointing, "oom": True}))
        return
    print(json.dumps({"impl": f"PyTorch {torch.__version__}", "batch": a.batch, "cap_gib": a.cap_gib,
                      "checkpointing": a.checkpointing, "examples_per_s": a.batch * a.steps / dt,
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Hugging Face baseline for bench/sft/pack.sh (HF=1): LlamaForCausalLM built from the bench's config.json
(random init, no download) fine-tuned on the same chats, rendered in ChatML as bytes (the ids of
examples/byte-tokenizer.json are the bytes), loss on the assistant turns only (labels -100 elsewhere), in
batches padded to their longest example (as transformers' DataCollatorForSeq2Seq does), SDPA attention,
bf16 autocast on CUDA, fused AdamW. Prints one line: trained (unmasked) tokens/s over the timed steps.

    torch_sft.py --config model.json --data train.jsonl --batch 8 --max-len 2048 --device cuda
"""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def render(chat, max_len):
    """ChatML bytes of one chat and its labels (-100 outside the assistant turns), cut at max_len + 1."""
    ids, labels = [], []
    for m in chat["messages"]:
        head = f"<|im_start|>{m['role']}\n".encode()
        body = (m["content"] + "<|im_end|>").encode()
        ids += list(head) + list(body) + [10]
        trained = m["role"] == "assistant"
        labels += [-100] * len(head) + (list(body) if trained else [-100] * len(body)) + [-100]
    return ids[: max_len + 1], labels[: max_len + 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    fields = json.load(open(a.config))
    fields.pop("model_type", None)
    fields.pop("architectures", None)
    cfg = LlamaConfig(**fields)
    cfg._attn_implementation = "sdpa"
    dev = torch.device(a.device)
    model = LlamaForCausalLM(cfg).to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=dev.type == "cuda")
    examples = [render(json.loads(line), a.max_len) for line in open(a.data) if line.strip()]

    def batch(i):
        rows = [examples[(i * a.batch + j) % len(examples)] for j in range(a.batch)]
        n = max(len(r[0]) for r in rows)
        x = torch.zeros(a.batch, n, dtype=torch.long)
        y = torch.full((a.batch, n), -100, dtype=torch.long)
        mask = torch.zeros(a.batch, n, dtype=torch.long)
        for j, (ids, lab) in enumerate(rows):
            x[j, : len(ids)] = torch.tensor(ids)
            y[j, : len(lab)] = torch.tensor(lab)
            mask[j, : len(ids)] = 1
        # predict token t+1 from tokens 0..t: inputs drop the last position, labels the first
        return x[:, :-1].to(dev), mask[:, :-1].to(dev), y[:, 1:].contiguous().to(dev), int((y[:, 1:] != -100).sum())

    def step(i):
        x, mask, y, trained = batch(i)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = model(input_ids=x, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1),
                                                 ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return trained, loss

    for i in range(a.warmup):
        step(i)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    total = 0
    for i in range(a.warmup, a.warmup + a.steps):
        trained, loss = step(i)
        total += trained
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"hf      {a.steps:6d} steps of {a.batch} x longest  {dt:8.1f} s  {total / dt:10.0f} trained tok/s  "
          f"(transformers, padded to the batch's longest; loss {float(loss):.4f})")


if __name__ == "__main__":
    main()

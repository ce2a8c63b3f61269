#!/usr/bin/env python3
"""Checks the loss of packed supervised fine-tuning (`ztrain train --sft-pack`) against Hugging Face
transformers' LlamaForCausalLM given the same packed rows with a block-diagonal causal attention mask and
position ids restarting at 0 in each example.

Usage: sft_pack_hf.py ZTRAIN [--device cuda] [--numpy]

The check writes the odd LLaMA of sft_hf.py (6 query heads on 2 key/value heads, heads of 8 channels, an
untied head, byte vocabulary) with random weights far from the initialisation, a JSONL file of chats of
different lengths and runs `ztrain train --sft-data ... --chat-template chatml --sft-pack --steps 1` with rows
of T tokens, without shuffling, on one batch holding every chat. The rows are rebuilt here by ztrain's rule
(worker/data/sft.h: in file order, each example goes into the first of the last 64 rows opened that has room,
else into a new row; rows in the order they were opened; a row's padding at its end), and the reference is
LlamaForCausalLM (eager attention, fp32, CPU) on those rows with a 4-D attention mask [B, 1, T, T] that lets a
token see only the tokens of its own example up to itself, position_ids restarting at 0 for each example (and
for the padding), and labels -100 outside the assistant answers. The loss ztrain logs for step 1 must equal
it within 1e-5 relative. The same model on the examples one to a padded row (an ordinary causal mask) must
give the same loss too, which shows that the mask and the positions were taken. With --numpy the reference
is the float64 numpy LLaMA of llama_numpy_ref.py run on each example alone (what the block-diagonal mask
means), no PyTorch needed.

Exits 0 when the losses agree, 1 on a mismatch or a failed run, 77 (skipped) when numpy, safetensors,
transformers (or, without --numpy, torch) are missing, or --device cuda finds no GPU build or no GPU.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# sft_hf skips (77) without numpy, safetensors and transformers
from sft_hf import T, chat_examples, load_torch_llama, padded, run_or_exit_code, start, write_inputs  # noqa: E402
import numpy as np  # noqa: E402
from llama_numpy_ref import numpy_logits  # noqa: E402

TOL = 1e-5
OPEN_ROWS = 64  # worker/data/sft.c: the rows first-fit packing keeps open
CHATS = [
    [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
     {"role": "assistant", "content": "5"}, {"role": "user", "content": "times 4?"},
     {"role": "assistant", "content": "20"}],
    [{"role": "user", "content": "Reverse \"été\"."}, {"role": "assistant", "content": "été"}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue, like the sky."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Bonjour !"}],
    [{"role": "user", "content": "Count to five."}, {"role": "assistant", "content": "1, 2, 3, 4, 5."}],
    [{"role": "user", "content": "?"}, {"role": "assistant", "content": "!"}],
]


def pack(exs):
    """ztrain's packing rule: the rows, each a list of example indices."""
    rows, used = [], []
    for i, (ids, _) in enumerate(exs):
        n = len(ids)
        for r in range(max(0, len(rows) - OPEN_ROWS), len(rows)):
            if used[r] + n <= T:
                rows[r].append(i)
                used[r] += n
                break
        else:
            rows.append([i])
            used.append(n)
    return rows


def packed_batch(exs, rows):
    """ids, labels, position ids [B, T] and the additive 4-D mask [B, 1, T, T] (0 where a token may look)."""
    B = len(rows)
    ids = np.zeros((B, T), dtype=np.int64)
    lab = np.full((B, T), -100, dtype=np.int64)
    pos = np.zeros((B, T), dtype=np.int64)
    allowed = np.zeros((B, T, T), dtype=bool)
    for b, row in enumerate(rows):
        at = 0
        spans = []
        for i in row:
            r, l = exs[i]
            ids[b, at:at + len(r)] = r
            lab[b, at:at + len(l)] = l
            spans.append((at, at + len(r)))
            at += len(r)
        if at < T:
            spans.append((at, T))  # the padding: a sequence of its own, positions from 0
        for s, e in spans:
            pos[b, s:e] = np.arange(e - s)
            allowed[b, s:e, s:e] = np.tril(np.ones((e - s, e - s), dtype=bool))
    return ids, lab, pos, allowed


def reference_torch(folder, exs, rows):
    import torch
    model = load_torch_llama(folder, attn_implementation="eager")
    ids, lab, pos, allowed = packed_batch(exs, rows)
    mask = torch.zeros(allowed.shape, dtype=torch.float32)
    mask[~torch.tensor(allowed)] = torch.finfo(torch.float32).min
    with torch.no_grad():
        packed = model(input_ids=torch.tensor(ids), attention_mask=mask[:, None], position_ids=torch.tensor(pos),
                       labels=torch.tensor(lab))
        # the same examples one to a padded row, an ordinary causal mask over the real tokens
        pids, plab, pmask = padded(exs)
        one_a_row = model(input_ids=torch.tensor(pids), attention_mask=torch.tensor(pmask),
                          labels=torch.tensor(plab))
    return float(packed.loss), float(one_a_row.loss)


def reference_numpy(weights, config, exs):
    """The mean cross-entropy over the trained tokens, each example alone (float64)."""
    total, count = 0.0, 0
    for r, l in exs:
        logits = numpy_logits(weights, config, np.asarray([r]))[0]
        mx = logits.max(-1, keepdims=True)
        lse = (mx + np.log(np.exp(logits - mx).sum(-1, keepdims=True)))[:, 0]
        for j in range(len(r) - 1):
            if l[j + 1] >= 0:
                total += lse[j] - logits[j, l[j + 1]]
                count += 1
    return total / count


def main():
    ztrain, device, use_numpy, config, tok = start(__doc__, sys.argv[1:])
    exs = chat_examples(tok, CHATS)
    rows = pack(exs)
    assert len(rows) < len(exs) and max(len(r) for r in rows) > 2, "the chats should pack several to a row"
    trained = sum(sum(1 for x in l if x >= 0) for _, l in exs)
    with tempfile.TemporaryDirectory(prefix="zt_sft_pack_hf_") as work:
        folder, weights = write_inputs(work, config, 31, CHATS)
        ours, log, code = run_or_exit_code(ztrain, work, device, len(rows), ["--sft-pack"])
        if code is not None:
            return code
        if use_numpy:
            ref, padded_loss = reference_numpy(weights, config, exs), None
        else:
            ref, padded_loss = reference_torch(folder, exs, rows)
    rel = abs(ours - ref) / abs(ref)
    what = "numpy LLaMA (float64) on each example alone" if use_numpy else \
        "transformers LlamaForCausalLM (fp32, eager) with a block-diagonal 4-D mask and restarting position_ids"
    print(f"packed sft loss on {len(exs)} chats in {len(rows)} rows of {T} ({[len(r) for r in rows]} a row, "
          f"{trained} trained tokens), ztrain on {device}: {ours:.7f}, {what}: {ref:.7f}, relative difference "
          f"{rel:.2e}" + (f"; transformers on padded rows {padded_loss:.7f}" if padded_loss is not None else ""))
    ok = rel <= TOL
    if padded_loss is not None and abs(padded_loss - ref) / abs(ref) > TOL:
        print(f"FAIL: transformers' packed loss {ref:.7f} differs from its padded loss {padded_loss:.7f}: the mask or the "
              "positions were not taken")
        ok = False
    if "packed" not in log:
        print("FAIL: the run's log does not say that it packs")
        ok = False
    if rel > TOL:
        print(f"FAIL: relative difference {rel:.2e} above {TOL}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

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
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from safetensors.numpy import save_file
    from transformers import PreTrainedTokenizerFast
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"skipped: {e} (this check needs numpy, safetensors and transformers)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from llama_numpy_ref import numpy_logits, random_weights, write_config  # noqa: E402

TOL = 1e-5
OPEN_ROWS = 64  # worker/data/sft.c: the rows first-fit packing keeps open
TOKENIZER = os.path.join(HERE, "..", "..", "examples", "byte-tokenizer.json")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CONFIG = dict(model_type="llama", num_hidden_layers=2, hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
              intermediate_size=40, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-5,
              rope_theta=10000.0, tie_word_embeddings=False)
CUDA_SIZES = dict(hidden_size=192, intermediate_size=344)
T = 256
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


def examples(tok):
    """Each chat as transformers renders and tokenizes it: ids and labels (-100 outside the assistant turns'
    content and <|im_end|>, the label of a token being the token itself)."""
    out = []
    for chat in CHATS:
        text = tok.apply_chat_template(chat, chat_template=CHATML, tokenize=False)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        spans, at = [], 0
        for m in chat:
            head = "<|im_start|>" + m["role"] + "\n"
            start = text.index(head, at) + len(head)
            end = start + len(m["content"]) + len("<|im_end|>")
            if m["role"] == "assistant":
                spans.append((start, end))
            at = end
        lab = [i if any(s < e_ <= e for s, e in spans) else -100 for i, (s_, e_) in zip(ids, offsets)]
        assert len(ids) <= T, f"a chat of {len(ids)} tokens does not fit {T}"
        out.append((ids, lab))
    return out


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
    import transformers
    from transformers import LlamaForCausalLM
    kw = dict(dtype=torch.float32) if int(transformers.__version__.split(".")[0]) >= 5 else \
        dict(torch_dtype=torch.float32)
    model = LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager", **kw).eval()
    ids, lab, pos, allowed = packed_batch(exs, rows)
    mask = torch.zeros(allowed.shape, dtype=torch.float32)
    mask[~torch.tensor(allowed)] = torch.finfo(torch.float32).min
    with torch.no_grad():
        packed = model(input_ids=torch.tensor(ids), attention_mask=mask[:, None], position_ids=torch.tensor(pos),
                       labels=torch.tensor(lab))
        # the same examples one to a padded row, an ordinary causal mask over the real tokens
        pids = np.zeros((len(exs), T), dtype=np.int64)
        plab = np.full((len(exs), T), -100, dtype=np.int64)
        pmask = np.zeros((len(exs), T), dtype=np.int64)
        for b, (r, l) in enumerate(exs):
            pids[b, :len(r)], plab[b, :len(l)], pmask[b, :len(r)] = r, l, 1
        padded = model(input_ids=torch.tensor(pids), attention_mask=torch.tensor(pmask), labels=torch.tensor(plab))
    return float(packed.loss), float(padded.loss)


def reference_numpy(weights, exs):
    """The mean cross-entropy over the trained tokens, each example alone (float64)."""
    total, count = 0.0, 0
    for r, l in exs:
        logits = numpy_logits(weights, CONFIG, np.asarray([r]))[0]
        mx = logits.max(-1, keepdims=True)
        lse = (mx + np.log(np.exp(logits - mx).sum(-1, keepdims=True)))[:, 0]
        for j in range(len(r) - 1):
            if l[j + 1] >= 0:
                total += lse[j] - logits[j, l[j + 1]]
                count += 1
    return total / count


def run_ztrain(ztrain, work, device, B):
    with open(os.path.join(work, "run.json"), "w") as f:
        json.dump({"shuffle": False}, f)
    cmd = [ztrain, "train", "--config", os.path.join(work, "run.json"),
           "--model", os.path.join(work, "model", "config.json"),
           "--init-from", os.path.join(work, "model", "model.safetensors"), "--tokenizer", TOKENIZER,
           "--sft-data", os.path.join(work, "chats.jsonl"), "--chat-template", "chatml", "--sft-pack",
           "--batch-size", str(B), "--seq-len", str(T), "--steps", "1", "--warmup", "0", "--lr", "1e-6",
           "--min-lr", "0", "--schedule", "nodecay", "--log-every", "1", "--save-every", "-1",
           "--out", os.path.join(work, "run"), "--device", device, "--threads", "2"]
    if device == "cuda":
        cmd += ["--precision", "fp32"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 and device == "cuda" and "built without the CUDA backend" in res.stderr:
        return None, ""
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    with open(os.path.join(work, "run", "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("step") == 1 and "loss" in rec:
                return float(rec["loss"]), res.stderr
    raise RuntimeError("metrics.jsonl has no loss for step 1")


def main():
    args = sys.argv[1:]
    use_numpy = "--numpy" in args
    device = "cpu"
    if "--device" in args:
        device = args[args.index("--device") + 1]
    rest = [a for i, a in enumerate(args) if a not in ("--numpy", "--device") and
            (i == 0 or args[i - 1] != "--device")]
    if len(rest) != 1:
        print(__doc__)
        return 2
    ztrain = rest[0]
    if not use_numpy:
        try:
            import torch  # noqa: F401
        except ImportError as e:
            print(f"skipped: {e} (without --numpy this check needs torch)")
            return 77
    global CONFIG
    if device == "cuda":
        CONFIG = dict(CONFIG, **CUDA_SIZES)
        try:
            import torch
            if not torch.cuda.is_available():
                print("skipped: no CUDA GPU")
                return 77
        except ImportError:
            pass
    tok = PreTrainedTokenizerFast(tokenizer_file=TOKENIZER)
    exs = examples(tok)
    rows = pack(exs)
    assert len(rows) < len(exs) and max(len(r) for r in rows) > 2, "the chats should pack several to a row"
    trained = sum(sum(1 for x in l if x >= 0) for _, l in exs)
    with tempfile.TemporaryDirectory(prefix="zt_sft_pack_hf_") as work:
        folder = os.path.join(work, "model")
        os.makedirs(folder)
        write_config(os.path.join(folder, "config.json"), CONFIG)
        weights = random_weights(np.random.default_rng(31), CONFIG, np.float32)
        save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(work, "chats.jsonl"), "w") as f:
            for chat in CHATS:
                f.write(json.dumps({"messages": chat}, ensure_ascii=False) + "\n")
        try:
            ours, log = run_ztrain(ztrain, work, device, len(rows))
        except RuntimeError as e:
            print(f"FAIL: {e}")
            return 1
        if ours is None:
            print("skipped: this ztrain was built without CUDA")
            return 77
        if use_numpy:
            ref, padded = reference_numpy(weights, exs), None
        else:
            ref, padded = reference_torch(folder, exs, rows)
    rel = abs(ours - ref) / abs(ref)
    what = "numpy LLaMA (float64) on each example alone" if use_numpy else \
        "transformers LlamaForCausalLM (fp32, eager) with a block-diagonal 4-D mask and restarting position_ids"
    print(f"packed sft loss on {len(exs)} chats in {len(rows)} rows of {T} ({[len(r) for r in rows]} a row, "
          f"{trained} trained tokens), ztrain on {device}: {ours:.7f}, {what}: {ref:.7f}, relative difference "
          f"{rel:.2e}" + (f"; transformers on padded rows {padded:.7f}" if padded is not None else ""))
    ok = rel <= TOL
    if padded is not None and abs(padded - ref) / abs(ref) > TOL:
        print(f"FAIL: transformers' packed loss {ref:.7f} differs from its padded loss {padded:.7f}: the mask or the "
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

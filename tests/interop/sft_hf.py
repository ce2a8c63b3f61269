#!/usr/bin/env python3
"""Checks the loss of supervised fine-tuning in ztrain against Hugging Face transformers' LlamaForCausalLM
with labels -100 on everything but the answers.

Usage: sft_hf.py ZTRAIN [--device cuda] [--numpy]

ZTRAIN is the ztrain binary of a build. The check writes an odd LLaMA (6 query heads on 2 key/value heads,
heads of 8 channels, an MLP of 40, an untied head, byte vocabulary) with random weights far from the
initialisation (config.json and model.safetensors), a JSONL file of chats (system prompts, several rounds,
non-ASCII text) and runs `ztrain train --sft-data ... --chat-template chatml --steps 1` on one batch holding
every chat, with examples/byte-tokenizer.json, in fp32 (on --device cpu, or cuda). The loss ztrain logs for
step 1 (the starting weights' loss on that batch) must equal, within 1e-4 relative, the loss of
LlamaForCausalLM.from_pretrained of the same folder given the chats as transformers' apply_chat_template
renders them with the ChatML template string, tokenized by the same tokenizer.json, with labels -100 on every
token outside the assistant answers (each answer's content and its <|im_end|>) and on the padding. With
--numpy the model side is the float64 numpy LLaMA of llama_numpy_ref.py instead (no PyTorch needed); the
rendering, the tokens and the labels still come from transformers.

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
from llama_numpy_ref import mean_loss, numpy_logits, random_weights, write_config  # noqa: E402

TOL = 1e-4
TOKENIZER = os.path.join(HERE, "..", "..", "examples", "byte-tokenizer.json")
# The ChatML template as Qwen and others ship it in tokenizer_config.json.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CONFIG = dict(model_type="llama", num_hidden_layers=2, hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
              intermediate_size=40, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-5,
              rope_theta=10000.0, tie_word_embeddings=False)
# On the GPU, heads of 32 channels (the CUDA attention serves 32, 64, 80, 96, 128 and 256) and an MLP of 344.
CUDA_SIZES = dict(hidden_size=192, intermediate_size=344)
T = 256
CHATS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
     {"role": "assistant", "content": "5"}, {"role": "user", "content": "times 4?"},
     {"role": "assistant", "content": "20"}],
    [{"role": "user", "content": "Reverse \"été\"."}, {"role": "assistant", "content": "été"}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue, like the sky."}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Bonjour !"}],
]


def rows_and_labels(tok):
    """The chats as transformers renders and tokenizes them: ids per chat, and labels (-100 outside the
    assistant turns' content and <|im_end|>)."""
    rows, labels = [], []
    for chat in CHATS:
        text = tok.apply_chat_template(chat, chat_template=CHATML, tokenize=False)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        spans, at = [], 0
        for m in chat:
            head = "<|im_start|>" + m["role"] + "\n"
            start = text.index(head, at) + len(head)
            end = start + len(m["content"]) + len("<|im_end|>")
            assert text[start:end] == m["content"] + "<|im_end|>"
            if m["role"] == "assistant":
                spans.append((start, end))
            at = end
        # a token belongs to the span that holds its last character
        lab = [i if any(s < e_ <= e for s, e in spans) else -100 for i, (s_, e_) in zip(ids, offsets)]
        assert len(ids) <= T, f"a chat of {len(ids)} tokens does not fit {T}"
        rows.append(ids)
        labels.append(lab)
    return rows, labels


def padded(rows, labels):
    B = len(rows)
    ids = np.zeros((B, T), dtype=np.int64)
    lab = np.full((B, T), -100, dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.int64)
    for b, (r, l) in enumerate(zip(rows, labels)):
        ids[b, :len(r)] = r
        lab[b, :len(l)] = l
        mask[b, :len(r)] = 1
    return ids, lab, mask


def reference_torch(folder, ids, lab, mask):
    import torch
    import transformers
    from transformers import LlamaForCausalLM
    # transformers 5 names the argument dtype; 4.x torch_dtype
    kw = dict(dtype=torch.float32) if int(transformers.__version__.split(".")[0]) >= 5 else \
        dict(torch_dtype=torch.float32)
    model = LlamaForCausalLM.from_pretrained(folder, **kw).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), labels=torch.tensor(lab))
    return float(out.loss)


def reference_numpy(weights, ids, lab):
    logits = numpy_logits(weights, CONFIG, ids)
    targets = np.full(lab.shape, -1, dtype=np.int64)
    targets[:, :-1] = np.where(lab[:, 1:] >= 0, lab[:, 1:], -1)  # label j+1 is predicted at position j
    return mean_loss(logits, targets)


def run_ztrain(ztrain, work, device):
    with open(os.path.join(work, "run.json"), "w") as f:
        json.dump({"shuffle": False}, f)  # the batch holds the chats in file order
    cmd = [ztrain, "train", "--config", os.path.join(work, "run.json"),
           "--model", os.path.join(work, "model", "config.json"),
           "--init-from", os.path.join(work, "model", "model.safetensors"), "--tokenizer", TOKENIZER,
           "--sft-data", os.path.join(work, "chats.jsonl"), "--chat-template", "chatml",
           "--batch-size", str(len(CHATS)), "--seq-len", str(T), "--steps", "1", "--warmup", "0", "--lr", "1e-6", "--min-lr", "0",
           "--schedule", "nodecay", "--log-every", "1", "--save-every", "-1", "--out", os.path.join(work, "run"),
           "--device", device, "--threads", "2"]
    if device == "cuda":
        cmd += ["--precision", "fp32"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 and device == "cuda" and "built without the CUDA backend" in res.stderr:
        return None
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    with open(os.path.join(work, "run", "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("step") == 1 and "loss" in rec:
                return float(rec["loss"])
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
            import transformers  # noqa: F401
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
    rows, labels = rows_and_labels(tok)
    ids, lab, mask = padded(rows, labels)
    trained = int((lab >= 0).sum())
    with tempfile.TemporaryDirectory(prefix="zt_sft_hf_") as work:
        folder = os.path.join(work, "model")
        os.makedirs(folder)
        write_config(os.path.join(folder, "config.json"), CONFIG)
        weights = random_weights(np.random.default_rng(27), CONFIG, np.float32)
        save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(work, "chats.jsonl"), "w") as f:
            for chat in CHATS:
                f.write(json.dumps({"messages": chat}, ensure_ascii=False) + "\n")
        try:
            ours = run_ztrain(ztrain, work, device)
        except RuntimeError as e:
            print(f"FAIL: {e}")
            return 1
        if ours is None:
            print("skipped: this ztrain was built without CUDA")
            return 77
        ref = reference_numpy(weights, ids, lab) if use_numpy else reference_torch(folder, ids, lab, mask)
    rel = abs(ours - ref) / abs(ref)
    what = "numpy LLaMA (float64)" if use_numpy else "transformers LlamaForCausalLM (fp32)"
    print(f"sft loss on {len(CHATS)} chats ({int(mask.sum())} tokens, {trained} trained), ztrain on {device}: "
          f"{ours:.7f}, {what} with labels -100: {ref:.7f}, relative difference {rel:.2e}")
    if rel > TOL:
        print(f"FAIL: relative difference {rel:.2e} above {TOL}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

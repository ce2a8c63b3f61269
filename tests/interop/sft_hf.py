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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import zt_testlib as t  # noqa: E402

t.require("numpy", "safetensors", "transformers", needs="numpy, safetensors and transformers")
import numpy as np  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

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


def chat_examples(tok, chats):
    """Each chat as transformers renders and tokenizes it: (ids, labels), the labels -100 outside the assistant
    turns' content and <|im_end|>, the label of a token being the token itself."""
    out = []
    for chat in chats:
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
        out.append((ids, lab))
    return out


def padded(exs):
    """The examples one to a row of T: ids (padded with 0), labels (-100 on the padding) and attention mask."""
    B = len(exs)
    ids = np.zeros((B, T), dtype=np.int64)
    lab = np.full((B, T), -100, dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.int64)
    for b, (r, l) in enumerate(exs):
        ids[b, :len(r)] = r
        lab[b, :len(l)] = l
        mask[b, :len(r)] = 1
    return ids, lab, mask


def load_torch_llama(folder, **extra):
    """LlamaForCausalLM.from_pretrained(folder) in float32, eval mode."""
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(folder, **extra, **t.hf_float32()).eval()


def reference_torch(folder, ids, lab, mask):
    import torch
    model = load_torch_llama(folder)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), labels=torch.tensor(lab))
    return float(out.loss)


def reference_numpy(weights, config, ids, lab):
    logits = numpy_logits(weights, config, ids)
    targets = np.full(lab.shape, -1, dtype=np.int64)
    targets[:, :-1] = np.where(lab[:, 1:] >= 0, lab[:, 1:], -1)  # label j+1 is predicted at position j
    return mean_loss(logits, targets)


def parse_args(args):
    """ZTRAIN [--device cuda] [--numpy] as (ztrain, device, use_numpy); None when the words are off."""
    use_numpy = "--numpy" in args
    device = "cpu"
    if "--device" in args:
        device = args[args.index("--device") + 1]
    rest = [a for i, a in enumerate(args) if a not in ("--numpy", "--device") and
            (i == 0 or args[i - 1] != "--device")]
    return (rest[0], device, use_numpy) if len(rest) == 1 else None


def skip_reason(device, use_numpy):
    """Why the check cannot run here (torch missing without --numpy, no CUDA GPU with --device cuda), or None."""
    if not use_numpy:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as e:
            return f"{e} (without --numpy this check needs torch)"
    if device == "cuda":
        try:
            import torch
            if not torch.cuda.is_available():
                return "no CUDA GPU"
        except ImportError:
            pass
    return None


def start(doc, args):
    """The start of sft_hf.py and sft_pack_hf.py: (ztrain, device, use_numpy, the model's config, the tokenizer);
    exits 2 (printing doc) when the words are off, 77 when the check cannot run here."""
    parsed = parse_args(args)
    if parsed is None:
        print(doc)
        sys.exit(2)
    ztrain, device, use_numpy = parsed
    reason = skip_reason(device, use_numpy)
    if reason:
        print(f"skipped: {reason}")
        sys.exit(77)
    config = dict(CONFIG, **CUDA_SIZES) if device == "cuda" else CONFIG
    return ztrain, device, use_numpy, config, PreTrainedTokenizerFast(tokenizer_file=TOKENIZER)


def write_inputs(work, config, seed, chats):
    """The model folder work/model (config.json, model.safetensors of random float32 weights from seed) and
    the chats as work/chats.jsonl; returns the folder and the weights."""
    folder = os.path.join(work, "model")
    os.makedirs(folder)
    write_config(os.path.join(folder, "config.json"), config)
    weights = random_weights(np.random.default_rng(seed), config, np.float32)
    save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(work, "chats.jsonl"), "w") as f:
        for chat in chats:
            f.write(json.dumps({"messages": chat}, ensure_ascii=False) + "\n")
    return folder, weights


def run_ztrain(ztrain, work, device, batch, extra=()):
    """One step of `ztrain train --sft-data` on the files of write_inputs, batch examples or rows, with the
    flags extra: (the loss it logs for step 1, its stderr), or (None, "") when ztrain has no CUDA backend."""
    with open(os.path.join(work, "run.json"), "w") as f:
        json.dump({"shuffle": False}, f)  # the batch holds the chats in file order
    cmd = [ztrain, "train", "--config", os.path.join(work, "run.json"),
           "--model", os.path.join(work, "model", "config.json"),
           "--init-from", os.path.join(work, "model", "model.safetensors"), "--tokenizer", TOKENIZER,
           "--sft-data", os.path.join(work, "chats.jsonl"), "--chat-template", "chatml", *extra,
           "--batch-size", str(batch), "--seq-len", str(T), "--steps", "1", "--warmup", "0", "--lr", "1e-6",
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


def run_or_exit_code(ztrain, work, device, batch, extra=()):
    """run_ztrain, and the script's exit code when it cannot go on (1 after a failed run, 77 without CUDA):
    (loss, stderr, None) or (None, "", code), having printed why."""
    try:
        ours, log = run_ztrain(ztrain, work, device, batch, extra)
    except RuntimeError as e:
        print(f"FAIL: {e}")
        return None, "", 1
    if ours is None:
        print("skipped: this ztrain was built without CUDA")
        return None, "", 77
    return ours, log, None


def main():
    ztrain, device, use_numpy, config, tok = start(__doc__, sys.argv[1:])
    ids, lab, mask = padded(chat_examples(tok, CHATS))
    trained = int((lab >= 0).sum())
    with tempfile.TemporaryDirectory(prefix="zt_sft_hf_") as work:
        folder, weights = write_inputs(work, config, 27, CHATS)
        ours, _, code = run_or_exit_code(ztrain, work, device, len(CHATS))
        if code is not None:
            return code
        ref = reference_numpy(weights, config, ids, lab) if use_numpy else reference_torch(folder, ids, lab, mask)
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

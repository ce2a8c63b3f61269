#!/usr/bin/env python3
"""Checks `ztrain export --out DIR`: a model folder as transformers' save_pretrained writes it.

Usage: hf_export_check.py ZTRAIN                                (the folder checks; no torch needed)
       hf_export_check.py --full ZTRAIN GPT2_TOOL LLAMA_TOOL BERT_TOOL  (also loads the models in torch)

Everything is written into a scratch directory that is removed at the end (set ZT_KEEP=1 to keep it).

For a tiny GPT-2 (tied head, Conv1D weights) and a tiny LLaMA (grouped-query attention, untied head) it
tokenizes a text and trains a few steps with `ztrain train`; for a tiny BERT classifier it trains a few steps
on examples/sentiment.json's texts, whose run names its tokenizer. It exports each checkpoint three ways:
  - into a folder with --max-shard-size 40KB: config.json, shards model-0000i-of-0000n.safetensors (n > 1,
    none over 40 KB of tensor data unless a single tensor is larger) and model.safetensors.index.json whose
    weight_map names every tensor of every shard and whose total_size is their sum; the safetensors
    library loads every tensor and each equals the checkpoint's own model.safetensors bit for bit; with
    --tokenizer (GPT-2, LLaMA), tokenizer.json and the tokenizer_config.json / special_tokens_map.json
    beside it are copied byte for byte; without it (BERT) the run's tokenizer is;
  - into the same folder again with the default shard size (5GB): one model.safetensors, and the
    earlier shards and index are gone (transformers would otherwise read them);
  - with --dtype bf16: every tensor is BF16 and equals the checkpoint's rounded to nearest even (numpy).
config.json loads with transformers' AutoConfig.from_pretrained(DIR) and gives the run's sizes.

With --full it also loads each folder with AutoModelForCausalLM.from_pretrained in float32 (BERT:
AutoModelForSequenceClassification; no missing or unexpected tensors) and compares its loss on random rows
with ztrain's (gpt2_tool / llama_tool / bert_tool importing the same folder) within 1e-4 relative, and for
LLaMA and BERT the logits within 1e-4 of their largest magnitude.
Exits 0 when every check passes, 1 on a mismatch, 77 (skipped) with --full when torch is missing.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

FULL = len(sys.argv) > 1 and sys.argv[1] == "--full"
if FULL:
    try:
        import torch
        import transformers  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    except ImportError as e:  # pragma: no cover - depends on the environment
        print(f"skipped: {e} (the --full check needs torch and transformers)")
        sys.exit(77)

MAX_SHARD = 40000  # --max-shard-size 40KB (decimal, as transformers counts)

MODELS = {
    "gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 2,
             "n_embd": 32, "n_positions": 64, "vocab_size": 256, "layer_norm_epsilon": 1e-5,
             "tie_word_embeddings": True},
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
              "intermediate_size": 88, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64, "vocab_size": 256, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None},
    # Trained on examples/sentiment.json's labelled texts; the run names its tokenizer, which the export copies.
    "bert": {"model_type": "bert", "architectures": ["BertForSequenceClassification"], "vocab_size": 168,
             "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
             "max_position_embeddings": 32, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0,
             "id2label": {"0": "negative", "1": "positive"}},
}
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
SIZES = {"gpt2": ("n_layer", "n_embd", "vocab_size"),
         "llama": ("num_hidden_layers", "hidden_size", "intermediate_size", "num_key_value_heads", "vocab_size"),
         "bert": ("num_hidden_layers", "hidden_size", "intermediate_size", "id2label", "vocab_size")}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}")
    return cond


def run(cmd):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{res.stderr.strip()}")
    return res


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def data_bytes(path):
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header(path).items() if k != "__metadata__")


def bf16_round(x):
    """float32 -> bf16 bits, round to nearest even (NaN kept quiet), as float32 values."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    return (r.astype(np.uint32) << 16).view(np.float32)


def train(zt, work, name):
    model = os.path.join(work, f"{name}.json")
    with open(model, "w") as f:
        json.dump(MODELS[name], f)
    run_dir = os.path.join(work, f"run_{name}")
    if name == "bert":
        run([zt, "train", "--config", os.path.join(EXAMPLES, "sentiment.json"), "--model", model, "--steps", 3,
             "--warmup", 1, "--eval-every", 0, "--save-every", 3, "--threads", 1, "--out", run_dir])
    else:
        run([zt, "train", "--model", model, "--train-data", os.path.join(work, "data", "text_train_*.bin"),
             "--steps", 3, "--batch-size", 2, "--seq-len", 16, "--threads", 1, "--seed", 5, "--out", run_dir])
    return run_dir


def check_folder(zt, work, name, run_dir, tokenizer_dir):
    ckpt = os.path.join(run_dir, "ckpt_000003")
    ref = load_file(os.path.join(ckpt, "model.safetensors"))
    out = os.path.join(work, f"export_{name}")
    if os.path.exists(out):
        shutil.rmtree(out)
    # A causal LM's run names no tokenizer: give one; the classifier's run names the example's.
    tok_files = ["tokenizer.json"] if name == "bert" else \
        ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    if name == "bert":
        tok_src = {"tokenizer.json": os.path.join(EXAMPLES, "sentiment-tokenizer.json")}
        run([zt, "export", "--checkpoint", run_dir, "--out", out, "--max-shard-size", "40KB"])
    else:
        tok_src = {f: os.path.join(tokenizer_dir, f) for f in tok_files}
        run([zt, "export", "--checkpoint", run_dir, "--out", out, "--max-shard-size", "40KB",
             "--tokenizer", os.path.join(tokenizer_dir, "tokenizer.json")])

    # Shards, index, every tensor.
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    n = len(files)
    check(n > 1, f"{name}: expected several shards of at most 40KB, found {files}")
    check(files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)],
          f"{name}: shard names {files}")
    check("model.safetensors" not in files, f"{name}: model.safetensors beside the shards")
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        index = json.load(f)
    weight_map = index.get("weight_map", {})
    seen = {}
    total = 0
    for fname in files:
        path = os.path.join(out, fname)
        hdr = header(path)
        check(hdr.get("__metadata__", {}).get("format") == "pt", f"{name}: {fname} lacks metadata format=pt")
        size = data_bytes(path)
        ntensors = len(hdr) - ("__metadata__" in hdr)
        check(size <= MAX_SHARD or ntensors == 1, f"{name}: {fname} holds {size} bytes in {ntensors} tensors")
        total += size
        for k, v in load_file(path).items():
            check(k not in seen, f"{name}: tensor {k} in {fname} and {seen.get(k)}")
            seen[k] = fname
            check(weight_map.get(k) == fname, f"{name}: index maps {k} to {weight_map.get(k)}, it is in {fname}")
            check(k in ref and v.dtype == np.float32 and v.shape == ref[k].shape and np.array_equal(v, ref[k]),
                  f"{name}: tensor {k} differs from the checkpoint's")
    check(set(seen) == set(ref), f"{name}: tensors {sorted(set(ref) ^ set(seen))[:5]} missing or extra")
    check(set(weight_map) == set(seen), f"{name}: the index names {sorted(set(weight_map) ^ set(seen))[:5]}")
    check(index.get("metadata", {}).get("total_size") == total,
          f"{name}: total_size {index.get('metadata')} but the shards hold {total} bytes")

    # config.json and the tokenizer files.
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(ckpt, "model_config.json")) as f:
        check(cfg == json.load(f), f"{name}: config.json differs from the checkpoint's model_config.json")
    for fname in tok_files:
        with open(tok_src[fname], "rb") as a, open(os.path.join(out, fname), "rb") as b:
            check(a.read() == b.read(), f"{name}: {fname} was not copied as it is")
    if name == "bert":
        check(not os.path.exists(os.path.join(out, "tokenizer_config.json")),
              f"{name}: a tokenizer_config.json that did not sit beside the run's tokenizer")
    from transformers import AutoConfig
    hf = AutoConfig.from_pretrained(out)
    check(hf.model_type == name, f"{name}: AutoConfig gives model_type {hf.model_type}")
    want = MODELS[name]
    for key in SIZES[name]:
        value = {int(k): v for k, v in want[key].items()} if key == "id2label" else want[key]  # int keys
        check(getattr(hf, key) == value, f"{name}: AutoConfig gives {key} = {getattr(hf, key)}, "
                                         f"the run had {want[key]}")

    # The same folder again, unsharded: the old shards and index must go.
    run([zt, "export", "--checkpoint", run_dir, "--out", out])
    left = sorted(f for f in os.listdir(out) if f.startswith("model"))
    check(left == ["model.safetensors"], f"{name}: after an unsharded export into the folder: {left}")
    single = load_file(os.path.join(out, "model.safetensors"))
    check(set(single) == set(ref) and all(np.array_equal(single[k], ref[k]) for k in ref),
          f"{name}: the unsharded export differs from the checkpoint")

    # BF16, sharded.
    out16 = os.path.join(work, f"export_{name}_bf16")
    run([zt, "export", "--checkpoint", ckpt, "--out", out16, "--dtype", "bf16", "--max-shard-size", "40KB"])
    got = {}
    for fname in sorted(f for f in os.listdir(out16) if f.endswith(".safetensors")):
        hdr = header(os.path.join(out16, fname))
        check(all(v["dtype"] == "BF16" for k, v in hdr.items() if k != "__metadata__"), f"{name}: {fname} not BF16")
        with open(os.path.join(out16, fname), "rb") as f:
            (hn,) = struct.unpack("<Q", f.read(8))
            f.seek(8 + hn)
            blob = f.read()
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            bits = np.frombuffer(blob[a:b], dtype="<u2").astype(np.uint32) << 16
            got[k] = bits.view(np.float32).reshape(v["shape"])
    check(set(got) == set(ref), f"{name}: the bf16 export has tensors {sorted(set(got) ^ set(ref))[:5]} differing")
    for k in ref:
        if k in got:
            check(np.array_equal(got[k], bf16_round(ref[k])), f"{name}: bf16 {k} is not the rounded checkpoint")
    return out


def write_tokens(path, rows):
    rows = np.asarray(rows, dtype=np.int32)
    with open(path, "wb") as f:
        f.write(struct.pack("<ii", rows.shape[0], rows.shape[1] - 1))
        f.write(rows.astype("<i4").tobytes())


def full_check_bert(out, tool, work):
    """AutoModelForSequenceClassification.from_pretrained(out) against bert_tool's logits and loss."""
    model, info = AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32,
                                                                     output_loading_info=True)
    model.eval()
    check(not info.get("missing_keys") and not info.get("unexpected_keys") and not info.get("mismatched_keys"),
          f"bert: loading info {info}")
    B, T = 3, 12
    rng = np.random.default_rng(4)
    tokens = rng.integers(5, 168, size=(B, T)).astype(np.int32)  # no [PAD]: every position attends
    labels = rng.integers(0, 2, size=B)
    targets = np.full((B, T), -1, dtype=np.int32)
    targets[:, 0] = labels
    batch = os.path.join(work, "batch_bert.bin")
    with open(batch, "wb") as f:
        f.write(struct.pack("<ii", B, T))
        for a in (tokens, np.zeros((B, T), dtype=np.int32), targets):
            f.write(a.astype("<i4").tobytes())
    tool_out = os.path.join(work, "tool_bert")
    os.makedirs(tool_out, exist_ok=True)
    loss = float(run([tool, os.path.join(out, "config.json"), 1, batch, tool_out, out]).stdout.split()[0])
    ours = np.fromfile(os.path.join(tool_out, "logits.bin"), dtype="<f4").reshape(B, 2)
    with torch.no_grad():
        theirs = model(input_ids=torch.as_tensor(tokens, dtype=torch.long),
                       token_type_ids=torch.zeros((B, T), dtype=torch.long)).logits.numpy()
    err = np.abs(ours - theirs).max() / np.abs(theirs).max()
    check(err <= 1e-4, f"bert: logits differ by {err:.3g} of their largest magnitude")
    hf_loss = float(torch.nn.functional.cross_entropy(torch.as_tensor(theirs).double(),
                                                      torch.as_tensor(labels, dtype=torch.long)))
    check(abs(hf_loss - loss) <= 1e-4 * abs(hf_loss), f"bert: transformers' loss {hf_loss:.9g}, ztrain's {loss:.9g}")
    print(f"bert: from_pretrained loss {hf_loss:.9g}, ztrain {loss:.9g}")


def full_check(name, out, tool, work):
    """from_pretrained(out) in float32 against ztrain's loss (and LLaMA's logits) for the same folder."""
    if name == "bert":
        return full_check_bert(out, tool, work)
    model, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
    model.eval()
    missing = [k for k in info.get("missing_keys", []) if not (name == "gpt2" and k == "lm_head.weight")]
    check(not missing and not info.get("unexpected_keys") and not info.get("mismatched_keys"),
          f"{name}: loading info {info}")
    rows = np.random.default_rng(3).integers(0, 256, size=(2, 17))
    tokens = os.path.join(work, f"rows_{name}.bin")
    write_tokens(tokens, rows)
    tool_out = os.path.join(work, f"tool_{name}")
    os.makedirs(tool_out, exist_ok=True)
    target = os.path.join(tool_out, "model.safetensors") if name == "gpt2" else tool_out
    loss = float(run([tool, os.path.join(out, "config.json"), 1, tokens, target, out]).stdout.strip())
    ids = torch.as_tensor(rows, dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1]).logits
        hf_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                                                    ids[:, 1:].reshape(-1)).item()
    check(abs(hf_loss - loss) <= 1e-4 * abs(hf_loss), f"{name}: transformers' loss {hf_loss:.9g}, ztrain's {loss:.9g}")
    if name == "llama":
        ours = load_file(os.path.join(tool_out, "outputs.safetensors"))["logits"]
        theirs = logits.numpy()
        err = np.abs(ours - theirs).max() / np.abs(theirs).max()
        check(err <= 1e-4, f"{name}: logits differ by {err:.3g} of their largest magnitude")
    print(f"{name}: from_pretrained loss {hf_loss:.9g}, ztrain {loss:.9g}")


def main():
    args = sys.argv[2:] if FULL else sys.argv[1:]
    if len(args) != (4 if FULL else 1):
        sys.exit(__doc__)
    zt = args[0]
    work = tempfile.mkdtemp(prefix="zt_export_")
    try:
        return checks(zt, args, work)
    finally:
        if os.environ.get("ZT_KEEP") == "1":
            print(f"scratch directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def checks(zt, args, work):
    with open(os.path.join(work, "text.txt"), "w") as f:
        for i in range(300):
            f.write(f"Line {i}: a small text for a small model, {i * 7 % 31} times over.\n")
    run([zt, "tokenize", "--input", os.path.join(work, "text.txt"), "--out-dir", os.path.join(work, "data"),
         "--name", "text", "--val-fraction", "0"])
    # A tokenizer folder as Hugging Face ships one (its content does not matter here: it is copied).
    tok_dir = os.path.join(work, "tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    with open(os.path.join(tok_dir, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}, f)
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 64}, f)
    with open(os.path.join(tok_dir, "special_tokens_map.json"), "w") as f:
        json.dump({}, f)
    for name in MODELS:
        run_dir = train(zt, work, name)
        out = check_folder(zt, work, name, run_dir, tok_dir)
        if FULL:
            full_check(name, out, args[1 + list(MODELS).index(name)], work)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("ok: the exported folders hold the checkpoints' tensors, index, config and tokenizer files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks ztrain's T5 against Hugging Face transformers' T5ForConditionalGeneration, both ways.

Usage: t5_hf.py [--device cuda] T5_TOOL [ZTRAIN]

T5_TOOL is tests/worker/t5_tool from a ztrain build; ZTRAIN, where given, its worker/ztrain. With --device cuda
(a CUDA build, on a GPU) ztrain's pass runs through its CUDA executor in fp32 and the same tolerances hold. For two odd configs, T5 v1.0 (ReLU MLP, head tied to the
shared embedding with the d_model^-0.5 rescale, 8 buckets, max distance 20) and T5 v1.1 (gated-gelu MLP, an
untied lm_head, 32 buckets, max distance 128), both with heads of d_kv = 10 channels that do not divide d_model
(3 heads, d_model 24; on the GPU 3 heads of 16, d_model 40), a vocabulary of 100 and more decoder than encoder layers, and an mT5 as transformers 5 builds it (gated-gelu,
tied head, no rescale), it builds a random model in
float32 (weights perturbed away from their initialisation), saves it with save_pretrained, and has ztrain import
the folder with transformers' own config.json. On a batch of 3 sequences (encoder lengths 11, 7 and 4 of 11,
padded on the right; 8 decoder positions, labels -100 past each target's end):
  - ztrain's logits and mean loss equal transformers' (eval mode), 1e-4 relative;
  - every parameter's gradient of that loss (the bias tables included) equals torch autograd's, 1e-4 relative
    to the tensor's largest entry;
  - ztrain's re-export (model.safetensors and config.json) loads with from_pretrained without missing,
    unexpected or mismatched tensors, holds the same weights and gives the same logits;
  - with ZTRAIN: `ztrain generate --temperature 0` on the export (with the byte-level tokenizer of examples/)
    gives the tokens of transformers' generate(do_sample=False), up to its end-of-sequence token, and
    `--num-beams K` those of generate(num_beams=K) for several beams and length penalties, with the end
    token's output row made to compete so that hypotheses end early.
Exits 0 when every check passes, 1 on a mismatch, 77 (skipped) when torch or transformers is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import load_file
    from transformers import MT5Config, MT5ForConditionalGeneration, T5Config, T5ForConditionalGeneration
except ImportError as e:
    print(f"skipped: {e} (this check needs numpy, safetensors, torch and transformers)")
    sys.exit(77)

ARGS = sys.argv[1:]
DEVICE = "cpu"
if ARGS[:1] == ["--device"]:
    DEVICE, ARGS = (ARGS[1] if len(ARGS) > 1 else ""), ARGS[2:]
    if DEVICE not in ("cpu", "cuda"):
        print(f"--device takes cpu or cuda, not '{DEVICE}'")
        sys.exit(2)
TOOL = ARGS[0] if len(ARGS) > 0 else None
ZTRAIN = ARGS[1] if len(ARGS) > 1 else None
BYTES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "byte-tokenizer.json")
if not TOOL:
    print("usage: t5_hf.py [--device cuda] T5_TOOL [ZTRAIN]")
    sys.exit(2)
MAJOR = int(transformers.__version__.split(".")[0])
KW = dict(dtype=torch.float32) if MAJOR >= 5 else dict(torch_dtype=torch.float32)
V, B, TE, TD = 100, 3, 11, 8
# The widths: on the GPU d_model, heads x d_kv and d_ff must be multiples of 8 (the CUDA kernels' vectors), so
# the GPU run takes 40 wide with 3 heads of 16 (48), still neither a power of two nor d_model / heads.
C, DKV, FF_GATED, FF_RELU = (40, 16, 56, 72) if DEVICE == "cuda" else (24, 10, 36, 40)
LENS = [11, 7, 4]
TARGET_LENS = [8, 5, 3]
failures = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{(': ' + detail) if detail else ''}")
    if not ok:
        failures.append(name)


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    scale = max(np.abs(b).max(), 1e-30)
    return float(np.abs(a - b).max() / scale)


def make_model(v11, folder, mt5=False):
    Config, Model = (MT5Config, MT5ForConditionalGeneration) if mt5 else (T5Config, T5ForConditionalGeneration)
    cfg = Config(vocab_size=V, d_model=C, d_kv=DKV, d_ff=FF_GATED if v11 else FF_RELU, num_layers=2, num_decoder_layers=3,
                   num_heads=3, relative_attention_num_buckets=32 if v11 else 8,
                   relative_attention_max_distance=128 if v11 else 20,
                   feed_forward_proj="gated-gelu" if v11 or mt5 else "relu", tie_word_embeddings=not v11,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.1,
                   layer_norm_epsilon=1e-6)
    torch.manual_seed(3 + v11)
    model = Model(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # norms away from 1
                p.add_(0.3 * torch.randn_like(p))
            else:
                p.mul_(1.0 + 0.2 * torch.randn_like(p))
        if v11:  # an lm_head of its own
            model.lm_head.weight = torch.nn.Parameter(torch.randn(V, C) * 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    if v11:
        # transformers 5 writes every T5 config tied; a checkpoint with its own lm_head reads as untied
        path = os.path.join(folder, "config.json")
        c = json.load(open(path))
        c["tie_word_embeddings"] = False
        json.dump(c, open(path, "w"), indent=2)
    model = Model.from_pretrained(folder, **KW)
    model.eval()
    return model


def batch():
    rng = np.random.default_rng(7)
    enc = rng.integers(2, V, size=(B, TE)).astype(np.int32)
    labels = rng.integers(2, V, size=(B, TD)).astype(np.int32)
    for b in range(B):
        enc[b, LENS[b] - 1] = 1  # eos
        enc[b, LENS[b]:] = 0     # padding
        labels[b, TARGET_LENS[b] - 1] = 1
        labels[b, TARGET_LENS[b]:] = -100
    dec = np.zeros_like(labels)
    dec[:, 1:] = np.where(labels[:, :-1] < 0, 0, labels[:, :-1])
    dec[:, 0] = 0
    return enc, labels, dec


def run_tool(folder, enc, labels, dec, out):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "batch.bin")
    targets = np.where(labels < 0, -1, labels).astype(np.int32)
    with open(path, "wb") as f:
        np.asarray([B, TE, TD], dtype=np.int32).tofile(f)
        enc.astype(np.int32).tofile(f)
        np.asarray(LENS, dtype=np.int32).tofile(f)
        dec.astype(np.int32).tofile(f)
        targets.tofile(f)
    res = subprocess.run([TOOL, "--device", DEVICE, os.path.join(folder, "config.json"), "1", path, out, folder],
                         capture_output=True, text=True)
    if res.returncode == 77:
        print(f"skipped: {res.stdout.strip()}")
        raise SystemExit(77)
    if res.returncode != 0:
        print(res.stdout, res.stderr)
        raise SystemExit(1)
    return float(res.stdout.strip()), load_file(os.path.join(out, "outputs.safetensors"))


def hf_pass(model, enc, labels, dec):
    ids = torch.as_tensor(enc, dtype=torch.long)
    mask = torch.as_tensor(np.arange(TE)[None, :] < np.asarray(LENS)[:, None], dtype=torch.long)
    out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=torch.as_tensor(dec, dtype=torch.long))
    logits = out.logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.as_tensor(labels, dtype=torch.long).reshape(-1),
                                             ignore_index=-100)
    return logits, loss


def one(v11, mt5=False):
    tag = "mT5 (tied, unscaled)" if mt5 else "v1.1" if v11 else "v1.0"
    Model = MT5ForConditionalGeneration if mt5 else T5ForConditionalGeneration
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "hf")
        model = make_model(v11, folder, mt5)
        enc, labels, dec = batch()
        out = os.path.join(tmp, "zt")
        loss, outputs = run_tool(folder, enc, labels, dec, out)
        model.zero_grad()
        logits, ref_loss = hf_pass(model, enc, labels, dec)
        ref_loss.backward()
        ref_logits = logits.detach().numpy()
        # padded decoder positions (no label) differ in nothing, but compare the labelled ones as a loss does
        check(f"{tag} logits", rel_err(outputs["logits"], ref_logits) < 1e-4,
              f"max rel {rel_err(outputs['logits'], ref_logits):.2e}")
        check(f"{tag} loss", abs(loss - ref_loss.item()) <= 1e-4 * abs(ref_loss.item()),
              f"ztrain {loss:.7f}, transformers {ref_loss.item():.7f}")
        worst, worst_name, n = 0.0, "", 0
        params = dict(model.named_parameters())
        for key, g in outputs.items():
            if not key.startswith("grad."):
                continue
            name = key[5:]
            ref = params[name].grad
            ref = np.zeros(g.shape) if ref is None else ref.numpy()
            e = rel_err(g, ref)
            n += 1
            if e > worst:
                worst, worst_name = e, name
        check(f"{tag} gradients ({n} tensors)", worst < 1e-4 and n == len(params),
              f"worst {worst:.2e} ({worst_name}); transformers has {len(params)} parameters")
        # the re-export
        again, info = Model.from_pretrained(out, output_loading_info=True, **KW)
        again.eval()
        clean = not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
        check(f"{tag} re-export loads", clean, str(info))
        same = all(torch.equal(p, dict(again.named_parameters())[k]) for k, p in model.named_parameters())
        check(f"{tag} re-export holds the weights", same)
        with torch.no_grad():
            logits2, _ = hf_pass(again, enc, labels, dec)
        check(f"{tag} re-export logits", rel_err(logits2.numpy(), ref_logits) < 1e-6,
              f"max rel {rel_err(logits2.numpy(), ref_logits):.2e}")
        if ZTRAIN:
            generate(again, out, tag)


def generate(model, folder, tag):
    prompt = "HELLO 42, T5"  # bytes below the vocabulary of 100
    ids = torch.as_tensor([[ord(c) for c in prompt]], dtype=torch.long)
    with torch.no_grad():
        # no cache: transformers sizes it by num_layers, which this decoder exceeds
        ref = model.generate(ids, max_new_tokens=10, do_sample=False, use_cache=False)[0, 1:].tolist()
    if ref and ref[-1] == 1:
        ref = ref[:-1]  # ztrain stops before the end-of-sequence token
    res = subprocess.run([ZTRAIN, "generate", "--weights", os.path.join(folder, "model.safetensors"), "--model",
                          os.path.join(folder, "config.json"), "--tokenizer", BYTES, "--prompt", prompt,
                          "--max-new-tokens", "10", "--temperature", "0"], capture_output=True)
    if res.returncode != 0:
        print(res.stderr.decode(errors="replace"))
    got = list(res.stdout[len(prompt) + 1:].rstrip(b"\n"))
    check(f"{tag} greedy generation", res.returncode == 0 and got == ref, f"ztrain {got}, transformers {ref}")
    beam(model, folder, tag, prompt, ids, ref)


def beam(model, folder, tag, prompt, ids, greedy):
    """`ztrain generate --num-beams K` against generate(num_beams=K), with hypotheses that end early: the end token's
    output row is made a copy of the row of a token greedy decoding picks (slightly larger), so that it competes."""
    import copy
    boosted = copy.deepcopy(model)
    with torch.no_grad():
        head = boosted.get_output_embeddings().weight
        head[1] = head[greedy[min(2, len(greedy) - 1)]] * 1.02
    d = folder + "-eos"
    boosted.save_pretrained(d)
    if boosted.get_output_embeddings().weight is not boosted.get_input_embeddings().weight:
        path = os.path.join(d, "config.json")  # as make_model: transformers 5 writes every T5 config tied
        c = json.load(open(path))
        c["tie_word_embeddings"] = False
        json.dump(c, open(path, "w"), indent=2)
    ended = 0
    for beams, penalty in ((2, 1.0), (4, 1.0), (4, 0.0), (3, 2.0)):
        with torch.no_grad():
            ref = boosted.generate(ids, max_new_tokens=10, do_sample=False, num_beams=beams, length_penalty=penalty,
                                   early_stopping=False, use_cache=False)[0, 1:].tolist()
        if 1 in ref:
            ended += 1
            ref = ref[:ref.index(1)]  # ztrain prints the tokens before the end-of-sequence token (then padding)
        res = subprocess.run([ZTRAIN, "generate", "--weights", os.path.join(d, "model.safetensors"), "--model",
                              os.path.join(d, "config.json"), "--tokenizer", BYTES, "--prompt", prompt,
                              "--max-new-tokens", "10", "--num-beams", str(beams), "--length-penalty", str(penalty)],
                             capture_output=True)
        if res.returncode != 0:
            print(res.stderr.decode(errors="replace"))
        got = list(res.stdout[len(prompt) + 1:].rstrip(b"\n"))
        check(f"{tag} beam search ({beams} beams, length penalty {penalty})", res.returncode == 0 and got == ref,
              f"ztrain {got}, transformers {ref}")
    check(f"{tag} beam search: hypotheses ended with the end token", ended > 0, f"in {ended} of the 4 searches")


one(False)
one(True)
one(False, mt5=True)
print(f"{'FAILED: ' + ', '.join(failures) if failures else f'all T5 checks passed ({DEVICE})'}")
sys.exit(1 if failures else 0)

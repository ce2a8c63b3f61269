#!/usr/bin/env python3
"""Checks that ztrain's exported GPT-2 loads in Hugging Face transformers and gives the same loss.

Usage: hf_gpt2_check.py GPT2_TOOL [CHECKPOINT_DIR]

GPT2_TOOL is tests/worker/gpt2_tool from a ztrain build. For two model shapes (a tiny one and a 4-layer,
256-wide model with a byte vocabulary), and for seeded and far-from-initial weights, it makes a model,
tokens and an export (model.safetensors + config.json written by ztrain), loads the folder with
GPT2LMHeadModel.from_pretrained in float32 and eval mode, and compares the loss of
model(input_ids=rows, labels=rows) (transformers shifts the labels, as ztrain's targets are shifted)
with ztrain's, within 1e-4 relative. It also requires that loading reported no unexpected, mismatched
or missing tensors (other than lm_head.weight, which is tied to wte) and that the head is tied.

With CHECKPOINT_DIR (a `ztrain train` checkpoint, e.g. runs/demo/ckpt_000200), it also checks the
trained weights: the checkpoint's own model.safetensors with its model_config.json, and the same weights
imported and exported again by ztrain.

Exits 0 when every check passes, 1 on a mismatch, 77 (skipped) when torch or transformers is missing.
"""
import json
import os
import shutil
import sys
import tempfile

try:
    import numpy as np
    import torch
    import transformers
    from transformers import GPT2LMHeadModel
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"skipped: {e} (this check needs numpy, torch and transformers)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_numpy_ref import CONFIGS, random_rows, random_weights, run_tool, write_config, write_tokens  # noqa: E402


def hf_loss(folder, rows):
    """Loads folder (model.safetensors + config.json) with transformers and returns (loss, problems)."""
    model, info = GPT2LMHeadModel.from_pretrained(folder, torch_dtype=torch.float32, output_loading_info=True)
    model.eval()
    problems = []
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]
    for what, keys in (("missing", missing), ("unexpected", info.get("unexpected_keys", [])),
                       ("mismatched", info.get("mismatched_keys", []))):
        if keys:
            problems.append(f"{what} tensors when loading: {list(keys)[:5]}")
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr() and not torch.equal(
            model.lm_head.weight, model.transformer.wte.weight):
        problems.append("lm_head.weight is not tied to wte")
    ids = torch.as_tensor(np.asarray(rows), dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
        # The same loss from the logits of the first T positions, computed here.
        logits = model(input_ids=ids[:, :-1]).logits
        manual = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                                                   ids[:, 1:].reshape(-1))
    if abs(out.loss.item() - manual.item()) > 1e-4 * abs(manual.item()):
        problems.append(f"transformers' shifted-label loss {out.loss.item():.9g} differs from the logits' "
                        f"cross-entropy {manual.item():.9g}")
    return float(out.loss.item()), problems


def report(label, ours, theirs, problems):
    rel = abs(ours - theirs) / abs(theirs)
    ok = rel < 1e-4 and not problems
    print(f"{'ok  ' if ok else 'FAIL'} {label}: ztrain {ours:.9g}, transformers {theirs:.9g}, "
          f"relative difference {rel:.2e}" + "".join(f"; {p}" for p in problems))
    return ok


def main():
    if len(sys.argv) not in (2, 3):
        print("usage: hf_gpt2_check.py GPT2_TOOL [CHECKPOINT_DIR]", file=sys.stderr)
        return 2
    tool = os.path.abspath(sys.argv[1])
    ckpt = sys.argv[2] if len(sys.argv) == 3 else None
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    torch.manual_seed(0)
    rng = np.random.default_rng(99)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="zt_hf_check_") as tmp:
        for name, fields, B, T in CONFIGS:
            for kind in ("seeded", "far-from-init"):
                d = os.path.join(tmp, f"{name}-{kind}")
                os.makedirs(d)
                cfg_in, tok, out = (os.path.join(d, f) for f in ("in_config.json", "tokens.bin", "model.safetensors"))
                write_config(cfg_in, fields)
                rows = random_rows(rng, B, T, fields["vocab_size"])
                write_tokens(tok, rows)
                init = None
                if kind == "far-from-init":
                    from safetensors.numpy import save_file
                    init = os.path.join(tmp, f"{name}-init.safetensors")
                    save_file(random_weights(rng, fields, np.float32, "transformer."), init, metadata={"format": "pt"})
                ours = run_tool(tool, cfg_in, 7, tok, out, init=init)
                os.remove(cfg_in)  # the folder holds only what ztrain exported: model.safetensors + config.json
                os.remove(tok)
                theirs, problems = hf_loss(d, rows)
                failures += not report(f"{name} {kind}", ours, theirs, problems)

        if ckpt:
            cfg_path = os.path.join(ckpt, "model_config.json")
            weights = os.path.join(ckpt, "model.safetensors")
            with open(cfg_path) as f:
                cfg = json.load(f)
            T = min(64, cfg["n_positions"] - 1)
            rows = random_rows(rng, 2, T, cfg["vocab_size"])
            tok = os.path.join(tmp, "ckpt-tokens.bin")
            write_tokens(tok, rows)
            # The weights imported and exported again by ztrain.
            d = os.path.join(tmp, "ckpt-reexport")
            os.makedirs(d)
            ours = run_tool(tool, cfg_path, 0, tok, os.path.join(d, "model.safetensors"), init=weights)
            theirs, problems = hf_loss(d, rows)
            failures += not report(f"checkpoint {ckpt} (exported again)", ours, theirs, problems)
            # The checkpoint's own file, beside its model config.
            d = os.path.join(tmp, "ckpt-direct")
            os.makedirs(d)
            shutil.copy(weights, os.path.join(d, "model.safetensors"))
            shutil.copy(cfg_path, os.path.join(d, "config.json"))
            theirs, problems = hf_loss(d, rows)
            failures += not report(f"checkpoint {ckpt} (its own model.safetensors)", ours, theirs, problems)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

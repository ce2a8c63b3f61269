#!/usr/bin/env python3
"""Checks ztrain's GPT-NeoX against Hugging Face transformers' GPTNeoXForCausalLM, both ways.

Usage: neox_hf.py FAMILY_TOOL

FAMILY_TOOL is tests/worker/family_tool from a ztrain build (ztrain is beside it, in ../../worker). For odd
configs (rotary_pct 0.25 of heads of 16 channels, a vocabulary of 1003, parallel and sequential residuals,
tied and untied heads, exact GELU and gelu_new) it builds a random GPTNeoXForCausalLM in float32 (LayerNorm
weights away from 1, biases away from 0), saves it with save_pretrained and has ztrain import the folder with
transformers' own config.json. On 2 x 16 tokens it compares:
  - ztrain's logits and mean loss with transformers' (eval mode), 1e-4 relative;
  - every parameter's gradient of that loss (loss.backward()), 1e-4 relative to the tensor's largest entry;
  - ztrain's re-export: from_pretrained loads it without missing, unexpected or mismatched tensors, it holds
    exactly the original weights and gives the same logits;
  - `ztrain generate --temperature 0` against model.generate(do_sample=False) on a model of 256 tokens.
Where a GPU is visible and family_tool was built with CUDA, the first two checks run again with ztrain's
CUDA executor in fp32 (heads of 32 channels, 8 rotated). Exits 0 when every check passes, 1 on a mismatch,
77 (skipped) when torch or transformers is missing.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import zt_testlib as t  # noqa: E402

t.require("numpy", "safetensors", "torch", "transformers", needs="numpy, safetensors, torch and transformers")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM  # noqa: E402

sys.path.insert(0, HERE)
from gpt2_numpy_ref import random_rows, write_tokens  # noqa: E402
from neox_numpy_ref import run_tool  # noqa: E402

TOL = 1e-4
VARIANTS = [("parallel, untied, gelu", dict(use_parallel_residual=True, tie_word_embeddings=False, hidden_act="gelu")),
            ("sequential, tied, gelu_new",
             dict(use_parallel_residual=False, tie_word_embeddings=True, hidden_act="gelu_new"))]


def make_config(kw, gpu=False, vocab=1003):
    width = dict(hidden_size=128, num_attention_heads=4, intermediate_size=344) if gpu else \
        dict(hidden_size=48, num_attention_heads=3, intermediate_size=40)
    return GPTNeoXConfig(vocab_size=vocab, num_hidden_layers=2, max_position_embeddings=64, rotary_pct=0.25,
                         rotary_emb_base=10000, layer_norm_eps=1e-5, initializer_range=0.2, bos_token_id=0,
                         eos_token_id=None, **width, **kw)


def random_model(cfg, seed):
    torch.manual_seed(seed)
    model = GPTNeoXForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def load(folder):
    return GPTNeoXForCausalLM.from_pretrained(folder, output_loading_info=True, **t.hf_float32())


def hf_grad_name(name):
    # transformers 5 calls the head lm_head; its files (and ztrain's) call it embed_out
    return "embed_out.weight" if name == "lm_head.weight" else name


def check(tool, tmp, label, kw, rng, device=None):
    problems = []
    tied = kw["tie_word_embeddings"]
    model = random_model(make_config(kw, gpu=device == "cuda"), 1 + tied)
    tag = f"{int(tied)}{device or ''}"
    hf_dir = os.path.join(tmp, f"hf-{tag}")
    model.save_pretrained(hf_dir)
    B, T = 2, 16
    rows = random_rows(rng, B, T, 1003)
    rows[1, -1] = -1
    tok = os.path.join(tmp, f"tokens-{tag}.bin")
    write_tokens(tok, rows)
    out = os.path.join(tmp, f"zt-{tag}")
    ours_loss = run_tool(tool, os.path.join(hf_dir, "config.json"), tok, out, hf_dir, seed=0, device=device)
    ours = load_file(os.path.join(out, "logits.safetensors"))["logits"]
    grads = load_file(os.path.join(out, "grads.safetensors"))
    ids, logits, loss = t.hf_loss_and_grads(model, rows)
    d_logits = t.rel(torch.from_numpy(ours), logits.detach())
    d_loss = abs(ours_loss - loss.item()) / abs(loss.item())
    if d_logits > TOL or d_loss > TOL:
        problems.append(f"logits differ by {d_logits:.2e}, loss {ours_loss:.9g} against {loss.item():.9g}")
    worst, worst_name = 0.0, ""
    for name, p in model.named_parameters():
        key = hf_grad_name(name)
        if key not in grads:
            if not (tied and name == "lm_head.weight"):
                problems.append(f"ztrain wrote no gradient for {name}")
            continue
        d = t.rel(torch.from_numpy(grads[key]), p.grad)
        if d > worst:
            worst, worst_name = d, name
    if worst > TOL:
        problems.append(f"gradient of {worst_name} differs by {worst:.2e}")
    if device is None:
        back, info = load(out)
        problems += t.hf_reload_problems(model, back, info, ids, logits, tied)[0]
    print(f"{label}{', ztrain on ' + device if device else ''}: logits {d_logits:.2e}, loss {d_loss:.2e}, "
          f"gradients {worst:.2e}")
    return problems


def check_generate(tool, tmp):
    ztrain = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(tool)))), "worker",
                          "ztrain")
    model = random_model(make_config(VARIANTS[0][1], vocab=256), 7)
    folder = os.path.join(tmp, "gen")
    model.save_pretrained(folder)
    prompt, n = b"Pythia says", 12
    got, failed = t.ztrain_greedy(ztrain, folder, prompt, n)
    if failed:
        return [failed]
    with torch.no_grad():
        seq = model.generate(torch.tensor([list(prompt)]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                             pad_token_id=0)
    want = bytes(seq[0].tolist())
    print(f"greedy generation: {got!r}")
    return [] if got == want else [f"ztrain generated {got!r}, transformers {want!r}"]


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tool = sys.argv[1]
    rng = np.random.default_rng(5)
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, kw in VARIANTS:
            problems += [f"{label}: {p}" for p in check(tool, tmp, label, kw, rng)]
        problems += [f"generate: {p}" for p in check_generate(tool, tmp)]
        probe = subprocess.run([tool, "--device", "cuda"], capture_output=True, text=True)
        if torch.cuda.is_available() and "needs a build with CUDA" not in probe.stderr:
            for label, kw in VARIANTS:
                problems += [f"{label}, cuda: {p}" for p in check(tool, tmp, label, kw, rng, device="cuda")]
        else:
            print("no GPU or no CUDA build: the CUDA executor's checks were not run")
    for p in problems:
        print("MISMATCH", p)
    print("all checks passed" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

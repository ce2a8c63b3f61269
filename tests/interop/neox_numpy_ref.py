#!/usr/bin/env python3
"""Checks ztrain's GPT-NeoX against a numpy transcription of transformers' GPTNeoXForCausalLM.

Usage: neox_numpy_ref.py FAMILY_TOOL

FAMILY_TOOL is tests/worker/family_tool from a ztrain build. For configs of odd shapes (3 heads of 16 channels
with rotary_pct 0.25 or 0.5, a vocabulary of 1003, parallel and sequential residuals, tied and untied heads,
exact GELU and gelu_new, with and without attention biases; rotary fields as Pythia's configs write them and
as transformers 5's rope_parameters) it writes random weights in Hugging Face's layout (query_key_value's
rows interleaved per head) under Hugging Face's names, has ztrain import them, and compares on 2 x 11 tokens:
  - ztrain's logits and mean loss with the numpy model's (float64), 1e-4 relative;
  - ztrain's gradient (exported under Hugging Face's names and layout) of sampled entries of every tensor with
    central differences of the numpy loss, 1e-4 relative to the tensor's largest gradient;
  - ztrain's re-export holds exactly the imported weights (the q, k, v permutation undone), and its
    config.json reads back as the same config;
  - `ztrain generate --temperature 0` (a vocabulary of the 256 bytes) continues a prompt with the numpy
    model's greedy tokens.
Exits 0 when every check passes, 1 on a mismatch, 77 (skipped) without numpy and safetensors.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import zt_testlib as t  # noqa: E402

t.require("numpy", "safetensors", needs="numpy and safetensors")
import numpy as np  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

sys.path.insert(0, HERE)
from gpt2_numpy_ref import random_rows, write_tokens  # noqa: E402

TOL = 1e-4

BASE = dict(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], vocab_size=1003, hidden_size=48,
            num_attention_heads=3, num_hidden_layers=2, intermediate_size=40, max_position_embeddings=64,
            layer_norm_eps=1e-5, initializer_range=0.02, bos_token_id=0, eos_token_id=2, attention_dropout=0.0,
            hidden_dropout=0.0, use_cache=True)

CONFIGS = [
    ("parallel, untied, rotary 0.25 (rope_parameters), gelu",
     dict(BASE, use_parallel_residual=True, tie_word_embeddings=False, hidden_act="gelu",
          rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25))),
    ("sequential, tied, rotary 0.5 (rotary_pct), gelu_new",
     dict(BASE, use_parallel_residual=False, tie_word_embeddings=True, hidden_act="gelu_new", rotary_pct=0.5,
          rotary_emb_base=100.0)),
    ("parallel, untied, full rotary, no attention bias",
     dict(BASE, use_parallel_residual=True, tie_word_embeddings=False, hidden_act="gelu", rotary_pct=1.0,
          rotary_emb_base=10000.0, attention_bias=False, num_hidden_layers=3)),
]


def rotary(cfg):
    p = cfg.get("rope_parameters") or {}
    return p.get("partial_rotary_factor", cfg.get("rotary_pct", 0.25)), p.get("rope_theta",
                                                                             cfg.get("rotary_emb_base", 10000.0))


def hf_weights(rng, cfg):
    """Random GPTNeoXForCausalLM weights under Hugging Face's names, float32."""
    C, V, F, L = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    bias = cfg.get("attention_bias", True)
    w = {"gpt_neox.embed_in.weight": rng.normal(0, 0.3, (V, C))}
    for l in range(L):
        p = f"gpt_neox.layers.{l}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            w[p + n + ".weight"] = 1 + rng.normal(0, 0.2, C)
            w[p + n + ".bias"] = rng.normal(0, 0.2, C)
        w[p + "attention.query_key_value.weight"] = rng.normal(0, 0.3, (3 * C, C))
        w[p + "attention.dense.weight"] = rng.normal(0, 0.3, (C, C))
        if bias:
            w[p + "attention.query_key_value.bias"] = rng.normal(0, 0.3, 3 * C)
            w[p + "attention.dense.bias"] = rng.normal(0, 0.3, C)
        w[p + "mlp.dense_h_to_4h.weight"] = rng.normal(0, 0.3, (F, C))
        w[p + "mlp.dense_h_to_4h.bias"] = rng.normal(0, 0.3, F)
        w[p + "mlp.dense_4h_to_h.weight"] = rng.normal(0, 0.3, (C, F))
        w[p + "mlp.dense_4h_to_h.bias"] = rng.normal(0, 0.3, C)
    w["gpt_neox.final_layer_norm.weight"] = 1 + rng.normal(0, 0.2, C)
    w["gpt_neox.final_layer_norm.bias"] = rng.normal(0, 0.2, C)
    if not cfg.get("tie_word_embeddings", False):
        w["embed_out.weight"] = rng.normal(0, 0.3, (V, C))
    return {k: v.astype(np.float32) for k, v in w.items()}


def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x, act):
    if act == "gelu":
        erf = np.vectorize(math.erf)
        return 0.5 * x * (1 + erf(x / math.sqrt(2)))
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def numpy_logits(w, cfg, ids):
    """GPTNeoXForCausalLM's forward (modeling_gpt_neox.py) in float64."""
    C, NH, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    HS, eps, act = C // NH, cfg["layer_norm_eps"], cfg.get("hidden_act", "gelu")
    pct, base = rotary(cfg)
    rot = int(HS * pct)
    B, T = ids.shape
    inv = 1.0 / (np.float32(base) ** (np.arange(0, rot, 2, dtype=np.float32) / np.float32(rot)))
    ang = (np.arange(T, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float64)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    g = lambda k: w[k].astype(np.float64)  # noqa: E731
    x = g("gpt_neox.embed_in.weight")[ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)

    def rope(t):  # [B, NH, T, HS]
        r, p = t[..., :rot], t[..., rot:]
        half = np.concatenate([-r[..., rot // 2:], r[..., :rot // 2]], -1)
        return np.concatenate([r * cos + half * sin, p], -1)

    for l in range(L):
        p = f"gpt_neox.layers.{l}."
        h = _ln(x, g(p + "input_layernorm.weight"), g(p + "input_layernorm.bias"), eps)
        qkv = h @ g(p + "attention.query_key_value.weight").T
        if p + "attention.query_key_value.bias" in w:
            qkv = qkv + g(p + "attention.query_key_value.bias")
        qkv = qkv.reshape(B, T, NH, 3 * HS).transpose(0, 2, 1, 3)
        q, k, v = rope(qkv[..., :HS]), rope(qkv[..., HS:2 * HS]), qkv[..., 2 * HS:]
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(HS) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        a = ((s / s.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        a = a @ g(p + "attention.dense.weight").T
        if p + "attention.dense.bias" in w:
            a = a + g(p + "attention.dense.bias")

        def mlp(y):
            y = _ln(y, g(p + "post_attention_layernorm.weight"), g(p + "post_attention_layernorm.bias"), eps)
            y = _gelu(y @ g(p + "mlp.dense_h_to_4h.weight").T + g(p + "mlp.dense_h_to_4h.bias"), act)
            return y @ g(p + "mlp.dense_4h_to_h.weight").T + g(p + "mlp.dense_4h_to_h.bias")

        if cfg.get("use_parallel_residual", True):
            x = x + a + mlp(x)
        else:
            x = x + a
            x = x + mlp(x)
    x = _ln(x, g("gpt_neox.final_layer_norm.weight"), g("gpt_neox.final_layer_norm.bias"), eps)
    head = "gpt_neox.embed_in.weight" if cfg.get("tie_word_embeddings", False) else "embed_out.weight"
    return x @ g(head).T


def mean_loss(logits, targets):
    z = logits - logits.max(-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    keep = targets >= 0
    return -(np.take_along_axis(lp, np.maximum(targets, 0)[..., None], -1)[..., 0] * keep).sum() / keep.sum()


def run_tool(tool, config, tokens, out_dir, init, seed=7, device=None):
    """family_tool on one batch (its loss; logits, gradients and the export in out_dir), on --device device."""
    cmd = [tool] + (["--device", device] if device else []) + [config, str(seed), tokens, out_dir, init]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return float(res.stdout.strip())


def check(tool, label, cfg, rng, tmp):
    problems = []
    w = hf_weights(rng, cfg)
    folder = os.path.join(tmp, f"in{len(os.listdir(tmp))}")
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    # the buffers older files carry are skipped on import
    extra = {"gpt_neox.layers.0.attention.rotary_emb.inv_freq": np.ones(2, np.float32),
             "gpt_neox.layers.0.attention.masked_bias": np.zeros(1, np.float32)}
    save_file(dict(w, **extra), os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    B, T = 2, 11
    rows = random_rows(rng, B, T, cfg["vocab_size"])
    rows[1, -1] = -1  # an ignored target
    tokens = os.path.join(folder, "tokens.bin")
    write_tokens(tokens, rows)
    out = os.path.join(folder, "out")
    loss = run_tool(tool, os.path.join(folder, "config.json"), tokens, out, os.path.join(folder, "model.safetensors"))
    ids, targets = rows[:, :T], rows[:, 1:]
    ref = numpy_logits(w, cfg, ids)
    ours = load_file(os.path.join(out, "logits.safetensors"))["logits"].astype(np.float64)
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    ref_loss = mean_loss(ref, targets)
    rel_loss = abs(loss - ref_loss) / abs(ref_loss)
    if not rel <= TOL or not rel_loss <= TOL:
        problems.append(f"logits differ by {rel:.2e} relative, loss {loss} vs {ref_loss} ({rel_loss:.2e})")
    # the re-export: exactly the weights imported, nothing else
    back = load_file(os.path.join(out, "model.safetensors"))
    if set(back) != set(w):
        problems.append(f"export names differ: {sorted(set(back) ^ set(w))}")
    else:
        for k in w:
            if not np.array_equal(back[k], w[k]):
                problems.append(f"export of {k} differs from the imported tensor")
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)
    for k in ("hidden_size", "num_attention_heads", "use_parallel_residual", "tie_word_embeddings", "vocab_size"):
        if saved.get(k, BASE.get(k)) != cfg.get(k, saved.get(k)):
            problems.append(f"config.json: {k} is {saved.get(k)}, was {cfg.get(k)}")
    pct, base = rotary(cfg)
    if saved["rotary_pct"] != pct or saved["rotary_emb_base"] != base:
        problems.append(f"config.json: rotary {saved['rotary_pct']}, {saved['rotary_emb_base']} vs {pct}, {base}")
    # gradients: sampled entries against central differences of the float64 loss
    grads = load_file(os.path.join(out, "grads.safetensors"))
    wd = {k: v.astype(np.float64) for k, v in w.items()}
    worst = 0.0
    for name in sorted(w):
        g = grads[name].astype(np.float64)
        scale = max(np.abs(g).max(), 1e-6)
        flat = g.reshape(-1)
        picks = set(rng.integers(0, flat.size, 3).tolist()) | {int(np.abs(flat).argmax())}
        for i in sorted(picks):
            h = 1e-5
            base_val = wd[name].reshape(-1)[i]
            wd[name].reshape(-1)[i] = base_val + h
            lp = mean_loss(numpy_logits(wd, cfg, ids), targets)
            wd[name].reshape(-1)[i] = base_val - h
            lm = mean_loss(numpy_logits(wd, cfg, ids), targets)
            wd[name].reshape(-1)[i] = base_val
            fd = (lp - lm) / (2 * h)
            err = abs(flat[i] - fd) / scale
            worst = max(worst, err)
            if err > TOL:
                problems.append(f"gradient of {name}[{i}]: ztrain {flat[i]:.6g}, differences {fd:.6g} ({err:.2e})")
    print(f"{label}: logits {rel:.2e}, loss {rel_loss:.2e}, gradients {worst:.2e} (relative)")
    return problems


def check_generate(tool, rng, tmp):
    """Greedy generation of `ztrain generate` (beside family_tool in the build) against the numpy model's."""
    ztrain = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(tool)))), "worker",
                          "ztrain")
    cfg = dict(CONFIGS[0][1], vocab_size=256, eos_token_id=None)
    w = hf_weights(rng, cfg)
    folder = os.path.join(tmp, "gen")
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(w, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    prompt, n = b"Pythia says", 12
    got, failed = t.ztrain_greedy(ztrain, folder, prompt, n)
    if failed:
        return [failed]
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(numpy_logits(w, cfg, np.array([ids]))[0, -1].argmax()))
    want = bytes(ids)
    print(f"greedy generation: {got!r}")
    return [] if got == want else [f"ztrain generated {got!r}, numpy's greedy tokens are {want!r}"]


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    rng = np.random.default_rng(1234)
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, cfg in CONFIGS:
            problems += [f"{label}: {p}" for p in check(sys.argv[1], label, cfg, rng, tmp)]
        problems += [f"generate: {p}" for p in check_generate(sys.argv[1], rng, tmp)]
    for p in problems:
        print("MISMATCH", p)
    failed = len({p.split(':')[0] for p in problems})
    print(f"{len(CONFIGS) + 1 - failed} passed, {failed} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

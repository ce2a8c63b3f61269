#!/usr/bin/env python3
"""Checks ztrain's GPT-2 against an independent numpy implementation of GPT-2's forward pass.

Usage: gpt2_numpy_ref.py GPT2_TOOL

For two model shapes (a tiny one and a 4-layer, 256-wide model with a byte vocabulary) it writes a
Hugging Face config.json and a tokens file, runs GPT2_TOOL (tests/worker/gpt2_tool.c), which creates a
model from a seed, exports model.safetensors and config.json and prints its loss, then loads both files
with safetensors.numpy and json, recomputes the loss in float64 (HF Conv1D layout, gelu_new, layer norm
with the config's epsilon, causal softmax, head tied to wte) and requires agreement within 1e-5 relative.
It also checks the exported file's header: F32 only, {"format": "pt"} metadata and exactly GPT-2's
Hugging Face tensor names. A second round starts from weights far from GPT-2's initialisation, written
by the safetensors library (F32 with the "transformer." prefix, F16 without it), which ztrain imports
and exports again unchanged. Exits 0 when all checks pass, 1 on a mismatch, 77 (skipped) without numpy or
safetensors.

The helpers (write_config, write_tokens, run_tool, numpy_loss) are also used by hf_gpt2_check.py.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"skipped: {e} (install numpy and safetensors)")
    sys.exit(77)

# The shapes the checks run on: (name, HF config fields, batch size, sequence length).
CONFIGS = [
    ("tiny", dict(n_layer=2, n_head=2, n_embd=16, n_positions=8, vocab_size=11), 2, 6),
    ("4x256-bytes", dict(n_layer=4, n_head=4, n_embd=256, n_positions=256, vocab_size=256), 2, 64),
]


def write_config(path, fields, eps=1e-5):
    """Writes a Hugging Face GPT-2 config.json with the given sizes."""
    cfg = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "activation_function": "gelu_new",
        "layer_norm_epsilon": eps,
        "n_inner": None,
        "tie_word_embeddings": True,
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
    }
    cfg.update(fields)
    cfg["n_ctx"] = cfg["n_positions"]
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def write_tokens(path, rows):
    """Writes the tokens file gpt2_tool reads: int32 B, T, then B rows of T+1 tokens."""
    rows = np.asarray(rows, dtype=np.int32)
    B, T1 = rows.shape
    with open(path, "wb") as f:
        f.write(struct.pack("<ii", B, T1 - 1))
        f.write(rows.astype("<i4").tobytes())


def random_rows(rng, B, T, V):
    return rng.integers(0, V, size=(B, T + 1), dtype=np.int64)


def run_tool(tool, config, seed, tokens, out, init=None):
    """Runs gpt2_tool and returns the loss it printed."""
    cmd = [tool, config, str(seed), tokens, out] + ([init] if init else [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return float(res.stdout.strip())


def read_header(path):
    """The JSON header of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def expected_names(n_layer):
    names = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias"}
    for l in range(n_layer):
        for s in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                  "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                  "mlp.c_proj.weight", "mlp.c_proj.bias"):
            names.add(f"transformer.h.{l}.{s}")
    return names


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def numpy_loss(weights_path, config_path, rows):
    """GPT-2's mean next-token loss over rows [B, T+1] (targets of -1 ignored), in float64."""
    with open(config_path) as f:
        cfg = json.load(f)
    W = {k.removeprefix("transformer."): v.astype(np.float64) for k, v in load_file(weights_path).items()}
    L, NH, C, eps = cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["layer_norm_epsilon"]
    rows = np.asarray(rows)
    x_ids, y = rows[:, :-1], rows[:, 1:]
    B, T = x_ids.shape
    HS = C // NH
    h = W["wte.weight"][x_ids] + W["wpe.weight"][:T]
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    for l in range(L):
        p = f"h.{l}."
        a = _layer_norm(h, W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = a @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]  # Conv1D: [in, out]
        q, k, v = np.split(qkv, 3, axis=-1)
        q, k, v = (t.reshape(B, T, NH, HS).transpose(0, 2, 1, 3) for t in (q, k, v))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HS)
        s = np.where(mask, -np.inf, s)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        att = (s @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        h = h + att @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        m = _layer_norm(h, W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        m = _gelu_new(m @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
        h = h + m @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    h = _layer_norm(h, W["ln_f.weight"], W["ln_f.bias"], eps)
    logits = h @ W["wte.weight"].T
    mx = logits.max(-1, keepdims=True)
    lse = (mx + np.log(np.exp(logits - mx).sum(-1, keepdims=True)))[..., 0]
    valid = y >= 0
    picked = np.take_along_axis(logits, np.where(valid, y, 0)[..., None], axis=-1)[..., 0]
    return float(((lse - picked) * valid).sum() / valid.sum())


def hf_shapes(fields):
    """GPT-2's tensors (without the "transformer." prefix) and their Hugging Face shapes."""
    C, V, P = fields["n_embd"], fields["vocab_size"], fields["n_positions"]
    shapes = {"wte.weight": (V, C), "wpe.weight": (P, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for l in range(fields["n_layer"]):
        p = f"h.{l}."
        shapes.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,), p + "attn.c_attn.weight": (C, 3 * C),
                       p + "attn.c_attn.bias": (3 * C,), p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                       p + "ln_2.weight": (C,), p + "ln_2.bias": (C,), p + "mlp.c_fc.weight": (C, 4 * C),
                       p + "mlp.c_fc.bias": (4 * C,), p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,)})
    return shapes


def random_weights(rng, fields, dtype, prefix):
    """Weights far from GPT-2's initialisation (sharp attention, large activations), so that every part of
    the forward pass matters to the loss."""
    out = {}
    for name, shape in hf_shapes(fields).items():
        fan_in = shape[0] if len(shape) == 2 and "wte" not in name and "wpe" not in name else 1
        x = rng.normal(0.0, 1.0 / np.sqrt(fan_in) if fan_in > 1 else 0.1, size=shape)
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
            x += 1.0
        out[prefix + name] = x.astype(dtype)
    return out


def check_file(path, n_layer):
    """Returns a list of problems with the exported file's header."""
    hdr = read_header(path)
    problems = []
    meta = hdr.pop("__metadata__", None)
    if meta != {"format": "pt"}:
        problems.append(f"metadata is {meta}, expected {{'format': 'pt'}}")
    dtypes = {v["dtype"] for v in hdr.values()}
    if dtypes != {"F32"}:
        problems.append(f"dtypes {sorted(dtypes)}, expected only F32")
    names = set(hdr)
    want = expected_names(n_layer)
    if names != want:
        problems.append(f"unexpected tensors {sorted(names - want)}, missing {sorted(want - names)}")
    return problems


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    tool = sys.argv[1]
    rng = np.random.default_rng(1234)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="zt_gpt2_ref_") as tmp:
        for name, fields, B, T in CONFIGS:
            for seed, ignore_last in ((1, False), (2, True)):
                d = os.path.join(tmp, f"{name}-{seed}")
                os.makedirs(d)
                cfg_in, tok, out = (os.path.join(d, f) for f in ("in_config.json", "tokens.bin", "model.safetensors"))
                write_config(cfg_in, fields, eps=1e-5 if seed == 1 else 1e-6)
                rows = random_rows(rng, B, T, fields["vocab_size"])
                if ignore_last:
                    rows[0, -1] = -1
                write_tokens(tok, rows)
                ours = run_tool(tool, cfg_in, seed, tok, out)
                # The reference reads the config.json that ztrain wrote beside the weights.
                ref = numpy_loss(out, os.path.join(d, "config.json"), rows)
                rel = abs(ours - ref) / abs(ref)
                problems = check_file(out, fields["n_layer"])
                ok = rel < 1e-5 and not problems
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name} seed {seed}: ztrain {ours:.9g}, numpy {ref:.9g}, "
                      f"relative difference {rel:.2e}" + "".join(f"; {p}" for p in problems))
            # Weights written by the safetensors library itself (F32 with HF's prefix, F16 without it),
            # imported by ztrain and exported again: the export must hold exactly the same values.
            for dtype, prefix in ((np.float32, "transformer."), (np.float16, "")):
                d = os.path.join(tmp, f"{name}-import-{np.dtype(dtype).name}")
                os.makedirs(d)
                cfg_in, tok, init, out = (os.path.join(d, f) for f in
                                          ("in_config.json", "tokens.bin", "init.safetensors", "model.safetensors"))
                write_config(cfg_in, fields)
                weights = random_weights(rng, fields, dtype, prefix)
                save_file(weights, init, metadata={"format": "pt"})
                rows = random_rows(rng, B, T, fields["vocab_size"])
                write_tokens(tok, rows)
                ours = run_tool(tool, cfg_in, 0, tok, out, init=init)
                ref = numpy_loss(out, os.path.join(d, "config.json"), rows)
                rel = abs(ours - ref) / abs(ref)
                problems = check_file(out, fields["n_layer"])
                exported = load_file(out)
                for k, v in weights.items():
                    if not np.array_equal(exported["transformer." + k.removeprefix("transformer.")],
                                          v.astype(np.float32)):
                        problems.append(f"{k} changed through import and export")
                ok = rel < 1e-5 and not problems
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name} imported {np.dtype(dtype).name}: ztrain {ours:.9g}, "
                      f"numpy {ref:.9g}, relative difference {rel:.2e}" + "".join(f"; {p}" for p in problems))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

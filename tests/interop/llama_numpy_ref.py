#!/usr/bin/env python3
"""Checks ztrain's LLaMA against an independent numpy implementation of LlamaForCausalLM's forward pass.

Usage: llama_numpy_ref.py LLAMA_TOOL

For three odd model shapes (6 query heads sharing 2 key/value heads with llama3 rope scaling and an untied
head; a tied head with linear rope scaling; a Mistral config with 8 heads on 2 key/value heads and a byte
vocabulary) it writes a Hugging Face config.json and a tokens file and runs LLAMA_TOOL
(tests/worker/llama_tool.c), which makes a model from a seed (or imports weights), exports model.safetensors
and config.json and writes its logits. The reference loads both files with safetensors.numpy and json,
recomputes the logits and the loss in float64 (RMSNorm, rotate-half RoPE with transformers' inverse
frequencies, causal attention with repeated key/value heads, SwiGLU) and requires agreement within 1e-4
relative. It also checks the exported file's header: F32 only, {"format": "pt"} metadata and exactly
Hugging Face's tensor names. Further rounds import weights far from the initialisation written by the
safetensors library (F32 with the "model." prefix, F16 without it, F32 in three shards with an index) and
check that ztrain exports them unchanged, and that a sharded export holds the same tensors. Exits 0 when all
checks pass, 1 on a mismatch, 77 (skipped) without numpy or safetensors.

The helpers (write_config, run_tool, numpy_logits, ...) are also used by llama_hf.py.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"skipped: {e} (install numpy and safetensors)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_numpy_ref import random_rows, read_header, write_tokens  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}

# The shapes the checks run on: (name, HF config fields, batch size, sequence length).
CONFIGS = [
    ("gqa3-llama3-untied", dict(model_type="llama", num_hidden_layers=2, hidden_size=24, num_attention_heads=6,
                                num_key_value_heads=2, intermediate_size=20, vocab_size=37,
                                max_position_embeddings=32, rms_norm_eps=1e-5, rope_theta=10000.0,
                                rope_scaling=LLAMA3, tie_word_embeddings=False), 2, 12),
    ("tied-linear", dict(model_type="llama", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=48, vocab_size=50, max_position_embeddings=32,
                         rms_norm_eps=1e-6, rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 2.0},
                         tie_word_embeddings=True), 3, 9),
    ("mistral-bytes", dict(model_type="mistral", num_hidden_layers=3, hidden_size=64, num_attention_heads=8,
                           num_key_value_heads=2, intermediate_size=96, vocab_size=256,
                           max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None,
                           tie_word_embeddings=False), 2, 64),
]


def write_config(path, fields):
    """Writes a Hugging Face config.json with the given fields."""
    cfg = {
        "architectures": ["MistralForCausalLM" if fields.get("model_type") == "mistral" else "LlamaForCausalLM"],
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
        "use_cache": True,
    }
    cfg.update(fields)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def run_tool(tool, config, seed, tokens, out_dir, init=None, shard_bytes=None, device=None):
    """Runs llama_tool (on device "cuda" when given) and returns the loss it printed."""
    cmd = [tool] + (["--shard-bytes", str(shard_bytes)] if shard_bytes else [])
    cmd += ["--device", device] if device else []
    cmd += [config, str(seed), tokens, out_dir] + ([init] if init else [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return float(res.stdout.strip())


def hf_shapes(cfg):
    """LlamaForCausalLM's tensors (Hugging Face names) and their shapes."""
    C, V, F, L = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    HS = C // cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    for l in range(L):
        p = f"model.layers.{l}."
        shapes.update({p + "input_layernorm.weight": (C,), p + "self_attn.q_proj.weight": (C, C),
                       p + "self_attn.k_proj.weight": (KV * HS, C), p + "self_attn.v_proj.weight": (KV * HS, C),
                       p + "self_attn.o_proj.weight": (C, C), p + "post_attention_layernorm.weight": (C,),
                       p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                       p + "mlp.down_proj.weight": (C, F)})
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (V, C)
    return shapes


def random_weights(rng, cfg, dtype, prefix=True):
    """Weights far from the initialisation (sharp attention, norms away from 1), so that every part of the
    forward pass matters to the logits."""
    out = {}
    for name, shape in hf_shapes(cfg).items():
        if len(shape) == 1:
            x = 1.0 + 0.3 * rng.normal(size=shape)
        else:
            x = rng.normal(0.0, 1.0 / math.sqrt(shape[1]) if "embed" not in name else 0.5, size=shape)
        out[name if prefix else name.removeprefix("model.")] = x.astype(dtype)
    return out


def inv_freq(cfg):
    """RoPE inverse frequencies as transformers' ROPE_INIT_FUNCTIONS compute them ("default", "linear",
    "llama3"), from rope_theta / rope_scaling or rope_parameters."""
    C, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    HS = C // NH
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", scaling.get("rope_theta", 10000.0))
    base = 1.0 / (theta ** (np.arange(0, HS, 2, dtype=np.float64) / HS))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return base
    if kind == "linear":
        return base / scaling["factor"]
    assert kind == "llama3", kind
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / base
    out = np.where(wavelen > old / lo, base / factor, base)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    return np.where(medium, smoothed, out)


def _rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def numpy_logits(weights, cfg, ids):
    """LlamaForCausalLM's logits [B, T, V] for input ids [B, T], in float64. weights: HF names to arrays."""
    W = {k.removeprefix("model."): v.astype(np.float64) for k, v in weights.items()}
    L, C, NH = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads") or NH
    eps, HS = cfg["rms_norm_eps"], C // NH
    ids = np.asarray(ids)
    B, T = ids.shape
    freqs = np.arange(T, dtype=np.float64)[:, None] * inv_freq(cfg)[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)  # [T, HS]
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    h = W["embed_tokens.weight"][ids]
    for l in range(L):
        p = f"layers.{l}."
        a = _rms_norm(h, W[p + "input_layernorm.weight"], eps)
        q = (a @ W[p + "self_attn.q_proj.weight"].T).reshape(B, T, NH, HS).transpose(0, 2, 1, 3)
        k = (a @ W[p + "self_attn.k_proj.weight"].T).reshape(B, T, NKV, HS).transpose(0, 2, 1, 3)
        v = (a @ W[p + "self_attn.v_proj.weight"].T).reshape(B, T, NKV, HS).transpose(0, 2, 1, 3)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k, v = np.repeat(k, NH // NKV, axis=1), np.repeat(v, NH // NKV, axis=1)  # head h reads kv h // group
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(HS)
        s = np.where(mask, -np.inf, s)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        att = (s @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        h = h + att @ W[p + "self_attn.o_proj.weight"].T
        m = _rms_norm(h, W[p + "post_attention_layernorm.weight"], eps)
        g = m @ W[p + "mlp.gate_proj.weight"].T
        u = m @ W[p + "mlp.up_proj.weight"].T
        h = h + (g / (1.0 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    h = _rms_norm(h, W["norm.weight"], eps)
    head = W["embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    return h @ head.T


def mean_loss(logits, targets):
    """Mean cross-entropy over targets >= 0."""
    mx = logits.max(-1, keepdims=True)
    lse = (mx + np.log(np.exp(logits - mx).sum(-1, keepdims=True)))[..., 0]
    valid = targets >= 0
    picked = np.take_along_axis(logits, np.where(valid, targets, 0)[..., None], axis=-1)[..., 0]
    return float(((lse - picked) * valid).sum() / valid.sum())


def compare(out_dir, rows, ours):
    """Compares ztrain's logits and loss (in out_dir, from llama_tool) with the reference's computed from the
    weights and config.json that ztrain wrote there. Returns (relative difference of the logits, of the loss)."""
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = load_file(os.path.join(out_dir, "model.safetensors"))
    rows = np.asarray(rows)
    ref = numpy_logits(weights, cfg, rows[:, :-1])
    got = load_file(os.path.join(out_dir, "outputs.safetensors"))["logits"].astype(np.float64)
    rel_logits = float(np.abs(got - ref).max() / np.abs(ref).max())
    loss = mean_loss(ref, rows[:, 1:])
    return rel_logits, abs(ours - loss) / abs(loss), loss


def check_file(path, cfg):
    """Returns a list of problems with an exported file's header."""
    hdr = read_header(path)
    problems = []
    meta = hdr.pop("__metadata__", None)
    if meta != {"format": "pt"}:
        problems.append(f"metadata is {meta}, expected {{'format': 'pt'}}")
    dtypes = {v["dtype"] for v in hdr.values()}
    if dtypes != {"F32"}:
        problems.append(f"dtypes {sorted(dtypes)}, expected only F32")
    want = hf_shapes(cfg)
    if set(hdr) != set(want):
        problems.append(f"unexpected tensors {sorted(set(hdr) - set(want))}, missing {sorted(set(want) - set(hdr))}")
    for k, v in hdr.items():
        if k in want and tuple(v["shape"]) != want[k]:
            problems.append(f"{k} has shape {v['shape']}, expected {list(want[k])}")
    return problems


def save_sharded(weights, folder, nshards):
    """Writes weights as Hugging Face's sharded form: model-0000k-of-0000n.safetensors and the index."""
    names = list(weights)
    weight_map = {}
    for k in range(nshards):
        part = names[k::nshards]
        fname = f"model-{k + 1:05d}-of-{nshards:05d}.safetensors"
        save_file({n: weights[n] for n in part}, os.path.join(folder, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    total = sum(v.nbytes for v in weights.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)


def load_sharded(folder):
    """The tensors of a sharded checkpoint, through its index."""
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        index = json.load(f)
    out = {}
    for fname in sorted(set(index["weight_map"].values())):
        out.update(load_file(os.path.join(folder, fname)))
    if set(out) != set(index["weight_map"]):
        raise RuntimeError(f"{folder}: the index and the shards name different tensors")
    return out


def report(label, rel_logits, rel_loss, ours, ref, problems):
    ok = rel_logits < 1e-4 and rel_loss < 1e-4 and not problems
    print(f"{'ok  ' if ok else 'FAIL'} {label}: loss ztrain {ours:.9g}, numpy {ref:.9g} (relative difference "
          f"{rel_loss:.2e}); logits relative difference {rel_logits:.2e}" + "".join(f"; {p}" for p in problems))
    return ok


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    tool = sys.argv[1]
    rng = np.random.default_rng(4321)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="zt_llama_ref_") as tmp:
        for name, fields, B, T in CONFIGS:
            base = os.path.join(tmp, name)
            os.makedirs(base)
            cfg_in, tok = os.path.join(base, "in_config.json"), os.path.join(base, "tokens.bin")
            write_config(cfg_in, fields)
            # Weights from ztrain's own initialisation (the last target of a row ignored the second time).
            for seed in (1, 2):
                rows = random_rows(rng, B, T, fields["vocab_size"])
                if seed == 2:
                    rows[0, -1] = -1
                write_tokens(tok, rows)
                out = os.path.join(base, f"seed{seed}")
                ours = run_tool(tool, cfg_in, seed, tok, out)
                rel_logits, rel_loss, ref = compare(out, rows, ours)
                problems = check_file(os.path.join(out, "model.safetensors"), fields)
                failures += not report(f"{name} seed {seed}", rel_logits, rel_loss, ours, ref, problems)
            # Weights written by the safetensors library: F32 with the prefix, F16 without, F32 in three shards;
            # imported by ztrain and exported again, they must come out unchanged.
            rows = random_rows(rng, B, T, fields["vocab_size"])
            write_tokens(tok, rows)
            for form in ("f32", "f16-no-prefix", "sharded"):
                weights = random_weights(rng, fields, np.float16 if form.startswith("f16") else np.float32,
                                         prefix=form != "f16-no-prefix")
                init = os.path.join(base, f"init-{form}")
                os.makedirs(init)
                if form == "sharded":
                    save_sharded(weights, init, 3)
                    init_path = os.path.join(init, "model.safetensors.index.json")
                else:
                    init_path = os.path.join(init, "model.safetensors")
                    save_file(weights, init_path, metadata={"format": "pt"})
                out = os.path.join(base, f"imported-{form}")
                ours = run_tool(tool, cfg_in, 0, tok, out, init=init_path)
                rel_logits, rel_loss, ref = compare(out, rows, ours)
                problems = check_file(os.path.join(out, "model.safetensors"), fields)
                exported = load_file(os.path.join(out, "model.safetensors"))
                for k, v in weights.items():
                    if not np.array_equal(exported["model." + k.removeprefix("model.") if k != "lm_head.weight"
                                                   else k], v.astype(np.float32)):
                        problems.append(f"{k} changed through import and export")
                failures += not report(f"{name} imported {form}", rel_logits, rel_loss, ours, ref, problems)
                if form == "sharded":
                    # ztrain's own sharded export (shards of at most 2 KiB) holds the same tensors.
                    out2 = os.path.join(base, "export-sharded")
                    ours2 = run_tool(tool, cfg_in, 0, tok, out2, init=init, shard_bytes=2048)
                    shards = load_sharded(out2)
                    problems = [f"{k} differs in the sharded export" for k in exported
                                if not np.array_equal(shards.get(k), exported[k])]
                    if set(shards) != set(exported):
                        problems.append("the sharded export names other tensors")
                    nfiles = len([f for f in os.listdir(out2) if f.endswith(".safetensors") and f.startswith("model-")])
                    ok = not problems and ours2 == ours and nfiles > 1
                    failures += not ok
                    print(f"{'ok  ' if ok else 'FAIL'} {name} sharded export: {nfiles} shards, the same tensors"
                          + "".join(f"; {p}" for p in problems))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

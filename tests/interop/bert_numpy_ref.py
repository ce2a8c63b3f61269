#!/usr/bin/env python3
"""Checks ztrain's BERT and RoBERTa against an independent numpy implementation of their forward passes.

Usage: bert_numpy_ref.py BERT_TOOL

For four models of odd sizes (BERT and RoBERTa, each with the masked-LM and the sequence-classification
head; head counts that are not powers of two, vocabularies that are not multiples of 64, both GELU forms)
it writes a Hugging Face config.json and a padded batch with token types, runs BERT_TOOL
(tests/worker/bert_tool.c), which creates a model from a seed (or imports weights), exports
model.safetensors and config.json, and writes its logits and loss, then recomputes both in float64 with
numpy from the exported files (Hugging Face semantics: padding mask on the keys, RoBERTa's position ids
from create_position_ids_from_input_ids, post-LN encoder layers, the tied decoder or the pooler and
classifier) and requires agreement within 1e-4 relative: logits of every position that is not padding
(relative to the largest logit) and the loss. It also checks the exported header (F32 only,
{"format": "pt"}, exactly Hugging Face's names), and imports weights far from the initialisation written
by the safetensors library in the forms Hugging Face files take (with and without the "bert." prefix,
F16, LayerNorm gamma/beta, the position_ids buffer, the tied decoder, and a sharded index): the export
must give them back unchanged. Exits 0 when all checks pass, 1 on a mismatch, 77 (skipped) without numpy
or safetensors.

The functions and tables (CONFIGS, write_config, make_batch, write_batch, run_tool, read_logits, numpy_forward,
hf_shapes, random_weights) are also used by bert_hf.py.
"""
import json
import math
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

# (name, config.json fields, batch size, sequence length)
CONFIGS = [
    ("bert-mlm", dict(model_type="bert", architectures=["BertForMaskedLM"], vocab_size=103, hidden_size=36,
                      num_hidden_layers=2, num_attention_heads=3, intermediate_size=50, max_position_embeddings=20,
                      type_vocab_size=2, pad_token_id=0, hidden_act="gelu_new", layer_norm_eps=1e-12), 3, 9),
    ("bert-cls", dict(model_type="bert", architectures=["BertForSequenceClassification"], vocab_size=71,
                      hidden_size=30, num_hidden_layers=3, num_attention_heads=5, intermediate_size=37,
                      max_position_embeddings=12, type_vocab_size=3, pad_token_id=0, hidden_act="gelu",
                      layer_norm_eps=1e-12, id2label={"0": "neg", "1": "neutral", "2": "pos"},
                      label2id={"neg": 0, "neutral": 1, "pos": 2}), 4, 10),
    ("roberta-mlm", dict(model_type="roberta", architectures=["RobertaForMaskedLM"], vocab_size=97, hidden_size=30,
                         num_hidden_layers=2, num_attention_heads=5, intermediate_size=47,
                         max_position_embeddings=16, type_vocab_size=1, pad_token_id=1, hidden_act="gelu",
                         layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2), 2, 11),
    ("roberta-cls", dict(model_type="roberta", architectures=["RobertaForSequenceClassification"], vocab_size=89,
                         hidden_size=42, num_hidden_layers=2, num_attention_heads=7, intermediate_size=29,
                         max_position_embeddings=15, type_vocab_size=1, pad_token_id=1, hidden_act="gelu",
                         layer_norm_eps=1e-5, num_labels=5), 3, 13),
]


def write_config(path, fields):
    cfg = {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02,
           "position_embedding_type": "absolute", "classifier_dropout": None, "use_cache": True}
    cfg.update(fields)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def is_mlm(fields):
    return fields["architectures"][0].endswith("ForMaskedLM")


def num_labels(fields):
    return len(fields["id2label"]) if "id2label" in fields else fields.get("num_labels", 2)


def make_batch(rng, fields, B, T):
    """A right-padded batch: tokens, token types and targets [B,T] (int32)."""
    V, pad = fields["vocab_size"], fields["pad_token_id"]
    tokens = rng.integers(0, V - 1, size=(B, T))
    tokens = np.where(tokens >= pad, tokens + 1, tokens)  # no pad inside a sequence
    lens = [T] + [int(rng.integers(T // 2, T)) for _ in range(B - 1)]
    types = rng.integers(0, fields["type_vocab_size"], size=(B, T))
    for b, n in enumerate(lens):
        tokens[b, n:] = pad
        types[b, n:] = 0
    if is_mlm(fields):
        targets = np.where(rng.random((B, T)) < 0.4, rng.integers(0, V, size=(B, T)), -1)
        targets[0, 0] = 5
        targets[tokens == pad] = -1
    else:
        targets = np.full((B, T), -1)
        targets[:, 0] = rng.integers(0, num_labels(fields), size=B)
    return tokens.astype(np.int32), types.astype(np.int32), targets.astype(np.int32)


def write_batch(path, tokens, types, targets):
    B, T = tokens.shape
    with open(path, "wb") as f:
        f.write(struct.pack("<ii", B, T))
        for a in (tokens, types, targets):
            f.write(np.asarray(a, dtype="<i4").tobytes())


def run_tool(tool, config, seed, batch, out_dir, init=None, device=None):
    """Runs bert_tool (on device "cuda" when given); returns (loss, correct, counted)."""
    cmd = [tool] + (["--device", device] if device else [])
    cmd += [config, str(seed), batch, out_dir] + ([init] if init else [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    loss, correct, counted = res.stdout.split()
    return float(loss), int(correct), int(counted)


def read_logits(out_dir, fields, B, T):
    x = np.fromfile(os.path.join(out_dir, "logits.bin"), dtype="<f4")
    return x.reshape(B, T, -1) if is_mlm(fields) else x.reshape(B, -1)


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


_erf = np.vectorize(math.erf)


def _gelu(x, act):
    if act == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def numpy_forward(weights, cfg, tokens, types, targets):
    """Logits and mean loss in float64 with Hugging Face's semantics. weights: name -> array (HF names)."""
    W = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    roberta = cfg["model_type"] == "roberta"
    pf = "roberta." if roberta else "bert."
    C, NH, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    eps, act, pad = cfg["layer_norm_eps"], cfg["hidden_act"], cfg["pad_token_id"]
    B, T = tokens.shape
    HS = C // NH
    mask = tokens != pad
    pos = (np.cumsum(mask, axis=1) * mask + pad) if roberta else np.broadcast_to(np.arange(T), (B, T))
    e = pf + "embeddings."
    h = W[e + "word_embeddings.weight"][tokens] + W[e + "token_type_embeddings.weight"][types]
    h = h + W[e + "position_embeddings.weight"][pos]
    h = _layer_norm(h, W[e + "LayerNorm.weight"], W[e + "LayerNorm.bias"], eps)
    key_bias = np.where(mask, 0.0, -np.inf)[:, None, None, :]
    for l in range(L):
        p = f"{pf}encoder.layer.{l}."

        def lin(x, name):
            return x @ W[p + name + ".weight"].T + W[p + name + ".bias"]

        q, k, v = (lin(h, "attention.self." + n).reshape(B, T, NH, HS).transpose(0, 2, 1, 3)
                   for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(HS) + key_bias
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        att = (s @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        h = _layer_norm(h + lin(att, "attention.output.dense"), W[p + "attention.output.LayerNorm.weight"],
                        W[p + "attention.output.LayerNorm.bias"], eps)
        m = _gelu(lin(h, "intermediate.dense"), act)
        h = _layer_norm(h + lin(m, "output.dense"), W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"],
                        eps)
    if is_mlm(cfg):
        if roberta:
            t = _gelu(h @ W["lm_head.dense.weight"].T + W["lm_head.dense.bias"], "gelu")
            t = _layer_norm(t, W["lm_head.layer_norm.weight"], W["lm_head.layer_norm.bias"], eps)
            logits = t @ W[e + "word_embeddings.weight"].T + W["lm_head.bias"]
        else:
            c = "cls.predictions."
            t = _gelu(h @ W[c + "transform.dense.weight"].T + W[c + "transform.dense.bias"], act)
            t = _layer_norm(t, W[c + "transform.LayerNorm.weight"], W[c + "transform.LayerNorm.bias"], eps)
            logits = t @ W[e + "word_embeddings.weight"].T + W[c + "bias"]
        y = np.where(mask, targets, -1).reshape(-1)
        flat = logits.reshape(B * T, -1)
    else:
        x = h[:, 0]
        if roberta:
            x = np.tanh(x @ W["classifier.dense.weight"].T + W["classifier.dense.bias"])
            logits = x @ W["classifier.out_proj.weight"].T + W["classifier.out_proj.bias"]
        else:
            x = np.tanh(x @ W["bert.pooler.dense.weight"].T + W["bert.pooler.dense.bias"])
            logits = x @ W["classifier.weight"].T + W["classifier.bias"]
        y = np.where(mask[:, 0], targets[:, 0], -1)
        flat = logits
    mx = flat.max(-1, keepdims=True)
    lse = (mx + np.log(np.exp(flat - mx).sum(-1, keepdims=True)))[:, 0]
    valid = y >= 0
    picked = flat[np.arange(len(y)), np.where(valid, y, 0)]
    loss = float(((lse - picked) * valid).sum() / valid.sum())
    return logits, loss


def hf_shapes(fields):
    """Every parameter's Hugging Face name and shape."""
    roberta = fields["model_type"] == "roberta"
    pf = "roberta." if roberta else "bert."
    C, V, I = fields["hidden_size"], fields["vocab_size"], fields["intermediate_size"]
    e = pf + "embeddings."
    s = {e + "word_embeddings.weight": (V, C), e + "position_embeddings.weight": (fields["max_position_embeddings"], C),
         e + "token_type_embeddings.weight": (fields["type_vocab_size"], C), e + "LayerNorm.weight": (C,),
         e + "LayerNorm.bias": (C,)}
    for l in range(fields["num_hidden_layers"]):
        p = f"{pf}encoder.layer.{l}."
        for n in ("query", "key", "value"):
            s[p + f"attention.self.{n}.weight"] = (C, C)
            s[p + f"attention.self.{n}.bias"] = (C,)
        s.update({p + "attention.output.dense.weight": (C, C), p + "attention.output.dense.bias": (C,),
                  p + "attention.output.LayerNorm.weight": (C,), p + "attention.output.LayerNorm.bias": (C,),
                  p + "intermediate.dense.weight": (I, C), p + "intermediate.dense.bias": (I,),
                  p + "output.dense.weight": (C, I), p + "output.dense.bias": (C,),
                  p + "output.LayerNorm.weight": (C,), p + "output.LayerNorm.bias": (C,)})
    NL = num_labels(fields)
    if is_mlm(fields) and roberta:
        s.update({"lm_head.dense.weight": (C, C), "lm_head.dense.bias": (C,), "lm_head.layer_norm.weight": (C,),
                  "lm_head.layer_norm.bias": (C,), "lm_head.bias": (V,)})
    elif is_mlm(fields):
        c = "cls.predictions."
        s.update({c + "transform.dense.weight": (C, C), c + "transform.dense.bias": (C,),
                  c + "transform.LayerNorm.weight": (C,), c + "transform.LayerNorm.bias": (C,), c + "bias": (V,)})
    elif roberta:
        s.update({"classifier.dense.weight": (C, C), "classifier.dense.bias": (C,),
                  "classifier.out_proj.weight": (NL, C), "classifier.out_proj.bias": (NL,)})
    else:
        s.update({"bert.pooler.dense.weight": (C, C), "bert.pooler.dense.bias": (C,), "classifier.weight": (NL, C),
                  "classifier.bias": (NL,)})
    return s


def random_weights(rng, fields, dtype=np.float32):
    """Weights far from the initialisation (large activations, sharp attention), by Hugging Face name."""
    out = {}
    for name, shape in hf_shapes(fields).items():
        if len(shape) == 2 and "embeddings" not in name:
            x = rng.normal(0.0, 1.0 / math.sqrt(shape[1]), size=shape)
        else:
            x = rng.normal(0.0, 0.3 if len(shape) == 2 else 0.1, size=shape)
        if name.endswith("LayerNorm.weight") or name.endswith("layer_norm.weight"):
            x += 1.0
        out[name] = x.astype(dtype)
    return out


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def check_file(path, fields):
    hdr = read_header(path)
    problems = []
    meta = hdr.pop("__metadata__", None)
    if meta != {"format": "pt"}:
        problems.append(f"metadata is {meta}, expected {{'format': 'pt'}}")
    if {v["dtype"] for v in hdr.values()} != {"F32"}:
        problems.append("dtypes other than F32")
    want = hf_shapes(fields)
    if set(hdr) != set(want):
        problems.append(f"unexpected tensors {sorted(set(hdr) - set(want))}, missing {sorted(set(want) - set(hdr))}")
    for k, v in hdr.items():
        if k in want and tuple(v["shape"]) != tuple(want[k]):
            problems.append(f"{k} has shape {v['shape']}, expected {list(want[k])}")
    return problems


def compare(fields, ours_logits, ours_loss, ref_logits, ref_loss, tokens):
    """Relative differences of the logits (non-padding rows, against the largest logit) and of the loss."""
    mask = tokens != fields["pad_token_id"]
    a = ours_logits[mask] if is_mlm(fields) else ours_logits
    b = ref_logits[mask] if is_mlm(fields) else ref_logits
    rel_logits = float(np.abs(a - b).max() / np.abs(b).max())
    rel_loss = abs(ours_loss - ref_loss) / abs(ref_loss)
    return rel_logits, rel_loss


def hf_file_forms(weights, fields, rng):
    """The weights as Hugging Face files hold them, in several forms: (label, {file: tensors}, index)."""
    pf = "roberta." if fields["model_type"] == "roberta" else "bert."
    forms = []
    # F16 without the model prefix (a base-model file's names for the body), LayerNorm as gamma/beta, with
    # the position_ids buffer, and for masked LM the tied decoder written out.
    f16 = {}
    for k, v in weights.items():
        name = k[len(pf):] if k.startswith(pf) and "pooler" not in k else k
        if name.endswith("LayerNorm.weight"):
            name = name[:-len("weight")] + "gamma"
        elif name.endswith("LayerNorm.bias"):
            name = name[:-len("bias")] + "beta"
        f16[name] = v.astype(np.float16)
    f16["embeddings.position_ids"] = np.arange(fields["max_position_embeddings"], dtype=np.int64)[None]
    if is_mlm(fields):
        dec = "lm_head.decoder." if fields["model_type"] == "roberta" else "cls.predictions.decoder."
        bias = "lm_head.bias" if fields["model_type"] == "roberta" else "cls.predictions.bias"
        f16[dec + "weight"] = f16["embeddings.word_embeddings.weight"]
        f16[dec + "bias"] = f16[bias]
    forms.append(("f16-hf-names", {"model.safetensors": f16}, False))
    # F32 in two shards with an index.
    names = sorted(weights)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": {k: weights[k] for k in names[:half]},
              "model-00002-of-00002.safetensors": {k: weights[k] for k in names[half:]}}
    forms.append(("f32-sharded", shards, True))
    return forms


def main():
    if len(sys.argv) != 2:
        print("usage: bert_numpy_ref.py BERT_TOOL", file=sys.stderr)
        return 2
    tool = sys.argv[1]
    rng = np.random.default_rng(2024)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="zt_bert_ref_") as tmp:
        for name, fields, B, T in CONFIGS:
            tokens, types, targets = make_batch(rng, fields, B, T)
            runs = [("seeded", None, None)]
            weights = random_weights(rng, fields)
            runs.append(("random-f32", {"model.safetensors": weights}, False))
            runs += hf_file_forms(weights, fields, rng)
            for label, files, indexed in runs:
                d = os.path.join(tmp, f"{name}-{label}")
                init_dir = os.path.join(d, "init")
                os.makedirs(init_dir)
                cfg_in, batch = os.path.join(d, "in_config.json"), os.path.join(d, "batch.bin")
                write_config(cfg_in, fields)
                write_batch(batch, tokens, types, targets)
                init = None
                if files:
                    for fname, tensors in files.items():
                        save_file(tensors, os.path.join(init_dir, fname), metadata={"format": "pt"})
                    if indexed:
                        wm = {k: f for f, ts in files.items() for k in ts}
                        with open(os.path.join(init_dir, "model.safetensors.index.json"), "w") as f:
                            json.dump({"metadata": {}, "weight_map": wm}, f)
                    init = init_dir
                loss, correct, counted = run_tool(tool, cfg_in, 7, batch, d, init)
                exported = load_file(os.path.join(d, "model.safetensors"))
                with open(os.path.join(d, "config.json")) as f:
                    saved_cfg = json.load(f)
                ref_logits, ref_loss = numpy_forward(exported, saved_cfg, tokens, types, targets)
                rel_logits, rel_loss = compare(fields, read_logits(d, fields, B, T), loss, ref_logits, ref_loss,
                                               tokens)
                problems = check_file(os.path.join(d, "model.safetensors"), fields)
                if files:
                    for k, v in weights.items():
                        want = v.astype(np.float16).astype(np.float32) if "f16" in label else v
                        if not np.array_equal(exported[k], want):
                            problems.append(f"{k} changed through import and export")
                ok = rel_logits < 1e-4 and rel_loss < 1e-4 and not problems
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name} {label}: loss ztrain {loss:.9g} numpy {ref_loss:.9g} "
                      f"(relative {rel_loss:.1e}), logits relative {rel_logits:.1e}, accuracy {correct}/{counted}"
                      + "".join(f"; {p}" for p in problems))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

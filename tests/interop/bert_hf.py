#!/usr/bin/env python3
"""Checks ztrain's BERT and RoBERTa against Hugging Face transformers, both ways.

Usage: bert_hf.py BERT_TOOL

For a BertForSequenceClassification and a RobertaForMaskedLM of odd sizes (head counts that are not powers
of two, vocabularies that are not multiples of 64), and a BertForMaskedLM (tanh GELU) and a
RobertaForSequenceClassification, made by transformers with random weights far from their
initialisation and saved with save_pretrained (config.json + model.safetensors), it runs BERT_TOOL
(tests/worker/bert_tool.c), which reads that config.json, imports the folder, runs a padded batch with token
types and targets, writes its logits, loss and gradients, and exports model.safetensors + config.json again.
It then requires, in float32 on the CPU:
  - the logits of every position that is not padding and the loss equal transformers' (attention_mask from
    the padding, token_type_ids, labels) within 1e-4 relative;
  - the gradient of every parameter after one backward pass equal torch's within 1e-4 of the tensor's
    largest value (or of 1e-3 of the model's largest gradient, for the key biases, whose gradient is zero
    but for rounding); the tied decoder's gradient is part of the word embeddings', as in torch;
  - ztrain's export loads back with from_pretrained with no missing, unexpected or mismatched tensors (the
    tied decoder aside), the same architecture, and gives transformers' logits again.

Where a GPU is visible and bert_tool was built with CUDA, the same checks run again with ztrain's forward and
backward on the GPU (bert_tool --device cuda: the training engine's CUDA executor in fp32) for a
BertForSequenceClassification and a RobertaForMaskedLM with heads of 32 channels, which the CUDA attention
serves.

Exits 0 when every check passes, 1 on a mismatch, 77 (skipped) without torch or transformers.
"""
import json
import os
import sys
import tempfile

try:
    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import load_file
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"skipped: {e} (this check needs numpy, safetensors, torch and transformers)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bert_numpy_ref import make_batch, read_logits, run_tool, write_batch  # noqa: E402

MODELS = [
    ("BertForSequenceClassification",
     dict(vocab_size=103, hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=50,
          max_position_embeddings=24, type_vocab_size=3, pad_token_id=0, hidden_act="gelu", layer_norm_eps=1e-12,
          num_labels=3), 4, 11),
    ("RobertaForMaskedLM",
     dict(vocab_size=97, hidden_size=30, num_hidden_layers=3, num_attention_heads=5, intermediate_size=47,
          max_position_embeddings=20, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
          hidden_act="gelu", layer_norm_eps=1e-5), 3, 13),
    # the other two heads, and the tanh GELU
    ("BertForMaskedLM",
     dict(vocab_size=71, hidden_size=42, num_hidden_layers=2, num_attention_heads=7, intermediate_size=29,
          max_position_embeddings=16, type_vocab_size=2, pad_token_id=0, hidden_act="gelu_new",
          layer_norm_eps=1e-12), 2, 9),
    ("RobertaForSequenceClassification",
     dict(vocab_size=89, hidden_size=30, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
          max_position_embeddings=18, type_vocab_size=1, pad_token_id=1, hidden_act="gelu", layer_norm_eps=1e-5,
          num_labels=5), 3, 10),
]


def make_model(arch, fields):
    cls = getattr(transformers, arch)
    config_cls = transformers.RobertaConfig if arch.startswith("Roberta") else transformers.BertConfig
    config = config_cls(**fields)
    torch.manual_seed(0)
    model = cls(config)
    with torch.no_grad():  # far from the initialisation, so that every part of the model matters
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embeddings" not in name:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
            elif p.dim() == 2:
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, 0.1)
                if name.endswith("LayerNorm.weight") or name.endswith("layer_norm.weight"):
                    p.add_(1.0)
    model.eval()
    return model


def hf_run(model, tokens, types, targets, mlm):
    """Logits, loss and the gradient of every parameter (by name) of one forward and backward pass."""
    ids = torch.as_tensor(tokens, dtype=torch.long)
    mask = (ids != model.config.pad_token_id).long()
    tt = torch.as_tensor(types, dtype=torch.long)
    y = torch.as_tensor(targets, dtype=torch.long)
    if mlm:
        labels = torch.where((y >= 0) & (mask == 1), y, torch.full_like(y, -100))
    else:
        labels = y[:, 0]
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, token_type_ids=tt, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach().numpy(), float(out.loss.item()), grads


def report(ok, label, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {label}: {detail}")
    return ok


# On the GPU: heads of 32 channels (3 and 5 heads), MLP widths that are multiples of 8.
GPU_MODELS = [
    ("BertForSequenceClassification",
     dict(vocab_size=103, hidden_size=96, num_hidden_layers=2, num_attention_heads=3, intermediate_size=56,
          max_position_embeddings=24, type_vocab_size=3, pad_token_id=0, hidden_act="gelu", layer_norm_eps=1e-12,
          num_labels=3), 4, 11),
    ("RobertaForMaskedLM",
     dict(vocab_size=97, hidden_size=160, num_hidden_layers=2, num_attention_heads=5, intermediate_size=48,
          max_position_embeddings=20, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
          hidden_act="gelu", layer_norm_eps=1e-5), 3, 13),
]


def gpu_tool(tool):
    """Whether bert_tool takes --device cuda (a CUDA build)."""
    import subprocess
    res = subprocess.run([tool, "--device", "cuda"], capture_output=True, text=True)
    return "needs a build with CUDA" not in res.stderr


def check_model(tool, arch, fields, B, T, tmp, device=None):
    mlm = arch.endswith("ForMaskedLM")
    model = make_model(arch, fields)
    where = os.path.join(tmp, arch + (f"-{device}" if device else ""))
    src = os.path.join(where, "hf")
    out = os.path.join(where, "ztrain")
    os.makedirs(out)
    model.save_pretrained(src, safe_serialization=True)
    with open(os.path.join(src, "config.json")) as f:
        saved = json.load(f)
    batch_fields = dict(fields, model_type=saved["model_type"], architectures=[arch])
    tokens, types, targets = make_batch(np.random.default_rng(7), batch_fields, B, T)
    batch = os.path.join(where, "batch.bin")
    write_batch(batch, tokens, types, targets)
    failures = 0

    loss, correct, counted = run_tool(tool, os.path.join(src, "config.json"), 0, batch, out, init=src,
                                      device=device)
    arch_label = arch + (f" (ztrain on {device})" if device else "")
    logits = read_logits(out, batch_fields, B, T)
    hf_logits, hf_loss, hf_grads = hf_run(model, tokens, types, targets, mlm)
    keep = tokens != fields["pad_token_id"]
    a, b = (logits[keep], hf_logits[keep]) if mlm else (logits, hf_logits)
    rel_logits = float(np.abs(a - b).max() / np.abs(b).max())
    rel_loss = abs(loss - hf_loss) / abs(hf_loss)
    failures += not report(rel_logits < 1e-4 and rel_loss < 1e-4, f"{arch_label} logits and loss",
                           f"loss ztrain {loss:.9g}, transformers {hf_loss:.9g} (relative {rel_loss:.1e}); logits "
                           f"relative {rel_logits:.1e}; accuracy {correct}/{counted}")

    ours = load_file(os.path.join(out, "grads.safetensors"))
    problems, worst, worst_kb = [], 0.0, 0.0
    # The key bias's gradient is zero in exact arithmetic (a softmax ignores a constant added to a row of
    # scores): both sides hold rounding noise there, so every tensor is also measured against a floor of
    # 1e-3 of the largest gradient of the model.
    floor = 1e-3 * max(float(np.abs(g).max()) for g in hf_grads.values())
    for name, g in hf_grads.items():
        if name not in ours:
            problems.append(f"no gradient for {name}")
            continue
        scale = max(float(np.abs(g).max()), floor)
        err = float(np.abs(ours[name] - g).max()) / scale
        if "key.bias" in name:
            worst_kb = max(worst_kb, err)
        else:
            worst = max(worst, err)
        if err > 1e-4:
            problems.append(f"{name} differs by {err:.1e} of its largest value")
    extra = sorted(set(ours) - set(hf_grads))
    if extra:
        problems.append(f"gradients of tensors transformers does not have: {extra[:4]}")
    failures += not report(not problems, f"{arch_label} gradients",
                           f"{len(hf_grads)} tensors, worst {worst:.1e} of the tensor's largest value (key biases: "
                           f"{worst_kb:.1e} of the floor)"
                           + "".join(f"; {p}" for p in problems[:6]))

    cls = getattr(transformers, arch)
    back, info = cls.from_pretrained(out, torch_dtype=torch.float32, output_loading_info=True)
    back.eval()
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "lm_head.decoder.weight",
            "lm_head.decoder.bias"}
    problems = []
    for what in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = [k for k in info.get(what, []) if k not in tied]
        if keys:
            problems.append(f"{what.replace('_', ' ')}: {list(keys)[:5]}")
    if back.config.architectures != [arch]:
        problems.append(f"architectures {back.config.architectures}")
    back_logits, back_loss, _ = hf_run(back, tokens, types, targets, mlm)
    a2 = back_logits[keep] if mlm else back_logits
    rel_back = float(np.abs(a2 - b).max() / np.abs(b).max())
    if rel_back > 1e-6:
        problems.append(f"logits differ by {rel_back:.1e}")
    failures += not report(not problems, f"{arch_label} re-export loads in transformers",
                           f"loss {back_loss:.9g}, logits relative {rel_back:.1e}"
                           + "".join(f"; {p}" for p in problems))
    return failures


def main():
    if len(sys.argv) != 2:
        print("usage: bert_hf.py BERT_TOOL", file=sys.stderr)
        return 2
    tool = os.path.abspath(sys.argv[1])
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    torch.set_num_threads(2)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="zt_bert_hf_") as tmp:
        for arch, fields, B, T in MODELS:
            failures += check_model(tool, arch, fields, B, T, tmp)
        if torch.cuda.is_available() and gpu_tool(tool):
            for arch, fields, B, T in GPU_MODELS:
                failures += check_model(tool, arch, fields, B, T, tmp, device="cuda")
        else:
            print("skipped: the CUDA executor's checks (no GPU here, or bert_tool was built without CUDA)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

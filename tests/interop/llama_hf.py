#!/usr/bin/env python3
"""Checks ztrain's LLaMA against Hugging Face transformers' LlamaForCausalLM, both ways.

Usage: llama_hf.py LLAMA_TOOL

LLAMA_TOOL is tests/worker/llama_tool from a ztrain build. For an odd config (6 query heads sharing 2
key/value heads, i.e. 3 query heads per group; heads of 8 channels; an MLP of 40; a vocabulary of 1000;
llama3 rope scaling whose ramp the head's frequencies straddle) with an untied head, and the same with a
tied head saved in shards, it builds a random LlamaForCausalLM in float32 (initializer_range 0.2, norm
weights away from 1), saves it with save_pretrained, and has ztrain import the saved folder with transformers'
own config.json. Then it compares, on a batch of 2 x 16 tokens:
  - ztrain's logits and mean loss with transformers' (eval mode, cross-entropy of the logits), 1e-4 relative;
  - every parameter's gradient of that loss (loss.backward()), 1e-4 relative to the tensor's largest entry;
  - ztrain's re-export (model.safetensors and config.json): from_pretrained loads it without missing,
    unexpected or mismatched tensors, it holds exactly the original weights, and gives the same logits.
Where a GPU is visible and llama_tool was built with CUDA, the first two checks run again with ztrain's
forward and backward on the GPU (llama_tool --device cuda, the training engine's CUDA executor in fp32), with
heads of 32 channels (192 wide, an MLP of 344), which the CUDA attention serves.
Then models that ztrain initialises in the shapes of llama_numpy_ref.py (llama3 scaling and an untied head,
linear scaling and a tied head, a Mistral config) load from ztrain's export with AutoModelForCausalLM and
give ztrain's logits and loss (1e-4 relative).
Exits 0 when every check passes, 1 on a mismatch, 77 (skipped) when torch or transformers is missing.
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import zt_testlib as t  # noqa: E402

t.require("numpy", "safetensors", "torch", "transformers", needs="numpy, safetensors, torch and transformers")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

sys.path.insert(0, HERE)
from gpt2_numpy_ref import random_rows, write_tokens  # noqa: E402
from llama_numpy_ref import CONFIGS, run_tool, write_config  # noqa: E402

TOL = 1e-4
MAJOR = int(transformers.__version__.split(".")[0])


def make_config(tied, gpu=False, qwen2=False):
    rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=16)
    # transformers 5 keeps rope_theta and the scaling in rope_parameters; 4.x in rope_theta and rope_scaling.
    rope_kw = dict(rope_parameters=dict(rope, rope_theta=10000.0)) if MAJOR >= 5 else \
        dict(rope_theta=10000.0, rope_scaling=rope)
    # On the GPU, heads of 32 channels (the CUDA attention serves 32, 64, 80, 96, 128, 256) and an MLP of 344.
    width = dict(hidden_size=192, intermediate_size=344) if gpu else dict(hidden_size=48, intermediate_size=40)
    cls = Qwen2Config if qwen2 else LlamaConfig
    return cls(vocab_size=1000, num_hidden_layers=2, **width,
               num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
               initializer_range=0.2, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, **rope_kw)


def load(folder, cls=LlamaForCausalLM):
    return cls.from_pretrained(folder, output_loading_info=True, **t.hf_float32())


def check(tool, tmp, tied, rng, device=None, qwen2=False):
    label = ("Qwen2, " if qwen2 else "") + ("tied head, sharded" if tied else "untied head") + \
        (f", ztrain on {device}" if device else "")
    problems = []
    torch.manual_seed(1 + tied)
    cls = Qwen2ForCausalLM if qwen2 else LlamaForCausalLM
    model = cls(make_config(tied, gpu=device == "cuda", qwen2=qwen2)).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("_proj.bias"):  # away from 1 and from 0
                p.add_(0.3 * torch.randn_like(p))
    model.eval()
    tag = f"{int(tied)}{device or ''}{'q' if qwen2 else ''}"
    hf_dir = os.path.join(tmp, f"hf-{tag}")
    # the tied model in shards of 100 kB: ztrain reads the index through the folder
    model.save_pretrained(hf_dir, **(dict(max_shard_size="100KB") if tied else {}))
    if tied and not os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")):
        problems.append("save_pretrained wrote no sharded checkpoint")

    B, T = 2, 16
    rows = random_rows(rng, B, T, 1000)
    rows[1, -1] = -1  # one ignored target
    tok = os.path.join(tmp, f"tokens-{tag}.bin")
    write_tokens(tok, rows)
    out = os.path.join(tmp, f"zt-{tag}")
    ours_loss = run_tool(tool, os.path.join(hf_dir, "config.json"), 0, tok, out, init=hf_dir, device=device)
    ours = load_file(os.path.join(out, "outputs.safetensors"))

    ids, logits, loss = t.hf_loss_and_grads(model, rows)
    d_logits = t.rel(torch.from_numpy(ours["logits"]), logits.detach())
    d_loss = abs(ours_loss - loss.item()) / abs(loss.item())
    if d_logits > TOL:
        problems.append(f"logits differ by {d_logits:.2e}")
    if d_loss > TOL:
        problems.append(f"loss {ours_loss:.9g} against {loss.item():.9g}")
    worst_grad, worst_name = 0.0, ""
    for name, p in model.named_parameters():
        key = "grad." + name
        if key not in ours:
            problems.append(f"ztrain wrote no gradient for {name}")
            continue
        d = t.rel(torch.from_numpy(ours[key]), p.grad)
        if d > worst_grad:
            worst_grad, worst_name = d, name
    if worst_grad > TOL:
        problems.append(f"gradient of {worst_name} differs by {worst_grad:.2e}")

    # ztrain's export, loaded back into transformers.
    back, info = load(out, cls)
    reload_problems, d_back = t.hf_reload_problems(model, back, info, ids, logits, tied)
    problems += reload_problems
    if back.config.num_key_value_heads != 2 or back.config.tie_word_embeddings != tied:
        problems.append("ztrain's config.json loads with other sizes")

    ok = not problems
    print(f"{'ok  ' if ok else 'FAIL'} {label}: loss ztrain {ours_loss:.9g}, transformers {loss.item():.9g}; "
          f"relative differences: logits {d_logits:.2e}, loss {d_loss:.2e}, gradients {worst_grad:.2e} "
          f"(largest: {worst_name}), re-export logits {d_back:.2e}" + "".join(f"; {p}" for p in problems))
    return ok


def check_export(tool, tmp, name, fields, B, T, rng):
    """A model ztrain initialised, loaded by transformers from ztrain's export."""
    d = os.path.join(tmp, f"export-{name}")
    os.makedirs(d)
    cfg_in, tok, out = (os.path.join(d, f) for f in ("in_config.json", "tokens.bin", "out"))
    write_config(cfg_in, fields)
    rows = random_rows(rng, B, T, fields["vocab_size"])
    write_tokens(tok, rows)
    ours_loss = run_tool(tool, cfg_in, 3, tok, out)
    ours = load_file(os.path.join(out, "outputs.safetensors"))["logits"]
    model, info = load(out, AutoModelForCausalLM)
    model.eval()
    problems = [f"{what} tensors: {list(keys)[:5]}" for what in ("missing", "unexpected", "mismatched")
                if (keys := [k for k in info.get(f"{what}_keys", []) if k != "lm_head.weight"])]
    with torch.no_grad():
        logits = model(input_ids=torch.as_tensor(rows[:, :-1], dtype=torch.long)).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.as_tensor(rows[:, 1:], dtype=torch.long).reshape(-1)).item()
    d_logits = t.rel(torch.from_numpy(ours), logits)
    d_loss = abs(ours_loss - loss) / abs(loss)
    ok = d_logits < TOL and d_loss < TOL and not problems
    print(f"{'ok  ' if ok else 'FAIL'} export {name} as {type(model).__name__}: loss ztrain {ours_loss:.9g}, "
          f"transformers {loss:.9g}; relative differences: logits {d_logits:.2e}, loss {d_loss:.2e}"
          + "".join(f"; {p}" for p in problems))
    return ok


def check_generate(ztrain, tmp, qwen2):
    """`ztrain generate --temperature 0` against transformers' greedy decoding, and `--num-beams` against its
    beam search, on a byte-level model."""
    name = "qwen2" if qwen2 else "llama"
    torch.manual_seed(11)
    cfg = make_config(False, qwen2=qwen2)
    cfg.vocab_size, cfg.initializer_range = 256, 0.5  # token ids are bytes; peaked logits, no near ties
    model = (Qwen2ForCausalLM if qwen2 else LlamaForCausalLM)(cfg).float().eval()
    d = os.path.join(tmp, f"gen-{name}")
    model.save_pretrained(d)
    prompt, new = b"The ", 24
    eos = cfg.eos_token_id  # ztrain stops there (not printed), as generate() does

    def cut(ids):
        tail = ids[len(prompt):]
        return prompt + bytes(tail[:tail.index(eos)] if eos in tail else tail)

    with torch.no_grad():
        out = model.generate(torch.tensor([list(prompt)]), max_new_tokens=new, do_sample=False, pad_token_id=0)
    want = cut(out[0].tolist())
    import subprocess
    res = subprocess.run([ztrain, "generate", "--weights", os.path.join(d, "model.safetensors"), "--model",
                          os.path.join(d, "config.json"), "--prompt", prompt.decode(), "--max-new-tokens",
                          str(new), "--temperature", "0"], capture_output=True)
    got = res.stdout[:len(want)] if res.returncode == 0 else b""
    ok = res.returncode == 0 and got == want
    print(f"{'ok  ' if ok else 'FAIL'} greedy generation ({name}): ztrain {got!r}, transformers {want!r}"
          + ("" if res.returncode == 0 else f"; ztrain failed: {res.stderr.decode()[-300:]}"))
    # --ignore-eos goes on past the end token, as generate(eos_token_id=None) does.
    with torch.no_grad():
        out = model.generate(torch.tensor([list(prompt)]), max_new_tokens=new, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    want_all = bytes(out[0].tolist())
    res = subprocess.run([ztrain, "generate", "--weights", os.path.join(d, "model.safetensors"), "--model",
                          os.path.join(d, "config.json"), "--prompt", prompt.decode(), "--max-new-tokens",
                          str(new), "--temperature", "0", "--ignore-eos"], capture_output=True)
    got = res.stdout[:len(want_all)] if res.returncode == 0 else b""
    ok_all = res.returncode == 0 and got == want_all and len(res.stdout) == len(want_all) + 1
    print(f"{'ok  ' if ok_all else 'FAIL'} greedy generation with --ignore-eos ({name}): ztrain {got!r}, "
          f"transformers {want_all!r}")
    ok = ok and ok_all
    # Beam search, as generate(num_beams=K) does it (hypotheses end at the config's eos_token_id).
    for beams, penalty in ((2, 1.0), (4, 1.0), (3, 0.0)):
        with torch.no_grad():
            out = model.generate(torch.tensor([list(prompt)]), max_new_tokens=new, do_sample=False, num_beams=beams,
                                 length_penalty=penalty, early_stopping=False, pad_token_id=0)
        want_b = cut(out[0].tolist())
        res = subprocess.run([ztrain, "generate", "--weights", os.path.join(d, "model.safetensors"), "--model",
                              os.path.join(d, "config.json"), "--prompt", prompt.decode(), "--max-new-tokens",
                              str(new), "--num-beams", str(beams), "--length-penalty", str(penalty)],
                             capture_output=True)
        got = res.stdout[:len(want_b)] if res.returncode == 0 else b""
        ok_b = res.returncode == 0 and got == want_b
        print(f"{'ok  ' if ok_b else 'FAIL'} beam search ({name}, {beams} beams, length penalty {penalty}): "
              f"ztrain {got!r}, transformers {want_b!r}"
              + ("" if res.returncode == 0 else f"; ztrain failed: {res.stderr.decode()[-300:]}"))
        ok = ok and ok_b
    return ok


def gpu_tool(tool):
    """Whether llama_tool takes --device cuda (a CUDA build)."""
    import subprocess
    res = subprocess.run([tool, "--device", "cuda"], capture_output=True, text=True)
    return "needs a build with CUDA" not in res.stderr


def main():
    if len(sys.argv) != 2:
        print("usage: llama_hf.py LLAMA_TOOL", file=sys.stderr)
        return 2
    tool = os.path.abspath(sys.argv[1])
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    rng = np.random.default_rng(7)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="zt_llama_hf_") as tmp:
        for qwen2 in (False, True):
            for tied in (False, True):
                failures += not check(tool, tmp, tied, rng, qwen2=qwen2)
        # The CUDA executor, where this machine has a GPU and the tool was built with CUDA.
        if torch.cuda.is_available() and gpu_tool(tool):
            for qwen2 in (False, True):
                for tied in (False, True):
                    failures += not check(tool, tmp, tied, rng, device="cuda", qwen2=qwen2)
        else:
            print("skipped: the CUDA executor's check (no GPU here, or llama_tool was built without CUDA)")
        for name, fields, B, T in CONFIGS:
            failures += not check_export(tool, tmp, name, fields, B, T, rng)
        ztrain = os.environ.get("ZTRAIN") or os.path.join(os.path.dirname(tool), "..", "..", "worker", "ztrain")
        for qwen2 in (False, True):
            failures += not check_generate(ztrain, tmp, qwen2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

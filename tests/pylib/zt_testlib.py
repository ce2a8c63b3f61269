"""Helpers shared by ztrain's Python test scripts: recorded checks, a free local port, a hard time limit
for a whole test, and the summary that ends every script.

A script imports it after putting this folder on sys.path, relative to the script itself:

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
    import zt_testlib as t
"""

import signal
import socket
import struct
import threading

failures = []  # the descriptions of every failed check, in order


def check(cond, what):
    """Records a failed expectation (the test goes on, so one run shows every problem)."""
    if cond:
        print("ok   " + what)
    else:
        print("FAIL " + what)
        failures.append(what)


def free_port():
    """Returns a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_deadline(seconds):
    """Raises TimeoutError in the main thread after `seconds`, so that the finally blocks that end the
    servers still run when a test hangs; cancel it with cancel_deadline()."""
    message = "the test ran past %d s" % seconds
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError(message)))
    signal.alarm(seconds)


def cancel_deadline():
    """Cancels the time limit set by set_deadline."""
    signal.alarm(0)


def summary():
    """Prints the failed checks, or that all passed, and returns the script's exit code (1 or 0)."""
    if failures:
        print("%d check(s) failed:" % len(failures))
        for f in failures:
            print("  " + f)
        return 1
    print("all checks passed")
    return 0


def write_shard(path, tokens):
    """An llm.c token shard: 256 int32 header (magic, version 1, count), then uint16 tokens."""
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


class LineLog:
    """The lines a process writes to one of its pipes, collected by a thread, so that a test can wait for
    a line while the process runs."""

    def __init__(self, proc, pipe):
        self.proc = proc
        self.lines = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self.reader.start()

    def _drain(self, pipe):
        for line in pipe:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def text(self):
        with self.cond:
            return "".join(self.lines)

    def wait_count(self, text, count, timeout):
        """Waits until `count` lines hold text, or the process ended; returns whether they do."""
        def seen():
            return sum(text in l for l in self.lines)
        with self.cond:
            self.cond.wait_for(lambda: seen() >= count or self.proc.poll() is not None, timeout)
            return seen() >= count

    def join(self, timeout):
        self.reader.join(timeout)


def stop_all(procs):
    """Stops every process wrapper in procs (each with stop() and proc), killing the ones whose stop()
    fails: ending every process matters more than why one failed."""
    for p in procs:
        try:
            p.stop()
        except Exception:  # noqa: BLE001
            if hasattr(p, "proc") and p.proc.poll() is None:
                p.proc.kill()


def require(*modules, needs):
    """Imports each named module, or prints why the check is skipped (needs: what it needs, in words) and
    exits 77, ctest's code for a skipped test."""
    import importlib
    import sys
    try:
        for name in modules:
            importlib.import_module(name)
    except ImportError as e:
        print(f"skipped: {e} (this check needs {needs})")
        sys.exit(77)


# The checks of ztrain against Hugging Face transformers (tests/interop/*_hf.py); torch and transformers are
# imported when one runs, so that the scripts without them can import this module.

def hf_float32():
    """from_pretrained's keyword for float32 weights: dtype in transformers 5, torch_dtype in 4.x."""
    import torch
    import transformers
    major = int(transformers.__version__.split(".")[0])
    return dict(dtype=torch.float32) if major >= 5 else dict(torch_dtype=torch.float32)


def rel(a, b):
    """The largest difference of torch tensors a and b relative to b's largest entry."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def hf_loss_and_grads(model, rows):
    """A causal LM's passes over token rows [B, T+1] (inputs rows[:, :-1], targets rows[:, 1:], -1 ignored):
    zeroes the gradients, runs forward and loss.backward(); returns the input ids, the logits and the loss."""
    import torch
    ids = torch.as_tensor(rows[:, :-1], dtype=torch.long)
    targets = torch.as_tensor(rows[:, 1:], dtype=torch.long)
    model.zero_grad()
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-1)
    loss.backward()
    return ids, logits, loss


def hf_reload_problems(model, back, info, ids, logits, tied):
    """What is wrong with ztrain's export of model as transformers loads it (back, and the loading info of
    from_pretrained(..., output_loading_info=True)): missing (but a tied head), unexpected or mismatched
    tensors, weights that changed, logits on ids more than 1e-6 relative from logits. Returns the problems
    and that relative difference."""
    import torch
    problems = []
    back.eval()
    missing = [k for k in info.get("missing_keys", []) if not (tied and k == "lm_head.weight")]
    for what, keys in (("missing", missing), ("unexpected", info.get("unexpected_keys", [])),
                       ("mismatched", info.get("mismatched_keys", []))):
        if keys:
            problems.append(f"{what} tensors when loading ztrain's export: {list(keys)[:5]}")
    want, got = model.state_dict(), back.state_dict()
    changed = [k for k in want if k not in got or not torch.equal(want[k], got[k])]
    if changed:
        problems.append(f"tensors changed through ztrain: {changed[:5]}")
    with torch.no_grad():
        d_back = rel(back(input_ids=ids).logits, logits.detach())
    if d_back > 1e-6:
        problems.append(f"the re-export's logits differ by {d_back:.2e}")
    return problems, d_back


def ztrain_greedy(ztrain, folder, prompt, n):
    """Runs `ztrain generate --temperature 0` on the model folder (config.json and model.safetensors): n new
    tokens after the bytes prompt. Returns (what it printed, without the final newline, None), or (None, why
    it failed)."""
    import os
    import subprocess
    res = subprocess.run([ztrain, "generate", "--weights", os.path.join(folder, "model.safetensors"), "--model",
                          os.path.join(folder, "config.json"), "--prompt", prompt.decode(), "--temperature", "0",
                          "--max-new-tokens", str(n)], capture_output=True)
    if res.returncode != 0:
        return None, f"ztrain generate failed ({res.returncode}): {res.stderr.decode(errors='replace').strip()}"
    return (res.stdout[:-1] if res.stdout.endswith(b"\n") else res.stdout), None

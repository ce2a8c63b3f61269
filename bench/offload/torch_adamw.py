"""torch.optim.AdamW with its defaults on CPU tensors: the baseline of bench/offload/run.sh.

usage: torch_adamw.py N_MILLIONS THREADS [f32|bf16] [ITERS]
Prints one line: M params/s of optimizer.step() (best of ITERS), on 8 parameter tensors of N/8 elements.
With bf16, parameters stay fp32 and gradients are bf16 values converted to fp32 (torch's AdamW needs the
gradient in the parameter's dtype), so the conversion is part of the timed step."""
import sys
import time

import torch


def main():
    n = int(float(sys.argv[1]) * 1e6)
    threads = int(sys.argv[2])
    gdt = sys.argv[3] if len(sys.argv) > 3 else "f32"
    iters = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    torch.set_num_threads(threads)
    k = 8
    params = [torch.nn.Parameter(torch.randn(n // k)) for _ in range(k)]
    grads16 = [torch.randn(n // k).to(torch.bfloat16) for _ in range(k)]
    for p in params:
        p.grad = torch.randn(n // k)
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    best = 1e30
    for it in range(iters + 2):
        t0 = time.perf_counter()
        if gdt == "bf16":
            for p, g in zip(params, grads16):
                p.grad.copy_(g)
        opt.step()
        dt = time.perf_counter() - t0
        if it >= 2:
            best = min(best, dt)
    print(f"torch_adamw version={torch.__version__} threads={threads} n={n} grad={gdt} best_s={best:.6f} "
          f"mparams_s={n / best / 1e6:.1f}")


if __name__ == "__main__":
    main()

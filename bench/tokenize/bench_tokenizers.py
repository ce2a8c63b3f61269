"""Encoding speed of ztrain's tokenizer.json tokenizers against the Hugging Face tokenizers library.

Usage: bench_tokenizers.py HF_TOKENIZER_TOOL [ROUNDS]     (run by bench/tokenize/run.sh)

Builds the tokenizers of tests/interop/tokenizers_check.py (trained on data/corpus.txt with the library) and
encodes the corpus (1.4 MiB of English) with each:
  - ztrain: the whole corpus in one zt_tokenizer_encode call, one thread (hf_tokenizer_tool time);
  - tokenizers, one thread (RAYON_NUM_THREADS=1): encode() of the whole corpus as one string, and
    encode_batch() of its lines;
  - tokenizers, batch mode on every core: encode_batch() of its lines.
Each figure is the best of ROUNDS rounds (default 5), in wall time and, for the one-thread rows, also in the
process's CPU time, which a machine busy with other work disturbs less. Both sides give the same ids
(checked here for the whole corpus). Prints the load average before and after, and one table: MB/s of text
(10^6 bytes) and millions of tokens per second.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "interop"))
os.environ.setdefault("ZT_SOURCE_DIR", SRC)

LIB_TIMER = r'''
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
text = open(sys.argv[2], encoding="utf-8").read()
lines = text.splitlines(keepends=True)
rounds = int(sys.argv[3])
best = {"one": 1e30, "one_cpu": 1e30, "batch": 1e30, "batch_cpu": 1e30}
def keep(key, t0, c0):
    best[key] = min(best[key], time.perf_counter() - t0)
    best[key + "_cpu"] = min(best[key + "_cpu"], time.process_time() - c0)
for _ in range(rounds):
    t0, c0 = time.perf_counter(), time.process_time(); ids = tok.encode(text, add_special_tokens=False).ids; keep("one", t0, c0)
for _ in range(rounds):
    t0, c0 = time.perf_counter(), time.process_time(); enc = tok.encode_batch(lines, add_special_tokens=False); keep("batch", t0, c0)
best.update({"ntok": len(ids), "nbatch": sum(len(e.ids) for e in enc), "ids": ids})
print(json.dumps(best))
'''


def lib_times(path, corpus, rounds, threads):
    env = dict(os.environ)
    env["RAYON_NUM_THREADS"] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "true"
    res = subprocess.run([sys.executable, "-c", LIB_TIMER, path, corpus, str(rounds)], capture_output=True,
                         text=True, env=env, check=True)
    return json.loads(res.stdout)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    tool = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) == 3 else 5
    import tokenizers
    import tokenizers_check as tc
    corpus = os.path.join(SRC, "data", "corpus.txt")
    nbytes = os.path.getsize(corpus)
    work = tempfile.mkdtemp(prefix="zt_bench_tokenize_")
    cores = os.cpu_count()
    print(f"corpus {nbytes} bytes; tokenizers {tokenizers.__version__}; {cores} cores; best of {rounds} rounds; "
          f"load average {os.getloadavg()[0]:.2f}")
    rows = []
    for name, lib in tc.build_tokenizers().items():
        path = os.path.join(work, f"{name}.json")
        lib.save(path)
        out = subprocess.run([tool, "time", path, corpus, str(rounds)], capture_output=True, text=True, check=True)
        f = out.stdout.split()
        zt_tok, zt_s, zt_cpu = int(f[3]), float(f[5]), float(f[7])
        one = lib_times(path, corpus, rounds, 1)
        many = lib_times(path, corpus, rounds, cores)
        inp, outp = os.path.join(work, "in.bin"), os.path.join(work, "out.txt")
        tc.write_records(inp, [open(corpus, encoding="utf-8").read()])
        subprocess.run([tool, "encode", path, inp, outp], check=True)
        same = [int(x) for x in open(outp).read().split()] == one["ids"]
        for impl, secs, cpu, ntok in (
                ("ztrain, 1 thread, whole text", zt_s, zt_cpu, zt_tok),
                ("tokenizers encode, 1 thread, whole text", one["one"], one["one_cpu"], one["ntok"]),
                ("tokenizers encode_batch, 1 thread, lines", one["batch"], one["batch_cpu"], one["nbatch"]),
                (f"tokenizers encode_batch, {cores} threads, lines", many["batch"], None, many["nbatch"])):
            rows.append((name, impl, nbytes / secs / 1e6, ntok / secs / 1e6,
                         nbytes / cpu / 1e6 if cpu else None, same))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print()
    print("| tokenizer | implementation | MB/s (wall) | M tokens/s (wall) | MB/s (CPU time) | same ids |")
    print("|---|---|---:|---:|---:|---|")
    for name, impl, mbs, mtoks, mbs_cpu, same in rows:
        cpu = f"{mbs_cpu:.1f}" if mbs_cpu else "-"
        print(f"| {name} | {impl} | {mbs:.1f} | {mtoks:.2f} | {cpu} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()

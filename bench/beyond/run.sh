#!/usr/bin/env bash
# Training beyond GPU memory on one GPU: models whose training state does not fit under a --gpu-mem cap,
# with the weights streamed from host memory and AdamW on the host.
#   bench/beyond/run.sh [OUT_DIR]
#   ZTRAIN=build/worker/ztrain      the build measured
#   ROWS="..."                      which rows of the table below to run (default: all)
#   STEPS=N                         steps per row instead of the table's (more than SKIP)
#   SKIP=N                          the first N steps are not timed (default 3)
# Each row trains a GPT-2-shaped model (bench/gpt2-MODEL.json), or the LLaMA-2-7B shape (model llama-7b:
# bench/llama-7b.json), on random tokens, T = 1024, for its number of steps (the first SKIP = 3
# are not timed) without checkpoints (--save-every -1). Reported: tokens/s over the timed steps, TFLOP/s
# (6N + 6 L T C FLOPs per token; the recomputation of checkpointed layers not counted), the peak GPU
# memory the driver reports and the peak resident host memory of the process (sampled every 0.5 s; at the
# peak also split into anonymous, file-backed and shared memory, as /proc/PID/status counts them), the
# planner's lines (GPU, host, disk), the engine's breakdown of the last step, and the first and last loss.
# llama7b_11g_h64_ga64 is the ga16 row with 4x the tokens per step (524,288): the update over state on disk
# (about 31 s a step at 7B) is paid once per step, so more micro-batches hide more of it; run it with STEPS=3 SKIP=1 (steps 2 and 3 each wait for the update before them).
# The rows under --host-mem (llama7b_11g_h64*, llama7b_11g_h32*) show the host budget in the plan: the peak
# resident memory must stay under the cap; the *_hacc rows add the middle micro-batches' gradients on the
# host (--host-grad-accum) and must give the bits of the row without it (PAIRS). Under 32 GiB the fp32 host
# gradient of a 6.74B model (27 GB) with the bf16 copy of the weights (13.5 GB) does not fit: the
# grad_accum 16 row is expected to be refused with its minimum, and the grad_accum 1 row trains with the
# bf16 host gradient of one micro-batch (13.5 GB), the moments and masters on disk.
# ZT_MOMENTS_READ_AHEAD=0 in the environment turns the reads of the next update's first records ahead off (the
# same bits), for a before/after of rows with state on disk.
# Pairs of rows named in PAIRS are compared step by step (largest relative loss difference; "same bits"
# when every loss is equal). Writes OUT_DIR/rows.jsonl, one log per row, and prints OUT_DIR/table.md.
set -u
HERE="$(cd "$(dirname "$0")/.." && pwd)"
OUT_DIR="${1:-bench-out/beyond}"
ZTRAIN="${ZTRAIN:-build/worker/ztrain}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT_DIR"
DATA="${TMPDIR:-/tmp}/zt_bench_data"
mkdir -p "$DATA"
[ -f "$DATA/rnd_train_000.bin" ] || "$PY" "$HERE/make_shards.py" "$DATA/rnd" 4000000 || exit 1
NVME="${NVME_DIR:-${TMPDIR:-/tmp}/zt_beyond_nvme}"
RES="$OUT_DIR/rows.jsonl"
: > "$RES"

# name | model | steps | batch | grad_accum | precision | flags (commas for spaces)
TABLE="
1558m_gpu          1558m 50 8 1 bf16 --optimizer,gpu
1558m_streamed_11g 1558m 50 8 1 bf16 --optimizer,cpu,--weights,host,--gpu-mem,11GiB,--checkpointing,all
1558m_streamed_11g_ga8 1558m 10 8 8 bf16 --optimizer,cpu,--weights,host,--gpu-mem,11GiB,--checkpointing,all
1558m_streamed_11g_m16 1558m 50 8 1 bf16 --optimizer,cpu,--weights,host,--gpu-mem,11GiB,--checkpointing,all,--adam-moments,bf16
1558m_m16disk      1558m 10 8 1 bf16 --optimizer,cpu,--weights,host,--gpu-mem,11GiB,--checkpointing,all,--adam-moments,bf16,--moments-dir,NVME
1558m_m16split     1558m 10 8 1 bf16 --optimizer,cpu,--weights,host,--gpu-mem,11GiB,--checkpointing,all,--adam-moments,bf16,--moments-dir,NVME,--moments-ram,3GiB
1558m_auto_11g     1558m 10 8 1 bf16 --optimizer,cpu,--gpu-mem,11GiB,--checkpointing,all
1558m_fp16_11g     1558m 50 8 1 fp16 --optimizer,cpu,--weights,host,--gpu-mem,11GiB,--checkpointing,all
124m_streamed_ram  124m  12 8 1 bf16 --offload,cpu,--weights,host,--gpu-mem,4GiB,--checkpointing,all
124m_streamed_nvme 124m  12 8 1 bf16 --offload,nvme:NVME,--weights,host,--gpu-mem,4GiB,--checkpointing,all
6.7b_11g_ga4       6.7b  7  8 4 bf16 --optimizer,cpu,--gpu-mem,11GiB,--checkpointing,all
6.7b_nocap_ga4     6.7b  7  8 4 bf16 --optimizer,cpu,--checkpointing,all
6.7b_11g_b14_ga8   6.7b  6 14 8 bf16 --optimizer,cpu,--gpu-mem,11GiB,--checkpointing,all
6.7b_nocap_b14_ga8 6.7b  6 14 8 bf16 --optimizer,cpu,--checkpointing,all
6.7b_gpu_b14_ga8   6.7b  6 14 8 bf16 --optimizer,gpu,--checkpointing,all
llama7b_11g_ga4    llama-7b 7 8 4 bf16 --optimizer,cpu,--gpu-mem,11GiB,--checkpointing,all
13b_11g_m16disk    13b   5 8 1 bf16 --optimizer,cpu,--gpu-mem,11GiB,--checkpointing,all,--adam-moments,bf16,--moments-dir,NVME
13b_11g_m16disk_ga16 13b 4 8 16 bf16 --optimizer,cpu,--gpu-mem,11GiB,--checkpointing,all,--adam-moments,bf16,--moments-dir,NVME
13b_11g_m16disk_ga16_hacc 13b 4 8 16 bf16 --optimizer,cpu,--gpu-mem,11GiB,--checkpointing,all,--adam-moments,bf16,--moments-dir,NVME,--host-grad-accum
1558m_11g_h12      1558m 5  8 1 bf16 --optimizer,cpu,--gpu-mem,11GiB,--host-mem,12GiB,--checkpointing,all,--adam-moments,bf16,--moments-dir,NVME
llama7b_11g_h64_ga16 llama-7b 5 8 16 bf16 --optimizer,cpu,--gpu-mem,11GiB,--host-mem,64GiB,--checkpointing,all,--adam-moments,bf16,--moments-dir,NVME
llama7b_11g_h64_ga64 llama-7b 4 8 64 bf16 --optimizer,cpu,--gpu-mem,11GiB,--host-mem,64GiB,--checkpointing,all,--adam-moments,bf16,--moments-dir,NVME
llama7b_11g_h64_ga16_hacc llama-7b 5 8 16 bf16 --optimizer,cpu,--gpu-mem,11GiB,--host-mem,64GiB,--checkpointing,all,--adam-moments,bf16,--moments-dir,NVME,--host-grad-accum
llama7b_11g_h32_ga16 llama-7b 4 8 16 bf16 --optimizer,cpu,--gpu-mem,11GiB,--host-mem,32GiB,--checkpointing,all,--adam-moments,bf16,--moments-dir,NVME
llama7b_11g_h32_ga1 llama-7b 6 8 1 bf16 --optimizer,cpu,--gpu-mem,11GiB,--host-mem,32GiB,--checkpointing,all,--adam-moments,bf16,--moments-dir,NVME
"
PAIRS="1558m_streamed_11g:1558m_gpu 1558m_fp16_11g:1558m_gpu 124m_streamed_nvme:124m_streamed_ram 1558m_streamed_11g_m16:1558m_streamed_11g
13b_11g_m16disk_ga16_hacc:13b_11g_m16disk_ga16 llama7b_11g_h64_ga16_hacc:llama7b_11g_h64_ga16
llama7b_11g_h32_ga16:llama7b_11g_h64_ga16"
ROWS="${ROWS:-$(echo "$TABLE" | awk 'NF {print $1}')}"

baseline_mib=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
baseline_mib=${baseline_mib:-0}

# run NAME MODEL STEPS BATCH ACCUM PRECISION FLAGS
run() {
  local name=$1 model=$2 steps=${STEPS:-$3} batch=$4 accum=$5 prec=$6 flags=$7
  local run="${TMPDIR:-/tmp}/zt_beyond_run" log="$OUT_DIR/$name.log"
  rm -rf "$run" "$NVME"
  mkdir -p "$NVME"
  IFS=, read -r -a extra <<< "${flags//NVME/$NVME}"
  local cfg="$HERE/gpt2-$model.json" data="$DATA/rnd_train_000.bin"
  if [ "$model" = llama-7b ]; then
    cfg="$HERE/llama-7b.json" data="$DATA/rnd32k_train_000.bin"
    [ -f "$data" ] || "$PY" "$HERE/make_shards.py" "$DATA/rnd32k" 4000000 32000 || return 1
  fi
  "$ZTRAIN" train --model "$cfg" --train-data "$data" --device cuda \
    --precision "$prec" --steps "$steps" --batch-size "$batch" --grad-accum "$accum" --seq-len 1024 \
    --save-every -1 --log-every 1 --eval-every 0 --out "$run" "${extra[@]}" > "$log" 2>&1 &
  local pid=$! peak=0 rss=0 anon=0 file=0 shmem=0
  while kill -0 $pid 2>/dev/null; do
    local used kb top a f sh
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
    [ -n "$used" ] && [ "$used" -gt "$peak" ] && peak=$used
    top=$(ps -o rss=,pid= --ppid $pid -p $pid 2>/dev/null | sort -n | tail -1)
    kb=$(echo "$top" | awk '{print $1}')
    if [ -n "$kb" ] && [ "$kb" -gt "$rss" ]; then
      # the largest process's resident memory by kind at its peak: anonymous (the heap, pinned buffers),
      # file-backed (the binaries' and libraries' pages, mapped files), shared memory
      read -r a f sh < <(awk '/^RssAnon/ {a=$2} /^RssFile/ {f=$2} /^RssShmem/ {s=$2} END {print a+0, f+0, s+0}' \
        "/proc/$(echo "$top" | awk '{print $2}')/status" 2>/dev/null)
      rss=$kb anon=${a:-0} file=${f:-0} shmem=${sh:-0}
    fi
    sleep 0.5
  done
  wait $pid
  local rc=$?
  "$PY" - "$run/metrics.jsonl" "$log" "$name" "$model" "$batch" "$accum" "$prec" "$flags" \
    "$((peak - baseline_mib))" "$rss" "$rc" "$anon" "$file" "$shmem" <<'PY' | tee -a "$RES"
import json, os, re, sys
metrics, log, name, model, batch, accum, prec, flags, peak, rss, rc, anon, file, shmem = sys.argv[1:]
try:
    rows = [json.loads(l) for l in open(metrics) if '"loss"' in l]
except OSError:
    rows = []
tokens = int(batch) * int(accum) * 1024
timed = [r for r in rows if r["step"] > int(os.environ.get("SKIP", "3"))]
text = open(log, errors="replace").read()
out = {"name": name, "model": model, "batch": int(batch), "grad_accum": int(accum), "precision": prec,
       "flags": flags.replace(",", " "), "peak_gpu_gib": int(peak) / 1024, "peak_host_gib": int(rss) / 2**20,
       "peak_rss_anon_gib": int(anon) / 2**20, "peak_rss_file_gib": int(file) / 2**20,
       "peak_rss_shmem_gib": int(shmem) / 2**20,
       "rc": int(rc), "losses": [r["loss"] for r in rows], "skipped": sum(1 for r in rows if r.get("skipped"))}
if timed:
    out["tokens_per_s"] = tokens * len(timed) / sum(tokens / r["tokens_per_s"] for r in timed)
if rc != "0" or not timed:
    out["error"] = (re.findall(r"(?:ERROR|error:).*", text) or ["no timed steps"])[-1][:600]
# the planner's lines and the trainer's "memory:" lines (the measured peak against the plan, by phase)
out["plan"] = re.findall(r"(?:plan|memory): .*", text)
m = re.findall(r"engine: step ([0-9.]+) s \| host update ([0-9.]+) s .*?blocks ([0-9.]+) s \| waited for the "
               r"backward and norm ([0-9.]+) s \| copied down ([0-9.]+ \w+), up ([0-9.]+ \w+)", text)
if m:
    s, h, wu, wn, down, up = m[-1]
    out.update(step_s=float(s), host_update_s=float(h), wait_update_s=float(wu), wait_norm_s=float(wn),
               down=down, up=up)
d = re.findall(r"disk read waited ([0-9.]+) s, disk write waited ([0-9.]+) s, behind the last block ([0-9.]+) s "
               r"\(.*?, (\d) records? read ahead", text)
if d:
    rw, ww, bh, ra = d[-1]
    out.update(disk_read_wait_s=float(rw), disk_write_wait_s=float(ww), disk_behind_s=float(bh),
               disk_read_ahead=int(ra))
p = re.search(r"([0-9.]+)M parameters", text)
out["params"] = float(p.group(1)) * 1e6 if p else 0
print(json.dumps(out))
PY
}

for name in $ROWS; do
  row=$(echo "$TABLE" | awk -v n="$name" '$1 == n')
  [ -n "$row" ] || { echo "unknown row '$name' (see TABLE in $0)" >&2; exit 2; }
  set -- $row
  run "$@"
done

"$PY" - "$RES" "${PEAK_TFLOPS:-989}" "$PAIRS" <<'PY' | tee "$OUT_DIR/table.md"
import json, sys
peak = float(sys.argv[2])
shape = {"124m": (12, 768), "1558m": (48, 1600), "6.7b": (32, 4096), "13b": (41, 5120), "llama-7b": (32, 4096)}
rows = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    rows[r["name"]] = r
print("| row | params | batch x T x grad_accum | precision | flags | tokens/s | TFLOP/s | MFU | peak GPU GiB | "
      "peak host GiB (anon / file / shmem) | loss first -> last | host AdamW s | waited for updates s | step s | copied down, up | "
      "disk read / write waited s (records read ahead) |")
print("|---|---:|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---|")
for r in rows.values():
    L, C = shape[r["model"]]
    lo = f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}" if r["losses"] else ""
    if "tokens_per_s" in r:
        tf = r["tokens_per_s"] * (6 * r["params"] + 6 * L * 1024 * C) / 1e12
        speed = f"{r['tokens_per_s']:,.0f} | {tf:.0f} | {100 * tf / peak:.1f}%"
    else:
        speed = f"failed: {r.get('error', '')} | |"
    br = [f"{r[k]:.3f}" if k in r else "" for k in ("host_update_s", "wait_update_s", "step_s")]
    print(f"| {r['name']} | {r['params'] / 1e9:.2f}B | {r['batch']} x 1024 x {r['grad_accum']} | {r['precision']} | "
          f"{r['flags']} | {speed} | {r['peak_gpu_gib']:.1f} | {r['peak_host_gib']:.1f} ({r.get('peak_rss_anon_gib', 0):.1f} / "
          f"{r.get('peak_rss_file_gib', 0):.1f} / {r.get('peak_rss_shmem_gib', 0):.1f}) | {lo} | " + " | ".join(br)
          + f" | {r.get('down', '')}, {r.get('up', '')} | "
          + (f"{r['disk_read_wait_s']:.3f} / {r['disk_write_wait_s']:.3f} ({r['disk_read_ahead']})" if "disk_read_wait_s" in r else "")
          + " |")
print()
for pair in sys.argv[3].split():
    a, b = pair.split(":")
    if a not in rows or b not in rows or not rows[a]["losses"] or not rows[b]["losses"]:
        continue
    la, lb = rows[a]["losses"], rows[b]["losses"]
    n = min(len(la), len(lb))
    same = la[:n] == lb[:n]
    worst = max(abs(x - y) / abs(y) for x, y in zip(la[:n], lb[:n]))
    print(f"- {a} vs {b}: {n} steps, " + ("same bits" if same else f"largest relative loss difference {worst:.3g}"))
print()
for r in rows.values():
    for line in r["plan"]:
        print(f"    {r['name']}: {line}")
PY

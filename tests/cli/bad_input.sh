#!/usr/bin/env bash
# The ztrain CLI's bad-input suite, and one small end-to-end run.
#
# Bad input must give ONE clear error line on stderr ("ztrain: error: ..." or a log line at ERROR level)
# that names the problem, exit status 1 (runtime failure) or 2 (usage error) rather than a crash, and
# leave no output file, checkpoint or partial .tmp behind. Every case below checks all of that.
#
# The end-to-end run tokenizes a small text, trains a tiny model for 20 steps with eval and checkpoints,
# resumes it for 10 more, exports, generates and plots; each step must exit 0 and produce its file.
#
# Usage: bash tests/cli/bad_input.sh PATH/TO/ztrain        (ctest runs it as cli_bad_input)
# Set ZT_CLI_KEEP=1 to keep the scratch directory for a look after a failure.
set -u

if [ $# -ne 1 ] || [ ! -x "$1" ]; then
  echo "usage: bash $0 PATH/TO/ztrain" >&2
  exit 2
fi
ZT=$(realpath "$1")
SRC=$(cd "$(dirname "$0")/../.." && pwd) # the repository: examples/ for the fine-tuning cases
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zt_cli_XXXXXX")
if [ "${ZT_CLI_KEEP:-0}" = 1 ]; then
  echo "scratch directory: $WORK"
else
  trap 'rm -rf "$WORK"' EXIT
fi
cd "$WORK" || exit 1

passed=0
failed=0
failed_names=()
LIMIT_S=300 # no single command of this suite should come close; a hang is a failure, not a stuck ctest

# ---- reporting --------------------------------------------------------------------------------------

# fail NAME WHY: records a failed case and shows what the command printed.
fail() {
  local name=$1 why=$2
  failed=$((failed + 1))
  failed_names+=("$name")
  echo "FAIL $name: $why"
  if [ -s "$WORK/$name.err" ]; then
    echo "  --- stderr (last 8 lines) ---"
    tail -n 8 "$WORK/$name.err" | sed 's/^/  | /'
  fi
}

pass() {
  passed=$((passed + 1))
  echo "ok   $1"
}

# ---- binary fixtures written with printf only (no Python needed) -------------------------------------

le16() {
  local lo hi
  printf -v lo '%02x' $(($1 & 255))
  printf -v hi '%02x' $((($1 >> 8) & 255))
  printf "\\x$lo\\x$hi"
}

le32() {
  le16 $(($1 & 65535))
  le16 $((($1 >> 16) & 65535))
}

le64() {
  le32 $(($1 & 0xffffffff))
  le32 $((($1 >> 32) & 0xffffffff))
}

# make_shard FILE NTOKENS MAX_TOKEN [MAGIC] [DECLARED_NTOKENS]: an llm.c token shard (256 int32 header
# then uint16 tokens) whose tokens cycle through 0..MAX_TOKEN.
make_shard() {
  local file=$1 n=$2 max=$3 magic=${4:-20240520} declared=${5:-$2} i
  {
    le32 "$magic"
    le32 1
    le32 "$declared"
    head -c $((253 * 4)) /dev/zero
    for ((i = 0; i < n; i++)); do le16 $((i % (max + 1))); done
  } >"$file"
}

# make_safetensors FILE HEADER_JSON DATA_BYTES: a safetensors file with that header and zeroed data.
make_safetensors() {
  local file=$1 header=$2 nbytes=$3
  {
    le64 ${#header}
    printf '%s' "$header"
    head -c "$nbytes" /dev/zero
  } >"$file"
}

# flip_byte FILE OFFSET: inverts one byte in place.
flip_byte() {
  local file=$1 off=$2 v hex
  v=$(od -An -tu1 -j "$off" -N1 "$file" | tr -d ' ')
  printf -v hex '%02x' $((v ^ 255))
  printf "\\x$hex" | dd of="$file" bs=1 seek="$off" conv=notrunc status=none
}

# ---- running ztrain ---------------------------------------------------------------------------------

# run_zt NAME ARGS...: runs ztrain with stdout and stderr in NAME.out / NAME.err; sets $rc.
run_zt() {
  local name=$1
  shift
  timeout "$LIMIT_S" "$ZT" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
  rc=$?
}

# expect_error NAME CODES REGEX... -- ARGS...: runs `ztrain ARGS` and checks that the exit status is one
# of CODES ("1", "2" or "1|2"), that there was no crash, that stderr holds exactly one error line, and
# that stderr matches every REGEX (extended, case-insensitive). Returns 0 when all hold.
expect_error() {
  local name=$1 codes=$2
  shift 2
  local regexes=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    regexes+=("$1")
    shift
  done
  shift
  run_zt "$name" "$@"
  local err="$WORK/$name.err"
  if [ "$rc" -eq 124 ]; then
    fail "$name" "did not finish within ${LIMIT_S}s"
    return 1
  fi
  if [ "$rc" -ge 128 ]; then
    fail "$name" "killed by signal $((rc - 128)) (exit $rc): a crash, not an error message"
    return 1
  fi
  if grep -Eqi 'Segmentation fault|AddressSanitizer|runtime error:|internal error|Assertion .* failed|core dumped' "$err"; then
    fail "$name" "stderr shows a crash or a broken invariant"
    return 1
  fi
  if ! [[ "$rc" =~ ^($codes)$ ]]; then
    fail "$name" "exit status $rc, expected $codes"
    return 1
  fi
  local nerr
  nerr=$(grep -Ec '^ztrain: error: |^[0-9TZ:.-]+ ERROR ' "$err")
  if [ "$nerr" -ne 1 ]; then
    fail "$name" "expected exactly one error line ('ztrain: error: ...' or an ERROR log line) on stderr, found $nerr"
    return 1
  fi
  local re
  for re in "${regexes[@]}"; do
    if ! grep -Eqi -- "$re" "$err"; then
      fail "$name" "stderr does not match /$re/"
      return 1
    fi
  done
  return 0
}

# leftovers DIR: prints checkpoints, 'latest' files and *.tmp entries under DIR (nothing if DIR is absent).
leftovers() {
  [ -e "$1" ] || return 0
  find "$1" \( -name 'ckpt_*' -o -name latest -o -name '*.tmp' \) -print
}

# expect_no_output NAME PATH...: checks that none of the paths exists.
expect_no_output() {
  local name=$1 p
  shift
  for p in "$@"; do
    if [ -e "$p" ]; then
      fail "$name" "left $p behind"
      return 1
    fi
  done
  return 0
}

# expect_no_run_output NAME DIR: checks that a failed train left no checkpoint, 'latest' or .tmp in DIR.
expect_no_run_output() {
  local name=$1 dir=$2 left
  left=$(leftovers "$dir")
  if [ -n "$left" ]; then
    fail "$name" "left checkpoint files behind: $(echo "$left" | tr '\n' ' ')"
    return 1
  fi
  return 0
}

# train_case NAME CODES REGEX... -- ARGS...: a `ztrain train` that must fail; its --out is a fresh
# out_N (named by number so that the case's name cannot match a regex), which must hold no checkpoint
# afterwards. ARGS are added after a working base command line.
n_train_cases=0
train_case() {
  local name=$1
  shift
  n_train_cases=$((n_train_cases + 1))
  local run_dir="$WORK/out_$n_train_cases"
  local pre=()
  while [ "$1" != "--" ]; do
    pre+=("$1")
    shift
  done
  shift
  expect_error "$name" "${pre[@]}" -- train --model "$WORK/model.json" --train-data "$WORK/d1/d_train_*.bin" \
    --steps 2 --batch-size 2 --seq-len 16 --threads 1 --out "$run_dir" "$@" &&
    expect_no_run_output "$name" "$run_dir" && pass "$name"
}

# ---- fixtures ---------------------------------------------------------------------------------------

cat >model.json <<'EOF'
{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 2, "n_embd": 32,
 "n_positions": 64, "vocab_size": 256, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": true}
EOF
cat >model_bad_heads.json <<'EOF'
{"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 30, "n_positions": 64, "vocab_size": 256}
EOF
mkdir -p d1 d2 d3 d4
make_shard d1/d_train_000.bin 2000 255
cp d1/d_train_000.bin d2/t_train_000.bin
truncate -s $((256 * 4 + 1000)) d2/t_train_000.bin # header says 2000 tokens, 500 left
make_shard d3/m_train_000.bin 2000 255 20240521     # magic off by one
make_shard d4/v_train_000.bin 2000 300              # tokens up to 300, vocab is 256
printf 'this file is a regular file, not a directory\n' >afile

# Safetensors that fail validation in three different ways.
make_safetensors wa.safetensors '{"wte.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}' 8
make_safetensors wb.safetensors '{"wte.weight":{"dtype":"F32",' 0
make_safetensors wc.safetensors '{"wte.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,32]}}' 32

# A text corpus for the end-to-end run: ~24 KB of varied lines.
for ((i = 0; i < 400; i++)); do
  echo "Line $i: the quick brown fox jumps over the lazy dog $((i * 37 % 101)) times."
done >corpus.txt

# ---- end-to-end: tokenize, train, resume, export, generate, plot --------------------------------------

e2e_ok=1
step_ok() { # step_ok NAME: the command exited 0 with no error line
  if [ "$rc" -ne 0 ]; then
    fail "$1" "exit status $rc, expected 0"
    return 1
  fi
  if grep -Eq '^ztrain: error: |^[0-9TZ:.-]+ ERROR ' "$WORK/$1.err"; then
    fail "$1" "exit status 0 but an error line on stderr"
    return 1
  fi
  return 0
}
need_files() { # need_files NAME FILE...: every file exists and is not empty
  local name=$1 f
  shift
  for f in "$@"; do
    if [ ! -s "$f" ]; then
      fail "$name" "did not produce $f"
      return 1
    fi
  done
  return 0
}

run_zt e2e_tokenize tokenize --input corpus.txt --out-dir data --name corpus --val-fraction 0.1
if step_ok e2e_tokenize && need_files e2e_tokenize "$(ls data/corpus_train_*.bin 2>/dev/null | head -1)" \
  "$(ls data/corpus_val_*.bin 2>/dev/null | head -1)"; then
  pass e2e_tokenize
else
  e2e_ok=0
fi

if [ $e2e_ok = 1 ]; then
  run_zt e2e_train train --model model.json --train-data 'data/corpus_train_*.bin' \
    --val-data 'data/corpus_val_*.bin' --steps 20 --batch-size 4 --seq-len 32 --eval-every 10 \
    --eval-batches 2 --save-every 10 --log-every 5 --seed 1 --threads 2 --out run
  if step_ok e2e_train && need_files e2e_train run/latest run/metrics.jsonl run/config.json \
    run/model_config.json run/ckpt_000010/model.safetensors run/ckpt_000020/manifest.json \
    run/ckpt_000020/model.safetensors run/ckpt_000020/optim.safetensors; then
    if [ "$(tr -d '[:space:]' <run/latest)" != ckpt_000020 ]; then
      fail e2e_train "run/latest holds '$(cat run/latest)', expected ckpt_000020"
      e2e_ok=0
    elif ! grep -q '"val_loss"' run/metrics.jsonl; then
      fail e2e_train "run/metrics.jsonl has no val_loss line"
      e2e_ok=0
    elif [ -n "$(find run -name '*.tmp')" ]; then
      fail e2e_train "left .tmp entries in run/"
      e2e_ok=0
    else
      pass e2e_train
    fi
  else
    e2e_ok=0
  fi
fi

if [ $e2e_ok = 1 ]; then
  cp -r run run_before_resume # pristine copy for the corrupted-checkpoint case
  run_zt e2e_resume train --resume run --steps 30
  if step_ok e2e_resume && need_files e2e_resume run/ckpt_000030/model.safetensors; then
    if [ "$(tr -d '[:space:]' <run/latest)" != ckpt_000030 ]; then
      fail e2e_resume "run/latest holds '$(cat run/latest)', expected ckpt_000030"
      e2e_ok=0
    elif ! grep -q '"step": *30[,}]' run/metrics.jsonl; then
      fail e2e_resume "run/metrics.jsonl has no line for step 30"
      e2e_ok=0
    else
      pass e2e_resume
    fi
  else
    e2e_ok=0
  fi
fi

# ---- --host-mem on CPU ranks: the state moved to disk to fit, and a resume on the same bits ------------
# A model whose fp32 state dwarfs the buffers: the smallest plan (from the refusal of a cap too small) plus
# 1 MiB leaves the Adam moments all on disk and the fp32 masters mostly there. A run of 20 steps and one
# resumed from its step-10 checkpoint must write the same step-20 checkpoint, byte for byte.
cat >model_hm.json <<'EOF'
{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 8, "n_head": 2, "n_embd": 128,
 "n_positions": 64, "vocab_size": 256, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": true}
EOF
if [ $e2e_ok = 1 ]; then
  mkdir -p hm_state
  hm_args=(train --model model_hm.json --train-data 'data/corpus_train_*.bin' --batch-size 4 --seq-len 16 --threads 1
    --lr 1e-3 --moments-dir "$WORK/hm_state" --steps 20 --save-every 10)
  run_zt hostmem_probe "${hm_args[@]}" --out hm_probe --host-mem 1MiB
  hm_min=$(grep -Eo -- '--host-mem [0-9]+MiB or more' "$WORK/hostmem_probe.err" | grep -Eo '[0-9]+' | head -1)
  if [ -z "$hm_min" ]; then
    fail hostmem_train "the refusal of --host-mem 1MiB names no minimum"
  else
    hm_cap="$((hm_min + 1))MiB"
    run_zt hostmem_train "${hm_args[@]}" --out hm_run --host-mem "$hm_cap"
    if step_ok hostmem_train && need_files hostmem_train hm_run/ckpt_000010/model.safetensors \
      hm_run/ckpt_000020/optim.safetensors; then
      if ! grep -Eq "plan: host .* of --host-mem .*Adam moments on disk; fp32 masters on disk" "$WORK/hostmem_train.err"; then
        fail hostmem_train "the plan under --host-mem $hm_cap does not put the moments and the masters on disk"
      elif ! grep -q "fp32 masters on disk: blocks" "$WORK/hostmem_train.err"; then
        fail hostmem_train "the engine does not keep fp32 masters on disk"
      else
        pass hostmem_train
        cp -r hm_run hm_resumed
        rm -rf hm_resumed/ckpt_000020
        printf 'ckpt_000010' >hm_resumed/latest
        run_zt hostmem_resume train --resume hm_resumed --steps 20 --host-mem "$hm_cap"
        if step_ok hostmem_resume && need_files hostmem_resume hm_resumed/ckpt_000020/model.safetensors; then
          if cmp -s hm_run/ckpt_000020/model.safetensors hm_resumed/ckpt_000020/model.safetensors &&
            cmp -s hm_run/ckpt_000020/optim.safetensors hm_resumed/ckpt_000020/optim.safetensors; then
            pass hostmem_resume
          else
            fail hostmem_resume "the resumed run's step-20 checkpoint differs from the run that did not stop"
          fi
        fi
      fi
    fi
  fi
fi

export_ok=0
if [ $e2e_ok = 1 ]; then
  mkdir -p export
  run_zt e2e_export export --checkpoint run/ckpt_000030 --out export/model.safetensors
  if step_ok e2e_export && need_files e2e_export export/model.safetensors export/config.json; then
    pass e2e_export
    export_ok=1
  fi
fi

if [ $e2e_ok = 1 ]; then
  run_zt e2e_generate generate --checkpoint run --prompt "The " --max-new-tokens 20 --temperature 0.8 \
    --top-k 40 --seed 3
  if step_ok e2e_generate; then
    cp e2e_generate.out generated.txt
    nbytes=$(wc -c <generated.txt)
    if [ "$(head -c 4 generated.txt)" != "The " ]; then
      fail e2e_generate "stdout does not start with the prompt"
    elif [ "$nbytes" -lt 24 ]; then
      fail e2e_generate "stdout has $nbytes bytes, expected the 4-byte prompt and 20 generated bytes"
    else
      # The same seed gives the same text, from the run directory, the checkpoint or the export.
      run_zt e2e_generate_again generate --checkpoint run/ckpt_000030 --prompt "The " --max-new-tokens 20 \
        --temperature 0.8 --top-k 40 --seed 3
      if ! step_ok e2e_generate_again; then
        :
      elif ! cmp -s generated.txt e2e_generate_again.out; then
        fail e2e_generate "the same seed gave different text: '$(cat generated.txt)' vs '$(cat e2e_generate_again.out)'"
      elif [ $export_ok = 1 ]; then
        run_zt e2e_generate_export generate --weights export/model.safetensors --model export/config.json \
          --prompt "The " --max-new-tokens 20 --temperature 0.8 --top-k 40 --seed 3
        if step_ok e2e_generate_export; then
          if cmp -s generated.txt e2e_generate_export.out; then
            pass e2e_generate
          else
            fail e2e_generate_export "the exported weights gave different text than the checkpoint"
          fi
        fi
        # Sharded F32 (bit for bit the same weights, so the same text), then sharded BF16 (it loads and runs).
        mkdir -p shards shards16
        run_zt e2e_export_sharded export --checkpoint run/ckpt_000030 --out shards/model.safetensors \
          --max-shard-size 20KB
        nshards=$(ls shards/model-*-of-*.safetensors 2>/dev/null | wc -l)
        if step_ok e2e_export_sharded && need_files e2e_export_sharded shards/model.safetensors.index.json \
          shards/config.json; then
          if [ "$nshards" -lt 2 ]; then
            fail e2e_export_sharded "expected several shards of at most 20 KB, found $nshards"
          else
            run_zt e2e_generate_sharded generate --weights shards/model.safetensors.index.json \
              --model shards/config.json --prompt "The " --max-new-tokens 20 --temperature 0.8 --top-k 40 --seed 3
            if step_ok e2e_generate_sharded; then
              if cmp -s generated.txt e2e_generate_sharded.out; then
                pass e2e_export_sharded
              else
                fail e2e_export_sharded "the sharded export gave different text than the checkpoint"
              fi
            fi
          fi
        fi
        run_zt e2e_export_bf16 export --checkpoint run/ckpt_000030 --out shards16/model.safetensors \
          --dtype bf16 --max-shard-size 20KB
        if step_ok e2e_export_bf16 && need_files e2e_export_bf16 shards16/model.safetensors.index.json; then
          run_zt e2e_generate_bf16 generate --weights shards16 --model shards16/config.json --prompt "The " \
            --max-new-tokens 20 --seed 3
          step_ok e2e_generate_bf16 && pass e2e_export_bf16
        fi
      else
        pass e2e_generate
      fi
    fi
  fi

  # A conversation answered through a chat template: the reply alone on stdout (the rendered prompt, with
  # its <|im_start|> markers, is not echoed), at most --max-new-tokens bytes with the byte tokenizer.
  printf '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}\n' >chat.json
  run_zt e2e_generate_chat generate --checkpoint run --chat chat.json --chat-template chatml --max-new-tokens 12 \
    --temperature 0
  if step_ok e2e_generate_chat; then
    if grep -q 'im_start\|Be brief' e2e_generate_chat.out; then
      fail e2e_generate_chat "stdout echoes the rendered conversation: '$(cat e2e_generate_chat.out)'"
    elif [ "$(wc -c <e2e_generate_chat.out)" -gt 13 ]; then
      fail e2e_generate_chat "stdout has more than the 12 generated bytes and a newline"
    elif ! grep -q 'rendered with the chatml template' e2e_generate_chat.err; then
      fail e2e_generate_chat "the log does not say which template rendered the chat"
    else
      pass e2e_generate_chat
    fi
  fi

  run_zt e2e_plot plot --metrics run/metrics.jsonl --out plot.svg --title "cli test run"
  if step_ok e2e_plot && need_files e2e_plot plot.svg; then
    if ! grep -q '<svg' plot.svg; then
      fail e2e_plot "plot.svg is not an SVG document"
    elif command -v xmllint >/dev/null && ! xmllint --noout plot.svg 2>"$WORK/e2e_plot.err"; then
      fail e2e_plot "plot.svg is not well-formed XML"
    else
      pass e2e_plot
    fi
  fi
fi

# ---- bad data -----------------------------------------------------------------------------------------

train_case shard_truncated 1 't_train_000\.bin' 'truncat|short|expected .*bytes|size' -- \
  --train-data "$WORK/d2/t_train_*.bin"
train_case shard_bad_magic 1 'm_train_000\.bin' 'magic' -- --train-data "$WORK/d3/m_train_*.bin"
train_case vocab_mismatch 1 'vocab' '300|256' -- --train-data "$WORK/d4/v_train_*.bin"
train_case train_data_missing 1 'nope_train_\*\.bin|nope' 'no (file|shard)s?|match|not found|no such|does not exist' -- \
  --train-data "$WORK/nope/nope_train_*.bin"

# ---- bad supervised fine-tuning data (--sft-data) ---------------------------------------------------------

cp "$SRC/examples/llama-tiny.json" "$WORK/llama.json"
cat >"$WORK/model_bert.json" <<'EOF'
{"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 32, "num_hidden_layers": 1,
 "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 256, "max_position_embeddings": 64}
EOF
mkdir -p "$WORK/sftd"
cp "$SRC/examples/byte-tokenizer.json" "$WORK/sftd/tok.json" # no tokenizer_config.json beside it: no template
printf '{"prompt": "a", "completion": "b"}\nnot json\n' >"$WORK/sftd/malformed.jsonl"
printf '{"instruction": "a", "output": "b"}\n{"instruction": "c"}\n' >"$WORK/sftd/missing.jsonl"
printf '%s\n' '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}' \
  '{"messages": [{"role": "robot", "content": "a"}, {"role": "assistant", "content": "b"}]}' >"$WORK/sftd/role.jsonl"
printf '%s\n' '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}' \
  '{"messages": [{"role": "user", "content": "a"}]}' >"$WORK/sftd/noassist.jsonl"
printf '{"prompt": "a", "completion": ""}\n{"prompt": "b", "completion": ""}\n' >"$WORK/sftd/empty.jsonl"
{
  printf '{"prompt": "a", "completion": "b"}\n{"prompt": "'
  printf 'x%.0s' {1..100}
  printf '", "completion": "b"}\n'
} >"$WORK/sftd/long.jsonl"

# sft_case NAME CODES REGEX... -- ARGS...: a fine-tuning `ztrain train` of a tiny LLaMA that must fail, as
# train_case does.
sft_case() {
  local name=$1
  shift
  n_train_cases=$((n_train_cases + 1))
  local run_dir="$WORK/out_$n_train_cases"
  local pre=()
  while [ "$1" != "--" ]; do
    pre+=("$1")
    shift
  done
  shift
  expect_error "$name" "${pre[@]}" -- train --model "$WORK/llama.json" --tokenizer "$WORK/sftd/tok.json" \
    --steps 2 --batch-size 2 --seq-len 64 --threads 1 --out "$run_dir" "$@" &&
    expect_no_run_output "$name" "$run_dir" && pass "$name"
}

sft_case sft_malformed_line 1 'malformed\.jsonl:2' 'not valid JSON' 'one JSON object' -- \
  --sft-data "$WORK/sftd/malformed.jsonl"
sft_case sft_missing_field 1 'missing\.jsonl:2' '"output" is missing' 'needs "instruction" and "output"' -- \
  --sft-data "$WORK/sftd/missing.jsonl"
sft_case sft_unknown_role 1 'role\.jsonl:2' "unknown role 'robot'" 'system, user and assistant' -- \
  --sft-data "$WORK/sftd/role.jsonl" --chat-template chatml
sft_case sft_no_assistant 1 'noassist\.jsonl:2' 'no assistant message' "add the assistant's answer" -- \
  --sft-data "$WORK/sftd/noassist.jsonl" --chat-template chatml
sft_case sft_no_template 1 'role\.jsonl:1' 'no chat template' '--chat-template NAME' -- \
  --sft-data "$WORK/sftd/role.jsonl"
sft_case sft_unknown_template '1|2' '--chat-template' "unknown chat template 'vicuna'" 'chatml, qwen2' -- \
  --sft-data "$WORK/sftd/role.jsonl" --chat-template vicuna
sft_case sft_pack_without_examples '1|2' '--sft-pack' 'setting of supervised fine-tuning' '--sft-data' -- \
  --train-data "$WORK/d1/d_train_*.bin" --sft-pack
sft_case sft_pack_masked_lm '1|2' '--sft-pack' 'decoder models' 'bert model \(masked LM\)' 'drop' -- \
  --model "$WORK/model_bert.json" --sft-data "$WORK/sftd/role.jsonl" --chat-template chatml --sft-pack
sft_case sft_all_masked 1 'empty\.jsonl' 'no examples to train on' 'trained token' -- \
  --sft-data "$WORK/sftd/empty.jsonl"
sft_case sft_overlong_refused 1 'long\.jsonl' 'line 2' 'longer than the sequence length 64' \
  '--sft-overlong truncate' -- --sft-data "$WORK/sftd/long.jsonl" --sft-overlong refuse
sft_case sft_with_shards '1|2' '--train-data' '--sft-data' 'not both' -- --sft-data "$WORK/sftd/role.jsonl" \
  --train-data "$WORK/d1/d_train_*.bin"
sft_case sft_val_shards '1|2' '--val-data' '--sft-val-data' -- --sft-data "$WORK/sftd/role.jsonl" \
  --chat-template chatml --val-data "$WORK/d1/d_train_*.bin"
sft_case sft_encoder_model '1|2' '--sft-data' 'decoder' -- --model "$WORK/model_bert.json" \
  --sft-data "$WORK/sftd/role.jsonl"

# ---- bad weights for --init-from --------------------------------------------------------------------------

train_case init_from_truncated 1 'wa\.safetensors' 'truncat|past the end|beyond|short|outside' -- \
  --init-from "$WORK/wa.safetensors"
train_case init_from_bad_json 1 'wb\.safetensors' 'header|syntax|parse|invalid|not valid' -- --init-from "$WORK/wb.safetensors"
train_case init_from_bad_offsets 1 'wc\.safetensors' 'offset|bytes|shape' -- \
  --init-from "$WORK/wc.safetensors"
train_case init_from_missing 1 'no_such\.safetensors' 'no such|not exist|not found|cannot' -- \
  --init-from "$WORK/no_such.safetensors"
if [ $export_ok = 1 ]; then
  head -c $(($(wc -c <export/model.safetensors) - 100)) export/model.safetensors >cut.safetensors
  train_case init_from_cut_export 1 'cut\.safetensors' 'truncat|past the end|beyond|short|outside' -- \
    --init-from "$WORK/cut.safetensors"
fi

# ---- bad configuration --------------------------------------------------------------------------------

cat >unknown_key.json <<'EOF'
{"model": "model.json", "stepz": 10}
EOF
train_case config_unknown_key '1|2' 'stepz' 'did you mean' '"?steps"?' -- --config "$WORK/unknown_key.json"
train_case config_missing 1 'no_config\.json' 'no such|not exist|not found|cannot' -- --config "$WORK/no_config.json"
train_case model_heads_indivisible 1 'n_embd' 'n_head' 'divisible|multiple' -- --model "$WORK/model_bad_heads.json"
train_case seq_len_too_long '1|2' 'seq.len' 'n_positions|positions' -- --seq-len 128
train_case model_missing 1 'no_model\.json' 'no such|not exist|not found|cannot' -- --model "$WORK/no_model.json"

# ---- unwritable output --------------------------------------------------------------------------------------

# Tests run as root, so permissions do not stop a write: use a parent that is a regular file, and /proc.
train_case out_parent_is_file 1 'afile' 'not a directory|cannot|create|writ' -- --out "$WORK/afile/run"
train_case out_under_proc 1 '/proc/zt_no_such_dir' 'cannot|create|writ|no such|permission|not permitted' -- \
  --out /proc/zt_no_such_dir/run

# ---- bad flags -------------------------------------------------------------------------------------------

train_case flag_steps_not_a_number 2 '--steps' "'?abc'?" -- --steps abc
train_case flag_lr_negative 2 '--lr' -- --lr -1
train_case flag_unknown 2 'bogus' -- --bogus 3
train_case flag_missing_value 2 '--seq-len|value|argument' -- --seq-len
train_case flag_batch_zero 2 '--batch-size' -- --batch-size 0
if expect_error command_unknown 2 'frobnicate' -- frobnicate; then pass command_unknown; fi
if expect_error export_bad_dtype 2 '--dtype' 'bf16' -- export --checkpoint "$WORK/run" --out "$WORK/x/m.safetensors" \
  --dtype fp8 && expect_no_output export_bad_dtype "$WORK/x"; then
  pass export_bad_dtype
fi
if expect_error export_bad_shard_size 2 '--max-shard-size' -- export --checkpoint "$WORK/run" \
  --out "$WORK/x/m.safetensors" --max-shard-size lots && expect_no_output export_bad_shard_size "$WORK/x"; then
  pass export_bad_shard_size
fi
if expect_error export_tokenizer_missing 2 '--tokenizer' 'no_such_tokenizer\.json' -- export --checkpoint "$WORK/run" \
  --out "$WORK/x" --tokenizer "$WORK/no_such_tokenizer.json" &&
  expect_no_output export_tokenizer_missing "$WORK/x"; then
  pass export_tokenizer_missing
fi
if [ -d "$WORK/run" ]; then # the run directory's config.json is the run's own: exporting there would replace it
  cp "$WORK/run/config.json" "$WORK/run_config_before"
  if expect_error export_into_run 2 'run directory' 'another folder' -- export --checkpoint "$WORK/run" \
    --out "$WORK/run"; then
    if cmp -s "$WORK/run/config.json" "$WORK/run_config_before" && [ ! -e "$WORK/run/model.safetensors" ]; then
      pass export_into_run
    else
      fail export_into_run "changed the run directory"
    fi
  fi
fi
train_case flag_gpu_mem_not_a_size 2 '--gpu-mem' 'lots' -- --gpu-mem lots
train_case flag_gpu_mem_on_cpu 2 'gpu_mem' '--device cuda' -- --gpu-mem 4GiB
train_case flag_offload_unknown 2 '--offload' 'nvme:DIR' -- --offload disk
train_case flag_weights_host_on_cpu 2 'weights' '--device cuda' -- --weights host
train_case flag_adam_moments_unknown 2 '--adam-moments' 'fp32 or bf16' -- --adam-moments fp8
train_case flag_adam_moments_optimizer_server 2 'adam_moments' '--optimizer cpu' -- --adam-moments bf16 --optimizer server
train_case flag_moments_dir_optimizer_server 2 'moments_dir' '--optimizer cpu' -- --moments-dir /tmp --optimizer server
train_case flag_server_shm_unknown 2 '--server-shm' 'auto or off' -- --server-shm tcp
train_case flag_server_shm_without_servers 2 'server_shm' '--servers host:port' -- --server-shm off --optimizer server
train_case flag_host_mem_not_a_size 2 '--host-mem' -- --host-mem lots
train_case flag_host_mem_below_minimum 1 'host-mem 1\.00 MiB is below' 'smallest plan: at least [0-9.]+ [KM]iB' \
  'what would fit: --host-mem [0-9]+MiB or more' -- --host-mem 1MiB
train_case flag_host_mem_below_minimum_with_dir 1 'smallest plan: at least' 'moments and fp32 masters on disk' \
  '--host-mem [0-9]+MiB or more' -- --host-mem 1MiB --moments-dir "$WORK"
train_case flag_moments_ram_without_dir 2 'moments_ram' '--moments-dir DIR' -- --moments-ram 3GiB
train_case flag_moments_ram_not_a_size 2 '--moments-ram' '11GiB' -- --moments-ram lots
if expect_error finetune_without_init 2 'finetune' '--init-from' -- finetune --train-data "$WORK/d1/d_train_*.bin" \
  --out "$WORK/ft1" && expect_no_run_output finetune_without_init "$WORK/ft1"; then
  pass finetune_without_init
fi
mkdir -p lone
cp wa.safetensors lone/model.safetensors
if expect_error finetune_no_config_beside 2 'config\.json' '--model' -- finetune --init-from "$WORK/lone/model.safetensors" \
  --train-data "$WORK/d1/d_train_*.bin" --out "$WORK/ft2" && expect_no_run_output finetune_no_config_beside "$WORK/ft2"; then
  pass finetune_no_config_beside
fi
if expect_error generate_bad_temperature 2 '--temperature' -- generate --checkpoint "$WORK/run" --temperature -1; then
  pass generate_bad_temperature
fi
if expect_error generate_weights_without_model 2 '--model' -- generate --weights "$WORK/wa.safetensors"; then
  pass generate_weights_without_model
fi
# generate --chat: bad conversations and flags, each named with its fix
printf '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n' >chat_ends_assistant.json
printf '{"messages": [{"role": "robot", "content": "a"}]}\n' >chat_role.json
printf '{"turns": [{"role": "user", "content": "a"}]}\n' >chat_nomessages.json
printf '{"messages": [{"role": "user", "content": "a"}]}\n' >chat_ok.json
if expect_error generate_chat_ends_assistant 1 'chat_ends_assistant\.json' 'ends with an assistant message' \
  'end it with the user message' -- generate --checkpoint "$WORK/run" --chat chat_ends_assistant.json --chat-template chatml; then
  pass generate_chat_ends_assistant
fi
if expect_error generate_chat_role 1 'chat_role\.json' "message 1 has the unknown role 'robot'" 'system, user and assistant' \
  -- generate --checkpoint "$WORK/run" --chat chat_role.json --chat-template chatml; then
  pass generate_chat_role
fi
if expect_error generate_chat_no_messages 1 'chat_nomessages\.json' 'holds no "messages"' '\{"messages": ' -- \
  generate --checkpoint "$WORK/run" --chat chat_nomessages.json --chat-template chatml; then
  pass generate_chat_no_messages
fi
if expect_error generate_chat_no_template 1 'no chat template' '--chat-template NAME' 'chatml, qwen2' -- \
  generate --checkpoint "$WORK/run" --chat chat_ok.json; then
  pass generate_chat_no_template
fi
if expect_error generate_chat_unknown_template 1 "--chat-template: unknown chat template 'vicuna'" 'llama3' -- \
  generate --checkpoint "$WORK/run" --chat chat_ok.json --chat-template vicuna; then
  pass generate_chat_unknown_template
fi
if expect_error generate_chat_and_prompt 2 '--prompt TEXT or --chat FILE, not both' -- \
  generate --checkpoint "$WORK/run" --chat chat_ok.json --prompt hi; then
  pass generate_chat_and_prompt
fi
if expect_error generate_template_without_chat 2 'give --chat FILE too' -- \
  generate --checkpoint "$WORK/run" --chat-template chatml; then
  pass generate_template_without_chat
fi
if expect_error generate_beams_and_temperature 2 '--num-beams searches deterministically' 'drop them' -- \
  generate --checkpoint "$WORK/run" --num-beams 2 --temperature 0.5; then
  pass generate_beams_and_temperature
fi
if expect_error generate_too_many_beams 1 '--num-beams 200' 'give 1 to 128' -- \
  generate --checkpoint "$WORK/run" --num-beams 200 --max-new-tokens 3; then
  pass generate_too_many_beams
fi
if expect_error plot_unknown_flag 2 'colour' -- plot --metrics m.jsonl --out p.svg --colour red &&
  expect_no_output plot_unknown_flag p.svg; then
  pass plot_unknown_flag
fi

# ---- corrupted checkpoint for --resume ------------------------------------------------------------------

if [ -d run_before_resume ]; then
  cp -r run_before_resume run_corrupt
  ckpt=$(tr -d '[:space:]' <run_corrupt/latest)
  st="run_corrupt/$ckpt/model.safetensors"
  flip_byte "$st" $(($(wc -c <"$st") - 5)) # in the tensor data: the header still parses
  if expect_error resume_corrupt_checkpoint 1 'crc|checksum' 'model\.safetensors' -- \
    train --resume "$WORK/run_corrupt" --steps 40 &&
    expect_no_output resume_corrupt_checkpoint run_corrupt/ckpt_000030 run_corrupt/ckpt_000040; then
    if [ -n "$(find run_corrupt -name '*.tmp')" ]; then
      fail resume_corrupt_checkpoint "left .tmp entries: $(find run_corrupt -name '*.tmp' | tr '\n' ' ')"
    elif [ "$(tr -d '[:space:]' <run_corrupt/latest)" != "$ckpt" ]; then
      fail resume_corrupt_checkpoint "run_corrupt/latest changed to '$(cat run_corrupt/latest)'"
    else
      pass resume_corrupt_checkpoint
    fi
  fi
else
  fail resume_corrupt_checkpoint "not run: the end-to-end training run did not produce a checkpoint"
fi
if expect_error resume_missing 1 'no_such_run' 'not exist|no such|not found|cannot' -- train --resume "$WORK/no_such_run" --steps 5 &&
  expect_no_output resume_missing "$WORK/no_such_run"; then
  pass resume_missing
fi

# ---- generate, export, tokenize and plot with missing or bad inputs ----------------------------------------

if expect_error generate_missing_checkpoint 1 'no_such_ckpt' 'not exist|no such|not found|cannot' -- \
  generate --checkpoint "$WORK/no_such_ckpt" --max-new-tokens 5; then
  pass generate_missing_checkpoint
fi
if expect_error generate_corrupt_weights 1 'wc\.safetensors' 'offset|bytes|shape' -- \
  generate --weights "$WORK/wc.safetensors" --model "$WORK/model.json" --max-new-tokens 5; then
  if [ -s "$WORK/generate_corrupt_weights.out" ]; then
    fail generate_corrupt_weights "printed text to stdout although the weights could not be loaded"
  else
    pass generate_corrupt_weights
  fi
fi
if expect_error export_missing_checkpoint 1 'no_such_ckpt' 'not exist|no such|not found|cannot' -- \
  export --checkpoint "$WORK/no_such_ckpt" --out "$WORK/exp_missing.safetensors" &&
  expect_no_output export_missing_checkpoint "$WORK/exp_missing.safetensors" "$WORK/exp_missing.safetensors.tmp" \
    "$WORK/config.json"; then
  pass export_missing_checkpoint
fi
if expect_error tokenize_missing_input 1 'no_such_corpus\.txt' 'not exist|no such|not found|cannot' -- \
  tokenize --input "$WORK/no_such_corpus.txt" --out-dir "$WORK/tok_missing"; then
  if [ -d tok_missing ] && [ -n "$(find tok_missing -type f)" ]; then
    fail tokenize_missing_input "left files behind: $(find tok_missing -type f | tr '\n' ' ')"
  else
    pass tokenize_missing_input
  fi
fi
# tokenizer.json files that are refused: an unimplemented component (named by its JSON path); a text that
# is not UTF-8; and 32-bit shards (a vocabulary over 65536 ids) whose ids the model has no row for.
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Whitespace"}}' >tok_ws.json
printf '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 70000}, "merges": []}}' >tok_big.json
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}' >tok_ok.json
printf 'caf\xe9\n' >latin1.txt
if expect_error tokenize_unsupported_tokenizer 1 'pre_tokenizer\.type' 'Whitespace' -- \
  tokenize --input latin1.txt --out-dir "$WORK/tok_unsup" --tokenizer "$WORK/tok_ws.json" &&
  expect_no_output tokenize_unsupported_tokenizer "$WORK/tok_unsup"; then
  pass tokenize_unsupported_tokenizer
fi
for ((i = 0; i < 40; i++)); do printf 'ab'; done >ab.txt
run_zt tokenize_big tokenize --input "$WORK/ab.txt" --out-dir "$WORK/tok_big" --tokenizer "$WORK/tok_big.json"
if [ "$rc" -eq 0 ] && grep -q '32-bit tokens' "$WORK/tokenize_big.out"; then
  train_case vocab_mismatch_32bit 1 'ab_train_000000\.bin' '70000' -- --train-data "$WORK/tok_big/ab_train_*.bin"
else
  fail vocab_mismatch_32bit "tokenize with a 70001-id tokenizer did not write 32-bit shards (exit $rc): $(cat \
    "$WORK/tokenize_big.err")"
fi
if expect_error tokenize_not_utf8 1 'latin1\.txt' 'UTF-8' -- \
  tokenize --input latin1.txt --out-dir "$WORK/tok_latin1" --tokenizer "$WORK/tok_ok.json" &&
  expect_no_output tokenize_not_utf8 "$WORK/tok_latin1"; then
  pass tokenize_not_utf8
fi
# Too few tokens to split off a validation part: the fix is more text or --val-fraction 0. A text that
# gives no token at all (only spaces, which this WordPiece tokenizer drops) is refused whatever the
# fraction, and the message names that fix, not --val-fraction 0.
printf 'a' >one_byte.txt
if expect_error tokenize_too_few_tokens 1 '1 token' 'validation' 'give more text or --val-fraction 0' -- \
  tokenize --input one_byte.txt --out-dir "$WORK/tok_few" --val-fraction 0.1 &&
  expect_no_output tokenize_too_few_tokens "$WORK/tok_few"; then
  pass tokenize_too_few_tokens
fi
printf '{"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"}, ' >tok_wp.json
printf '"pre_tokenizer": {"type": "WhitespaceSplit"}}' >>tok_wp.json
printf '   \n \n\t \n' >spaces.txt
for frac in 0 0.1; do
  name=tokenize_no_tokens_$frac
  if expect_error "$name" 1 'spaces\.txt' 'no text that the tokenizer turns into tokens' 'give a file with words' -- \
    tokenize --input spaces.txt --out-dir "$WORK/tok_none" --tokenizer "$WORK/tok_wp.json" --val-fraction $frac &&
    expect_no_output "$name" "$WORK/tok_none"; then
    if grep -q -- '--val-fraction' "$WORK/$name.err"; then
      fail "$name" "the message offers --val-fraction, which cannot help a text with no tokens"
    else
      pass "$name"
    fi
  fi
done
if [ -d run ]; then # the end-to-end run's checkpoints
  if expect_error generate_unsupported_tokenizer 1 'pre_tokenizer\.type' 'Whitespace' -- \
    generate --checkpoint "$WORK/run" --tokenizer "$WORK/tok_ws.json" --max-new-tokens 5; then
    if [ -s "$WORK/generate_unsupported_tokenizer.out" ]; then
      fail generate_unsupported_tokenizer "printed text to stdout although the tokenizer was refused"
    else
      pass generate_unsupported_tokenizer
    fi
  fi
fi
if expect_error plot_missing_metrics 1 'no_such_metrics\.jsonl' 'not exist|no such|not found|cannot' -- \
  plot --metrics "$WORK/no_such_metrics.jsonl" --out "$WORK/missing.svg" &&
  expect_no_output plot_missing_metrics "$WORK/missing.svg" "$WORK/missing.svg.tmp"; then
  pass plot_missing_metrics
fi
printf 'not json\n{"step": "x"}\n' >junk_metrics.jsonl
if expect_error plot_no_points 1 'junk_metrics\.jsonl' 'no train or eval|nothing to plot|no point' -- \
  plot --metrics "$WORK/junk_metrics.jsonl" --out "$WORK/junk.svg" &&
  expect_no_output plot_no_points "$WORK/junk.svg" "$WORK/junk.svg.tmp"; then
  pass plot_no_points
fi
printf '{"step":1,"loss":5.5,"lr":1e-4}\n{"step":2,"loss":5.0,"lr":2e-4}\n' >small_metrics.jsonl
if expect_error plot_out_parent_is_file 1 'afile' 'not a directory|cannot|create|writ' -- plot --metrics "$WORK/small_metrics.jsonl" --out "$WORK/afile/p.svg" &&
  expect_no_output plot_out_parent_is_file "$WORK/afile/p.svg"; then
  pass plot_out_parent_is_file
fi

echo
echo "cli_bad_input: $passed passed, $failed failed"
if [ $failed -gt 0 ]; then
  echo "failed: ${failed_names[*]}"
  exit 1
fi
exit 0

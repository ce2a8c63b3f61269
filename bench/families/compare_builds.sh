#!/usr/bin/env bash
# Trains the same small models with two builds of ztrain and compares what they wrote, bit for bit: every
# step's loss and gradient norm (metrics.jsonl without its timings) and the checkpoint's safetensors files
# (weights, Adam moments). For checking that a change to the model code keeps the CPU results.
#   bench/families/compare_builds.sh OLD_ZTRAIN NEW_ZTRAIN [WORK_DIR]
# Models: GPT-2, LLaMA (GQA, untied head), Qwen2 (q/k/v biases, tied head), Mistral (one key/value head,
# llama3 rope scaling, two end ids), GPT-NeoX (partial rotary, parallel residual), BERT masked LM, RoBERTa
# classification, T5 v1.1 (gated-gelu, untied head, more decoder than encoder layers) and v1.0 (relu, tied)
# on input/target pairs; each at 1, 2 and 3 CPU ranks (ztrain launch), with every layer checkpointed at 2 ranks.
# The checkpoints' model_config.json files are compared too, key by key (what `ztrain export` writes).
# Prints one line per run and exits 1 on any difference. MODELS="gpt2 neox" runs only those.
set -euo pipefail
old=$(realpath "$1"); new=$(realpath "$2")
work=${3:-$(mktemp -d)}
mkdir -p "$work"
cd "$(dirname "$0")/../.."
root=$PWD
py=${PYTHON:-$root/.venv/bin/python3}
steps=6

# Data: byte-level shards of the bundled corpus; a WordPiece tokenizer with labelled texts, and shards of
# those texts for the masked LM.
"$new" tokenize --input data/corpus.txt --out-dir "$work/bytes" --name c > /dev/null
"$py" bench/make_cls_data.py "$work/cls" 96 40 > /dev/null
"$py" - "$work/cls" <<'PY'
import json, sys
d = sys.argv[1]
with open(f"{d}/train.jsonl") as f, open(f"{d}/texts.txt", "w") as out:
    for line in f:
        out.write(json.loads(line)["text"] + "\n")
PY
"$py" - "$work/t5.jsonl" <<'PY'
import json, random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for _ in range(64):
        w = "".join(r.choice("abcdefgh") for _ in range(r.randint(3, 9)))
        f.write(json.dumps({"input": "reverse: " + w, "target": w[::-1]}) + "\n")
PY
"$new" tokenize --input "$work/cls/texts.txt" --tokenizer "$work/cls/tokenizer.json" --out-dir "$work/mlm" \
  --name t > /dev/null

cat > "$work/gpt2.json" <<'J'
{"model_type": "gpt2", "n_layer": 3, "n_head": 4, "n_embd": 64, "n_positions": 64, "vocab_size": 256}
J
cat > "$work/llama.json" <<'J'
{"model_type": "llama", "hidden_size": 48, "intermediate_size": 88, "num_hidden_layers": 3,
 "num_attention_heads": 6, "num_key_value_heads": 2, "max_position_embeddings": 64, "vocab_size": 256,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
J
cat > "$work/qwen2.json" <<'J'
{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 48, "intermediate_size": 72,
 "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "max_position_embeddings": 64,
 "vocab_size": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true,
 "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 2}
J
cat > "$work/mistral.json" <<'J'
{"model_type": "mistral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 1, "max_position_embeddings": 64, "vocab_size": 256,
 "sliding_window": null, "eos_token_id": [2, 3], "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
 "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}
J
cat > "$work/neox.json" <<'J'
{"model_type": "gpt_neox", "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
 "num_attention_heads": 3, "max_position_embeddings": 64, "vocab_size": 256, "rotary_pct": 0.25,
 "rotary_emb_base": 10000, "use_parallel_residual": true, "hidden_act": "gelu", "layer_norm_eps": 1e-5}
J
cat > "$work/bert.json" <<'J'
{"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 30522, "hidden_size": 32,
 "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 64}
J
cat > "$work/roberta.json" <<'J'
{"model_type": "roberta", "architectures": ["RobertaForSequenceClassification"], "vocab_size": 30522,
 "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
 "max_position_embeddings": 66, "pad_token_id": 0, "num_labels": 2}
J

cat > "$work/t5.json" <<'J'
{"model_type": "t5", "vocab_size": 256, "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 2,
 "num_decoder_layers": 3, "num_heads": 4, "relative_attention_num_buckets": 8, "relative_attention_max_distance": 20,
 "feed_forward_proj": "gated-gelu", "tie_word_embeddings": false, "initializer_factor": 0.5, "pad_token_id": 0,
 "eos_token_id": 1, "decoder_start_token_id": 0}
J
cat > "$work/t5v10.json" <<'J'
{"model_type": "t5", "vocab_size": 256, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 3,
 "num_decoder_layers": 2, "num_heads": 4, "relative_attention_num_buckets": 8, "feed_forward_proj": "relu",
 "tie_word_embeddings": true, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}
J

data_flags() {
  case $1 in
    t5|t5v10) echo "--sft-data $work/t5.jsonl --sft-val-data $work/t5.jsonl --tokenizer examples/byte-tokenizer.json --target-len 16" ;;
    gpt2|llama|qwen2|mistral|neox) echo "--train-data $work/bytes/c_train_*.bin --val-data $work/bytes/c_val_*.bin" ;;
    bert) echo "--train-data $work/mlm/t_train_*.bin --val-data $work/mlm/t_val_*.bin --tokenizer $work/cls/tokenizer.json" ;;
    roberta) echo "--train-data $work/cls/train.jsonl --val-data $work/cls/train.jsonl --tokenizer $work/cls/tokenizer.json" ;;
  esac
}

# The step lines of metrics.jsonl without the fields that are timings.
strip_metrics() {
  "$py" -c '
import json, sys
for line in open(sys.argv[1]):
    o = json.loads(line)
    for k in ("tokens_per_s", "elapsed_s", "time", "seconds"):
        o.pop(k, None)
    print(json.dumps(o, sort_keys=True))' "$1"
}

# Whether two JSON files hold the same keys with the same values written the same way (numbers compared as
# their text: 10000 and 10000.0 differ), whatever the order of the keys.
same_json() {
  "$py" -c '
import json, sys
load = lambda p: json.load(open(p), parse_float=str, parse_int=str)
sys.exit(0 if load(sys.argv[1]) == load(sys.argv[2]) else 1)' "$1" "$2"
}

fail=0
port=29611
for model in ${MODELS:-gpt2 llama qwen2 mistral neox bert roberta t5 t5v10}; do
  for W in 1 2 3; do
    for ckpt in none all; do
      [ "$ckpt" = all ] && [ "$W" != 2 ] && continue
      for which in old new; do
        bin=$old; [ $which = new ] && bin=$new
        outdir="$work/run_${model}_${W}_${ckpt}_$which"
        rm -rf "$outdir"
        port=$((port + 1))
        # shellcheck disable=SC2046
        "$bin" launch --nproc "$W" --master-port "$port" train --model "$work/$model.json" $(data_flags $model) \
          --out "$outdir" --steps $steps --batch-size 6 --seq-len 32 --grad-accum 2 --lr 1e-3 --eval-every 3 \
          --eval-batches 2 --save-every 3 --seed 7 --checkpointing "$ckpt" --threads 1 > "$outdir.log" 2>&1 || {
          echo "FAIL $model W=$W ckpt=$ckpt: the $which build failed (log $outdir.log)"; tail -3 "$outdir.log"; fail=1; continue 2; }
      done
      a="$work/run_${model}_${W}_${ckpt}_old" b="$work/run_${model}_${W}_${ckpt}_new"
      diffs=""
      cmp -s <(strip_metrics "$a/metrics.jsonl") <(strip_metrics "$b/metrics.jsonl") || diffs+=" metrics.jsonl"
      for f in "$a"/ckpt_*/*.safetensors; do
        rel=${f#"$a"/}
        cmp -s "$f" "$b/$rel" || diffs+=" $rel"
      done
      for f in "$a"/ckpt_*/model_config.json; do
        rel=${f#"$a"/}
        same_json "$f" "$b/$rel" || diffs+=" $rel"
      done
      files=$(ls "$a"/ckpt_*/*.safetensors | wc -l)
      if [ -n "$diffs" ]; then
        echo "DIFF $model W=$W checkpointing=$ckpt:$diffs"; fail=1
      else
        echo "same $model W=$W checkpointing=$ckpt: $steps steps of losses and grad norms, $files safetensors files"
      fi
    done
  done
done
exit $fail

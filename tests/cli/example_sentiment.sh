#!/usr/bin/env bash
# The BERT classification example (examples/sentiment.json): its files are what examples/make_sentiment.py
# writes; 150 steps of `ztrain train --config examples/sentiment.json` (one thread, the example's seed) lift
# the validation accuracy from chance to at least 0.7 and lower the validation loss by at least 0.1 (the
# full 300-step run reaches 1.0); and `ztrain export --out DIR` of that run writes the run's tokenizer
# byte for byte beside config.json and the weights, a folder that transformers' AutoConfig reads as the
# example's BertForSequenceClassification with its labels.
#
# Usage: bash tests/cli/example_sentiment.sh PATH/TO/ztrain PATH/TO/python3   (ctest: cli_example_sentiment)
set -u
if [ $# -ne 2 ] || [ ! -x "$1" ]; then
  echo "usage: bash $0 PATH/TO/ztrain PATH/TO/python3" >&2
  exit 2
fi
ZT=$(realpath "$1")
PY=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zt_sentiment_XXXXXX")
trap 'rm -rf "$WORK"' EXIT
failed=0
fail() {
  echo "FAIL $1"
  failed=1
}

# 1. The committed data and tokenizer are the generator's output.
if "$PY" "$SRC/examples/make_sentiment.py" "$WORK/gen" >"$WORK/gen.log" 2>&1; then
  for f in sentiment-train.jsonl sentiment-val.jsonl sentiment-tokenizer.json; do
    cmp -s "$WORK/gen/$f" "$SRC/examples/$f" || fail "examples/$f differs from what examples/make_sentiment.py writes"
  done
else
  fail "examples/make_sentiment.py failed: $(tail -3 "$WORK/gen.log")"
fi

# 2. Training rises above chance.
if "$ZT" train --config "$SRC/examples/sentiment.json" --steps 150 --threads 1 --eval-every 150 \
  --save-every 150 --out "$WORK/run" >"$WORK/train.log" 2>&1; then
  "$PY" - "$WORK/run/metrics.jsonl" <<'PYEOF' || failed=1
import json, sys
evals = [r for r in map(json.loads, open(sys.argv[1])) if "val_accuracy" in r]
if [r["step"] for r in evals] != [0, 150]:
    sys.exit(f"FAIL expected evaluations at steps 0 and 150, found {[r['step'] for r in evals]}")
first, last = evals
print(f"val accuracy {first['val_accuracy']:.3f} -> {last['val_accuracy']:.3f}, "
      f"loss {first['val_loss']:.4f} -> {last['val_loss']:.4f}")
if not (last["val_accuracy"] >= 0.7 and last["val_loss"] <= first["val_loss"] - 0.1):
    sys.exit("FAIL the classifier did not learn: accuracy below 0.7 or loss not 0.1 lower")
PYEOF
else
  fail "ztrain train --config examples/sentiment.json failed: $(tail -3 "$WORK/train.log")"
fi

# 3. The export folder carries the run's tokenizer and loads as the example's classifier.
if [ -d "$WORK/run/ckpt_000150" ]; then
  if "$ZT" export --checkpoint "$WORK/run" --out "$WORK/export" >"$WORK/export.log" 2>&1; then
    cmp -s "$WORK/export/tokenizer.json" "$SRC/examples/sentiment-tokenizer.json" ||
      fail "the export's tokenizer.json is not the run's examples/sentiment-tokenizer.json"
    [ -f "$WORK/export/model.safetensors" ] || fail "the export has no model.safetensors"
    "$PY" - "$WORK/export" <<'PYEOF' 2>"$WORK/autoconfig.err" || { failed=1; tail -3 "$WORK/autoconfig.err"; }
import sys
from transformers import AutoConfig
c = AutoConfig.from_pretrained(sys.argv[1])
got = (c.model_type, c.architectures, c.id2label, c.hidden_size, c.num_hidden_layers)
want = ("bert", ["BertForSequenceClassification"], {0: "negative", 1: "positive"}, 128, 4)
if got != want:
    sys.exit(f"FAIL AutoConfig reads {got}, expected {want}")
PYEOF
  else
    fail "ztrain export --out DIR failed: $(tail -3 "$WORK/export.log")"
  fi
fi
[ $failed = 0 ] && echo "ok: the sentiment example trains and exports"
exit $failed

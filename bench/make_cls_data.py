#!/usr/bin/env python3
"""Writes a classification data set for the BERT benchmarks: make_cls_data.py OUT_DIR [N_TRAIN] [WORDS]
OUT_DIR/tokenizer.json: a WordPiece tokenizer (BERT's normalizer, pre-tokenizer and [CLS]/[SEP] post-processor)
over 30522 ids: [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103 as in bert-base-uncased, words "w<i>"
elsewhere. OUT_DIR/train.jsonl: N_TRAIN examples of WORDS random words (default 2048 of 600: every example
fills 512 positions after truncation, as the PyTorch baseline's random tokens do) with a label 0 or 1."""
import json
import os
import random
import sys


def main():
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    words = int(sys.argv[3]) if len(sys.argv) > 3 else 600
    os.makedirs(out, exist_ok=True)
    special = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}
    vocab = {special.get(i, f"w{i}"): i for i in range(30522)}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in sorted(special.items())]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                          "strip_accents": None, "lowercase": True},
           "pre_tokenizer": {"type": "BertPreTokenizer"},
           "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]},
           "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
           "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                     "max_input_chars_per_word": 100, "vocab": vocab}}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    rng = random.Random(1234)
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        for _ in range(n):
            text = " ".join(f"w{rng.randrange(104, 30522)}" for _ in range(words))
            f.write(json.dumps({"text": text, "label": rng.randrange(2)}) + "\n")


if __name__ == "__main__":
    main()

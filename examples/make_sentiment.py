#!/usr/bin/env python3
"""Writes the sentiment example that examples/sentiment.json trains: python3 examples/make_sentiment.py [OUT_DIR]

examples/sentiment-train.jsonl and sentiment-val.jsonl: short reviews ("the soup was really tasty") labelled
"positive" or "negative", made from templates, subjects, intensifiers and opinion words with a fixed seed
(800 and 200 distinct texts, one in three negated: "not tasty" is negative, "never boring"
positive; the validation texts are not in the training file, their words are).
examples/sentiment-tokenizer.json: a WordPiece tokenizer of the training texts' words, made with the
`tokenizers` package (BERT's normalizer, pre-tokenizer and [CLS] ... [SEP] post-processor; [PAD] is id 0,
as bert-cls-tiny.json's pad_token_id says). Running it again writes the same files (into OUT_DIR when given:
tests/cli/example_sentiment.sh checks that they equal the committed ones).
"""
import json
import os
import random
import sys

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

HERE = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))

SUBJECTS = ["the movie", "this film", "the soup", "our hotel", "the service", "the concert", "this book",
            "the game", "my new phone", "the coffee", "the staff", "the trip", "this album", "the show",
            "the pizza", "the room", "the ending", "the class", "this app", "the weather"]
POSITIVE = ["great", "wonderful", "tasty", "lovely", "excellent", "fun", "brilliant", "friendly", "amazing",
            "pleasant", "charming", "delightful", "superb", "good", "beautiful"]
NEGATIVE = ["awful", "terrible", "boring", "bad", "horrible", "dull", "rude", "disappointing", "poor", "ugly",
            "noisy", "bland", "annoying", "dreadful", "weak"]
INTENSIFIERS = ["", "really ", "very ", "quite ", "so ", "truly "]
TEMPLATES = ["{s} was {n}{i}{w}", "i found {s} {n}{i}{w}", "{s} is {n}{i}{w}", "honestly, {s} was {n}{i}{w}",
             "{s} felt {n}{i}{w} to me", "we thought {s} was {n}{i}{w}"]
NEGATIONS = ["not ", "never ", "hardly "]  # one text in three: "not great" is negative, "not bad" positive


def examples(rng, n):
    seen = set()
    out = []
    while len(out) < n:
        positive_word = rng.randrange(2)
        word = rng.choice(POSITIVE if positive_word else NEGATIVE)
        negation = rng.choice(NEGATIONS) if rng.randrange(3) == 0 else ""
        label = positive_word ^ (negation != "")
        intensifier = "" if negation else rng.choice(INTENSIFIERS)
        text = rng.choice(TEMPLATES).format(s=rng.choice(SUBJECTS), n=negation, i=intensifier, w=word)
        if text in seen:
            continue
        seen.add(text)
        out.append({"text": text, "label": "positive" if label else "negative"})
    return out


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def main():
    os.makedirs(HERE, exist_ok=True)
    rng = random.Random(25)
    rows = examples(rng, 1000)
    train, val = rows[:800], rows[800:]
    write_jsonl(os.path.join(HERE, "sentiment-train.jsonl"), train)
    write_jsonl(os.path.join(HERE, "sentiment-val.jsonl"), val)

    # The vocabulary: every word of the training texts whole, then single characters and ##characters so
    # that an unseen word still splits into known pieces. (WordPieceTrainer would pick similar pieces, but
    # in an order that changes from run to run; this file is the same every time.)
    tok = Tokenizer(models.WordPiece({"[UNK]": 0}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words = set()
    for r in train:
        words.update(w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(r["text"])))
    chars = sorted(set("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-") | {c for w in words for c in w})
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    pieces = specials + sorted(words) + [c for c in chars if c not in words] + ["##" + c for c in chars]
    vocab = {t: i for i, t in enumerate(pieces)}
    tok.model = models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##")
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(specials)
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    assert tok.token_to_id("[PAD]") == 0
    tok.save(os.path.join(HERE, "sentiment-tokenizer.json"))
    print(f"wrote {len(train)} + {len(val)} examples and a tokenizer of {tok.get_vocab_size()} ids")


if __name__ == "__main__":
    main()

"""Checks ztrain's tokenizer.json tokenizers against the Hugging Face tokenizers library.

Usage: tokenizers_check.py HF_TOKENIZER_TOOL [WORK_DIR]
  (HF_TOKENIZER_TOOL: build/tests/worker/hf_tokenizer_tool; ZT_SOURCE_DIR names the source tree, default two
  folders up; WORK_DIR keeps the tokenizer.json files, default a temporary folder)

With the library it builds and saves (tokenizer.json) these tokenizers, training them on the bundled corpus
(data/corpus.txt) plus half of a text suite, so that the other half has characters they never saw:
  - bpe-classic:  BPE with [UNK] (fused), end-of-word suffix, NFD + Lowercase + StripAccents, WhitespaceSplit +
                  Punctuation + Digits, BPEDecoder;
  - bpe-splits:   BPE behind Split (String patterns) and Punctuation and Digits with every split behavior;
  - wordpiece:    BERT (BertNormalizer lowercasing and stripping accents, BertPreTokenizer, WordPiece "##",
                  [CLS] $A [SEP]), plus a normalized added token;
  - wordpiece-cased: BertNormalizer without lowercasing or accent stripping;
  - gpt2:         GPT-2-style byte-level BPE (<|endoftext|>, an lstrip/rstrip added token);
  - gpt2-prefix:  the same with add_prefix_space, and its merges written in the "a b" string form;
  - llama3:       LLaMA-3-style: Split on cl100k's regex + ByteLevel without regex, ignore_merges,
                  <|begin_of_text|> $A;
  - qwen2:        the same with Qwen2's regex (digits one by one);
  - llama2:       LLaMA-2-style: Prepend and Replace "▁" normalizers, no pre-tokenizer, BPE with byte fallback
                  (<0x00>..<0xFF>) and fused <unk>, decoder Replace/ByteFallback/Fuse/Strip, <s> $A;
  - llama2-metaspace: the same pieces with a Metaspace pre-tokenizer (prepend_scheme first, no split) and no
                  normalizer, as newer conversions write LLaMA-2 and Mistral;
  - metaspace-split: Metaspace splitting at every "▁" (prepend_scheme always) and a Metaspace decoder;
  - unigram-t5:   Unigram as T5 has it: normalizers Precompiled (a SentencePiece charsmap built here from NFKC,
                  with the control and whitespace rules of SentencePiece's nmt_nfkc), Strip (right) and Replace
                  (Regex " {2,}" -> "▁"), pre-tokenizers WhitespaceSplit + Metaspace, </s> appended, no byte
                  fallback (unknown characters fuse into one <unk>);
  - unigram-metaspace: the charsmap alone before Metaspace (the older T5 and mT5 files: whitespace runs
                  become runs of "▁"), byte fallback to <0xXX> pieces;
  - unigram-first: NFKC and Replace " {2,}" -> " " (no charsmap), Metaspace with prepend_scheme first, byte
                  fallback, <s> $A.
  The Unigram tokenizers are trained on a mixed-script corpus (the bundled one and lines of Latin with
  accents, Cyrillic, Greek, CJK, Arabic, emoji, digits) and compared as the library reads them back from
  the file (it parses the scores in its own way, not always to the nearest double).
For each, the ids of every text of the suite (Unicode: accents, CJK, Arabic, combining marks; emoji: ZWJ
sequences, flags, skin tones; digits; whitespace runs: spaces, tabs, newlines, \\r\\n, NBSP; unknown
characters; special tokens inside text) and of the whole corpus must equal the library's, with and without
special tokens; decoding them (and random id sequences) must equal the library's decode(ids,
skip_special_tokens=False); for byte-level tokenizers the per-token bytes must join into the decoded text.

The charsmap is also checked on its own: the normalized texts of every code point after, before and
between keys, which follow from the grapheme clusters (the library replaces a cluster shorter than 6 bytes
that begins with a key as a whole); they may differ only on characters newer than ztrain's Unicode tables.

Then it compares the Unicode tables: the properties the library reads from Oniguruma (\\p{L}, \\p{N}, \\s),
from the unicode_categories crate (BERT's punctuation, controls, Mn), and its lowercase and NFD, against
ztrain's (Unicode of worker/data/unicode_tables.c), over planes 0 to 3 and 14. Code points where they disagree
(characters newer than one of the two tables) are counted and listed; none of them may occur in the suite.

Exit status: 0 when everything matches, 1 otherwise, 77 when the tokenizers library is missing.
"""
import base64
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import unicodedata

try:
    import tokenizers
    from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                            trainers, AddedToken)
except ImportError:
    print("skipped: the tokenizers library is not installed (scripts/install-deps.sh installs it in .venv)")
    sys.exit(77)

SRC = os.environ.get("ZT_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CORPUS = os.path.join(SRC, "data", "corpus.txt")

CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = CL100K.replace(r"\p{N}{1,3}", r"\p{N}")

# Trained on (with the corpus): characters these texts bring in are in the vocabularies.
SUITE_TRAIN = [
    "Café, naïve, résumé, façade — déjà vu. Ærøskøbing, Straße, İstanbul, ΣΊΣΥΦΟΣ σοφός.",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
    "مرحبا بالعالم، هذه جملة عربية. שלום עולם.",
    "Emoji: 😀 😂 👍 🎉 ❤️ and more 😀😀😀.",
    "Numbers 0123456789, 3.14159, 1,000,000 and ²³ ½ Ⅻ ١٢٣.",
    "Tabs\tand  spaces   and\nnewlines\r\nand\u00a0NBSP.",
]
# Never trained on.
SUITE = SUITE_TRAIN + [
    "",
    " ",
    "a",
    "In the beginning God created the heaven and the earth.",
    "  leading and trailing spaces  ",
    "\n\n\nthree newlines first",
    "tabs\t\t\tand\t \t mixed \t",
    "windows\r\nline\r\n\r\nendings\r\n",
    "nbsp\u00a0\u00a0between and\u202fnarrow\u2009thin\u3000ideographic",
    "it's, IT'S, they'll, we'Ve, I'M, you'D, 'tis, x'ſ, don't",
    "12345678901234567890 and 1 22 333 4444 55555 ٠١٢٣٤٥",
    "x²³⁴⁵ ⅓ Ⅻ ⑳ 𝟙𝟚𝟛",
    "Ünïcödé àccénts: ÀÉÎÕÜ àéîõü ñ Ñ ç Ç ø Ø å Å",
    "combining: e\u0301 a\u0300 o\u0308\u0323 q\u0307\u0323 n\u0303",
    "Zürich, Kraków, Đà Nẵng, Ōsaka, İzmir, ǅungla, ß ẞ",
    "漢字かな交じり文。カタカナ、ひらがな。中文字符测试。𠀀𠀁 𪜀",
    "한국어 텍스트와 조합 자모: 가각간",
    "العربية: السلام عليكم ورحمة الله. فارسی: سلام",
    "עברית עם ניקוד: שָׁלוֹם",
    "हिन्दी पाठ: नमस्ते दुनिया। ไทย: สวัสดีครับ",
    "Ελληνικά: Καλημέρα κόσμε. Русский: Привет, мир! Українська: ґ є і ї",
    "emoji ZWJ: 👨‍👩‍👧‍👦 👩‍💻 🏳️‍🌈 🧑🏽‍🚀 family",
    "flags: 🇫🇷🇩🇪🇯🇵🇺🇸 and skin tones 👋🏻👋🏼👋🏽👋🏾👋🏿",
    "newer emoji: 🫠 🫶 🥹 🪿 🫎",
    "symbols: ©®™ ±×÷ ∑∏∫ ≤≥≠ →⇒ ♠♣♥♦ €£¥₹ §¶ †‡ •…",
    "punctuation runs: !!! ??? ... --- ((())) [[x]] {{y}} <<z>> \"quoted\" 'single' `back`",
    "unknown: \u0378\u0379 \ue000\uf8ff \U000f0000 \U0010fffd \ufeff zero\u200bwidth \u200d joiner",
    "controls: a\u0001b\u0007c\u001bd\u007fe\u0085f",
    "mixed: The 2024 Olympics 🏅 in Paris 🇫🇷 cost €9.7bn — «très cher»!",
    "<|endoftext|>special in the middle<|endoftext|> and <mask> mask",
    "[CLS] bert specials [SEP] [MASK] [UNK] inside",
    "<s>llama</s> <|begin_of_text|>three<|end_of_text|>",
    "JERUSALEM, jerusalem and Jerusalem",
    "a" * 120 + " " + "supercalifragilisticexpialidocious" * 4,
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 and 🄰🄱🄲",
    "\u0130 \u0131 \u03a3 \u1e9e \u2126 \u212a \u00c5",
]


# The Unigram tokenizers train on these too (with the corpus and SUITE_TRAIN): more scripts.
UNIGRAM_TRAIN = [
    "Русский язык: съешь же ещё этих мягких французских булок, да выпей чаю. Москва, 2024 год.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "Ça coûte 12,50 € à Besançon; l'été dernier, où étiez-vous? Łódź, Žižkov, Ørsted, Šiauliai.",
    "中文分词测试：我们在北京大学学习自然语言处理。日本語の文章も少し：今日は良い天気です。",
    "اللغة العربية جميلة جدا، وهذه جملة أخرى للتدريب ١٢٣٤٥ ٦٧٨٩٠.",
    "Emoji again: 😀😃😄 🎉🎊 👍👍 ❤️ 🚀 and digits 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024.",
]


# More texts for the Unigram tokenizers: what the charsmap changes (compatibility characters, composing pairs,
# controls, CR LF as one cluster), clusters that begin with a key, and the training scripts' texts.
UNIGRAM_SUITE = UNIGRAM_TRAIN + [
    "ﬁne ﬂour, ①②③, ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３, ㍻ ㌔, ™ ℃ ½, Å Ω K, ｶﾀｶﾅ",
    "e\u0301te\u0301 o\u0308 A\u0301 ñ n\u0303 q\u0301 ™\u0301 ①\u0308 x\u200dq",
    "ctrl\x01\x02mid\x1fend\x7f, tab\there, cr\rlf\ncrlf\r\n\r\nend",
    "   three leading, two  inner,   three inner\t\t and trailing   ",
    "\u3000ideographic\u3000space\u00a0nbsp\u2009thin\u2028line sep",
    "Σίσυφος ΣΊΣΥΦΟΣ ϐ ϑ ϕ, ё Ё й Й, ß ẞ, ǅ ǈ",
    "数字１２３と漢字、﹝括弧﹞【角】「鉤」。",
    "😀\u0301 👩🏽\u200d🔬 🇺🇳 #\ufe0f\u20e3 1\ufe0f\u20e3",
    "unknown: \U000f0000\U000f0001 ꙮ 𓀀𓀁 ᚠᚡ and ⸻",
]


def corpus_text():
    with open(CORPUS, encoding="utf-8") as f:
        return f.read()


def training_iter():
    yield corpus_text()
    for t in SUITE_TRAIN:
        yield t


def train(tok, trainer):
    tok.train_from_iterator(training_iter(), trainer)
    return tok


def build_tokenizers():
    out = {}

    t = Tokenizer(models.BPE(unk_token="[UNK]", fuse_unk=True, end_of_word_suffix="</w>"))
    t.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents()])
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
                                               pre_tokenizers.Digits(individual_digits=True)])
    t.decoder = decoders.BPEDecoder(suffix="</w>")
    out["bpe-classic"] = train(t, trainers.BpeTrainer(vocab_size=1200, special_tokens=["[UNK]"],
                                                      end_of_word_suffix="</w>", show_progress=False))

    # Every split behavior: String splits and the character classes of Punctuation and Digits.
    t = Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="merged_with_previous"),
        pre_tokenizers.Punctuation(behavior="contiguous"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Split("e", behavior="merged_with_next"),
        pre_tokenizers.Split("\n", behavior="removed"),
        pre_tokenizers.Split("th", behavior="contiguous")])
    out["bpe-splits"] = train(t, trainers.BpeTrainer(vocab_size=800, special_tokens=["[UNK]"], show_progress=False))

    for name, lower in (("wordpiece", True), ("wordpiece-cased", False)):
        t = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
        t.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                  strip_accents=None, lowercase=lower)
        t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        t.decoder = decoders.WordPiece(prefix="##")
        train(t, trainers.WordPieceTrainer(vocab_size=2000, show_progress=False,
                                           special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
        t.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", t.token_to_id("[CLS]")), ("[SEP]", t.token_to_id("[SEP]"))])
        t.add_tokens([AddedToken("Jerusalem", normalized=True)])
        out[name] = t

    for name, prefix in (("gpt2", False), ("gpt2-prefix", True)):
        t = Tokenizer(models.BPE())
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix)
        t.decoder = decoders.ByteLevel()
        t.post_processor = processors.ByteLevel(trim_offsets=True)
        train(t, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"], show_progress=False,
                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        t.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False)])
        out[name] = t

    for name, pattern in (("llama3", CL100K), ("qwen2", QWEN2)):
        t = Tokenizer(models.BPE(ignore_merges=True))
        t.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        t.decoder = decoders.ByteLevel()
        specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(4)]
        train(t, trainers.BpeTrainer(vocab_size=2000, special_tokens=specials, show_progress=False,
                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        t.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                          special_tokens=[("<|begin_of_text|>", t.token_to_id("<|begin_of_text|>"))])])
        out[name] = t

    out["llama2"] = build_llama2()
    out["llama2-metaspace"] = build_llama2(metaspace="first")
    out["metaspace-split"] = build_llama2(metaspace="always")
    out.update(build_unigrams())
    return out


def charsmap_base64(mapping):
    """SentencePiece's precompiled charsmap (base64) for mapping (str -> str): u32 size of the trie in bytes,
    the trie, then the normalized strings, each ended by a NUL. The trie is a double array over the keys'
    UTF-8 bytes in darts-clone's unit layout (what SentencePiece writes and the library reads): a unit holds
    its label (bits 0-7), a has-leaf flag (bit 8) and the XOR offset from its position to its children
    (bits 10-30); a leaf unit (bit 31) holds the offset of the key's normalized string. Children of a node
    sit at base ^ label with base unique to the node, the leaf at base ^ 0; the root is unit 0."""
    root, norm, where = {}, bytearray(), {}
    for key in sorted(mapping, key=lambda k: k.encode("utf-8")):
        val = mapping[key].encode("utf-8")
        if val not in where:
            where[val] = len(norm)
            norm += val + b"\0"
        node = root
        for b in key.encode("utf-8"):
            node = node.setdefault(b, {})
        node[None] = where[val]
    units, taken, bases = [0] * 256, bytearray(256), set()
    taken[0] = 1  # the root
    first_block = 0

    def place(labels):
        nonlocal first_block
        blk = first_block
        while True:
            if len(units) < (blk + 1) * 256:
                units.extend([0] * 256)
                taken.extend(bytes(256))
            start = blk * 256
            for x in range(256):
                if start + x not in bases and all(not taken[start + (x ^ c)] for c in labels):
                    return start + x
            blk += 1
            if blk > first_block + 4:  # blocks this full are skipped from now on
                first_block += 1

    stack = [(0, root)]
    while stack:
        pos, node = stack.pop()
        labels = [0 if k is None else k for k in node]
        base = place(labels)
        bases.add(base)
        for c in labels:
            taken[base ^ c] = 1
        assert pos ^ base < (1 << 21)
        units[pos] |= (pos ^ base) << 10
        if None in node:
            units[pos] |= 1 << 8
            units[base] = node[None] | (1 << 31)
        for k, child in node.items():
            if k is not None:
                units[base ^ k] = k
                stack.append((base ^ k, child))
    blob = struct.pack("<I", 4 * len(units)) + struct.pack(f"<{len(units)}I", *units) + bytes(norm)
    return base64.b64encode(blob).decode("ascii")


def nmt_nfkc_like():
    """A charsmap like SentencePiece's nmt_nfkc, from this Python's unicodedata: each character NFKC changes
    -> its NFKC form, a few composing pairs (e + U+0301 -> é), tab, CR and LF -> a space, other ASCII
    controls -> nothing, and "q" -> "Q" (a one-byte key, so that the check of grapheme clusters can put any
    character after a key)."""
    m = {}
    for c in range(0x110000):
        if not 0xD800 <= c <= 0xDFFF:
            ch = chr(c)
            n = unicodedata.normalize("NFKC", ch)
            if n != ch:
                m[ch] = n
    for base in "aeiouAEIOUnc":
        for mark in "\u0300\u0301\u0302\u0303\u0308\u0327":
            composed = unicodedata.normalize("NFC", base + mark)
            if len(composed) == 1:
                m[base + mark] = composed
    for c in "\t\r\n":
        m[c] = " "
    for c in list(range(1, 9)) + [0x0B, 0x0C] + list(range(0x0E, 0x20)) + [0x7F]:
        m[chr(c)] = ""
    m["q"] = "Q"
    return m


_CHARSMAP = []
UNIGRAM_FILES = {}


def charsmap():
    if not _CHARSMAP:
        _CHARSMAP.append(charsmap_base64(nmt_nfkc_like()))
    return _CHARSMAP[0]


def precompiled_json():
    return {"type": "Precompiled", "precompiled_charsmap": charsmap()}


def build_unigrams():
    """The Unigram tokenizers (see the top of this file), each as the library reads it from the file."""
    out = {}
    pre = normalizers.Precompiled(base64.b64decode(charsmap()))
    meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    variants = {
        "unigram-t5": (normalizers.Sequence([pre, normalizers.Strip(left=False, right=True),
                                             normalizers.Replace(Regex(" {2,}"), "▁")]),
                       pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), meta]), False, "$A </s>"),
        "unigram-metaspace": (pre, meta, True, None),
        "unigram-first": (normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]),
                          pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True), True,
                          "<s> $A"),
    }
    for name, (normalizer, pre_tokenizer, byte_fallback, template) in variants.items():
        t = Tokenizer(models.Unigram())
        t.normalizer = normalizer
        t.pre_tokenizer = pre_tokenizer
        t.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        trainer = trainers.UnigramTrainer(vocab_size=2000, special_tokens=["<pad>", "</s>", "<unk>", "<s>"],
                                          unk_token="<unk>", show_progress=False, max_piece_length=12)
        # a part of the corpus is enough to train on (the Unigram trainer is slow); the ids are compared on all
        t.train_from_iterator([corpus_text()[:300000]] + SUITE_TRAIN + UNIGRAM_TRAIN, trainer)
        spec = json.loads(t.to_str())
        if byte_fallback:
            low = min(score for _, score in spec["model"]["vocab"])
            spec["model"]["vocab"] += [[f"<0x{b:02X}>", low] for b in range(256)]
            spec["model"]["byte_fallback"] = True
            spec["decoder"] = {"type": "Sequence", "decoders": [
                spec["decoder"], {"type": "ByteFallback"}, {"type": "Fuse"}]}
        if template:
            first, last = template.split("$A")
            special = (first or last).strip()
            sid = [i for i, (p, _) in enumerate(spec["model"]["vocab"]) if p == special][0]
            t2 = Tokenizer.from_str(json.dumps(spec))
            t2.post_processor = processors.TemplateProcessing(
                single=template, pair=template + " " + template.replace("$A", "$B:1"),
                special_tokens=[(special, sid)])
            spec["post_processor"] = json.loads(t2.to_str())["post_processor"]  # the model's scores stay
        # the file as Python writes the trainer's scores (each the nearest decimal of its double)
        UNIGRAM_FILES[name] = json.dumps(spec, ensure_ascii=False)
        out[name] = Tokenizer.from_str(UNIGRAM_FILES[name])
    return out


def build_llama2(metaspace=None):
    """SentencePiece-style pieces trained with a Metaspace pre-tokenizer, then laid out as LLaMA-2's
    tokenizer.json is: <unk> <s> </s>, the 256 byte tokens, the pieces; normalizer Prepend + Replace, no
    pre-tokenizer, byte fallback. metaspace "first": as newer conversions write it, no normalizer and a
    Metaspace pre-tokenizer (prepend_scheme first, no split); "always": Metaspace splitting at every "▁",
    with a Metaspace decoder."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    train(t, trainers.BpeTrainer(vocab_size=1500, show_progress=False, max_token_length=16))
    trained = json.loads(t.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    # runs of "▁" for runs of spaces, as LLaMA-2 has them
    merges = list(trained["merges"])
    for run in ("▁▁", "▁▁▁▁"):
        if run not in vocab:
            vocab[run] = len(vocab)
            half = run[:len(run) // 2]
            merges.append([half, half])
    spec = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, c in enumerate(["<unk>", "<s>", "</s>"])],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    if metaspace == "first":
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    elif metaspace == "always":
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
        spec["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
            {"type": "ByteFallback"}, {"type": "Fuse"}]}
    return Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))


def legacy_merges(path_in, path_out):
    """Rewrites the merges of a tokenizer.json in the older "a b" string form."""
    with open(path_in, encoding="utf-8") as f:
        spec = json.load(f)
    spec["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    with open(path_out, "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)


def write_records(path, texts):
    with open(path, "wb") as f:
        for t in texts:
            b = t.encode("utf-8")
            f.write(b"%d\n" % len(b) + b)


def read_records(path):
    out = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        nl = data.index(b"\n", pos)
        n = int(data[pos:nl])
        out.append(data[nl + 1:nl + 1 + n])
        pos = nl + 1 + n
    return out


def run_tool(tool, *args):
    res = subprocess.run([tool, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{tool} {' '.join(args)}: exit {res.returncode}: {res.stderr.strip()}")
    return res.stdout


def encode_with_tool(tool, tok_path, texts, work, add_special):
    inp, out = os.path.join(work, "in.bin"), os.path.join(work, "out.txt")
    write_records(inp, texts)
    run_tool(tool, "encode", tok_path, inp, out, *(["--add-special"] if add_special else []))
    with open(out, encoding="utf-8") as f:
        lines = f.read().split("\n")[:-1]
    return [[int(x) for x in line.split()] if not line.startswith("error") else line for line in lines]


def decode_with_tool(tool, tok_path, id_lists, work):
    inp, out = os.path.join(work, "ids.txt"), os.path.join(work, "dec.bin")
    with open(inp, "w") as f:
        for ids in id_lists:
            f.write(" ".join(map(str, ids)) + "\n")
    run_tool(tool, "decode", tok_path, inp, out)
    return [b.decode("utf-8") for b in read_records(out)]


class Report:
    def __init__(self):
        self.failures = 0

    def check(self, ok, what):
        if not ok:
            self.failures += 1
        print(("ok   " if ok else "FAIL ") + what)
        return ok


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def check_tokenizer(rep, tool, name, path, lib, work, extra=()):
    corpus = corpus_text()
    texts = SUITE + list(extra) + [corpus[:20000], corpus]
    labels = [repr(t[:40]) for t in SUITE + list(extra)] + ["corpus[:20000]", "whole corpus"]
    info = run_tool(tool, "info", path)
    vocab = int(info.split("vocab_size")[1])
    rep.check(vocab == lib.get_vocab_size(with_added_tokens=True), f"{name}: vocab size {vocab}")
    for add_special in (False, True):
        got = encode_with_tool(tool, path, texts, work, add_special)
        want = [e.ids for e in lib.encode_batch(texts, add_special_tokens=add_special)]
        bad = [i for i in range(len(texts)) if got[i] != want[i]]
        total = sum(len(w) for w in want)
        rep.check(not bad, f"{name}: ids of {len(texts)} texts ({total} tokens), "
                           f"add_special_tokens={add_special}")
        for i in bad[:5]:
            k = first_difference(got[i], want[i]) if isinstance(got[i], list) else 0
            print(f"     {labels[i]}: ztrain {got[i][max(0, k - 3):k + 5] if isinstance(got[i], list) else got[i]}"
                  f" library {want[i][max(0, k - 3):k + 5]} (at token {k}; library tokens "
                  f"{lib.encode(texts[i], add_special_tokens=add_special).tokens[max(0, k - 3):k + 5]})")
    # Decoding: the suite's ids, with specials, and random ids (byte tokens out of order give U+FFFD).
    rng = random.Random(1234)
    id_lists = [lib.encode(t, add_special_tokens=True).ids for t in SUITE]
    id_lists += [[rng.randrange(vocab) for _ in range(rng.randrange(1, 40))] for _ in range(200)]
    got = decode_with_tool(tool, path, id_lists, work)
    want = [lib.decode(ids, skip_special_tokens=False) for ids in id_lists]
    bad = [i for i in range(len(id_lists)) if got[i] != want[i]]
    rep.check(not bad, f"{name}: decode of {len(id_lists)} id lists (the suite's and random ones)")
    for i in bad[:3]:
        print(f"     ids {id_lists[i][:12]}: ztrain {got[i][:60]!r} library {want[i][:60]!r}")
    # Byte-level: the tokens' bytes (what ztrain generate prints one by one) join into the decoded text.
    if "gpt2" in name or "llama3" in name or "qwen2" in name:
        pieces_path = os.path.join(work, "pieces.bin")
        run_tool(tool, "pieces", path, pieces_path)
        pieces = read_records(pieces_path)
        bad = []
        for t in SUITE:
            ids = lib.encode(t, add_special_tokens=True).ids
            if b"".join(pieces[i] for i in ids) != lib.decode(ids, skip_special_tokens=False).encode("utf-8"):
                bad.append(t)
        rep.check(not bad, f"{name}: the bytes of the tokens, one by one, make the decoded text")


PAIR_TEXTS = [
    ("The movie was great", "I loved every minute of it, really."),
    ("short", "a much longer second text that has many more words than the first one does"),
    ("a much longer first text that has many more words than the second one does, twice over", "tiny"),
    ("Ünïcödé ünd 🙂 emoji", "数字 12345 and 日本語のテキスト"),
    ("", "empty first"),
    ("only a first text", None),
    ("a single text that is long enough to be cut at the shorter lengths of the sweep", None),
]
PAIR_LENGTHS = (0, 6, 7, 12, 13, 32)


def write_pair_records(path, pairs):
    with open(path, "wb") as f:
        for a, b in pairs:
            ab = a.encode("utf-8")
            f.write(b"%d\n" % len(ab) + ab)
            if b is None:
                f.write(b"-\n")
            else:
                bb = b.encode("utf-8")
                f.write(b"%d\n" % len(bb) + bb)


def check_pairs(rep, tool, name, path, lib, work):
    """Pairs of texts with special tokens and longest_first truncation: ids and type ids."""
    inp, out = os.path.join(work, "pairs.bin"), os.path.join(work, "pairs.txt")
    write_pair_records(inp, PAIR_TEXTS)
    specials_pair = lib.num_special_tokens_to_add(True)
    specials_single = lib.num_special_tokens_to_add(False)
    bad = []
    for max_len in PAIR_LENGTHS:
        run_tool(tool, "pair", path, inp, out, str(max_len))
        with open(out, encoding="utf-8") as f:
            lines = f.read().split("\n")[:-1]
        if max_len:
            lib.enable_truncation(max_len, strategy="longest_first")
        else:
            lib.no_truncation()
        for (a, b), line in zip(PAIR_TEXTS, lines):
            if max_len and max_len < (specials_pair if b is not None else specials_single):
                if not line.startswith("error"):
                    bad.append((max_len, a, "ztrain did not refuse a length shorter than the special tokens"))
                continue
            e = lib.encode(a, b, add_special_tokens=True)
            want = " ".join(map(str, e.ids)) + " |" + "".join(f" {t}" for t in e.type_ids)
            if line.strip() != want.strip():
                bad.append((max_len, a, f"ztrain {line[:80]!r} library {want[:80]!r}"))
    lib.no_truncation()
    rep.check(not bad, f"{name}: {len(PAIR_TEXTS)} texts and pairs with special tokens and type ids, truncated "
                       f"to {', '.join(map(str, PAIR_LENGTHS))} tokens")
    for max_len, a, msg in bad[:4]:
        print(f"     max_len {max_len}, {a[:30]!r}: {msg}")


def normalize_with_tool(tool, tok_path, texts, work):
    inp, out = os.path.join(work, "norm_in.bin"), os.path.join(work, "norm_out.bin")
    write_records(inp, texts)
    run_tool(tool, "normalize", tok_path, inp, out)
    return [b.decode("utf-8") for b in read_records(out)]


def ztrain_category(tool, cp, work):
    out = os.path.join(work, "one_cp.txt")
    run_tool(tool, "unicode", f"{cp:X}", f"{cp:X}", out)
    with open(out) as f:
        return CATEGORIES[int(f.read().split()[1])]


def check_unicode_forms(rep, tool, work):
    """The normalizers NFC, NFKC and NFKD on every code point of planes 0 to 3 and 14 (each one alone, which
    decomposes and composes it again) and on the suites; they may differ only on characters that ztrain's
    Unicode tables do not have (or that the library's, of another version, treat otherwise), never on the
    suites' characters."""
    cps = sweep_code_points()
    suite = SUITE + UNIGRAM_SUITE
    suite_cps = {ord(ch) for t in suite for ch in t}
    for form in ("NFC", "NFKC", "NFKD"):
        spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                "normalizer": {"type": form}, "pre_tokenizer": None, "post_processor": None, "decoder": None,
                "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]], "byte_fallback": False}}
        path = os.path.join(work, f"{form}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        lib = Tokenizer.from_file(path).normalizer
        got = normalize_with_tool(tool, path, ["\n".join(chr(c) for c in cps)] + suite, work)
        want_cps = lib.normalize_str("\n".join(chr(c) for c in cps)).split("\n")
        got_cps = got[0].split("\n")
        bad = {c for c, g, w in zip(cps, got_cps, want_cps) if g != w} if len(got_cps) == len(cps) else set(cps)
        bad_texts = [t for t, g in zip(suite, got[1:]) if g != lib.normalize_str(t)]
        print(f"     {form}: {len(bad)} code points differ" + (": " + " ".join(f"U+{c:04X}" for c in sorted(bad)[:8])
                                                          if bad else "") + (" ..." if len(bad) > 8 else ""))
        rep.check(not (bad & suite_cps) and not bad_texts,
                  f"{form}: the suites' texts are normalized as the library does"
                  + (f" (differ: {[t[:30] for t in bad_texts[:3]]})" if bad_texts else ""))


def check_charsmap(rep, tool, work):
    """The Precompiled normalizer alone, over every code point of planes 0 to 3 and 14: after a key ("q"
    and "™"; the cluster "q" + c is replaced by "Q" alone when c extends the cluster), before a key
    (prepended characters), and on its own. Differences may only come from grapheme cluster properties of
    characters that ztrain's Unicode tables do not have (newer than their version), never on the suite."""
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": precompiled_json(), "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]], "byte_fallback": False}}
    path = os.path.join(work, "charsmap.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    lib = Tokenizer.from_file(path)
    cps = sweep_code_points()
    forms = (("q", ""), ("", "q"), ("™", ""))
    texts, who = [], []
    for c in cps:
        for pre, post in forms:
            texts.append(pre + chr(c) + post)
            who.append(c)
    chunk = 400  # texts joined with spaces, which break every cluster
    joined = [" ".join(texts[i:i + chunk]) for i in range(0, len(texts), chunk)]
    got = normalize_with_tool(tool, path, joined, work)
    suspects = []
    for k, (g, j) in enumerate(zip(got, joined)):
        if g != lib.normalizer.normalize_str(j):
            suspects += range(k * chunk, min(len(texts), (k + 1) * chunk))
    one_by_one = normalize_with_tool(tool, path, [texts[i] for i in suspects], work)
    bad = {who[i] for i, g in zip(suspects, one_by_one) if g != lib.normalizer.normalize_str(texts[i])}
    suite_cps = {ord(ch) for t in SUITE + UNIGRAM_SUITE for ch in t}
    newer = {c for c in bad if ztrain_category(tool, c, work) == "Cn"}
    print(f"     charsmap: {len(cps)} code points in {len(texts)} texts, {len(bad)} normalized otherwise "
          f"({len(newer)} of them unassigned in ztrain's Unicode tables): "
          + " ".join(f"U+{c:04X}" for c in sorted(bad)[:8]) + (" ..." if len(bad) > 8 else ""))
    rep.check(bad == newer and not (bad & suite_cps),
              "charsmap: the normalized texts equal the library's but for characters newer than ztrain's tables")


# ---- Unicode tables ----------------------------------------------------------------------------------

def sweep_code_points():
    cps = list(range(0x20, 0x323B0)) + list(range(0xE0000, 0xE01F0))
    return [c for c in cps if not (0xD800 <= c <= 0xDFFF)]


def removed_set(cps, func, sep="a"):
    """The code points that func (a library normalizer or pre-tokenizer over "a".join(chars)) removes."""
    s = sep.join(chr(c) for c in cps)
    kept = set(func(s)) - {sep}
    return {c for c in cps if chr(c) not in kept}


def library_sets(cps):
    """The library's view of each property, as sets of code points."""
    sets = {}
    text = "".join(chr(c) for c in cps)
    for prop, rx in (("L", r"\p{L}"), ("N", r"\p{N}"), ("S", r"\s")):
        split = pre_tokenizers.Split(Regex(rx), behavior="removed")
        kept = "".join(p for p, _ in split.pre_tokenize_str(text))
        kept_set = set(kept)
        sets[prop] = {c for c in cps if chr(c) not in kept_set}
    joined = "a".join(chr(c) for c in cps)
    bert = pre_tokenizers.BertPreTokenizer().pre_tokenize_str(joined)
    pieces = [p for p, _ in bert]
    sets["bert_punct"] = {ord(p) for p in pieces if len(p) == 1 and p != "a"}
    kept = set("".join(pieces))
    sets["bert_space"] = {c for c in cps if chr(c) not in kept and chr(c) != "a"}
    clean = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False,
                                       lowercase=False).normalize_str(joined)
    kept = set(clean)
    sets["bert_control"] = {c for c in cps if chr(c) not in kept} - sets["bert_space"]
    kept = set(normalizers.StripAccents().normalize_str(joined))
    sets["marks"] = {c for c in cps if chr(c) not in kept}
    plain = [c for c in cps if normalizers.NFD().normalize_str(chr(c)) == chr(c)]
    kept = set(normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=True,
                                          lowercase=False).normalize_str("a".join(chr(c) for c in plain)))
    sets["bert_Mn"] = {c for c in plain if chr(c) not in kept}
    lower = normalizers.Lowercase().normalize_str("\n".join(chr(c) for c in cps)).split("\n")
    sets["lower"] = {c: lo for c, lo in zip(cps, lower) if lo != chr(c)}
    nfd = normalizers.NFD().normalize_str("\n".join(chr(c) for c in cps)).split("\n")
    sets["nfd"] = {c: d for c, d in zip(cps, nfd) if d != chr(c)}
    return sets


CATEGORIES = ["Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
              "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"]


def ztrain_sets(tool, cps, work):
    """ztrain's view, from its C tables (hf_tokenizer_tool unicode) and the rules tokenize_hf.c applies."""
    table = {}
    for first, last in ((0x20, 0x323AF), (0xE0000, 0xE01EF)):
        out = os.path.join(work, "unicode.txt")
        run_tool(tool, "unicode", f"{first:X}", f"{last:X}", out)
        with open(out) as f:
            for line in f:
                cp, cat, ws, lower, nfd = line.split()
                table[int(cp, 16)] = (CATEGORIES[int(cat)], ws == "1",
                                      "".join(chr(int(x, 16)) for x in lower.split(".")),
                                      "".join(chr(int(x, 16)) for x in nfd.split(".")))
    cat = {c: table[c][0] for c in cps}
    ws = {c for c in cps if table[c][1]}
    sets = {}
    sets["L"] = {c for c in cps if cat[c][0] == "L"}
    sets["N"] = {c for c in cps if cat[c][0] == "N"}
    sets["S"] = ws
    ascii_punct = {c for c in range(33, 127) if not chr(c).isalnum()}
    sets["bert_punct"] = {c for c in cps if (cat[c][0] == "P" or c in ascii_punct) and c not in ws}
    sets["bert_space"] = set(ws)
    sets["bert_control"] = {c for c in cps if cat[c] in ("Cc", "Cf", "Co") and c not in (9, 10, 13)} | {0xFFFD}
    sets["bert_control"] -= sets["bert_space"]
    sets["marks"] = {c for c in cps if cat[c][0] == "M"}
    sets["bert_Mn"] = {c for c in cps if cat[c] == "Mn" and table[c][3] == chr(c)}
    sets["lower"] = {c: table[c][2] for c in cps if table[c][2] != chr(c)}
    sets["nfd"] = {c: table[c][3] for c in cps if table[c][3] != chr(c)}
    return sets


def check_unicode(rep, tool, work):
    cps = sweep_code_points()
    lib = library_sets(cps)
    zt = ztrain_sets(tool, cps, work)
    suite_cps = {ord(ch) for t in SUITE for ch in t}
    with open(os.path.join(SRC, "worker", "data", "unicode_tables.c"), encoding="utf-8") as f:
        version = f.read().split('zt__unicode_tables_version[] = "')[1].split('"')[0]
    print(f"Unicode tables: ztrain {version} (worker/data/unicode_tables.c), "
          f"tokenizers {tokenizers.__version__} (Oniguruma, the unicode_categories crate, Rust's std and "
          f"unicode-normalization-alignments); {len(cps)} code points compared")
    for prop in ("L", "N", "S", "bert_punct", "bert_space", "bert_control", "marks", "bert_Mn", "lower", "nfd"):
        a, b = lib[prop], zt[prop]
        if isinstance(a, dict):
            diff = {c for c in set(a) | set(b) if a.get(c) != b.get(c)}
        else:
            diff = a ^ b
        in_suite = sorted(diff & suite_cps)
        sample = " ".join(f"U+{c:04X}" for c in sorted(diff)[:8])
        print(f"     {prop:13s} {len(diff):6d} code points differ{': ' + sample if diff else ''}"
              f"{' ...' if len(diff) > 8 else ''}")
        rep.check(not in_suite, f"unicode {prop}: no difference on the characters of the text suite"
                  + (f" (differ: {' '.join(f'U+{c:04X}' for c in in_suite)})" if in_suite else ""))


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    tool = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) == 3 else tempfile.mkdtemp(prefix="zt_tokenizers_check_")
    os.makedirs(work, exist_ok=True)
    print(f"tokenizers {tokenizers.__version__}; files in {work}")
    rep = Report()
    toks = build_tokenizers()
    for name, lib in toks.items():
        path = os.path.join(work, f"{name}.json")
        lib.save(path)
        if name == "gpt2-prefix":
            legacy_merges(path, path)
            lib = Tokenizer.from_file(path)
        if name.startswith("unigram"):
            with open(path, "w", encoding="utf-8") as f:
                f.write(UNIGRAM_FILES[name])
            # The library's scores as it reads them back from this file: its JSON parser does not always give
            # the nearest double, and parsing the written scores again can move them once more.
            lib = Tokenizer.from_file(path)
            with open(path, encoding="utf-8") as f:
                scores = [score for _, score in json.load(f)["model"]["vocab"]]
            again = [score for _, score in json.loads(lib.to_str())["model"]["vocab"]]
            moved = sum(a != b for a, b in zip(scores, again))
            print(f"     {name}: {len(scores)} pieces, {moved} scores that the library reads as another double "
                  f"than the nearest one")
        check_tokenizer(rep, tool, name, path, lib, work, UNIGRAM_SUITE if name.startswith("unigram") else ())
        if name in ("wordpiece", "gpt2", "llama3", "llama2", "unigram-t5"):
            check_pairs(rep, tool, name, path, lib, work)
    # BERT's and RoBERTa's own post-processors on the WordPiece vocabulary.
    for name, proc in (("bert-processing", processors.BertProcessing),
                       ("roberta-processing", processors.RobertaProcessing)):
        lib = Tokenizer.from_str(toks["wordpiece"].to_str())
        lib.post_processor = proc(("[SEP]", lib.token_to_id("[SEP]")), ("[CLS]", lib.token_to_id("[CLS]")))
        path = os.path.join(work, f"{name}.json")
        lib.save(path)
        check_pairs(rep, tool, name, path, lib, work)
    check_charsmap(rep, tool, work)
    check_unicode_forms(rep, tool, work)
    check_unicode(rep, tool, work)
    print(f"{rep.failures} check(s) failed" if rep.failures else "all checks passed")
    return 1 if rep.failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks `ztrain generate --chat` against Hugging Face transformers: a conversation rendered by a model's
ChatML template, tokenized with its tokenizer.json (special tokens <|im_start|> and <|im_end|> as added
tokens), answered greedily and by beam search, ending at <|im_end|>.

Usage: chat_generate_hf.py ZTRAIN

The check builds a random LlamaForCausalLM (4 heads on 2 key/value heads, vocabulary of the 256 bytes plus the
two special tokens) whose <|im_end|> output row is made a copy of the row of a token greedy decoding picks
(slightly smaller), so that some replies end early (with this seed, the beam searches'); a byte-level tokenizer.json made with the `tokenizers` library;
and a tokenizer_config.json holding the ChatML template string as models publish it. For a conversation with
a system prompt, two user turns and non-ASCII text:
  - transformers: apply_chat_template(add_generation_prompt=True), the tokenizer's ids, then generate() with
    eos_token_id <|im_end|>, greedy and with num_beams 2 and 4 (length penalty 1, early_stopping False),
    the reply being the new tokens before <|im_end|>;
  - ztrain: `ztrain generate --weights ... --tokenizer tokenizer.json --chat chat.json` (the template found in
    the tokenizer_config.json beside the tokenizer), with `--temperature 0` or `--num-beams K`;
the replies must be the same bytes, and at least one of them must have ended at <|im_end|>.
Exits 0 when they agree, 1 on a mismatch, 77 (skipped) when torch, transformers or tokenizers are missing.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import zt_testlib as t  # noqa: E402

t.require("torch", "transformers", "tokenizers", needs="torch, transformers and tokenizers")
import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

# teknium/OpenHermes-2.5-Mistral-7B's plain ChatML, as its tokenizer_config.json holds it
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHAT = [{"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Grün."},
        {"role": "user", "content": "And another, s'il vous plaît?"}]
NEW = 20


def bytes_to_unicode():
    """GPT-2's map of the 256 bytes onto printable characters (the byte-level pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def make_tokenizer(folder):
    """A byte-level BPE without merges (token id = byte value) and <|im_start|> 256, <|im_end|> 257."""
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", chat_template=CHATML)


def reply(model, ids, end, beams):
    kw = dict(num_beams=beams, length_penalty=1.0, early_stopping=False) if beams > 1 else {}
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=end,
                             pad_token_id=end, **kw)[0, len(ids):].tolist()
    ended = end in out
    out = out[:out.index(end)] if ended else out
    return bytes(out), ended


def main():
    if len(sys.argv) != 2:
        print("usage: chat_generate_hf.py ZTRAIN", file=sys.stderr)
        return 2
    ztrain = sys.argv[1]
    torch.manual_seed(5)
    with tempfile.TemporaryDirectory(prefix="zt_chat_gen_") as d:
        hf_tok = make_tokenizer(d)
        end = hf_tok.convert_tokens_to_ids("<|im_end|>")
        text = hf_tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
        ids = hf_tok(text, add_special_tokens=False)["input_ids"]
        cfg = LlamaConfig(vocab_size=258, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          initializer_range=0.5, tie_word_embeddings=False, bos_token_id=None, eos_token_id=end)
        model = LlamaForCausalLM(cfg).float().eval()
        greedy, _ = reply(model, ids, end, 1)
        with torch.no_grad():  # the end token competes with the seventh byte greedy decoding picks
            head = model.get_output_embeddings().weight
            head[end] = head[greedy[min(6, len(greedy) - 1)]] * 0.99
        model.save_pretrained(d)
        with open(os.path.join(d, "chat.json"), "w") as f:
            json.dump({"messages": CHAT}, f, ensure_ascii=False)
        any_ended = False
        for beams in (1, 2, 4):
            want, ended = reply(model, ids, end, beams)
            any_ended = any_ended or ended
            flags = ["--temperature", "0"] if beams == 1 else ["--num-beams", str(beams)]
            res = subprocess.run([ztrain, "generate", "--weights", os.path.join(d, "model.safetensors"), "--model",
                                  os.path.join(d, "config.json"), "--tokenizer", os.path.join(d, "tokenizer.json"),
                                  "--chat", os.path.join(d, "chat.json"), "--max-new-tokens", str(NEW)] + flags,
                                 capture_output=True)
            got = res.stdout[:-1] if res.stdout.endswith(b"\n") else res.stdout
            t.check(res.returncode == 0 and got == want,
                    f"chat reply, {'greedy' if beams == 1 else f'{beams} beams'}: ztrain {got!r}, transformers "
                    f"{want!r}{' (ended at <|im_end|>)' if ended else ''}"
                    + ("" if res.returncode == 0 else f"; ztrain failed: {res.stderr.decode()[-300:]}"))
        t.check(any_ended, "some reply ended at <|im_end|>")
    return t.summary()


if __name__ == "__main__":
    sys.exit(main())

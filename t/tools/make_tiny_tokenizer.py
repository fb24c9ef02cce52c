#!/usr/bin/python3
"""Writes a small byte-level BPE tokenizer.json for the tiny test packs (vocab <= 1024).

Ids 0..255 are the 256 byte tokens (id = byte value), 256.. are merges learned from the
English text below (most frequent pair first, ties broken by the pair's ids, so the output is
the same on every machine; rare pairs too, up to --merges), and Muse's six control tokens are special added tokens at
1000..1005. Usage: make_tiny_tokenizer.py OUT.json [--merges N]
"""
import json
import re
import sys

CONTROL = ["<|begin_of_text|>", "<|end_of_text|>", "<|eom|>", "<|eot|>", "<|start|>", "<|message|>"]
CONTROL_BASE = 1000

# GPT-2 style pre-split: words with their leading space, numbers, punctuation runs, spaces.
SPLIT = r" ?\p{L}+| ?\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
SPLIT_PY = r" ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"  # ASCII training text only

TEXT = """
The assistant reads the question, thinks about it, and then writes an answer for the user.
A good answer is short and clear. When the user asks about the weather in a city, the
assistant can call a tool that returns the forecast for the next days, and then it tells the
user what the weather will be. The system message says who the assistant is and what it knows.
You are a helpful AI assistant. Knowledge cutoff: 2026-01-04. Reasoning strength: high.
Say hello to the world. Hello, world! The quick brown fox jumps over the lazy dog.
In this environment you have access to a set of tools you can use to answer the question.
You can invoke a function by writing a block like the following, with the name of the
function and the value of each parameter. String and scalar parameters are written as is,
while lists and objects use JSON format. Here are the functions available in JSONSchema
format. This is the value for the second parameter that can span multiple lines.
Once upon a time there was a small model that wanted to learn to speak. It read many books
and many stories, and every day it learned a little more about words, numbers and the world.
Numbers like 1, 2, 3, 10, 42, 100 and 2026 appear in text as well as names like Paris,
London and Tokyo. What is the capital of France? The capital of France is Paris.
"""


def byte_to_unicode():
    """The GPT-2 byte-level alphabet: printable bytes stand for themselves, the rest shift."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def learn_merges(text, max_merges):
    words = {}
    for piece in re.findall(SPLIT_PY, text):
        key = tuple(piece.encode("utf-8"))
        words[key] = words.get(key, 0) + 1
    seqs = [(list(k), c) for k, c in words.items()]
    tokens = {i: bytes([i]) for i in range(256)}
    merges = []
    next_id = 256
    while len(merges) < max_merges and next_id < CONTROL_BASE:
        counts = {}
        for seq, c in seqs:
            for a, b in zip(seq, seq[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + c
        if not counts:
            break
        pair, best = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        tokens[next_id] = tokens[pair[0]] + tokens[pair[1]]
        merges.append(pair)
        for seq, _ in seqs:
            i = 0
            while i < len(seq) - 1:
                if seq[i] == pair[0] and seq[i + 1] == pair[1]:
                    seq[i:i + 2] = [next_id]
                i += 1
        next_id += 1
    return tokens, merges


def tokenizer_json(tokens, merges, control_base=CONTROL_BASE):
    """A Hugging Face tokenizer.json of byte-level BPE tokens (id -> bytes) and merges (id
    pairs, in rank order), with Muse's control tokens at control_base ..; demo_data.py uses it
    too."""
    b2u = byte_to_unicode()

    def spell(tid):
        return "".join(b2u[b] for b in tokens[tid])

    vocab = {spell(t): t for t in sorted(tokens)}
    added = [{"id": control_base + i, "content": c, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i, c in enumerate(CONTROL)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab,
                  "merges": [spell(a) + " " + spell(b) for a, b in merges]},
    }


def build(max_merges):
    tokens, merges = learn_merges(TEXT, max_merges)
    return tokenizer_json(tokens, merges)


def main(argv):
    if len(argv) < 2 or argv[1].startswith("-"):
        sys.stderr.write("usage: make_tiny_tokenizer.py OUT.json [--merges N]\n")
        return 2
    max_merges = 600
    if len(argv) == 4 and argv[2] == "--merges":
        max_merges = int(argv[3])
    tok = build(max_merges)
    with open(argv[1], "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

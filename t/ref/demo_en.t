#!/usr/bin/python3
"""The trained demo pack (conf/packs/demo-en) against the training script's own forward.

t/ref/data/demo_en_parity.json holds one held-out chat example (State of the Union addresses
the model never saw) as text segments and token ids; demo_en_logits.npy the fp32 logits
t/tools/train_demo.py's forward computed for those ids from this very pack's weights (EXL3
Linears dequantized by t/ref/exl3_ref.py), rounded to fp16 for storage. Checks: the engine's
tokenizer gives the same ids; muse-engine logits matches to relative L2 < 1e-2 at 95% of the
positions and on average (an MoE routing near-tie, decided apart by the two EXL3 paths' roundings,
may flip one position), the same top-1 at 95% of them and the same perplexity within 2%; and a
greedy chat reply is English words that end the assistant turn with <|eot|>. Missing binaries
fail; a checkout without the pack yet (t/tools/demo_finish.sh makes it) skips.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "t", "ref"))
from tap import diag, ok  # noqa: E402
import tap  # noqa: E402

PACK = os.path.join(ROOT, "conf", "packs", "demo-en")
DATA = os.path.join(ROOT, "t", "ref", "data")
REL_L2_BOUND = 1e-2
REL_L2_SHARE = 0.95
TOP1_BOUND = 0.95
PPL_BOUND = 0.02
PACK_BYTES_BOUND = 12 * 1000 * 1000


def run(cmd, stdin=None):
    try:
        p = subprocess.run(cmd, cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, "", str(err)
    return p.returncode == 0, p.stdout, p.stderr.strip()[-2000:]


def log_softmax(z):
    z = z.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def check_tokenizer(engine, segs, ids):
    tok = os.path.join(PACK, "tokenizer.json")
    with open(tok, encoding="utf-8") as f:
        special = {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}
    got, back = [], True
    for kind, s in segs:
        if kind == "special":
            got.append(special[s])
            continue
        good, out, err = run([engine, "tokenize", "--tokenizer", tok], s)
        if not good:
            diag(err)
            return ok(False, "muse-engine tokenize runs on the pack's tokenizer")
        seg_ids = out.strip()
        got.extend(int(x) for x in seg_ids.split(","))
        good, text, err = run([engine, "detokenize", "--tokenizer", tok, "--ids", seg_ids])
        back = back and good and text.rstrip("\n") == s.rstrip("\n")
    ok(got == ids, f"the engine's tokenizer gives the {len(ids)} ids the model was trained with")
    ok(back, "muse-engine detokenize gives every text segment back")
    ok(len(special) == 6 and all(8186 <= i < 8192 for i in special.values()),
       "the six control tokens sit at 8186..8191")


def check_logits(engine, ids, ref, tmp):
    out = os.path.join(tmp, "demo_en.logits")
    good, _, err = run([engine, "logits", "--model", PACK, "--tokens", ",".join(map(str, ids)), "--out", out])
    if not ok(good, "muse-engine logits runs on the demo pack"):
        diag(err)
        return
    eng = np.fromfile(out, dtype="<f4")
    if not ok(eng.size == ref.size, f"the engine wrote {ref.shape[0]} x {ref.shape[1]} floats"):
        return
    eng = eng.reshape(ref.shape).astype(np.float64)
    ok(bool(np.all(np.isfinite(eng))), "engine logits are finite")
    rel = np.linalg.norm(eng - ref, axis=1) / np.linalg.norm(ref, axis=1)
    diag(f"rel L2: max {rel.max():.3e} at position {int(rel.argmax())}, mean {rel.mean():.3e}")
    share = float((rel < REL_L2_BOUND).mean())
    diag(f"positions over {REL_L2_BOUND}: {np.nonzero(rel >= REL_L2_BOUND)[0].tolist()}")
    ok(share >= REL_L2_SHARE, f"rel L2 error < {REL_L2_BOUND} at >= {REL_L2_SHARE:.0%} of positions")
    ok(float(rel.mean()) < REL_L2_BOUND, f"mean rel L2 error < {REL_L2_BOUND}")
    agree = float((eng.argmax(1) == ref.argmax(1)).mean())
    diag(f"top-1 agreement {agree:.4f} over {len(rel)} positions")
    ok(agree >= TOP1_BOUND, f"same top-1 token at >= {TOP1_BOUND:.0%} of positions")
    targets = np.asarray(ids[1: ref.shape[0] + 1])
    n = len(targets)
    nll_e = -log_softmax(eng[:n])[np.arange(n), targets].mean()
    nll_r = -log_softmax(ref[:n])[np.arange(n), targets].mean()
    diag(f"held-out perplexity: engine {np.exp(nll_e):.3f}, training script {np.exp(nll_r):.3f}")
    ok(abs(np.exp(nll_e) / np.exp(nll_r) - 1) < PPL_BOUND, f"the same held-out perplexity within {PPL_BOUND:.0%}")
    ok(np.exp(nll_r) < 100, "the model predicts held-out text (perplexity < 100 of 8192 tokens)")


def check_chat(engine, tmp):
    msgs = os.path.join(tmp, "messages.json")
    with open(msgs, "w") as f:
        json.dump([{"role": "user", "content": "Tell me about the economy."}], f)
    good, out, err = run([engine, "chat", "--model", PACK, "--messages", msgs, "--max-tokens", "96",
                          "--temperature", "0"])
    if not ok(good, "muse-engine chat runs on the demo pack"):
        diag(err)
        return
    reply = json.loads(out)
    text = reply.get("content") or ""
    diag(f"reply: {text!r}")
    ok(reply.get("finish_reason") == "stop", "the reply ends the turn itself (a stop id, not max tokens)")
    words = re.findall(r"[A-Za-z']+", text)
    ok(len(words) >= 5 and len(" ".join(words)) >= 0.8 * len(re.sub(r"[^A-Za-z' ]", "", text)),
       "the reply is English words (at least five)")


def main():
    if not os.path.exists(os.path.join(PACK, "config.json")) or not os.path.exists(os.path.join(DATA, "demo_en_logits.npy")):
        print("1..0 # SKIP conf/packs/demo-en or its reference logits are not in this checkout yet "
              "(t/tools/demo_finish.sh makes them)")
        return 0
    build = os.environ.get("BUILD", "build")
    engine = os.path.join(ROOT, build, "muse-engine")
    if not ok(os.access(engine, os.X_OK), f"{engine} exists (make it first)"):
        return tap.done()
    files = [f for f in os.listdir(PACK) if os.path.isfile(os.path.join(PACK, f))]
    size = sum(os.path.getsize(os.path.join(PACK, f)) for f in files)
    diag(f"{PACK}: {len(files)} files, {size} bytes")
    ok(size < PACK_BYTES_BOUND, f"the committed pack is under {PACK_BYTES_BOUND} bytes")
    cfg = json.load(open(os.path.join(PACK, "config.json")))
    q = cfg.get("quantization_config") or {}
    ok(q.get("quant_method") == "exl3" and q.get("bits") == 4 and q.get("head_bits") == 6
       and q.get("codebook") == "mul1", "the pack is EXL3, 4 bits, head 6 bits, MUL1")
    with open(os.path.join(DATA, "demo_en_parity.json")) as f:
        parity = json.load(f)
    ref = np.load(os.path.join(DATA, "demo_en_logits.npy")).astype(np.float64)
    ids = parity["ids"][: ref.shape[0]]
    ok(len(ids) > cfg["sliding_window"], f"{len(ids)} positions exceed the sliding window {cfg['sliding_window']}")
    check_tokenizer(engine, parity["segments"], parity["ids"])
    with tempfile.TemporaryDirectory(prefix="muse-demo-en-") as tmp:
        check_logits(engine, ids, ref, tmp)
        check_chat(engine, tmp)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""A world of processes (--tp-world W --tp-rank R --tp-master HOST:PORT) on the CPU backend: two
processes holding one rank each, on 127.0.0.1 and a free port, give logits bit for bit equal to
one process holding both (--ranks 2), on the tiny-tp packs (fp16 and EXL3 4 bits), and the same
tokens from generate, greedy and seeded sampling. Refusals: an unreachable master within the
timeout, a listener that is not muse, a world, context or model that differs (both sides name
both values), malformed --tp-* flags (exit 2 naming the flag). A follower killed mid-run stops
rank 0 within seconds with a line naming rank 1; rank 0 killed stops the follower naming rank 0.
"""
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "t", "ref"))
from tap import diag, ok  # noqa: E402
import tap  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
ENGINE = os.path.join(ROOT, os.environ.get("MUSE_ENGINE", os.path.join(BUILD, "muse-engine")))
PACK = os.path.join(ROOT, BUILD, "muse-pack")
TOKENS = ",".join(str((i * 7919 + 13) % 1000) for i in range(41))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(cmd, timeout=120):
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def world(args, ranks_args=None, timeout=120):
    """Runs args as rank 1 (in the background) and rank 0 of a world of 2; both results."""
    master = f"127.0.0.1:{free_port()}"
    tp = lambda r: ["--tp-world", "2", "--tp-rank", str(r), "--tp-master", master]  # noqa: E731
    f = subprocess.Popen([ENGINE] + (ranks_args or args) + tp(1), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    r0 = run([ENGINE] + args + tp(0), timeout)
    out1, err1 = f.communicate(timeout=timeout)
    return r0, (f.returncode, out1, err1), master


def main():
    if not ok(os.access(ENGINE, os.X_OK) and os.access(PACK, os.X_OK), "muse-engine and muse-pack exist"):
        return tap.done()
    with tempfile.TemporaryDirectory(prefix="muse-tp-") as tmp:
        packs = {}
        for kind, extra in (("fp16", []), ("exl3-4", ["--exl3-random", "4", "--codebook", "mul1"])):
            packs[kind] = os.path.join(tmp, kind)
            rc, _, err = run([PACK, "--config", "conf/packs/tiny-tp.json", "--out", packs[kind], "--seed", "7"] + extra)
            ok(rc == 0, f"{kind}: muse-pack makes the tiny-tp pack") or diag(err)
        for kind, pack in packs.items():
            one = os.path.join(tmp, f"{kind}.one")
            rc, _, err = run([ENGINE, "logits", "--model", pack, "--tokens", TOKENS, "--out", one, "--ranks", "2"])
            ok(rc == 0, f"{kind}: logits --ranks 2 in one process") or diag(err)
            two = os.path.join(tmp, f"{kind}.two")
            (rc0, _, e0), (rc1, _, e1), _ = world(["logits", "--model", pack, "--tokens", TOKENS, "--out", two])
            same = rc0 == 0 and rc1 == 0 and open(one, "rb").read() == open(two, "rb").read()
            ok(same, f"{kind}: logits of two processes (--tp-world 2) equal one process --ranks 2, bit for bit")
            if not same:
                diag(f"rank 0 exit {rc0}: {e0.strip()}\nrank 1 exit {rc1}: {e1.strip()}")
            ok(not os.path.exists(two + ".x"), f"{kind}: rank 1 writes no --out of its own")
            for label, s in (("greedy", []), ("seeded sampling", ["--temperature", "0.9", "--top-k", "40", "--seed", "11"])):
                gen = ["generate", "--model", pack, "--tokens", "5,6,7,8,9", "--max-tokens", "10", "--chunk", "3"] + s
                rc, want, err = run([ENGINE] + gen + ["--ranks", "2"])
                (rc0, got, e0), (rc1, out1, e1), _ = world(gen)
                good = rc == 0 and rc0 == 0 and rc1 == 0 and got == want and want.strip() and not out1.strip()
                ok(good, f"{kind} generate {label}: two processes print the tokens of --ranks 2 ({want.strip()}); rank 1 prints none")
                if not good:
                    diag(f"want {want!r} got {got!r}; rank 0: {e0.strip()} rank 1: {e1.strip()}")
        refusals(tmp, packs["fp16"], packs["exl3-4"])
        failures(packs["fp16"])
        bad_streams(packs["fp16"])
    return tap.done()


def refusals(tmp, pack, other):
    gen = ["generate", "--model", pack, "--tokens", "1,2,3", "--max-tokens", "4"]
    port = free_port()
    t0 = time.monotonic()
    rc, _, err = run([ENGINE] + gen + ["--tp-world", "2", "--tp-rank", "1", "--tp-master", f"127.0.0.1:{port}",
                                       "--tp-timeout-ms", "1500"])
    took = time.monotonic() - t0
    ok(rc != 0 and f"--tp-master 127.0.0.1:{port}: no rank 0 answered within 1500 ms" in err and took < 3.5,
       f"unreachable master: refused within the timeout + 2 s ({took:.1f} s), naming it")
    diag(err.strip())
    # rank 0 alone: the missing rank named within the timeout
    t0 = time.monotonic()
    rc, _, err = run([ENGINE] + gen + ["--tp-world", "2", "--tp-rank", "0", "--tp-master", f"127.0.0.1:{free_port()}",
                                       "--tp-timeout-ms", "1000"])
    took = time.monotonic() - t0
    ok(rc != 0 and "rank 1 did not join within 1000 ms" in err and took < 3,
       f"rank 0 alone: 'rank 1 did not join within 1000 ms' after {took:.1f} s")
    # a listener that takes the connection and says nothing
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(1)
    rc, _, err = run([ENGINE] + gen + ["--tp-world", "2", "--tp-rank", "1", "--tp-master",
                                       f"127.0.0.1:{mute.getsockname()[1]}", "--tp-timeout-ms", "1000"])
    mute.close()
    ok(rc != 0 and "connected, but no muse rank 0 answered within 1000 ms" in err,
       "a listener that says nothing: 'connected, but no muse rank 0 answered within 1000 ms'")
    # a listener that is not muse
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    port = lsock.getsockname()[1]

    def stranger():
        c, _ = lsock.accept()
        c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        time.sleep(1)
        c.close()
    th = threading.Thread(target=stranger)
    th.start()
    rc, _, err = run([ENGINE] + gen + ["--tp-world", "2", "--tp-rank", "1", "--tp-master", f"127.0.0.1:{port}",
                                       "--tp-timeout-ms", "3000"])
    th.join()
    lsock.close()
    ok(rc != 0 and "answered but is not a muse rank 0" in err and "HTTP/1.1" in err,
       "a listener that sends something else: 'answered but is not a muse rank 0', showing what it sent")
    diag(err.strip())
    # a stranger at rank 0's door is ignored; the world still forms
    master_port = free_port()
    tp0 = ["--tp-world", "2", "--tp-rank", "0", "--tp-master", f"127.0.0.1:{master_port}"]
    p0 = subprocess.Popen([ENGINE] + gen + tp0, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(50):
        try:
            s = socket.create_connection(("127.0.0.1", master_port))
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            s.close()
            break
        except OSError:
            time.sleep(0.1)
    rc1, _, e1 = run([ENGINE] + gen + ["--tp-world", "2", "--tp-rank", "1", "--tp-master", f"127.0.0.1:{master_port}"])
    out0, e0 = p0.communicate(timeout=60)
    ok(p0.returncode == 0 and rc1 == 0 and "ignored a connection from 127.0.0.1" in e0 and out0.strip(),
       "rank 0 ignores a connection that is not a muse rank and the world still forms")
    # what must agree, named on both sides with both values
    cases = [
        (gen + ["--tp-world", "3"], gen, "--tp-world 3, rank 0 has --tp-world 2"),
        (["generate", "--model", pack, "--tokens", "1,2,3", "--max-tokens", "5"], gen, "rank 0 has 7, rank 1 has 8"),
        (["generate", "--model", other, "--tokens", "1,2,3", "--max-tokens", "4"], gen, "the model (config.json, tensor shapes and contents) differs"),
    ]
    for r1args, r0args, want in cases:
        master = f"127.0.0.1:{free_port()}"
        extra1 = [] if "--tp-world" in r1args else ["--tp-world", "2"]
        f = subprocess.Popen([ENGINE] + r1args + extra1 + ["--tp-rank", "1", "--tp-master", master], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rc0, _, e0 = run([ENGINE] + r0args + ["--tp-world", "2", "--tp-rank", "0", "--tp-master", master])
        _, e1 = f.communicate(timeout=60)
        good = rc0 != 0 and f.returncode != 0 and want in e0 and want in e1
        ok(good, f"mismatch refused on both sides: '{want}'")
        if not good:
            diag(f"rank 0 exit {rc0}: {e0.strip()}\nrank 1 exit {f.returncode}: {e1.strip()}")
    bad = [
        (["--tp-world", "2", "--tp-rank", "0"], "--tp-master: --tp-world W, --tp-rank R and --tp-master HOST:PORT go together"),
        (["--tp-rank", "1", "--tp-master", "h:1"], "--tp-world: --tp-world W, --tp-rank R and --tp-master HOST:PORT go together"),
        (["--tp-world", "2", "--tp-rank", "2", "--tp-master", "h:1"], "--tp-rank 2: outside 0 .. 1"),
        (["--tp-world", "9", "--tp-rank", "0", "--tp-master", "h:1"], "--tp-world 9"),
        (["--tp-world", "2", "--tp-rank", "0", "--tp-master", "nohost"], "--tp-master nohost: no :PORT"),
        (["--tp-world", "2", "--tp-rank", "0", "--tp-master", "h:99999"], "--tp-master h:99999: the port must be"),
        (["--tp-world", "2", "--tp-rank", "0", "--tp-master", "[::1:5"], "--tp-master [::1:5"),
        (["--tp-timeout-ms", "500"], "--tp-timeout-ms goes with"),
        (["--tp-world", "2", "--tp-rank", "0", "--tp-master", "h:1", "--ranks", "2"], "--ranks 2 with --tp-world 2"),
        (["--tp-world", "2", "--tp-rank", "0", "--tp-master", "h:1", "--backend", "cuda"], "--tp-world goes with --backend cpu"),
    ]
    for args, want in bad:
        rc, _, err = run([ENGINE] + gen + args)
        ok(rc == 2 and want in err, f"{' '.join(args)}: exit 2, '{want}'")
        if not (rc == 2 and want in err):
            diag(f"exit {rc}: {err.strip()}")
    rc, _, err = run([ENGINE, "serve", "--model", pack, "--tp-world", "2", "--tp-rank", "1", "--tp-master", "h:1",
                      "--listen", "/tmp/x.sock"])
    ok(rc == 2 and "--listen goes with rank 0" in err, "serve: --listen on rank 1 refused (exit 2)")
    rc, _, err = run([ENGINE, "serve", "--model", pack, "--tp-world", "2", "--tp-rank", "0", "--tp-master", "h:1"])
    ok(rc == 2 and "--listen SOCKET is required" in err, "serve: rank 0 without --listen refused (exit 2)")


def failures(pack):
    """A rank killed mid-run stops the other within seconds, naming it; a rank that hangs
    (SIGSTOP) is named by the other after --tp-timeout-ms."""
    gen = ["generate", "--model", pack, "--tokens", "1,2,3", "--max-tokens", "4000", "--threads", "1",
           "--tp-timeout-ms", "1000"]
    master = f"127.0.0.1:{free_port()}"
    tp = lambda r: ["--tp-world", "2", "--tp-rank", str(r), "--tp-master", master]  # noqa: E731
    p1 = subprocess.Popen([ENGINE] + gen + tp(1), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p0 = subprocess.Popen([ENGINE] + gen + tp(0), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p0.stdout.read(8)
    p1.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        _, err = p0.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        p0.kill()
        _, err = p0.communicate()
    took = time.monotonic() - t0
    p1.send_signal(signal.SIGKILL)
    p1.send_signal(signal.SIGCONT)
    p1.communicate()
    err = err.decode(errors="replace")
    ok(first and p0.returncode not in (0, None) and took < 3.5 and "rank 1 (127.0.0.1:" in err
       and "no answer before the deadline" in err,
       f"rank 1 hung (SIGSTOP): rank 0 exits {p0.returncode} after {took:.1f} s (--tp-timeout-ms 1000), naming rank 1")
    diag(err.strip()[-300:])
    gen = ["generate", "--model", pack, "--tokens", "1,2,3", "--max-tokens", "4000", "--threads", "1"]
    for victim in (1, 0):
        master = f"127.0.0.1:{free_port()}"
        tp = lambda r: ["--tp-world", "2", "--tp-rank", str(r), "--tp-master", master]  # noqa: E731
        procs = [subprocess.Popen([ENGINE] + gen + tp(r), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for r in (1, 0)]
        procs = {1: procs[0], 0: procs[1]}
        first = procs[0].stdout.read(8)  # rank 0 is printing tokens: the world is running
        procs[victim].send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        other = procs[1 - victim]
        try:
            _, err = other.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            other.kill()
            _, err = other.communicate()
        took = time.monotonic() - t0
        procs[victim].communicate()
        err = err.decode(errors="replace")
        good = first and other.returncode not in (0, None) and took < 5 and f"rank {victim} (" in err and "stopped" in err
        ok(good, f"rank {victim} killed mid-run: rank {1 - victim} exits {other.returncode} within {took:.1f} s, "
           f"naming rank {victim}")
        diag(err.strip()[-300:])


def fake_rank0(records):
    """A listener that passes the rendezvous (it echoes the follower's own values back) and then
    sends records: what a broken or hostile rank 0 could send. Returns (port, thread)."""
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def serve():
        c, _ = lsock.accept()
        hello = b""
        while len(hello) < 104:
            chunk = c.recv(104 - len(hello))
            if not chunk:
                return
            hello += chunk
        reply = b"muse-tp\n" + struct.pack("<III", 1, 0, 2) + b"\0" * 4 + hello[24:104] + os.urandom(128)
        c.sendall(reply + records)
        c.settimeout(5)
        try:  # until the follower hangs up (the last case: its close is what it gets)
            while c.recv(4096):
                pass
        except OSError:
            pass
        c.close()
        lsock.close()
    th = threading.Thread(target=serve)
    th.start()
    return lsock.getsockname()[1], th


def bad_streams(pack):
    """A follower checks every header, length and index of rank 0's records: it exits with the
    reason, never reads past a buffer (the sanitizer build where it exists)."""
    asan = os.path.join(ROOT, BUILD, "t", "muse-engine-asan")
    engine = asan if os.access(asan, os.X_OK) else ENGINE
    head = lambda op, n: struct.pack("<IIQ", 0x4354504D, op, n)  # noqa: E731
    rnd = lambda rows, wanted, tables: struct.pack("<iiqqq", 2, 0, rows, wanted, tables)  # noqa: E731
    cases = [
        ("a header of no muse magic", b"GARBAGE!" * 2, "out of step"),
        ("a sum where a broadcast is due", head(1, 8) + b"\0" * 8, "out of step: sent a sum where a broadcast was due"),
        ("a broadcast longer than any round", head(3, 1 << 40), "where at most"),
        ("a round of 10^9 rows", head(3, 32) + rnd(10 ** 9, 0, 1), "does not hold 1000000000 rows"),
        ("a record of no known kind", head(3, 8) + struct.pack("<ii", 77, 0), "no known kind (77)"),
        ("a snapshot of a slot outside the pool", head(3, 24) + struct.pack("<iiiiq", 3, 1, 0, 99, 1),
         "a snapshot record names slot 99"),
        ("a round naming a KV slot outside the pool",
         head(3, 32 + 17 + 24 + 8 + 4 + 4) + rnd(1, 1, 1) + struct.pack("<iqi", 1, 0, 0) + b"\1" + b"\0" * 32
         + struct.pack("<ii", 5, 0), "names KV slot 5"),
        ("rank 0 closing mid-record", head(3, 100) + b"\0" * 10, "rank 0 (127.0.0.1:"),
    ]
    for label, records, want in cases:
        port, th = fake_rank0(records)
        rc, _, err = run([engine, "generate", "--model", pack, "--tokens", "1", "--max-tokens", "1",
                          "--tp-world", "2", "--tp-rank", "1", "--tp-master", f"127.0.0.1:{port}",
                          "--tp-timeout-ms", "3000"], timeout=60)
        th.join()
        good = rc == 1 and want in err and "ERROR: AddressSanitizer" not in err and "runtime error" not in err
        ok(good, f"follower given {label}: exit 1, '{want}'")
        if not good:
            diag(f"exit {rc}: {err.strip()[-800:]}")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""EXL3: the C codebook tables, dequantization and linear against the NumPy reference
(t/ref/exl3_ref.py, written independently from design/EXL3.md). Uses build/t/test_exl3
(or $BUILD/t/test_exl3) in its --dump-table and --dump-tensors modes."""
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "t", "ref"))
import exl3_ref  # noqa: E402
import tap  # noqa: E402
from tap import ok  # noqa: E402

BIN = os.path.join(ROOT, os.environ.get("BUILD", "build"), "t", "test_exl3")
if not ok(os.access(BIN, os.X_OK), "%s is built (make)" % BIN):
    sys.exit(tap.done())

tmp = tempfile.mkdtemp(prefix="exl3_tables.")

# Spec facts the NumPy tables must reproduce on their own.
spec = {"3inst": (0.76806640625, -0.91943359375, -0.158203125, 1.24371),
        "mcg": (1.84375, 0.134521484375, 0.85009765625, 1.24411),
        "mul1": (-3.453125, 0.64111328125, -0.6513671875, 1.00031)}
for cb in exl3_ref.CODEBOOKS:
    table = exl3_ref.codebook_table(cb)
    want = spec[cb]
    rms = float(np.sqrt(np.mean(table.astype(np.float64) ** 2)))
    ok((float(table[0]), float(table[1]), float(table[0xFFFF])) == want[:3] and abs(rms - want[3]) <= 5e-6,
       "numpy %s: check values and RMS %.6f match EXL3.md" % (cb, rms))
    path = os.path.join(tmp, cb + ".bin")
    rc = subprocess.call([BIN, "--dump-table", cb, path])
    c_table = np.fromfile(path, dtype="<u2") if rc == 0 else np.zeros(0, np.uint16)
    diff = int(np.count_nonzero(c_table != table.view(np.uint16))) if c_table.size == 65536 else -1
    ok(diff == 0, "C %s table equals NumPy on all 65536 states (%d differ)" % (cb, diff))

# Stream test vector from the spec, decoded by numpy alone.
tile = np.zeros(64, np.uint16)
tile[:4] = (0x4567, 0x0123, 0xCDEF, 0x89AB)
tile[4:] = np.tile(tile[:4], 15)
ok(list(exl3_ref.tile_states(tile, 4)[:4]) == [0xDEF0, 0xEF01, 0xF012, 0x0123], "numpy: bits 4 test vector")

# Random Linears: C dequant and C linear vs NumPy.
rows = 5
for cb, bits, k, n, seed in (("mul1", 2, 256, 128, 11), ("3inst", 3, 128, 384, 12),
                              ("mcg", 5, 256, 256, 13), ("mul1", 8, 128, 128, 14)):
    d = os.path.join(tmp, "%s_%d" % (cb, bits))
    os.mkdir(d)
    rc = subprocess.call([BIN, "--dump-tensors", cb, str(bits), str(k), str(n), str(seed), d])
    if rc != 0:
        ok(False, "dump-tensors %s bits %d ran" % (cb, bits))
        continue

    def load(name, dtype):
        return np.fromfile(os.path.join(d, name), dtype=dtype)

    key = "model.layers.0.mlp.up_proj"
    tensors = {key + ".trellis": load("trellis.bin", "<i2").reshape(k // 16, n // 16, 16 * bits),
               key + ".suh": load("suh.bin", "<f2"), key + ".svh": load("svh.bin", "<f2"),
               key + ".bias": load("bias.bin", "<f2")}
    if cb != "3inst":
        tensors[key + "." + cb] = np.array(0, np.int32)
    get = tensors.get
    ref = exl3_ref.dequantize(get, key).astype(np.float64)
    c_deq = load("deq.bin", "<f4").reshape(k, n).astype(np.float64)
    rel = np.sqrt(np.mean((c_deq - ref) ** 2) / np.mean(ref ** 2))
    ok(rel < 1e-6 and np.mean(ref ** 2) > 0, "%s bits %d %dx%d: C dequant vs NumPy: relative RMS %.2e" % (cb, bits, k, n, rel))
    x = load("x.bin", "<f4").reshape(rows, k)
    y_ref = exl3_ref.exl3_linear(get, key, x).astype(np.float64)
    y_c = load("y.bin", "<f4").reshape(rows, n).astype(np.float64)
    # The fp16 A operand may round differently at a near-tie (fp32 butterflies vs a float64
    # matrix product; about 1 element in 2000), moving one output by about 2^-10 * |a_i w_ij|,
    # i.e. up to ~1e-4 of the RMS for k=128: allow 2.5e-4 at worst, 3e-5 RMS.
    scale = np.sqrt(np.mean(y_ref ** 2))
    rel = np.sqrt(np.mean((y_c - y_ref) ** 2)) / scale
    worst = np.max(np.abs(y_c - y_ref)) / scale
    ok(rel < 3e-5 and worst < 2.5e-4, "%s bits %d: C linear vs NumPy five steps: relative RMS %.2e, max %.2e" % (cb, bits, rel, worst))
    # ... and the fp16 rounding is really there: without it the outputs move ten times more.
    a64 = exl3_ref.block_had(x.astype(np.float64) * tensors[key + ".suh"].astype(np.float64))
    y_exact = exl3_ref.block_had(a64 @ exl3_ref.decoded_matrix(get, key)) * tensors[key + ".svh"].astype(np.float64)
    y_exact += tensors[key + ".bias"].astype(np.float64)
    rel_exact = np.sqrt(np.mean((y_c - y_exact) ** 2)) / scale
    ok(rel_exact > 10 * rel, "%s bits %d: the A operand is rounded to fp16 (unrounded differs by %.2e)" % (cb, bits, rel_exact))

for name in os.listdir(tmp):
    p = os.path.join(tmp, name)
    if os.path.isdir(p):
        for f in os.listdir(p):
            os.unlink(os.path.join(p, f))
        os.rmdir(p)
    else:
        os.unlink(p)
os.rmdir(tmp)
sys.exit(tap.done())

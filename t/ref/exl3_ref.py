"""Independent NumPy decoder for EXL3 weights, written from design/EXL3.md.

get(name) returns a numpy array for a tensor name or None; int16 tensors come as np.int16,
fp16 as np.float16, the 0-dim codebook markers as np.int32.

    dequantize(get, key)  -> float32 (k, n): diag(suh) Hk Wq Hn diag(svh)
    exl3_linear(get, key, x) -> float32 (T, n): the five steps, A operand rounded to fp16
"""
import numpy as np

CODEBOOKS = ("3inst", "mcg", "mul1")
_M32 = np.uint64(0xFFFFFFFF)


def _half_pair(x):
    """Low and high halves of uint64 x (< 2^32) as fp16 after mask and xor, summed, one rounding."""
    x = (x & np.uint64(0x8FFF8FFF)) ^ np.uint64(0x3B603B60)
    lo = (x & np.uint64(0xFFFF)).astype(np.uint16).view(np.float16).astype(np.float64)
    hi = (x >> np.uint64(16)).astype(np.uint16).view(np.float16).astype(np.float64)
    return (lo + hi).astype(np.float16)


def codebook_table(cb):
    """fp16 value of every 16-bit state, shape (65536,)."""
    s = np.arange(65536, dtype=np.uint64)
    if cb == "3inst":
        return _half_pair((s * np.uint64(89226354) + np.uint64(64248484)) & _M32)
    if cb == "mcg":
        return _half_pair((s * np.uint64(0xCBAC1FED)) & _M32)
    if cb == "mul1":
        x = (s * np.uint64(0x83DCD12D)) & _M32
        byte_sum = sum((x >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4))
        k_inv = float(np.array(0x1EEE, np.uint16).view(np.float16))
        k_bias = float(np.array(0xC931, np.uint16).view(np.float16))
        return ((1024.0 + byte_sum.astype(np.float64)) * k_inv + k_bias).astype(np.float16)
    raise ValueError("unknown codebook " + cb)


def tile_states(tiles, bits):
    """tiles: uint16 (..., 16*bits) -> states uint32 (..., 256) in position order."""
    tiles = np.asarray(tiles).view(np.uint16).astype(np.uint32)
    words = tiles[..., 0::2] | (tiles[..., 1::2] << 16)
    stream = np.unpackbits(words.astype(">u4").view(np.uint8), axis=-1)  # MSB first
    total = 256 * bits
    ends = (np.arange(256) + 1) * bits
    idx = (ends[:, None] - 16 + np.arange(16)[None, :]) % total  # 16-bit window, circular
    weights = (1 << np.arange(15, -1, -1)).astype(np.uint32)
    return (stream[..., idx].astype(np.uint32) * weights).sum(axis=-1).astype(np.uint32)


def position_elements():
    """Row and column (within the tile) of each position p = 0..255."""
    p = np.arange(256)
    lane, j = p // 8, p % 8
    r = 2 * (lane % 4) + (j & 1) + 8 * ((j >> 1) & 1)
    c = lane // 4 + 8 * (j >> 2)
    return r, c


def hadamard128():
    h = np.array([[1.0]])
    while h.shape[0] < 128:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(128.0)


def block_had(v, axis=-1):
    """H applied to each consecutive 128-chunk along axis (float64)."""
    v = np.moveaxis(np.asarray(v, np.float64), axis, -1)
    shape = v.shape
    out = (v.reshape(shape[:-1] + (shape[-1] // 128, 128)) @ hadamard128()).reshape(shape)
    return np.moveaxis(out, -1, axis)


def _codebook_of(get, key):
    mcg, mul1 = get(key + ".mcg"), get(key + ".mul1")
    if mcg is not None and mul1 is not None:
        raise ValueError(key + ": both .mcg and .mul1")
    return "mcg" if mcg is not None else "mul1" if mul1 is not None else "3inst"


def _signs(packed, length):
    bits = (packed.view(np.uint16).astype(np.uint32)[:, None] >> np.arange(16)) & 1
    return np.where(bits.reshape(-1)[:length] == 1, -1.0, 1.0)


def _scales(get, key, k, n):
    suh, svh = get(key + ".suh"), get(key + ".svh")
    if suh is not None and svh is not None:
        return suh.astype(np.float64), svh.astype(np.float64)
    return _signs(get(key + ".su"), k), _signs(get(key + ".sv"), n)


def decoded_matrix(get, key):
    """Wq: the decoded trellis as float64 (k, n)."""
    trellis = get(key + ".trellis")
    kt, nt, last = trellis.shape
    bits = last // 16
    table = codebook_table(_codebook_of(get, key)).astype(np.float64)
    values = table[tile_states(trellis, bits)]  # (kt, nt, 256)
    r, c = position_elements()
    tiles = np.zeros((kt, nt, 16, 16))
    tiles[:, :, r, c] = values
    return tiles.transpose(0, 2, 1, 3).reshape(kt * 16, nt * 16)


def dequantize(get, key):
    wq = decoded_matrix(get, key)
    k, n = wq.shape
    su, sv = _scales(get, key, k, n)
    w = block_had(block_had(wq, axis=1), axis=0)
    return (su[:, None] * w * sv[None, :]).astype(np.float32)


def exl3_linear(get, key, x):
    wq = decoded_matrix(get, key)
    k, n = wq.shape
    su, sv = _scales(get, key, k, n)
    x = np.asarray(x, np.float32).reshape(-1, k)
    a = (x * su.astype(np.float32)).astype(np.float32)  # step 1, fp32
    a = block_had(a).astype(np.float32).astype(np.float16)  # step 2: the fp16 A operand
    t = a.astype(np.float64) @ wq  # step 3
    y = block_had(t) * sv  # steps 4-5
    bias = get(key + ".bias")
    if bias is not None:
        y = y + bias.astype(np.float64)
    return y.astype(np.float32)

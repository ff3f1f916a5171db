"""TFRecord framing for event files, with a CRC-32C computed in NumPy; no TensorFlow.

An event file is a sequence of records: the data's length (uint64), its
masked CRC-32C, the data, the data's masked CRC-32C (all little-endian).
TensorBoard's own ``RecordWriter`` computes the CRC a byte at a time in
Python, about 0.4 us a byte: 2 to 10 ms for one written step of a few
kilobytes, longer than the statistics themselves. ``crc32c`` computes the
same checksum over many lanes of the data at once.

How. The CRC register update is linear over GF(2): with a register that
starts at 0, ``crc(A + B) = shift(crc(A), len(B)) ^ crc(B)``, where
``shift(x, n)`` is the register after ``n`` zero bytes. So the data is cut
into ``K`` lanes of ``m`` bytes (zeros in front, which leave a zero register
unchanged), all lanes are run through the byte table together (``m``
vectorised steps), and the lanes are joined pairwise, ``log2(K)`` vectorised
steps, ``shift`` being four table lookups per register (its tables for
``n = m * 2**i`` are built once by squaring).
"""

import struct

import numpy as np

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_MASK_DELTA = 0xA282EAD8
# Below this many bytes a plain loop is as fast.
_SMALL = 256


def _byte_table():
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> np.uint32(1)) ^ np.uint32(_POLY), t >> np.uint32(1)).astype(np.uint32)
    return t


_TABLE = _byte_table()
_TABLE_LIST = _TABLE.tolist()


def _word_table():
    """uint32 ``[65536]``: the register ``i`` (< 2**16) after two bytes, two table steps in one lookup."""
    r = np.arange(65536, dtype=np.uint32)
    for _ in range(2):
        r = _TABLE[r & 0xFF] ^ (r >> np.uint32(8))
    return r


_WORD_TABLE = _word_table()
_SHIFTS = {}  # n -> uint32 [4, 256]: the register after n zero bytes, per byte of the register


def _apply(tables, x):
    """``shift`` of the registers ``x`` (uint32 array) by the tables' number of zero bytes."""
    return (
        tables[0][x & 0xFF] ^ tables[1][(x >> np.uint32(8)) & 0xFF] ^ tables[2][(x >> np.uint32(16)) & 0xFF]
    ) ^ tables[3][x >> np.uint32(24)]


def _shift_tables(n):
    """uint32 ``[4, 256]`` for ``n`` zero bytes, ``n`` a power of two (by squaring the tables of ``n / 2``)."""
    tables = _SHIFTS.get(n)
    if tables is None:
        if n == 1:
            x = np.arange(256, dtype=np.uint32)[None, :] << (np.uint32(8) * np.arange(4, dtype=np.uint32))[:, None]
            tables = _TABLE[x & 0xFF] ^ (x >> np.uint32(8))
        else:
            half = _shift_tables(n // 2)
            tables = _apply(half, half)
        _SHIFTS[n] = tables
    return tables


_SHIFT_LISTS = {}


def _shift(x, n):
    """``shift`` of one register ``x`` (an int) by any ``n`` zero bytes (its binary digits' tables)."""
    bit = 1
    while n:
        if n & 1:
            t = _SHIFT_LISTS.get(bit)
            if t is None:
                t = _SHIFT_LISTS[bit] = _shift_tables(bit).tolist()
            x = t[0][x & 0xFF] ^ t[1][(x >> 8) & 0xFF] ^ t[2][(x >> 16) & 0xFF] ^ t[3][x >> 24]
        n >>= 1
        bit <<= 1
    return x


def _raw_small(data, register):
    for b in data:
        register = _TABLE_LIST[(register ^ b) & 0xFF] ^ (register >> 8)
    return register


def crc32c(data):
    """The CRC-32C of ``data`` (bytes), as ``zlib.crc32`` gives CRC-32."""
    n = len(data)
    if n < _SMALL:
        return _raw_small(data, 0xFFFFFFFF) ^ 0xFFFFFFFF
    # Short lanes: each step is a few NumPy calls whose cost is mostly their
    # overhead, so few steps over many lanes, and two bytes per step.
    lane = 16 if n < 1 << 16 else 64
    lanes = 1 << int(np.ceil(np.log2(-(-n // lane))))
    buffer = np.zeros(lanes * lane, np.uint8)
    buffer[lanes * lane - n :] = np.frombuffer(data, np.uint8)
    words = np.ascontiguousarray(buffer.view("<u2").reshape(lanes, lane // 2).T).astype(np.uint32)
    register = np.zeros(lanes, np.uint32)
    for word in words:
        register = _WORD_TABLE[(register ^ word) & 0xFFFF] ^ (register >> np.uint32(16))
    width = lane
    while len(register) > 1:
        register = _apply(_shift_tables(width), register[0::2]) ^ register[1::2]
        width *= 2
    # The register that started at 0xFFFFFFFF is that start shifted over the
    # data, plus the zero-start register (linearity); then the final xor.
    return (_shift(0xFFFFFFFF, n) ^ int(register[0])) ^ 0xFFFFFFFF


def masked_crc32c(data):
    """The masked CRC-32C that TFRecord framing stores."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def record(data):
    """``data`` framed as one TFRecord."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))

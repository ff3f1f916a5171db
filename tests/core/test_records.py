"""records: TFRecord framing with a vectorised CRC-32C, against TensorBoard's byte-at-a-time one."""

import struct

import numpy as np
import pytest
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

from tb_gradcheck.core import records


@pytest.mark.parametrize("n", [0, 1, 9, 255, 256, 257, 4095, 4096, 4097, 65535, 65536, 65537, 300_001])
def test_masked_crc32c_equals_tensorboards(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert records.masked_crc32c(data) == pywrap_tensorflow.masked_crc32c(data)


def test_crc32c_check_value_and_all_ones():
    assert records.crc32c(b"123456789") == 0xE3069283  # the CRC-32C catalogue's check value
    assert records.crc32c(b"\xff" * 1000) == pywrap_tensorflow.crc32c(b"\xff" * 1000) & 0xFFFFFFFF


def test_record_is_length_crc_data_crc():
    data = bytes(range(256)) * 3
    framed = records.record(data)
    (length,) = struct.unpack("<Q", framed[:8])
    assert length == len(data) and framed[12 : 12 + length] == data
    assert struct.unpack("<I", framed[8:12])[0] == pywrap_tensorflow.masked_crc32c(framed[:8])
    assert struct.unpack("<I", framed[-4:])[0] == pywrap_tensorflow.masked_crc32c(data)

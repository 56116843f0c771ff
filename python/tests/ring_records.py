"""The rings' test records, built in Python: what the checking consumers (``ring_check_lanes``
and the other checking kernels of kernels/ring.cu, ``vkgdr.CheckingRing`` on the CPU) verify.

A test payload is the record's sequence number (8 bytes, little-endian), the checksum of the
body (8 bytes), then the body; the checksum is the library's ``layout::test_checksum``. This
module imports neither vkgdr nor the test configuration, so that child processes (which must not
load CUDA) can import it.
"""

import numpy as np

MUL = np.uint64(0x9E3779B97F4A7C15)
#: The consumers' result words (``DeviceRing.results_of``, ``CheckingRing.results_of``).
RESULT_RECORDS, RESULT_CHECKSUM_SUM, RESULT_ERRORS, RESULT_NEXT_SEQ, RESULT_POS = range(5)


def checksum(body: np.ndarray) -> int:
    """layout::test_checksum: sum over the body's little-endian 32-bit words w[i] (the last one
    zero-filled) of mix(((i << 32) | w[i]) + 1), wrapping."""
    padded = np.zeros((len(body) + 3) // 4 * 4, dtype=np.uint8)
    padded[: len(body)] = body
    w = padded.view("<u4").astype(np.uint64)
    i = np.arange(len(w), dtype=np.uint64)
    x = ((i << np.uint64(32)) | w) + np.uint64(1)
    with np.errstate(over="ignore"):
        x = x * MUL
        x ^= x >> np.uint64(29)
        return int(x.sum(dtype=np.uint64))


def sealed_payload(seq: int, body: np.ndarray) -> "tuple[bytes, int]":
    """A test payload (seq, checksum of the body, body) and its checksum."""
    s = checksum(body)
    return seq.to_bytes(8, "little") + s.to_bytes(8, "little") + body.tobytes(), s

"""Compression bombs for the size-limit tests, made in a tenth of the time zlib would take.

Compressing 1 GiB of zeros at level 9 costs about 3 s of CPU, in every test process
that needs the bomb. A full flush after each 1 MiB block makes every block's bytes the
same, so one block is compressed and repeated; the trailer's checksum and size are
computed over the real content, so each bomb is a valid stream that inflates to exactly
what it says (tests/test_limits_wire.py, test_wire_encodings.py, test_redaction.py).
"""

from __future__ import annotations

import struct
import zlib

GZIP = zlib.MAX_WBITS | 16
ZLIB = zlib.MAX_WBITS
_BLOCK = b"\0" * 2**20


def zeros_packed(wbits: int, inflated: int, head: bytes = b"") -> bytes:
    """``head`` and then ``inflated`` zero bytes (whole MiB), as gzip (``GZIP``) or zlib."""
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    start = packer.compress(head) + packer.flush(zlib.Z_FULL_FLUSH)
    once = packer.compress(_BLOCK) + packer.flush(zlib.Z_FULL_FLUSH)
    assert once == packer.compress(_BLOCK) + packer.flush(zlib.Z_FULL_FLUSH)
    end = packer.flush()
    count = inflated // len(_BLOCK)
    if wbits == GZIP:  # CRC-32 and the size modulo 2**32, little-endian
        crc = zlib.crc32(head)
        for _ in range(count):
            crc = zlib.crc32(_BLOCK, crc)
        end = end[:-8] + struct.pack("<II", crc, (len(head) + count * len(_BLOCK)) % 2**32)
    else:  # Adler-32, big-endian
        adler = zlib.adler32(head)
        for _ in range(count):
            adler = zlib.adler32(_BLOCK, adler)
        end = end[:-4] + struct.pack(">I", adler)
    return start + once * count + end


def gzip_of_gzip(inflated: int, head: bytes = b"") -> bytes:
    """gzip of gzip of ``head`` and ``inflated`` zero bytes: a few KB for 1 GiB."""
    outer = zlib.compressobj(9, zlib.DEFLATED, GZIP)
    return outer.compress(zeros_packed(GZIP, inflated, head)) + outer.flush()

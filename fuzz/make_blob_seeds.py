#!/usr/bin/env python3
"""fuzz/make_blob_seeds.py: writes the hand-made invalid blobs of fuzz/corpus/blob/.

(No .kiln suffix: .gitignore ignores *.kiln.)

Each is a small blob that is wrong in one way the loader must refuse
(include/kiln/blob.h, docs/blob-format.md); the real, valid seeds are
compiled by `make fuzz` from the shipped models. Rerun after a format change:
    python3 fuzz/make_blob_seeds.py fuzz/corpus/blob
"""
import os
import struct
import sys

N_SECTIONS = 15  # KILN_SEC_COUNT in format 1.0
RECORD_BYTES = [48, 1, 80, 16, 32, 24, 16, 24, 16, 16, 1, 8, 32, 1, 2]  # sizeof each record


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def header(file_bytes, major=1, minor=0, n_sections=N_SECTIONS, table_offset=64, magic=b"KILNPLAN"):
    return struct.pack("<8sHHIQIIQ24s", magic, major, minor, 64, file_bytes, n_sections, 0,
                       table_offset, bytes(24))


def seal(blob):
    """Sets the CRC32C over everything but its own 4 bytes (offset 28)."""
    blob = bytearray(blob)
    crc = crc32c(bytes(blob[:28]) + bytes(blob[32:]))
    blob[28:32] = struct.pack("<I", crc)
    return bytes(blob)


def table(entries):
    return b"".join(struct.pack("<IIQQ", i, rb, off, count) for i, (rb, off, count) in enumerate(entries))


def pad64(b):
    return b + bytes(-len(b) % 64)


def main(out):
    os.makedirs(out, exist_ok=True)
    seeds = {}
    table_end = 64 + 24 * N_SECTIONS
    body_at = table_end + (-table_end % 64)

    # Every section empty, at the end of the file: META must hold one record.
    empty = table([(rb, body_at, 0) for rb in RECORD_BYTES])
    seeds["empty-sections"] = seal(pad64(header(body_at) + empty))

    # Counts whose byte size overflows 64 bits, offsets past the end.
    huge = table([(rb, 0xFFFFFFFFFFFFFFC0, 1 << 61) for rb in RECORD_BYTES])
    seeds["huge-counts"] = seal(pad64(header(body_at) + huge))

    # Sections that overlap the header and each other, misaligned.
    overlap = table([(rb, 8 * i, 1) for i, rb in enumerate(RECORD_BYTES)])
    seeds["overlapping-sections"] = seal(pad64(header(body_at) + overlap))

    good_table = table([(rb, body_at, 0) for rb in RECORD_BYTES])
    seeds["bad-magic"] = seal(pad64(header(body_at, magic=b"KILNPLAX") + good_table))
    seeds["major-2"] = seal(pad64(header(body_at, major=2) + good_table))
    seeds["minor-99"] = seal(pad64(header(body_at, minor=99) + good_table))
    seeds["table-outside"] = seal(pad64(header(body_at, table_offset=1 << 40) + good_table))
    seeds["bad-crc"] = pad64(header(body_at) + good_table)
    seeds["truncated-header"] = header(body_at)[:20]
    seeds["size-mismatch"] = seal(pad64(header(body_at * 2) + good_table))

    for name, data in sorted(seeds.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "blob"))

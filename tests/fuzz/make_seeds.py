"""Writes small seed inputs for the data-loader fuzz targets (tar shard, shard index, images)."""

import io
import os
import struct
import sys
import tarfile

import numpy as np
from PIL import Image


def image_bytes(fmt, size=(40, 30), mode="RGB"):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    img = Image.fromarray(arr).convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def tar_bytes(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def index_bytes(shard_size, samples):
    """Mirror of ShardIndex::serialize (csrc/data/tar_reader.cpp)."""
    out = b"TSIDX003" + struct.pack("<QQQ", shard_size, 0, len(samples))  # size, mtime_ns, count
    for key, fields in samples:
        out += struct.pack("<I", len(key)) + key.encode() + struct.pack("<I", 0)
        out += struct.pack("<I", len(fields))
        for ext, off, size in fields:
            # offset, size, header hash (any value: the fuzzer only round-trips the index)
            out += struct.pack("<H", len(ext)) + ext.encode() + struct.pack("<QQQ", off, size, 0)
    return out


def main(root):
    jpg, png = image_bytes("JPEG"), image_bytes("PNG")
    gray = image_bytes("JPEG", mode="L")
    tar = tar_bytes([("a/0.jpg", jpg), ("a/0.cls", b"3"), ("a/1.png", png), ("a/1.txt", b"x")])
    seeds = {
        "fuzz_tar": {"shard.tar": tar},
        "fuzz_index": {"shard.idx": index_bytes(len(tar), [("a/0", [("jpg", 512, len(jpg))])])},
        "fuzz_decode": {
            "rrc.jpg": b"\x00" + jpg,
            "resize.png": b"\x01" + png,
            "gray.jpg": b"\x13" + gray,
            "float_hwc.jpg": b"\x0e" + jpg,
        },
    }
    for target, files in seeds.items():
        os.makedirs(os.path.join(root, target), exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(root, target, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])

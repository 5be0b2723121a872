"""Writes small seed inputs for the data-loader fuzz targets (tar shard, shard index, images,
including CMYK/YCCK JPEGs, 16-bit PNGs and decompression bombs)."""

import io
import os
import struct
import sys
import tarfile
import zlib

import numpy as np
from PIL import Image


def image_bytes(fmt, size=(40, 30), mode="RGB"):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    img = Image.fromarray(arr).convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def raw_png(width, height, bit_depth, color_type, idat):
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", idat)
        + png_chunk(b"IEND", b"")
    )


def png16(color_type=2, size=(20, 12)):
    ch = {0: 1, 2: 3, 4: 2, 6: 4}[color_type]
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 65536, (size[1], size[0] * ch), dtype=np.uint16).astype(">u2")
    raw = b"".join(b"\0" + r.tobytes() for r in rows)
    return raw_png(size[0], size[1], 16, color_type, zlib.compress(raw))


def cmyk_jpeg(ycck=False):
    rng = np.random.default_rng(2)
    arr = rng.integers(0, 255, (24, 32, 4), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "CMYK").save(buf, "JPEG", quality=90)
    data = bytearray(buf.getvalue())
    if ycck:  # flip the Adobe marker's transform byte: the same scan read as YCCK
        i = data.index(b"\xff\xee")
        data[i + 15] = 2
    return bytes(data)


def jpeg_bomb(progressive=False):
    buf = io.BytesIO()
    Image.fromarray(np.full((16, 16, 3), 90, np.uint8)).save(
        buf, "JPEG", quality=50, progressive=progressive
    )
    data = bytearray(buf.getvalue())
    i = data.index(b"\xff\xc2" if progressive else b"\xff\xc0")
    data[i + 5 : i + 9] = struct.pack(">HH", 16000, 16000)
    return bytes(data)


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
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(
        buf, "JPEG", quality=85, progressive=True
    )
    progressive = buf.getvalue()
    palette = image_bytes("PNG", mode="P")
    tar = tar_bytes([("a/0.jpg", jpg), ("a/0.cls", b"3"), ("a/1.png", png), ("a/1.txt", b"x")])
    seeds = {
        "fuzz_tar": {"shard.tar": tar},
        "fuzz_index": {"shard.idx": index_bytes(len(tar), [("a/0", [("jpg", 512, len(jpg))])])},
        "fuzz_decode": {
            "rrc.jpg": b"\x00" + jpg,
            "resize.png": b"\x01" + png,
            "gray.jpg": b"\x13" + gray,
            "float_hwc.jpg": b"\x0e" + jpg,
            "cmyk.jpg": b"\x00" + cmyk_jpeg(),
            "ycck.jpg": b"\x11" + cmyk_jpeg(ycck=True),
            "progressive.jpg": b"\x02" + progressive,
            "bomb.png": b"\x01" + raw_png(16384, 16384, 8, 2, zlib.compress(bytes(1000))[:12]),
            "bomb.jpg": b"\x00" + jpeg_bomb(),
            "bomb_progressive.jpg": b"\x03" + jpeg_bomb(progressive=True),
            "rgb16.png": b"\x01" + png16(2),
            "gray16.png": b"\x01" + png16(0),
            "la16.png": b"\x01" + png16(4),
            "palette.png": b"\x01" + palette,
        },
    }
    for target, files in seeds.items():
        os.makedirs(os.path.join(root, target), exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(root, target, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes corpus/dataset: seed inputs of fuzz_dataset (dataset_fuzzer.cc), one per mode, made the
way the tests make their dataset files (tiny JPEGs, .cls and .json labels, .npy tensors, TFRecord
Examples with good CRCs). Run by hand when the input format changes:

    /usr/bin/python3 tests/fuzz/make_dataset_corpus.py
"""

from __future__ import annotations

import io
import struct
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

OUT = Path(__file__).resolve().parent / "corpus" / "dataset"


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked(crc32c(length))) + data
            + struct.pack("<I", masked(crc32c(data))))


def varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:  # a length-delimited field
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def example(image: bytes, label: int) -> bytes:
    image_feature = field(1, field(1, image))                 # Feature.bytes_list.value
    label_feature = field(3, field(1, varint(label)))          # Feature.int64_list.value (packed)
    entries = (field(1, field(1, b"image/encoded") + field(2, image_feature))
               + field(1, field(1, b"image/class/label") + field(2, label_feature)))
    return field(1, entries)                                   # Example.features


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=80)
    return buffer.getvalue()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def shard(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    seeds = {
        "webdataset.tar": (0, shard([
            ("a.jpg", jpeg(1)), ("a.cls", b"3"), ("a.depth.npy", npy(np.ones((2, 2), np.float32))),
            ("a.r.npy", npy(np.arange(6, dtype=np.int16).reshape(3, 2))),
            ("b.jpg", jpeg(2)), ("b.cls", b"1"), ("b.depth.npy", npy(np.zeros((2, 2), np.float32))),
            ("b.r.npy", npy(np.arange(2, dtype=np.int16).reshape(1, 2)))])),
        "tfrecord": (1, record(example(jpeg(3), 7)) + record(example(jpeg(4), 2))),
        "example": (2, example(jpeg(5), 1)),
        "member.npy": (3, npy(np.arange(12, dtype=np.float64).reshape(3, 4))),
        "scalar-member.npy": (3, npy(np.float32(2.5))),
        "odd-shapes.tar": (0, shard([
            ("a.jpg", jpeg(6)), ("a.cls", b"0"), ("a.s.npy", npy(np.float32(1))),
            ("a.depth.npy", npy(np.ones((3, 3), np.float32))),
            ("b.jpg", jpeg(7)), ("b.cls", b"1"), ("b.s.npy", npy(np.float32(2))),
            ("b.depth.npy", npy(np.ones((2, 2), np.float32))),
            ("c.jpg", jpeg(8)), ("c.cls", b"1"), ("c.s.npy", npy(np.int8(3))),
            ("c.depth.npy", npy(np.ones((2, 2), np.float32)))])),
        "arrays.npy": (4, npy(np.arange(20, dtype=np.uint8).reshape(5, 4))),
        "label.json": (5, b'{"meta": {"label": 9}, "label": 2, "x": [1, 2.5, "s", null]}'),
    }
    for name, (mode, data) in seeds.items():
        (OUT / name).write_bytes(bytes([mode]) + data)


if __name__ == "__main__":
    main()

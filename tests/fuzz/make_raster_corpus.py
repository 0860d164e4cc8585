#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the non-JPEG seeds of fuzz_decode into corpus/decode (run by hand, then commit):
small PNG, WebP, BMP, PPM/PGM files of each kind the decoders handle, made by Pillow, and a
TIFF header. Each file is the control byte (see decode_fuzzer.cc) followed by the image."""

import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image

out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "corpus" / "decode")
rng = np.random.default_rng(18)


def pixels(w, h, c):
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 9 % 256, y * 13 % 256, (x + y) * 5 % 256, (x * y) % 256], -1)[..., :c]
    return (base + rng.integers(0, 30, base.shape)).clip(0, 255).astype(np.uint8)


def write(name, control, image, fmt, **kw):
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    (out / name).write_bytes(bytes([control]) + buf.getvalue())


write("png-rgb", 0x00, Image.fromarray(pixels(40, 30, 3)), "PNG")
write("png-rgba-eval", 0x41, Image.fromarray(pixels(33, 47, 4), "RGBA"), "PNG")
write("png-gray16", 0x02, Image.fromarray(pixels(20, 20, 1)[..., 0].astype(np.uint16) * 200), "PNG")
write("png-palette", 0x0C, Image.fromarray(pixels(24, 18, 3)).convert("P", palette=Image.ADAPTIVE),
      "PNG", transparency=2)
write("png-interlaced-1bit", 0x81, Image.fromarray(pixels(17, 9, 1)[..., 0]).convert("1"), "PNG")
write("webp-lossy", 0x00, Image.fromarray(pixels(64, 48, 3)), "WEBP", quality=60)
write("webp-lossless-rgba", 0x47, Image.fromarray(pixels(31, 29, 4), "RGBA"), "WEBP", lossless=True)
write("bmp-24", 0x01, Image.fromarray(pixels(23, 19, 3)), "BMP")
write("bmp-8-palette", 0x10, Image.fromarray(pixels(16, 16, 3)).convert("P", palette=Image.ADAPTIVE,
                                                                         colors=8), "BMP")
write("ppm-p6", 0x00, Image.fromarray(pixels(21, 13, 3)), "PPM")
write("pgm-p5", 0x09, Image.fromarray(pixels(12, 25, 1)[..., 0]), "PPM")
(out / "tiff-header").write_bytes(bytes([0]) + b"II*\0\x08\0\0\0" + bytes(16))

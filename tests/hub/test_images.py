"""hub/images.open_image: pictures come out upright (EXIF orientation), and decompression bombs are
refused from their header, before any pixel is decoded. Every test image is built here."""
from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from attn_explorer.errors import UserError
from attn_explorer.hub import images
from attn_explorer.hub.images import open_image

MAX_PIXELS = images.MAX_PIXELS

RED, BLUE = (220, 20, 20), (20, 20, 220)
ORIENTATION = 0x0112  # the EXIF tag


def left_red_right_blue(w: int = 40, h: int = 20) -> Image.Image:
    img = Image.new("RGB", (w, h), BLUE)
    img.paste(RED, (0, 0, w // 2, h))
    return img


def colour_at(img: Image.Image, x: int, y: int) -> str:
    r, _, b = img.getpixel((x, y))
    return "red" if r > b else "blue"


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("orientation, size, where_red", [
    (1, (40, 20), "left"),  # upright already
    (3, (40, 20), "right"),  # upside down: rotate 180
    (6, (20, 40), "top"),  # camera held on its side: rotate 90 clockwise, the left edge goes to the top
    (8, (20, 40), "bottom"),  # the other side: rotate 90 counter-clockwise
])
def test_exif_orientation_is_applied(tmp_path, fmt, orientation, size, where_red):
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    path = tmp_path / f"photo.{fmt.lower()}"
    left_red_right_blue().save(path, format=fmt, exif=exif, **({"quality": 95} if fmt == "JPEG" else {}))
    img = open_image(path)
    assert img.size == size and img.mode == "RGB"
    w, h = img.size
    probes = {"left": (2, h // 2), "right": (w - 3, h // 2), "top": (w // 2, 2), "bottom": (w // 2, h - 3)}
    opposite = {"left": "right", "right": "left", "top": "bottom", "bottom": "top"}[where_red]
    assert colour_at(img, *probes[where_red]) == "red" and colour_at(img, *probes[opposite]) == "blue"


def test_exif_orientation_of_a_pil_image_given_directly(tmp_path):
    exif = Image.Exif()
    exif[ORIENTATION] = 6
    left_red_right_blue().save(tmp_path / "p.jpg", exif=exif, quality=95)
    with Image.open(tmp_path / "p.jpg") as given:
        img = open_image(given)
    assert img.size == (20, 40) and colour_at(img, 10, 2) == "red"


def png_bomb(path: Path, side: int) -> Path:
    """A valid 1-bit PNG of side x side black pixels: a few kB on disk, side² pixels once decoded."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" * (1 + (side + 7) // 8)  # filter byte + packed bits
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # 1-bit greyscale
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path


def test_a_decompression_bomb_is_refused_before_decoding(tmp_path, monkeypatch):
    bomb = png_bomb(tmp_path / "bomb.png", 20_000)
    assert bomb.stat().st_size < 200_000  # small file, 400 megapixels
    assert struct.unpack(">II", bomb.read_bytes()[16:24]) == (20_000, 20_000)  # IHDR width, height
    decoded = []
    real_load = Image.Image.load
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append(self.size) or real_load(self))
    t0 = time.perf_counter()
    with pytest.raises(UserError) as e:
        open_image(bomb)
    message = str(e.value)
    assert "bomb.png" in message and "20000×20000" in message and f"{MAX_PIXELS / 1e6:g} megapixels" in message
    assert "\n" not in message
    assert (20_000, 20_000) not in decoded  # refused from the header
    assert time.perf_counter() - t0 < 5  # decoding it took 30 s and 3 GB


def test_a_big_jpeg_is_decoded_small_not_refused(tmp_path):
    """JPEG can decode at 1/2 .. 1/8 scale (draft): a 64-megapixel photo is shrunk, not refused."""
    Image.new("RGB", (8000, 8000), (30, 90, 150)).save(tmp_path / "big.jpg", quality=50)
    assert 8000 * 8000 > MAX_PIXELS
    img = open_image(tmp_path / "big.jpg")
    assert img.size == (4000, 4000) and img.getpixel((5, 5))[2] > 100


def test_an_image_just_under_the_limit_is_read(tmp_path):
    side = int(MAX_PIXELS ** 0.5) - 1
    png_bomb(tmp_path / "ok.png", side)
    img = open_image(tmp_path / "ok.png")
    assert max(img.size) == images.MAX_SIDE and np.asarray(img).max() == 0


@pytest.mark.parametrize("make", [os.mkfifo, lambda p: os.symlink("/dev/zero", p)])
def test_a_pipe_or_device_is_refused_without_reading_it(tmp_path, make):
    """Opening a FIFO blocks until someone writes to it; /dev/zero never ends."""
    path = tmp_path / "photo.png"
    make(path)
    with pytest.raises(UserError, match="not a regular file"):
        open_image(path)

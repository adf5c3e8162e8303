"""Reading pictures safely and turning them into the pixels a vision model expects.

Any mode PIL can read (grayscale, RGBA, palette, 16-bit) becomes 8-bit RGB, turned upright as its
EXIF orientation says; huge pictures are shrunk, and decompression bombs refused from their header.
Preprocessing follows the checkpoint's preprocessor_config.json.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attn_explorer.errors import UserError

MAX_SIDE = 4096  # larger pictures are shrunk on load: no model here needs more, and memory stays sane
# Refused above this many pixels, read from the header before decoding: a 1.2 MB PNG declaring
# 20000 x 20000 took 3.2 GB and 30 s to decode. JPEGs are decoded at 1/2..1/8 scale first (keeping both
# sides >= MAX_SIDE / 2, more than any model input), so a 50-megapixel phone photo still opens.
MAX_PIXELS = 40_000_000
_PIL_LIMIT = threading.Lock()  # open_image swaps PIL's global limit for its own: one thread at a time
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def to_rgb(img):
    """Any PIL image -> 8-bit RGB. Transparent parts go on white; 16-bit and float are rescaled."""
    from PIL import Image

    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        a = np.asarray(img, dtype=np.float64)
        lo, hi = float(a.min()), float(a.max())
        a = np.zeros_like(a) if hi <= lo else (a - lo) / (hi - lo) * 255.0
        img = Image.fromarray(a.round().astype(np.uint8), "L")
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA"):
        bg = Image.new("RGB", img.size, (255, 255, 255))
        bg.paste(img.convert("RGBA"), mask=img.convert("RGBA").split()[-1])
        return bg
    return img.convert("RGB")


def _refuse_huge(size: tuple[int, int], name: str) -> None:
    w, h = size
    if w * h > MAX_PIXELS:
        raise UserError(f"{name} is {w}×{h} pixels ({w * h / 1e6:.0f} megapixels), over the limit of "
                        f"{MAX_PIXELS / 1e6:g} megapixels; shrink it first")


def _array_image(a: np.ndarray):
    """A NumPy picture as a PIL image: uint8 (H, W), (H, W, 3) or (H, W, 4); floats in [0, 1] are scaled."""
    from PIL import Image

    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (3, 4)) or min(a.shape[:2]) < 1:
        raise UserError(f"an image array must be (height, width) or (height, width, 3), got shape {a.shape}")
    if a.dtype.kind == "f":
        if not np.isfinite(a).all() or a.min() < 0 or a.max() > 1:
            raise UserError("a float image array must hold finite values in [0, 1]")
        a = (a * 255).round().astype(np.uint8)
    elif a.dtype != np.uint8:
        raise UserError(f"an image array must be uint8 (0-255) or float in [0, 1], not {a.dtype}")
    _refuse_huge((a.shape[1], a.shape[0]), "the image")
    return Image.fromarray(np.ascontiguousarray(a))


def open_image(source):
    """A path or a PIL image -> upright 8-bit RGB PIL image no larger than MAX_SIDE. Raises UserError."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if isinstance(source, np.ndarray):  # (H, W, 3) or (H, W) pixels, as a notebook holds them
        source = _array_image(source)
    if isinstance(source, Image.Image):
        img, name = source, "the image"
        _refuse_huge(img.size, name)
    elif not isinstance(source, (str, os.PathLike)):
        raise UserError(f"give an image as a file path, a PIL image or a (height, width, 3) uint8 array, not "
                        f"{type(source).__name__}")
    else:
        path = Path(source)
        name = path.name
        if not path.exists():
            raise UserError(f"image file not found: {path}")
        if path.is_dir():
            raise UserError(f"{path} is a folder, not an image file")
        if not path.is_file():  # a FIFO would block the open, /dev/zero would never end
            raise UserError(f"{path} is not a regular file (a device, pipe or socket)")
        try:
            with _PIL_LIMIT:
                old = Image.MAX_IMAGE_PIXELS
                Image.MAX_IMAGE_PIXELS = None  # PIL would refuse big JPEGs that draft() below can shrink
                try:
                    img = Image.open(path)  # reads the header only
                finally:
                    Image.MAX_IMAGE_PIXELS = old
            img.draft("RGB", (MAX_SIDE // 2, MAX_SIDE // 2))  # JPEG: decode at reduced size when huge
            _refuse_huge(img.size, name)
            img.load()
        except UnidentifiedImageError:
            raise UserError(f"{name} is not an image file this app can read (PNG, JPEG, GIF, BMP, TIFF, WebP...)") from None
        except (OSError, SyntaxError, ValueError) as e:
            raise UserError(f"{name} could not be read as an image ({e})") from None
    try:
        img = ImageOps.exif_transpose(img)  # a phone photo taken on its side comes out upright
    except (OSError, SyntaxError, ValueError) as e:
        raise UserError(f"{name} could not be read as an image (EXIF: {e})") from None
    if img.width < 1 or img.height < 1:
        raise UserError("the image is empty (0 pixels)")
    if max(img.size) > MAX_SIDE:
        img = img.copy()
        img.thumbnail((MAX_SIDE, MAX_SIDE))
    return to_rgb(img)


@dataclass
class ImagePreprocess:
    """Resize (shortest edge, or to a fixed size), centre-crop, rescale, normalise."""

    resize_shortest: int | None = None
    resize_to: tuple[int, int] | None = None  # (height, width)
    crop: tuple[int, int] | None = None  # (height, width)
    resample: int = 3  # PIL code: 2 bilinear, 3 bicubic
    rescale: float = 1 / 255
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    @classmethod
    def from_config(cls, pp: dict | None, image_size: int) -> "ImagePreprocess":
        """From preprocessor_config.json, or (pp None) a plain resize to the model's image size."""
        if not pp:
            return cls(resize_to=(image_size, image_size), resample=2, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
        size = pp.get("size") if pp.get("do_resize", True) else None
        shortest = to = crop = None
        if isinstance(size, int):
            shortest = size
        elif isinstance(size, dict):
            if "shortest_edge" in size:
                shortest = size["shortest_edge"]
            elif "height" in size:
                to = (size["height"], size["width"])
        if pp.get("do_center_crop"):
            c = pp.get("crop_size", image_size)
            crop = (c, c) if isinstance(c, int) else (c["height"], c["width"])
        return cls(
            resize_shortest=shortest, resize_to=to, crop=crop, resample=pp.get("resample", 2),
            rescale=pp.get("rescale_factor", 1 / 255) if pp.get("do_rescale", True) else 1.0,
            mean=tuple(pp.get("image_mean", IMAGENET_MEAN)) if pp.get("do_normalize", True) else (0.0, 0.0, 0.0),
            std=tuple(pp.get("image_std", IMAGENET_STD)) if pp.get("do_normalize", True) else (1.0, 1.0, 1.0),
        )

    def at_size(self, side: int) -> "ImagePreprocess":
        """The same recipe producing a side × side input (the resolution slider)."""
        if self.crop:
            ratio = (self.resize_shortest or self.crop[0]) / self.crop[0]
            return ImagePreprocess(round(side * ratio), None, (side, side), self.resample, self.rescale, self.mean, self.std)
        return ImagePreprocess(None, (side, side), None, self.resample, self.rescale, self.mean, self.std)

    def resized(self, size: tuple[int, int]) -> tuple[int, int]:
        """(width, height) of a picture of `size` (width, height) after the resize step, before the crop."""
        w, h = size
        if self.resize_to:
            return self.resize_to[1], self.resize_to[0]
        if self.resize_shortest:
            s = self.resize_shortest / min(w, h)
            return (max(1, int(w * s)) if w > h else self.resize_shortest,
                    max(1, int(h * s)) if h > w else self.resize_shortest)
        return w, h

    def crop_note(self, size: tuple[int, int]) -> str:
        """One line saying how a picture of `size` (width, height) loses its shape on the way in: the part of
        it a centre crop keeps, in the picture's own pixels ("centre-cropped 640×427 to 427×427 (the model
        reads square images)"), or a stretch to a fixed size; "" when it keeps its shape."""
        w, h = size
        rw, rh = self.resized(size)
        square = "square images" if not self.crop or self.crop[0] == self.crop[1] else "images of this shape"
        if self.resize_to and abs(rw / rh - w / h) > 0.01 * (w / h):
            shape = "square images" if rw == rh else f"{rw}×{rh} images"
            return f"stretched {w}×{h} to {rw}×{rh} (the model reads {shape})"
        if not self.crop:
            return ""
        ch, cw = self.crop
        if cw >= rw and ch >= rh:
            return ""
        # the kept part, in the picture's own pixels (the shortest-edge scale exactly: the resize truncates)
        sx, sy = ((self.resize_shortest / min(w, h),) * 2 if self.resize_shortest and not self.resize_to
                  else (rw / w, rh / h))
        kw, kh = min(w, round(min(cw, rw) / sx)), min(h, round(min(ch, rh) / sy))
        if abs(kw / kh - w / h) <= 0.01 * (w / h):
            return ""  # a border trimmed all round keeps the picture's shape: nothing is lost from one side
        return f"centre-cropped {w}×{h} to {kw}×{kh} (the model reads {square})"

    def __call__(self, img) -> tuple[np.ndarray, np.ndarray]:
        """RGB PIL image -> (pixels float32 (3, H, W) normalised, seen uint8 (H, W, 3))."""
        from PIL import Image

        resample = Image.Resampling(self.resample)
        if self.resize_to or self.resize_shortest:
            img = img.resize(self.resized(img.size), resample)
        if self.crop:
            ch, cw = self.crop
            w, h = img.size
            left, top = max(0, (w - cw) // 2), max(0, (h - ch) // 2)
            img = img.crop((left, top, left + cw, top + ch))
        seen = np.asarray(img, dtype=np.uint8).copy()
        x = seen.astype(np.float32) * np.float32(self.rescale)
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return np.ascontiguousarray(x.transpose(2, 0, 1)), seen

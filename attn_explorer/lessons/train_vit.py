"""Train a tiny ViT (the primer's exercise 4): patches, a class token, positions, a few pre-LN blocks.

The model is the explorer's own `core.vit.VisionTransformer`, sized tiny: 8×8 digits cut into 2×2
patches give 16 patch tokens plus [CLS]; each token is a 64-number vector, 4 heads look at the
others, and 2 blocks are enough. The classifier reads the [CLS] token after the last block.

`Trainer.run()` is a generator: AdamW on cross-entropy, one record per optimizer step (step, epoch,
loss, accuracy, time), the held-out accuracy at each epoch's end, and every `attention_every` steps
the [CLS] row of the last layer's attention (mean over heads, as a patch grid) for a few fixed test
images. The GUI runs it with `session.workers.launch` (so it can pause and stop between steps); the
CLI loops over it. Training takes torch's fused attention (no weights asked for); only the
snapshots take the explicit path that returns the probabilities.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from attn_explorer.core.vit import ViTConfig, VisionTransformer
from attn_explorer.errors import UserError
from attn_explorer.hub.load import build, save_checkpoint
from attn_explorer.lessons.digits import DATA_NAMES, Dataset, load_dataset

__all__ = ["TrainSettings", "TrainRecord", "Trainer", "model_config", "new_model", "cls_attention", "accuracy",
           "predict", "load_trained", "DATA_NAMES"]

PATCH_FOR_SIDE = {8: 2, 28: 4, 32: 4}  # 4×4, 7×7 and 8×8 patch grids
MAX_EPOCHS = 1000


@dataclass
class TrainSettings:
    data: str = "digits"  # one of DATA_NAMES
    data_dir: str | None = None  # cifar10: the folder with its Python batches
    epochs: int = 40
    batch_size: int = 64
    lr: float = 2e-3  # peak learning rate (one epoch of warm-up, then a cosine down to zero)
    weight_decay: float = 0.05
    seed: int = 0  # the split, the first weights and the batch order
    attention_every: int = 10  # optimizer steps between [CLS]-attention snapshots
    examples: int = 6  # fixed held-out images whose attention is shown
    # random shifts of up to this many pixels (augmentation). None: 0 for 8×8 images (1 px cost the digits 5
    # points of held-out accuracy), 2 for larger ones (MNIST, 30 epochs: 91.2 % without, 94.5 % with)
    shift: int | None = None

    def check(self) -> "TrainSettings":
        if self.data not in DATA_NAMES:
            raise UserError(f"unknown data {self.data!r}: use one of {', '.join(DATA_NAMES)}")
        for name in ("epochs", "batch_size", "attention_every", "examples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{name.replace('_', ' ')} must be a whole number of at least 1, got {v!r}")
        if self.epochs > MAX_EPOCHS:
            raise UserError(f"epochs must be at most {MAX_EPOCHS}, got {self.epochs}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"learning rate must be a positive number, got {self.lr!r}")
        return self


@dataclass
class TrainRecord:
    """What one step of training reports. Arrays are NumPy, so the record can cross into the GUI."""

    step: int  # optimizer steps done (0: before training)
    total_steps: int
    epoch: float  # epochs done, fractional (step / steps per epoch)
    elapsed_s: float  # training time so far (snapshots and evaluation included)
    loss: float | None = None  # this step's mean cross-entropy on its batch
    train_acc: float | None = None  # share of this epoch's training images classified right so far
    test_acc: float | None = None  # share of held-out images right: at step 0 and each epoch's end
    attention: np.ndarray | None = None  # (k, L, rows, cols): [CLS] attention to each patch, per block, head mean
    predicted: np.ndarray | None = None  # (k,) the model's class for each example, with `attention`
    ink: np.ndarray | None = None  # (L,) share of that attention on patches with ink (see ink_share)
    inked: float = 0.0  # share of the examples' patches that hold ink
    epoch_end: bool = False
    done: bool = False  # the last record of a run that trained every epoch
    # only at step 0: what is being learned
    images: np.ndarray | None = None  # (k, side, side, 3) uint8: the example images
    true: np.ndarray | None = None  # (k,) their labels
    classes: tuple[str, ...] = ()
    about: str = ""  # the data and the model, in one line
    notes: list[str] = field(default_factory=list)


def model_config(side: int, classes: int = 10) -> ViTConfig:
    """The tiny ViT for side × side images: 64-wide tokens, 4 heads, 2 pre-LN blocks, a 10-way head."""
    patch = PATCH_FOR_SIDE.get(side)
    if patch is None:
        raise UserError(f"no tiny ViT for {side}×{side} images; sides: {', '.join(map(str, PATCH_FOR_SIDE))}")
    return ViTConfig(image_size=side, patch_size=patch, channels=3, dim=64, num_layers=2, num_heads=4,
                     mlp_hidden=128, eps=1e-6, num_labels=classes)


def new_model(cfg: ViTConfig, seed: int = 0) -> VisionTransformer:
    """Fresh weights: ViT's usual truncated normal (std 0.02) for every matrix and the [CLS]/position vectors
    (a model loading meanwhile in another thread skips init in its own thread only: hub.built.on_meta)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = VisionTransformer(cfg)
        for name, p in model.named_parameters():
            if p.dim() > 1 or name in ("cls_token", "pos_embed"):
                torch.nn.init.trunc_normal_(p, std=0.02)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)
    return model


def normalise(x: torch.Tensor) -> torch.Tensor:
    """[0, 1] pixels -> what the explorer's image preprocessing gives a built-in ViT: (x - 0.5) / 0.5."""
    return (x - 0.5) / 0.5


def random_shift(x: torch.Tensor, shift: int, gen: torch.Generator) -> torch.Tensor:
    """Move each image by up to `shift` pixels in each direction, filling with black (the background)."""
    if shift <= 0:
        return x
    B, _, H, W = x.shape
    pad = F.pad(x, (shift, shift, shift, shift))
    dy = torch.randint(0, 2 * shift + 1, (B,), generator=gen)
    dx = torch.randint(0, 2 * shift + 1, (B,), generator=gen)
    rows = (dy[:, None] + torch.arange(H))[:, None, :, None].expand(B, x.shape[1], H, W + 2 * shift)
    out = pad.gather(2, rows)  # (B, C, H, W + 2s)
    cols = (dx[:, None] + torch.arange(W))[:, None, None, :].expand(B, x.shape[1], H, W)
    return out.gather(3, cols)


@torch.no_grad()
def predict(model: VisionTransformer, images: np.ndarray, batch: int = 512) -> np.ndarray:
    """The class the model gives each of images (N, 3, side, side) in [0, 1]."""
    out = []
    for i in range(0, len(images), batch):
        x = normalise(torch.from_numpy(images[i:i + batch]))
        out.append(model(x).logits.argmax(-1).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def accuracy(model: VisionTransformer, images: np.ndarray, labels: np.ndarray) -> float:
    """Share of images classified right."""
    return float((predict(model, images) == labels).mean()) if len(labels) else 0.0


@torch.no_grad()
def cls_attention(model: VisionTransformer, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How much [CLS] looks at each patch in every block, averaged over the heads: (k, L, rows, cols),
    each map summing to 1 over the patches and [CLS] itself; and the predicted classes (k,)."""
    out = model(normalise(torch.from_numpy(images)), output_attentions=True)
    rows, cols = out.grid
    mean = out.attentions.mean(2)  # (k, L, N, N), mean over heads
    maps = mean[:, :, 0, model.cfg.num_extra_tokens:].reshape(len(images), -1, rows, cols)
    return maps.numpy().astype(np.float32), out.logits.argmax(-1).numpy()


INK = 0.2  # a patch "holds ink" when its mean brightness (0..1) is above this


def ink_share(maps: np.ndarray, images: np.ndarray) -> tuple[np.ndarray, float]:
    """Share of [CLS]'s attention to the patches that goes to patches holding ink, per block, averaged over
    the images; and the share of patches that hold ink (what looking everywhere alike would give).

    maps (k, L, rows, cols) from cls_attention; images (k, 3, side, side) in [0, 1].
    """
    k, _, rows, cols = maps.shape
    p = images.shape[-1] // rows
    ink = images.mean(1).reshape(k, rows, p, cols, p).mean((2, 4)) > INK  # (k, rows, cols)
    to_patches = maps.sum((2, 3))  # (k, L)
    share = (maps * ink[:, None]).sum((2, 3)) / np.maximum(to_patches, 1e-12)
    return share.mean(0).astype(np.float32), float(ink.mean())


def snapshot(rec: TrainRecord, model: VisionTransformer, images: np.ndarray) -> TrainRecord:
    """Fill rec's attention, predicted, ink and inked for the example images."""
    rec.attention, rec.predicted = cls_attention(model, images)
    rec.ink, rec.inked = ink_share(rec.attention, images)
    return rec


class one_thread:
    """Run a block on one CPU thread, then restore the thread count. At these sizes (17 tokens of 64
    numbers) splitting each product over threads costs more than it saves: on a busy 2-core machine a
    training step took 15 ms on one thread and 600 ms on two (benchmarks/bench_train_vit.py). The
    count belongs to the calling thread (OpenMP), so other workers are not affected."""

    def __enter__(self):
        self.saved = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)


def pick_examples(y: np.ndarray, k: int) -> np.ndarray:
    """Indices of k held-out images: the first of each class in turn, so the strip shows different digits."""
    chosen: list[int] = []
    for c in np.unique(y):
        if len(chosen) == k:
            break
        chosen.append(int(np.flatnonzero(y == c)[0]))
    rest = [i for i in range(len(y)) if i not in set(chosen)]
    return np.asarray((chosen + rest)[:k], dtype=np.int64)


def to_uint8(images: np.ndarray) -> np.ndarray:
    """(k, 3, side, side) in [0, 1] -> (k, side, side, 3) uint8, for drawing."""
    return np.ascontiguousarray((np.clip(images, 0, 1) * 255).round().astype(np.uint8).transpose(0, 2, 3, 1))


class Trainer:
    """One training run: the data (loaded when the run starts, in the worker), the model and its steps.

    `run()` yields TrainRecords; between two of them the model is still, so it can be saved
    (`save`) while the run is paused or after it ended.
    """

    def __init__(self, settings: TrainSettings | None = None, dataset: Dataset | None = None):
        self.settings = (settings or TrainSettings()).check()
        self.dataset = dataset
        self.model: VisionTransformer | None = None
        self.steps = 0
        self.test_acc: float | None = None
        self.measured_at = -1  # the step at which test_acc was measured
        self.trained = False  # True once at least one optimizer step was taken

    def data(self) -> Dataset:
        if self.dataset is None:
            s = self.settings
            self.dataset = load_dataset(s.data, s.seed, s.data_dir)
        return self.dataset

    def examples(self) -> tuple[np.ndarray, np.ndarray]:
        d = self.data()
        idx = pick_examples(d.y_test, self.settings.examples)
        return d.x_test[idx], d.y_test[idx]

    def shift(self) -> int:
        """The augmentation's shift in pixels (see TrainSettings.shift)."""
        s = self.settings.shift
        return int(s) if s is not None else (0 if self.data().side <= 8 else 2)

    def about(self) -> str:
        d, m = self.data(), self.model
        c = m.cfg
        grid = c.image_size // c.patch_size
        params = sum(p.numel() for p in m.parameters())
        return (f"{d.source}: {len(d.y_train):,} to learn from, {len(d.y_test):,} held out. Model: {c.image_size}×"
                f"{c.image_size} images in {c.patch_size}×{c.patch_size} patches = {grid * grid} patch tokens + [CLS], "
                f"{c.dim}-wide, {c.num_heads} heads, {c.num_layers} blocks, {params:,} weights")

    def run(self) -> Iterator[TrainRecord]:
        s = self.settings
        d = self.data()
        self.model = model = new_model(model_config(d.side, len(d.classes)), s.seed)
        self.steps, self.trained, self.test_acc, self.measured_at = 0, False, None, -1
        gen = torch.Generator().manual_seed(s.seed)
        x_train, y_train = torch.from_numpy(d.x_train), torch.from_numpy(d.y_train)
        per_epoch = math.ceil(len(y_train) / s.batch_size)
        total = per_epoch * s.epochs
        opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
        warm = min(per_epoch, total)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda i: (i + 1) / warm if i < warm else 0.5 * (1 + math.cos(math.pi * (i - warm) / max(1, total - warm))))
        ex_images, ex_true = self.examples()
        t0 = time.perf_counter()
        first = TrainRecord(0, total, 0.0, 0.0, images=to_uint8(ex_images), true=ex_true, classes=d.classes,
                            about=self.about(), notes=list(d.notes))
        with one_thread():
            snapshot(first, model, ex_images)
            first.test_acc = self.held_out_accuracy()
        first.elapsed_s = time.perf_counter() - t0
        yield first
        for epoch in range(s.epochs):
            order = torch.randperm(len(y_train), generator=gen)
            right = seen = 0
            for b in range(per_epoch):
                idx = order[b * s.batch_size:(b + 1) * s.batch_size]
                with one_thread():  # restored before each yield: the pool thread serves other jobs too
                    rec = self._step(model, opt, sched, x_train[idx], y_train[idx], gen, total, per_epoch)
                    right += round(rec.train_acc * len(idx))
                    seen += len(idx)
                    rec.train_acc = right / seen
                    rec.epoch_end = b == per_epoch - 1
                    if self.steps % s.attention_every == 0 or rec.epoch_end:
                        snapshot(rec, model, ex_images)
                    if rec.epoch_end:
                        rec.test_acc = self.held_out_accuracy()
                        rec.done = epoch == s.epochs - 1
                rec.elapsed_s = time.perf_counter() - t0
                yield rec

    def _step(self, model, opt, sched, x, y, gen, total: int, per_epoch: int) -> TrainRecord:
        """One AdamW step on one batch; train_acc in the record is this batch's."""
        model.train()
        logits = model(normalise(random_shift(x, self.shift(), gen))).logits
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        model.eval()
        self.steps += 1
        self.trained = True
        acc = float((logits.detach().argmax(-1) == y).float().mean())
        return TrainRecord(self.steps, total, self.steps / per_epoch, 0.0, loss=loss.item(), train_acc=acc)

    def held_out_accuracy(self) -> float:
        """The model's accuracy on the held-out images now (measured again only when it took steps since)."""
        if self.measured_at != self.steps or self.test_acc is None:
            d = self.data()
            with one_thread():
                self.test_acc = accuracy(self.model, d.x_test, d.y_test)
            self.measured_at = self.steps
        return self.test_acc

    def save(self, path: str | Path) -> Path:
        """The model as our .safetensors (what `load_model(path)` reads back), with the held-out accuracy in its note."""
        if self.model is None:
            raise UserError("there is no model to save yet: start training first")
        path = Path(path).expanduser()
        if path.suffix != ".safetensors":
            raise UserError(f"save the model as a .safetensors file, not {path.name!r}")
        if not path.parent.is_dir():
            raise UserError(f"folder not found: {path.parent}")
        d = self.data()
        note = (f"tiny ViT trained here on {d.name} for {self.steps} steps; held-out accuracy "
                f"{100 * self.held_out_accuracy():.1f} % (seed {self.settings.seed})" if self.trained
                else "untrained: random weights (the tiny ViT before any training step)")
        try:
            return save_checkpoint(self.model, path, family="vit", trained=self.trained, labels=d.labels(), note=note)
        except OSError as e:
            raise UserError(f"could not save {path}: {e.strerror or e}") from None


def load_trained(path: str | Path, settings: TrainSettings | None = None) -> tuple[Trainer, TrainRecord]:
    """A saved tiny ViT as a Trainer on the chosen data, with its held-out accuracy and attention (one record)."""
    built = build(str(path))
    model = built.module
    if not isinstance(model, VisionTransformer) or model.cfg.num_labels < 1:
        raise UserError(f"{Path(path).name} is not an image classifier (a tiny ViT saved by this lesson)")
    t = Trainer(settings)
    d = t.data()
    if model.cfg.image_size != d.side or model.cfg.num_labels != len(d.classes):
        raise UserError(f"{Path(path).name} reads {model.cfg.image_size}×{model.cfg.image_size} images into "
                        f"{model.cfg.num_labels} classes; the chosen data ({d.name}) has {d.side}×{d.side} images "
                        f"and {len(d.classes)} classes")
    t.model = model.eval()
    t.trained = bool(built.info.get("trained", True))
    ex_images, ex_true = t.examples()
    t0 = time.perf_counter()
    rec = TrainRecord(0, 0, 0.0, 0.0, images=to_uint8(ex_images), true=ex_true, classes=d.classes, about=t.about(),
                      notes=list(d.notes) + [f"loaded {Path(path).name}: {built.info.get('note', '')}"])
    with one_thread():
        rec.test_acc = t.held_out_accuracy()
        snapshot(rec, model, ex_images)
    rec.elapsed_s = time.perf_counter() - t0
    return t, rec

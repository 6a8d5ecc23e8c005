"""MNIST from the files shipped in ``data/mnist/`` (never downloaded), and small datasets for loaders.
Used by notebooks 04, 11 and 12.

The repository ships the four gzip files of MNIST and ``MD5SUMS.raw``, the MD5 sums of the
decompressed files. :func:`prepare_mnist` decompresses them once into the layout that
``torchvision.datasets.MNIST`` expects (``data/MNIST/raw/``, git-ignored) and checks every MD5;
:func:`load_mnist` then returns ordinary ``torchvision.datasets.MNIST`` objects built with
``download=False``. Every shipped file is first checked against ``data/SHA256SUMS``
(:mod:`utils.shipped`), so a missing, truncated or corrupt file raises an error that names the
file and says how to restore it, and a wrong sum in ``MD5SUMS.raw`` is blamed on that list, not on
an intact ``.gz``.

The :class:`torch.utils.data.Dataset` classes at the bottom are the ones the notebooks use with
``num_workers > 0``: worker processes started with *spawn* (the default on macOS and Windows)
re-import a dataset's class by its module name, so it must live in an importable module, not in
a notebook cell.

Typical use::

    from utils.data import load_mnist
    train_set = load_mnist(train=True)          # torchvision.datasets.MNIST, 60000 samples
"""

from __future__ import annotations

import gzip
import hashlib
import os
import random
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler, TensorDataset
from torchvision.datasets import MNIST

from utils.paths import DATA_DIR, relpath
from utils.shipped import DataFileError, check_shipped, file_digest, read_sums

MNIST_SOURCE_DIR: Path = DATA_DIR / "mnist"
"""The shipped files: four ``*-ubyte.gz`` files and ``MD5SUMS.raw``."""

MNIST_FILES: tuple[str, ...] = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
"""Names of the decompressed MNIST files (the shipped files add ``.gz``)."""

MD5_LIST = "MD5SUMS.raw"

MNIST_MEAN: float = 0.1307
"""Mean pixel value of the 60000 training images, scaled to [0, 1] (4 decimals)."""

MNIST_STD: float = 0.3081
"""Standard deviation of the training pixels, scaled to [0, 1] (4 decimals)."""

RESTORE_HINT = (
    "restore it with `git checkout -- data/mnist/` (or copy the original file back from a clone "
    "of the course; data/README.md says where MNIST comes from)"
)


def _read_md5_list(source_dir: Path) -> dict[str, str]:
    md5_path = source_dir / MD5_LIST
    if not md5_path.is_file():
        raise FileNotFoundError(f"{relpath(md5_path)} is missing: {RESTORE_HINT}")
    check_shipped(md5_path)  # the shipped list is checked against data/SHA256SUMS first
    sums = read_sums(md5_path, "md5", RESTORE_HINT)
    missing = [name for name in MNIST_FILES if name not in sums]
    if missing:
        raise DataFileError(f"{relpath(md5_path)} has no MD5 sum for {', '.join(missing)}: {RESTORE_HINT}")
    return sums


def _decompress_checked(gz_path: Path, target: Path, expected_md5: str) -> None:
    """Decompress ``gz_path`` to ``target`` atomically, checking the MD5 of what comes out."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shipped = check_shipped(gz_path)  # True: the .gz is byte for byte the one the course ships
    # a unique temporary name + os.replace: two notebooks preparing MNIST at the same time never
    # see a half-written file. Mode 0o666 lets the umask decide, as for any new file (mkstemp: 0o600).
    tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        h = hashlib.md5()
        try:
            with gzip.open(gz_path, "rb") as src, os.fdopen(fd, "wb") as dst:
                while block := src.read(1 << 20):
                    h.update(block)
                    dst.write(block)
        except (EOFError, gzip.BadGzipFile, zlib.error) as err:
            raise DataFileError(
                f"{relpath(gz_path)} is truncated or corrupt ({type(err).__name__}: {err}): {RESTORE_HINT}"
            ) from err
        if h.hexdigest() != expected_md5:
            md5_path = relpath(gz_path.parent / MD5_LIST)
            culprit = (
                f"{md5_path} is corrupt (the .gz matches data/SHA256SUMS)"
                if shipped
                else f"{relpath(gz_path)} or {md5_path} is corrupt"
            )
            raise DataFileError(
                f"{relpath(gz_path)} decompresses to data with MD5 {h.hexdigest()}, expected {expected_md5} "
                f"(from {MD5_LIST}): {culprit}; {RESTORE_HINT}"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def prepare_mnist(source_dir: str | os.PathLike[str] | None = None, root: str | os.PathLike[str] | None = None) -> Path:
    """Make sure ``root/MNIST/raw/`` holds the four decompressed MNIST files with the right MD5s.

    A raw file that is already there with the right MD5 is kept; a missing or wrong one is
    (re)made from its ``.gz`` in ``source_dir``. Nothing is ever downloaded.

    Args:
        source_dir: folder with the shipped ``*.gz`` files and ``MD5SUMS.raw``
            (default ``data/mnist``).
        root: the ``root`` to give ``torchvision.datasets.MNIST`` (default ``data``).

    Returns:
        The raw folder, ``root/MNIST/raw``.

    Raises:
        TypeError: an argument is not a path.
        FileNotFoundError: ``MD5SUMS.raw`` or a ``.gz`` file is missing (the message names it).
        DataFileError: a ``.gz`` file is truncated or corrupt, or decompresses to the wrong MD5, or
            the cache holds a folder where a decompressed file belongs.
    """
    for name, value in (("source_dir", source_dir), ("root", root)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__}")
    source = Path(source_dir) if source_dir is not None else MNIST_SOURCE_DIR
    raw_dir = (Path(root) if root is not None else DATA_DIR) / "MNIST" / "raw"
    sums = _read_md5_list(source)
    for name in MNIST_FILES:
        gz_path = source / f"{name}.gz"
        if not gz_path.is_file():
            raise FileNotFoundError(f"{relpath(gz_path)} is missing: {RESTORE_HINT}")
        target = raw_dir / name
        if target.is_file() and file_digest(target, "md5") == sums[name]:
            continue
        if target.exists() and not target.is_file():  # a folder (or another non-file) in the cache (probe D12)
            what = "a folder" if target.is_dir() else "not a regular file"
            raise DataFileError(
                f"{relpath(target)} is {what}: the cache {relpath(raw_dir)}/ holds the decompressed "
                f"MNIST files only. Remove the cache (rm -r {relpath(raw_dir.parent)}) and run this again: it is "
                f"rebuilt from {relpath(source)}/"
            )
        _decompress_checked(gz_path, target, sums[name])
    return raw_dir


def load_mnist(
    train: bool = True,
    transform: Callable[[Any], Any] | None = None,
    target_transform: Callable[[Any], Any] | None = None,
    source_dir: str | os.PathLike[str] | None = None,
    root: str | os.PathLike[str] | None = None,
) -> MNIST:
    """Return the MNIST training (60000) or test (10000) set as a ``torchvision.datasets.MNIST``.

    The files are prepared with :func:`prepare_mnist` (decompressed once, MD5-checked); the
    dataset is built with ``download=False``, so no network is ever used.

    Args:
        train: the training set (``True``) or the test set (``False``).
        transform: applied to each PIL image, as in torchvision.
        target_transform: applied to each label.
        source_dir, root: see :func:`prepare_mnist`.

    Raises:
        TypeError: ``train`` is not a bool.
        FileNotFoundError, DataFileError: see :func:`prepare_mnist`.
    """
    if not isinstance(train, bool):
        raise TypeError(f"train must be a bool, got {type(train).__name__}")
    raw_dir = prepare_mnist(source_dir, root)
    return MNIST(
        str(raw_dir.parent.parent), train=train, transform=transform, target_transform=target_transform, download=False
    )


def mnist_tensors(
    train: bool = True,
    device: torch.device | str | None = None,
    mean: float = MNIST_MEAN,
    std: float = MNIST_STD,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole MNIST split as two tensors: normalised images ``[N, 1, 28, 28]`` float32 and labels int64.

    Equal to applying ``ToImage → ToDtype(float32, scale=True) → Normalize(mean, std)`` to
    every sample, but done once for the whole split, so training needs no per-sample work.

    Args:
        train: training or test split.
        device: where the tensors are put (``None``: CPU).
        mean, std: normalisation constants (``std`` must be > 0).
        kwargs: ``source_dir``/``root`` passed to :func:`load_mnist`.

    Raises:
        ValueError: ``std`` is not positive.
    """
    if not std > 0:
        raise ValueError(f"std must be > 0, got {std}")
    ds = load_mnist(train=train, **kwargs)
    # the same operations, in the same order, as v2.ToDtype(scale=True) and v2.Normalize: equal bits. On the CPU,
    # then moved: CUDA divides by a scalar as a multiplication by its reciprocal, which rounds differently.
    images = ds.data.unsqueeze(1).to(dtype=torch.float32).mul_(1.0 / 255).sub_(mean).div_(std)
    return images.to(device), ds.targets.to(device=device, dtype=torch.int64)


def tensor_loader(
    *tensors: torch.Tensor,
    batch_size: int,
    shuffle: bool = False,
    drop_last: bool = False,
    generator: torch.Generator | None = None,
) -> DataLoader:
    """A ``DataLoader`` over tensors already in memory (or on the GPU) that slices whole batches.

    The sampler is a ``BatchSampler`` and ``batch_size=None`` turns off automatic batching, so
    the dataset is indexed once per batch with a list of indices (``x[idx]``): no per-sample
    ``__getitem__`` and no ``collate_fn`` stacking. The batches are the same as those of
    ``DataLoader(TensorDataset(*tensors), batch_size, shuffle=shuffle, generator=generator)``.

    Raises:
        TypeError: no tensors were given, or one is not a tensor.
        ValueError: the tensors differ in their first dimension, or ``batch_size`` < 1.
    """
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("tensor_loader() expects one or more tensors, e.g. tensor_loader(x, y, batch_size=128)")
    if len({t.shape[0] for t in tensors}) != 1:
        raise ValueError(f"all tensors must have the same first dimension, got {[tuple(t.shape) for t in tensors]}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    ds = TensorDataset(*tensors)
    sampler = RandomSampler(ds, generator=generator) if shuffle else SequentialSampler(ds)
    # the generator is also given to the DataLoader, which draws a base seed from it for each
    # epoch (as a plain shuffled DataLoader does), so the global RNG is never touched
    return DataLoader(
        ds, batch_size=None, sampler=BatchSampler(sampler, batch_size, drop_last=drop_last), generator=generator
    )


# ---------------------------------------------------------------------------------------------
# Datasets used with num_workers > 0 (worker processes must be able to import them)
# ---------------------------------------------------------------------------------------------


def _check_length(length: int) -> int:
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be a non-negative int, got {length!r}")
    return length


class NegatedPairs(Dataset):
    """The notes' ``MyDataset``: item ``i`` is ``np.array([-2*i, -2*i])``, with a bounds check.

    The notes' version had no bounds check, so a sampler asking for index 15 of a 10-item
    dataset silently got an item; this one raises ``IndexError`` like a list does.
    """

    def __init__(self, length: int) -> None:
        self.length = _check_length(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> np.ndarray:
        if not -self.length <= idx < self.length:
            raise IndexError(f"index {idx} is out of range for a dataset of {self.length} items")
        idx %= self.length
        return np.array([-idx * 2, -idx * 2])


class WorkerTagged(Dataset):
    """Item ``i`` is ``(i, worker_id, torch_draw, numpy_draw)``: which process loaded it, and one
    random integer in ``[0, 1000)`` from torch's and from NumPy's global generator of that process.

    ``worker_id`` is ``-1`` in the main process (``num_workers=0``). The draws show how
    ``DataLoader`` seeds its workers: from its ``generator`` (or the global torch RNG) each epoch.
    """

    def __init__(self, length: int) -> None:
        self.length = _check_length(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> tuple[int, int, int, int]:
        if not 0 <= idx < self.length:
            raise IndexError(f"index {idx} is out of range for a dataset of {self.length} items")
        info = torch.utils.data.get_worker_info()
        worker_id = -1 if info is None else info.id
        return idx, worker_id, int(torch.randint(0, 1000, ()).item()), int(np.random.randint(0, 1000))


class SlowImages(Dataset):
    """``n`` fake 3x32x32 images; item ``i`` is ``(image, i % 10, pid)``, after ``io_ms`` ms of "reading".

    Used by notebook 11 (DataLoader throughput, ``persistent_workers``) and by
    ``benchmarks/dataloader_throughput.py``. The image of index ``i`` is a fixed function of ``i`` (its
    own seeded generator) plus a little CPU work; ``io_ms`` simulates the milliseconds spent reading one
    file with a sleep (the process waits, as it would for a disk, so waits overlap across worker
    processes even on a busy machine); ``pid`` is the id of the process that loaded the sample.

    Raises:
        TypeError: ``n`` is not an int or ``io_ms`` is not a number.
        ValueError: ``n`` is not positive or ``io_ms`` is negative.
    """

    def __init__(self, n: int = 1024, io_ms: float = 0.0) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        if n <= 0:
            raise ValueError(f"n must be positive, got {n}")
        if isinstance(io_ms, bool) or not isinstance(io_ms, (int, float)):
            raise TypeError(f"io_ms must be a number, got {type(io_ms).__name__}")
        if io_ms < 0:
            raise ValueError(f"io_ms must be >= 0, got {io_ms}")
        self.n, self.io_ms = n, float(io_ms)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} samples")
        if self.io_ms:
            time.sleep(self.io_ms / 1000)  # "reading the file"
        image = torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(index))  # "decoding"
        return (image - 0.5) / 0.25, index % 10, os.getpid()  # "normalising": a little CPU work


def seed_worker(worker_id: int) -> None:
    """A ``worker_init_fn`` that seeds Python's ``random`` and NumPy from the worker's torch seed.

    The recipe of PyTorch's reproducibility guide. ``DataLoader`` gives each worker the torch seed
    ``base_seed + worker_id`` and (since PyTorch 1.9) seeds ``random`` and NumPy itself; this
    function makes the NumPy/``random`` streams a documented function of the torch seed, and is the
    place for any other per-worker set-up. It lives in a module, not a notebook, because a worker
    started with *spawn* must import it by name.

    Raises:
        RuntimeError: called outside a DataLoader worker process.
    """
    if torch.utils.data.get_worker_info() is None:
        raise RuntimeError(f"seed_worker({worker_id}) must run inside a DataLoader worker (worker_init_fn=seed_worker)")
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)

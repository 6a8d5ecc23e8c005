"""DataLoader throughput: how num_workers, batch_size, pin_memory and persistent_workers change samples/s.

Notebook 09 shows a small table made with the same data set; this script runs the full sweep, which
takes about a minute and whose numbers depend on the machine (so they are not stored in a notebook)::

    .venv/bin/python -m benchmarks.dataloader_throughput            # default sweep, markdown table
    .venv/bin/python -m benchmarks.dataloader_throughput --io-ms 0  # pure CPU transforms, no simulated I/O

Each sample costs ``io_ms`` milliseconds of simulated file reading (a sleep: the process waits, as it
would for a disk or a network) plus a small CPU transform. Waiting parallelises across worker processes
even on a busy machine; the CPU part only parallelises when cores are free. ``pin_memory`` is measured
only when CUDA is present: it is what makes ``tensor.to("cuda", non_blocking=True)`` asynchronous.

The data set :class:`SyntheticImages` is importable (not defined in the notebook) because worker
processes started with the ``spawn`` method (macOS, Windows) must import the data set's class by name.
"""

from __future__ import annotations

import argparse
import os
import random
import time
import warnings
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """``n`` fake 3x32x32 images with labels, plus a random "augmentation" drawn from three RNGs.

    The image of index ``i`` is a fixed function of ``i`` (its own seeded generator). The augmentation
    adds a random brightness shift drawn from Python's ``random``, NumPy and torch (one draw each), so a
    notebook can show how DataLoader worker processes seed those generators; each sample also reports
    the id of the process that loaded it. ``io_ms`` simulates the milliseconds spent reading one file.

    Args:
        n: number of samples (positive int).
        io_ms: simulated I/O per sample in milliseconds (>= 0).
        augment: add the random brightness shift (``False``: every epoch returns identical data).
    """

    def __init__(self, n: int = 1024, io_ms: float = 0.0, augment: bool = True) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        if n <= 0:
            raise ValueError(f"n must be positive, got {n}")
        if isinstance(io_ms, bool) or not isinstance(io_ms, (int, float)):
            raise TypeError(f"io_ms must be a number, got {type(io_ms).__name__}")
        if io_ms < 0:
            raise ValueError(f"io_ms must be >= 0, got {io_ms}")
        self.n, self.io_ms, self.augment = n, float(io_ms), bool(augment)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, torch.Tensor, int]:
        """Return ``(image, label, draws, pid)``: ``draws`` holds the three random numbers used (zeros
        without augmentation) and ``pid`` the id of the process that loaded the sample."""
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} samples")
        if self.io_ms:
            time.sleep(self.io_ms / 1000)  # "reading the file"
        g = torch.Generator().manual_seed(index)
        image = torch.rand(3, 32, 32, generator=g)  # "decoding": fixed for a given index
        image = (image - 0.5) / 0.25  # "normalising": a little CPU work
        draws = torch.zeros(3)
        if self.augment:
            draws = torch.tensor([random.random(), float(np.random.rand()), float(torch.rand(()))])
            image = image + draws.sum()
        return image, index % 10, draws, os.getpid()


def samples_per_second(loader: Iterable, epochs: int = 1) -> float:
    """Iterate over ``loader`` ``epochs`` times and return the samples delivered per second."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}")
    count = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            count += len(batch[0])
    return count / (time.perf_counter() - start)


def sweep(n: int, io_ms: float, epochs: int) -> Iterator[dict[str, object]]:
    """Measure every configuration of the sweep; yields one row (a dict) per configuration."""
    pin_options = [False, True] if torch.cuda.is_available() else [False]
    for batch_size in (16, 64, 256):
        for workers in (0, 1, 2, 4):
            for persistent in ([False, True] if workers else [False]):
                for pin in pin_options:
                    loader = DataLoader(
                        SyntheticImages(n, io_ms),
                        batch_size=batch_size,
                        shuffle=True,
                        num_workers=workers,
                        persistent_workers=persistent,
                        pin_memory=pin,
                        generator=torch.Generator().manual_seed(0),
                    )
                    rate = samples_per_second(loader, epochs)
                    yield dict(batch_size=batch_size, num_workers=workers,
                               persistent_workers=persistent, pin_memory=pin, samples_per_s=rate)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2048, help="samples per epoch (default 2048)")
    parser.add_argument("--io-ms", type=float, default=0.5, help="simulated I/O per sample, ms (default 0.5)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per configuration (default 2)")
    args = parser.parse_args(argv)
    # DataLoader warns when num_workers exceeds the CPU count; waiting (simulated I/O) scales beyond it anyway
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s), "
          f"CUDA {'yes' if torch.cuda.is_available() else 'no'}; n={args.n}, io_ms={args.io_ms}, "
          f"epochs={args.epochs}\n")
    print("| batch_size | num_workers | persistent_workers | pin_memory | samples/s |")
    print("|---:|---:|:---:|:---:|---:|")
    for row in sweep(args.n, args.io_ms, args.epochs):
        print(f"| {row['batch_size']} | {row['num_workers']} | {row['persistent_workers']} | "
              f"{row['pin_memory']} | {row['samples_per_s']:.0f} |", flush=True)


if __name__ == "__main__":
    main()

"""DataLoader throughput: how num_workers, batch_size, pin_memory and persistent_workers change samples/s.

Notebook 11 shows a small table made with the same data set; this script runs the full sweep, which
takes about a minute and whose numbers depend on the machine (so they are not stored in a notebook)::

    .venv/bin/python -m benchmarks.dataloader_throughput            # default sweep, markdown table
    .venv/bin/python -m benchmarks.dataloader_throughput --io-ms 0  # pure CPU transforms, no simulated I/O

Each sample costs ``io_ms`` milliseconds of simulated file reading (a sleep: the process waits, as it
would for a disk or a network) plus a small CPU transform. Waiting parallelises across worker processes
even on a busy machine; the CPU part only parallelises when cores are free. ``pin_memory`` is measured
only when CUDA is present: it is what makes ``tensor.to("cuda", non_blocking=True)`` asynchronous.

The data set is :class:`utils.data.SlowImages`, shared with notebook 11: it lives in a module because
worker processes started with the ``spawn`` method (macOS, Windows) must import the data set's class by name.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Iterable, Iterator

import torch
from torch.utils.data import DataLoader

from utils.data import SlowImages


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
            for persistent in [False, True] if workers else [False]:
                for pin in pin_options:
                    loader = DataLoader(
                        SlowImages(n, io_ms),
                        batch_size=batch_size,
                        shuffle=True,
                        num_workers=workers,
                        persistent_workers=persistent,
                        pin_memory=pin,
                        generator=torch.Generator().manual_seed(0),
                    )
                    rate = samples_per_second(loader, epochs)
                    yield dict(
                        batch_size=batch_size,
                        num_workers=workers,
                        persistent_workers=persistent,
                        pin_memory=pin,
                        samples_per_s=rate,
                    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2048, help="samples per epoch (default 2048)")
    parser.add_argument("--io-ms", type=float, default=0.5, help="simulated I/O per sample, ms (default 0.5)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per configuration (default 2)")
    args = parser.parse_args(argv)
    # DataLoader warns when num_workers exceeds the CPU count; waiting (simulated I/O) scales beyond it anyway
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s), "
        f"CUDA {'yes' if torch.cuda.is_available() else 'no'}; n={args.n}, io_ms={args.io_ms}, "
        f"epochs={args.epochs}\n"
    )
    print("| batch_size | num_workers | persistent_workers | pin_memory | samples/s |")
    print("|---:|---:|:---:|:---:|---:|")
    for row in sweep(args.n, args.io_ms, args.epochs):
        print(
            f"| {row['batch_size']} | {row['num_workers']} | {row['persistent_workers']} | "
            f"{row['pin_memory']} | {row['samples_per_s']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

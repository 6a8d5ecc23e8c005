"""A small, readable training loop: one epoch, evaluation, and a fit loop with history.

The notebooks first write the five lines of a training step by hand; once that is understood
they call these helpers, so later lessons (mixed precision, several GPUs, ...) can focus on what
changes. Each batch is a pair ``(inputs, targets)``; both are moved to ``device`` with
``non_blocking=True`` (a no-op when they are there already, and an asynchronous copy from pinned
memory on CUDA).

Progress bars come from ``tqdm.auto`` (a widget in JupyterLab, text in a terminal) and show the
running loss and the throughput in samples per second. They are off when ``progress=False`` or
when the environment sets ``TQDM_DISABLE=1``, as ``make test``/``make execute`` do, so stored
notebook outputs stay deterministic.

Typical use::

    from utils.train import fit
    history = fit(model, train_loader, optimizer, nn.CrossEntropyLoss(), device, epochs=3,
                  scheduler=scheduler, val_loader=test_loader)
    plot_curves({"train": history.train_loss, "test": history.val_loss})
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

EpochCallback = Callable[[int, dict[str, float]], None]


@dataclass
class History:
    """Per-epoch metrics recorded by :func:`fit` (one list entry per epoch).

    ``val_*`` lists are empty when no ``val_loader`` was given; accuracies are ``nan`` when the
    outputs are not class scores.
    """

    train_loss: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    val_acc: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    """learning rate at the end of each epoch (of the first parameter group)"""
    seconds: list[float] = field(default_factory=list)
    """wall-clock seconds of each training epoch (evaluation not included)"""
    samples_per_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[float]]:
        """The non-empty lists by name, e.g. for ``plot_curves`` or a JSON file."""
        return {k: list(v) for k, v in vars(self).items() if v}


def _check_common(model: Any, loader: Any, device: Any) -> torch.device:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(loader, Iterable):
        raise TypeError(f"loader must be an iterable of (inputs, targets) batches, got {type(loader).__name__}")
    if not isinstance(device, (torch.device, str)):
        raise TypeError(f"device must be a torch.device or a string, got {type(device).__name__}")
    return torch.device(device)


def _unpack(batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise ValueError(
            f"each batch must be a pair (inputs, targets), got {type(batch).__name__}"
            + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
        )
    x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def _n_correct(outputs: torch.Tensor, targets: torch.Tensor) -> int | None:
    """Number of correct class predictions, or None when outputs are not class scores."""
    if outputs.dim() == 2 and targets.dim() == 1 and not targets.dtype.is_floating_point:
        return int((outputs.argmax(dim=1) == targets).sum().item())
    return None


def progress_disabled() -> bool:
    """True when the environment turns progress bars off (``TQDM_DISABLE=1``, set under nbval).

    Read at call time: tqdm itself reads its environment variables only once, at import.
    """
    return os.environ.get("TQDM_DISABLE", "").strip().lower() in {"1", "true", "yes"}


def _progress(loader: Any, desc: str, progress: bool) -> Any:
    total = len(loader) if hasattr(loader, "__len__") else None
    disable = (not progress) or progress_disabled()
    return tqdm(loader, desc=desc, total=total, leave=False, unit="batch", disable=disable)


def train_one_epoch(
    model: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device | str,
    scheduler: Any | None = None,
    *,
    max_batches: int | None = None,
    progress: bool = True,
    desc: str = "train",
) -> dict[str, float]:
    """Train ``model`` for one pass over ``loader`` and return its metrics.

    Each step is the classic five lines: ``zero_grad``, forward, loss, ``backward``, ``step``;
    then ``scheduler.step()`` if a scheduler is given (so pass a per-batch schedule such as
    ``OneCycleLR``; for a per-epoch one, call its ``step()`` yourself after each epoch).

    Args:
        max_batches: stop after this many batches (a quick run on part of the data).
        progress: show a tqdm progress bar with the running loss and samples/s.

    Returns:
        ``{"loss", "accuracy", "samples", "seconds", "samples_per_s"}``: the mean loss over the
        samples seen (weighted by batch size), the fraction of correct predictions (``nan`` if the
        outputs are not class scores), and the wall-clock time of the epoch.

    Raises:
        TypeError: ``model``/``loader``/``optimizer``/``device`` has the wrong type.
        ValueError: ``max_batches`` < 1, a batch is not an ``(inputs, targets)`` pair, or the
            loss is not finite (training diverged).
    """
    device = _check_common(model, loader, device)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if max_batches is not None and (isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1):
        raise ValueError(f"max_batches must be a positive int or None, got {max_batches!r}")
    model.train()
    loss_sum = torch.zeros((), device=device)  # summed on the device: no sync per batch
    correct = torch.zeros((), device=device, dtype=torch.int64)
    samples, classify = 0, True
    bar = _progress(loader, desc, progress)
    start = time.perf_counter()
    for i, batch in enumerate(bar):
        if max_batches is not None and i >= max_batches:
            break
        x, y = _unpack(batch, device)
        optimizer.zero_grad(set_to_none=True)
        outputs = model(x)
        loss = loss_fn(outputs, y)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        n = y.shape[0]
        samples += n
        loss_sum += loss.detach() * n
        if classify and outputs.dim() == 2 and y.dim() == 1 and not y.dtype.is_floating_point:
            correct += (outputs.detach().argmax(dim=1) == y).sum()
        else:
            classify = False
        if not bar.disable and (i % 20 == 0):
            elapsed = max(time.perf_counter() - start, 1e-9)
            bar.set_postfix(loss=f"{loss_sum.item() / samples:.4f}", samples_per_s=f"{samples / elapsed:.0f}")
    bar.close()
    if samples == 0:
        raise ValueError("the loader yielded no batches")
    mean_loss = loss_sum.item() / samples  # .item() waits for the device to finish
    seconds = time.perf_counter() - start
    if not math.isfinite(mean_loss):
        raise ValueError(f"the training loss is {mean_loss}: training diverged (lower the learning rate?)")
    return {
        "loss": mean_loss,
        "accuracy": correct.item() / samples if classify else math.nan,
        "samples": float(samples),
        "seconds": seconds,
        "samples_per_s": samples / max(seconds, 1e-9),
    }


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Switch ``model`` to ``eval()`` for the block and restore its previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device | str,
) -> dict[str, float]:
    """Mean loss and accuracy of ``model`` over ``loader`` in eval mode, without gradients.

    Returns:
        ``{"loss", "accuracy", "samples"}`` (accuracy is ``nan`` if outputs are not class scores).

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a batch is not an ``(inputs, targets)`` pair, or the loader is empty.
    """
    device = _check_common(model, loader, device)
    loss_sum, correct, samples, classify = 0.0, 0, 0, True
    with _eval_mode(model):
        for batch in loader:
            x, y = _unpack(batch, device)
            outputs = model(x)
            n = y.shape[0]
            loss_sum += float(loss_fn(outputs, y)) * n
            c = _n_correct(outputs, y)
            classify = classify and c is not None
            correct += c or 0
            samples += n
    if samples == 0:
        raise ValueError("the loader yielded no batches")
    return {"loss": loss_sum / samples, "accuracy": correct / samples if classify else math.nan, "samples": float(samples)}


@torch.no_grad()
def predict(model: nn.Module, loader: Iterable, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted classes (argmax of the outputs) and targets of every sample, both on the CPU.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a batch is not an ``(inputs, targets)`` pair, or the loader is empty.
    """
    device = _check_common(model, loader, device)
    preds, targets = [], []
    with _eval_mode(model):
        for batch in loader:
            x, y = _unpack(batch, device)
            preds.append(model(x).argmax(dim=1).cpu())
            targets.append(y.cpu())
    if not preds:
        raise ValueError("the loader yielded no batches")
    return torch.cat(preds), torch.cat(targets)


def fit(
    model: nn.Module,
    train_loader: Iterable,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device | str,
    epochs: int,
    scheduler: Any | None = None,
    val_loader: Iterable | None = None,
    *,
    on_epoch_end: EpochCallback | None = None,
    progress: bool = True,
) -> History:
    """Train for ``epochs`` epochs with :func:`train_one_epoch`, evaluating on ``val_loader`` after each.

    Args:
        scheduler: stepped after every batch (e.g. ``OneCycleLR``), see :func:`train_one_epoch`.
        val_loader: evaluated after every epoch with :func:`evaluate` (skipped when ``None``).
        on_epoch_end: called as ``on_epoch_end(epoch, metrics)`` after each epoch (epoch counts
            from 1; metrics has ``train_loss``, ``train_acc``, ``lr``, ``seconds``,
            ``samples_per_s`` and, with a ``val_loader``, ``val_loss`` and ``val_acc``), e.g. to
            log to TensorBoard.
        progress: show progress bars (also switched off by ``TQDM_DISABLE=1``).

    Returns:
        A :class:`History` with one entry per epoch in each list.

    Raises:
        ValueError: ``epochs`` < 1, and whatever :func:`train_one_epoch` raises.
        TypeError: an argument has the wrong type.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}")
    if on_epoch_end is not None and not callable(on_epoch_end):
        raise TypeError(f"on_epoch_end must be callable, got {type(on_epoch_end).__name__}")
    history = History()
    for epoch in range(1, epochs + 1):
        m = train_one_epoch(model, train_loader, optimizer, loss_fn, device, scheduler,
                            progress=progress, desc=f"epoch {epoch}/{epochs}")
        metrics = {
            "train_loss": m["loss"],
            "train_acc": m["accuracy"],
            "lr": float(optimizer.param_groups[0]["lr"]),
            "seconds": m["seconds"],
            "samples_per_s": m["samples_per_s"],
        }
        if val_loader is not None:
            v = evaluate(model, val_loader, loss_fn, device)
            metrics["val_loss"], metrics["val_acc"] = v["loss"], v["accuracy"]
            history.val_loss.append(v["loss"])
            history.val_acc.append(v["accuracy"])
        history.train_loss.append(m["loss"])
        history.train_acc.append(m["accuracy"])
        history.lr.append(metrics["lr"])
        history.seconds.append(m["seconds"])
        history.samples_per_s.append(m["samples_per_s"])
        if on_epoch_end is not None:
            on_epoch_end(epoch, metrics)
    return history

"""MNIST: the original training recipe against the course recipe of notebook 04, in one process.

Run from the repository root (a few minutes; the numbers depend on the machine)::

    .venv/bin/python -m benchmarks.mnist_speed                      # default caps: 300 s and 120 s
    .venv/bin/python -m benchmarks.mnist_speed --notes-budget 60 --course-budget 60 --threads 2

One thread by default, as in the notebook's stored outputs (on a busy machine, more threads than free cores is
slower).

Both models are notebook 04's own cells (``Net`` and ``course_model``), run by :mod:`tools.lesson_code`, so the
benchmark measures the code the learner reads. The two recipes, run one after the other with the same number of
threads:

* **notes** (the study notes' recipe): ``Net(softmax=True)`` (a softmax output fed to ``CrossEntropyLoss``),
  batch 4, SGD with lr 0.001 and momentum 0.9, per-sample PIL transforms
  (``ToImage``/``ToDtype``/``Normalize(0.5, 0.5)``) in a ``DataLoader`` with 2 worker processes, up to 3 epochs;
* **course**: notebook 04's ``course_model()`` (BatchNorm, logits, channels-last), batch 128 sliced from tensors
  held in memory, fused AdamW (betas 0.95, 0.99: one-cycle cycles β1 between 0.95 and 0.85) with a 1-epoch
  ``OneCycleLR`` up to lr 0.02, label smoothing 0.1.

Each recipe trains until its wall-clock budget or its epochs (3 for the notes, 1 for the course) are used up. Every
``--*-eval-every`` steps the clock is paused and the model is evaluated on the 10000 test images; the script prints
the best test accuracy reached, the training seconds until the first evaluation at >= 98%, and the ratio of the two
times (a lower bound when the notes' recipe does not reach 98% within its budget).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from tools.lesson_code import load
from utils.data import MNIST_MEAN, MNIST_STD, load_mnist, mnist_tensors, tensor_loader

TARGET = 0.98
NOTES_EPOCHS, COURSE_EPOCHS = 3, 1
LESSON = "04_mnist_cnn"
"""The notebook whose shared cells define the two models."""


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    was_training = model.training
    model.eval()
    correct = sum(int((model(x[i : i + 1000]).argmax(1) == y[i : i + 1000]).sum()) for i in range(0, len(y), 1000))
    model.train(was_training)
    return correct / len(y)


def run_recipe(
    name: str,
    model: nn.Module,
    batches: Callable[[int], Iterator[tuple[torch.Tensor, torch.Tensor]]],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    test: tuple[torch.Tensor, torch.Tensor],
    budget_s: float,
    eval_every: int,
    epochs: int,
    loss_fn: nn.Module,
) -> dict[str, float]:
    """Train until ``budget_s`` seconds of training or ``epochs`` epochs; evaluate every ``eval_every`` steps."""
    train_s, steps, best, time_to_target = 0.0, 0, 0.0, math.inf
    model.train()
    done = False
    for epoch in range(epochs):
        tick = time.perf_counter()
        for x, y in batches(epoch):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            steps += 1
            if steps % eval_every == 0:
                train_s += time.perf_counter() - tick
                acc = _accuracy(model, *test)
                best = max(best, acc)
                if acc >= TARGET and math.isinf(time_to_target):
                    time_to_target = train_s
                print(f"  {name:6} step {steps:6d}  {train_s:7.1f} s  test accuracy {acc:.4f}", flush=True)
                if train_s >= budget_s:
                    done = True
                    break
                tick = time.perf_counter()
        else:
            train_s += time.perf_counter() - tick
        if done:
            break
    acc = _accuracy(model, *test)
    best = max(best, acc)
    if acc >= TARGET and math.isinf(time_to_target):
        time_to_target = train_s
    return {"train_s": train_s, "steps": steps, "final_acc": acc, "best_acc": best, "time_to_98": time_to_target}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mnist_speed", description=__doc__.split("\n")[0])
    parser.add_argument("--notes-budget", type=float, default=300.0, help="training seconds for the notes' recipe")
    parser.add_argument("--course-budget", type=float, default=120.0, help="training seconds for the course recipe")
    parser.add_argument("--notes-eval-every", type=int, default=1500, help="steps (of 4 images) between evaluations")
    parser.add_argument("--course-eval-every", type=int, default=47, help="steps (of 128 images) between evaluations")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both recipes")
    args = parser.parse_args(argv)
    if args.threads < 1 or min(args.notes_budget, args.course_budget) <= 0:
        parser.error("--threads and the budgets must be positive")
    torch.set_num_threads(args.threads)
    results = {}

    # the notes' recipe ---------------------------------------------------------------------
    torch.manual_seed(0)
    tf = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5], [0.5])])
    train_set = load_mnist(train=True, transform=tf)
    loader = DataLoader(
        train_set,
        batch_size=4,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(0),
    )
    model = load(LESSON).Net(softmax=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    print(
        "notes : Net with a softmax output, batch 4, SGD lr 0.001 momentum 0.9, PIL transforms, 2 workers, "
        f"{args.threads} threads"
    )
    results["notes"] = run_recipe(
        "notes",
        model,
        lambda epoch: iter(loader),
        opt,
        None,
        mnist_tensors(train=False, mean=0.5, std=0.5),
        args.notes_budget,
        args.notes_eval_every,
        NOTES_EPOCHS,
        nn.CrossEntropyLoss(),
    )

    # the course recipe ---------------------------------------------------------------------
    torch.manual_seed(0)
    x, y = mnist_tensors(train=True)
    fast = tensor_loader(x, y, batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = load(LESSON).course_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.02, betas=(0.95, 0.99), weight_decay=1e-4, fused=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.02, total_steps=COURSE_EPOCHS * len(fast))
    print(
        f"course: lean CNN + BatchNorm, batch 128 from tensors, AdamW + OneCycleLR, label smoothing, "
        f"{args.threads} threads"
    )
    results["course"] = run_recipe(
        "course",
        model,
        lambda epoch: iter(fast),
        opt,
        sched,
        mnist_tensors(train=False, mean=MNIST_MEAN, std=MNIST_STD),
        args.course_budget,
        args.course_eval_every,
        COURSE_EPOCHS,
        nn.CrossEntropyLoss(label_smoothing=0.1),
    )

    print()
    print("| recipe | steps | training s | final test acc | best test acc | s to 98% |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        t98 = f"{r['time_to_98']:.1f}" if math.isfinite(r["time_to_98"]) else f"> {r['train_s']:.0f} (not reached)"
        print(f"| {name} | {r['steps']} | {r['train_s']:.1f} | {r['final_acc']:.4f} | {r['best_acc']:.4f} | {t98} |")
    notes_t, course_t = results["notes"]["time_to_98"], results["course"]["time_to_98"]
    if math.isfinite(course_t) and math.isfinite(notes_t):
        print(f"\nthe course recipe reaches 98% {notes_t / course_t:.1f}x sooner")
    elif math.isfinite(course_t):
        print(
            f"\nthe course recipe reaches 98% at least {results['notes']['train_s'] / course_t:.1f}x sooner "
            "(the notes' recipe did not reach it within its budget)"
        )
    else:
        print("\nthe course recipe did not reach 98% within its budget")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

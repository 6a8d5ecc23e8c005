"""Notebook 05's batched training loop against the notes' one-pair-at-a-time loop.

Both loops train the same model (notebook 05's GRU encoder + decoder with content-based attention,
same hidden size, same initial weights) on the same training split of ``data/eng-fra-course.txt``,
one after the other in this process, each capped in wall-clock time. The model, ``train_step`` and
``train_one_pair`` are notebook 05's own cells, run by :mod:`tools.lesson_code`:

* **notes' loop** -- the notes' ``trainIters``/``train``: a random pair at a time, the encoder and the
  decoder run word by word, teacher forcing, SGD with learning rate 0.01;
* **course loop** -- notebook 05: length-bucketed batches of 80 pairs, packed encoder, the decoder's
  GRU over the whole target in one call (teacher forcing), masked loss, gradient clipping, fused Adam
  with learning rate 7e-3.

Reported: sentence pairs trained per second (per CPU second and per wall second; on a shared machine
the CPU figure is the fair one), the ratio, and the time each loop needs to reach the same training
loss (the notes' loop's final loss, averaged over its last 500 pairs).

Run from the repository root (about two minutes; the numbers depend on the machine)::

    .venv/bin/python -m benchmarks.seq2seq_speed                  # 60 s per loop, one thread, CPU
    .venv/bin/python -m benchmarks.seq2seq_speed --seconds 20 --device cuda
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time

import torch

from tools.lesson_code import load
from utils import get_device, seed_everything
from utils.seq2seq import CORPUS_FILE, build_langs, filter_pairs, make_batches, read_pairs, split_pairs


class Clock:
    """CPU and wall seconds since creation."""

    def __init__(self) -> None:
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

    def cpu(self) -> float:
        return time.process_time() - self.cpu0

    def wall(self) -> float:
        return time.perf_counter() - self.wall0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def notes_loop(model, train, src_lang, tgt_lang, seconds: float, device: torch.device, seed: int) -> list[tuple]:
    """One random pair per step, SGD(lr=0.01). Returns (pairs, cpu_s, wall_s, loss) after every pair."""
    rng = random.Random(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    log, clock, pairs = [], Clock(), 0
    while clock.wall() < seconds:
        fr, en = rng.choice(train)
        src = torch.tensor(src_lang.encode(fr), device=device)
        tgt = torch.tensor(tgt_lang.encode(en), device=device)
        loss = load("05_seq2seq_translation").train_one_pair(model, src, tgt, optimizer)
        pairs += 1
        log.append((pairs, clock.cpu(), clock.wall(), loss))
    return log


def course_loop(
    model, train, src_lang, tgt_lang, seconds: float, device: torch.device, seed: int, batch_size: int
) -> list[tuple]:
    """Notebook 05's loop. Returns (pairs, cpu_s, wall_s, loss) after every batch."""
    rng = random.Random(seed)
    train_step = load("05_seq2seq_translation").train_step
    optimizer = torch.optim.Adam(model.parameters(), lr=7e-3, fused=device.type in ("cpu", "cuda"))
    log, clock, pairs = [], Clock(), 0
    while clock.wall() < seconds:
        for batch in make_batches(train, src_lang, tgt_lang, batch_size, rng):
            loss, _ = train_step(model, batch.to(device), optimizer, clip=1.0)
            sync(device)
            pairs += batch.src.shape[0]
            log.append((pairs, clock.cpu(), clock.wall(), loss, batch.src.shape[0]))
            if clock.wall() >= seconds:
                break
    return log


def first_time_below(log: list[tuple], target: float, window_pairs: int = 500) -> tuple[float, float] | None:
    """(cpu_s, wall_s) when the loss averaged over the last ``window_pairs`` pairs first reaches ``target``."""
    recent: list[tuple[float, int]] = []
    for row in log:
        n = row[4] if len(row) > 4 else 1
        recent.append((row[3], n))
        while sum(k for _, k in recent) - recent[0][1] >= window_pairs:
            recent.pop(0)
        seen = sum(k for _, k in recent)
        if row[0] >= window_pairs and sum(loss * k for loss, k in recent) / seen <= target:
            return row[1], row[2]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="wall-clock cap of each loop (default 60)")
    parser.add_argument("--hidden", type=int, default=112, help="hidden size, as in notebook 05")
    parser.add_argument("--batch-size", type=int, default=80, help="batch size of the course loop")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or mps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.hidden < 1 or args.batch_size < 1 or args.threads < 1:
        parser.error("--seconds, --hidden, --batch-size and --threads must be positive")
    torch.set_num_threads(args.threads)
    device = get_device(args.device)
    seed_everything(args.seed)

    train, _, _ = split_pairs(filter_pairs(read_pairs(CORPUS_FILE)), (0.8, 0.1, 0.1), seed=0)
    src_lang, tgt_lang = build_langs(train)
    model = load("05_seq2seq_translation").build_model("content", src_lang, tgt_lang, args.hidden)
    twin = copy.deepcopy(model)  # same initial weights for both loops
    print(
        f"{len(train)} training pairs, hidden size {args.hidden}, device {device.type}, "
        f"{torch.get_num_threads()} thread(s), {args.seconds:.0f} s wall per loop"
    )

    notes = notes_loop(model.to(device), train, src_lang, tgt_lang, args.seconds, device, args.seed)
    course = course_loop(twin.to(device), train, src_lang, tgt_lang, args.seconds, device, args.seed, args.batch_size)

    tail = notes[-500:]
    target = sum(row[3] for row in tail) / len(tail)
    rows = []
    for name, log in (("notes' loop (1 pair, SGD)", notes), (f"course loop (batch {args.batch_size}, Adam)", course)):
        pairs, cpu, wall = log[-1][0], log[-1][1], log[-1][2]
        reached = first_time_below(log, target)
        rows.append((name, pairs, pairs / cpu, pairs / wall, reached))
    print(
        f"\n{'loop':32} {'pairs':>8} {'pairs/CPU s':>12} {'pairs/wall s':>13} "
        f"{'reach loss ' + format(target, '.3f'):>22}"
    )
    for name, pairs, per_cpu, per_wall, reached in rows:
        when = f"{reached[0]:7.1f} s CPU {reached[1]:6.1f} s wall" if reached else "not reached"
        print(f"{name:32} {pairs:8d} {per_cpu:12.0f} {per_wall:13.0f} {when:>22}")
    (
        (_, _, notes_cpu_rate, notes_wall_rate, notes_reached),
        (_, _, course_cpu_rate, course_wall_rate, course_reached),
    ) = rows
    print(
        f"\nthroughput ratio: {course_cpu_rate / notes_cpu_rate:.0f}x per CPU second, "
        f"{course_wall_rate / notes_wall_rate:.0f}x per wall second (target >= 20x)"
    )
    if notes_reached and course_reached:
        print(
            f"time-to-loss ratio: {notes_reached[0] / course_reached[0]:.0f}x in CPU time, "
            f"{notes_reached[1] / course_reached[1]:.0f}x in wall time"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

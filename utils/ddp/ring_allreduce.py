"""All-reduce written by hand with send/recv: the naive way and the ring, with every message counted.

    torchrun --standalone --nproc_per_node=4 -m utils.ddp.ring_allreduce --out runs/ring

The notes' example: four machines hold ``[1, 2, 3, 4]``, ``[5, 6, 7, 8]``, ``[9, 10, 11, 12]`` and
``[13, 14, 15, 16]``; all of them must end with the sum ``[28, 32, 36, 40]``.

* naive: rank 0 receives every vector, adds them up, and sends the sum back to everyone;
* ring (环形 all-reduce): the vector is cut into ``world_size`` chunks. In ``world_size - 1``
  *scatter-reduce* steps each rank sends one chunk to its right neighbour and adds the chunk
  that arrives from its left neighbour; afterwards each rank holds one fully summed chunk. In
  ``world_size - 1`` *all-gather* steps the summed chunks travel round the ring, overwriting.

Each rank counts the messages and numbers it sends and receives, checks both results against
``dist.all_reduce``, and saves the ring's step-by-step buffers (``--out``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from utils.ddp.common import base_parser, distributed, report, save_result


@dataclass
class CommCount:
    """Messages and numbers (tensor elements) one rank sent and received."""

    sent_messages: int = 0
    recv_messages: int = 0
    sent_numbers: int = 0
    recv_numbers: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def chunk_slices(length: int, world_size: int) -> list[slice]:
    """Split ``range(length)`` into ``world_size`` contiguous chunks whose sizes differ by at most one."""
    if length < 0 or world_size < 1:
        raise ValueError(f"need length >= 0 and world_size >= 1, got {length}, {world_size}")
    base, extra = divmod(length, world_size)
    bounds, start = [], 0
    for i in range(world_size):
        stop = start + base + (1 if i < extra else 0)
        bounds.append(slice(start, stop))
        start = stop
    return bounds


def ring_schedule(rank: int, world_size: int) -> list[tuple[str, int, int]]:
    """``(phase, chunk sent to rank+1, chunk received from rank-1)`` for each of the 2(N-1) ring steps."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    n = world_size
    steps = [("scatter-reduce", (rank - t) % n, (rank - t - 1) % n) for t in range(n - 1)]
    steps += [("all-gather", (rank + 1 - t) % n, (rank - t) % n) for t in range(n - 1)]
    return steps


Send = Callable[[torch.Tensor, int], None]
Recv = Callable[[torch.Tensor, int], None]


def ring_all_reduce(t: torch.Tensor, rank: int, world_size: int, exchange: Callable[[torch.Tensor, int, torch.Tensor, int], None],
                    trace: list[list[float]] | None = None) -> torch.Tensor:
    """Sum ``t`` over all ranks, in place, by the ring algorithm.

    ``exchange(send_buf, dst, recv_buf, src)`` sends one chunk to the right neighbour while receiving
    one from the left (both at once, or the ring would deadlock). ``trace`` collects ``t`` after each step.
    """
    chunks = chunk_slices(t.numel(), world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for phase, send_i, recv_i in ring_schedule(rank, world_size):
        incoming = torch.empty_like(t[chunks[recv_i]])
        exchange(t[chunks[send_i]].clone(), right, incoming, left)
        if phase == "scatter-reduce":
            t[chunks[recv_i]] += incoming
        else:
            t[chunks[recv_i]] = incoming
        if trace is not None:
            trace.append(t.tolist())
    return t


def naive_all_reduce(t: torch.Tensor, rank: int, world_size: int, send: Send, recv: Recv) -> torch.Tensor:
    """Sum ``t`` over all ranks, in place: everybody sends to rank 0, rank 0 adds and sends the sum back."""
    if rank == 0:
        incoming = torch.empty_like(t)
        for src in range(1, world_size):
            recv(incoming, src)
            t += incoming
        for dst in range(1, world_size):
            send(t, dst)
    else:
        send(t, 0)
        recv(t, 0)
    return t


def simulate_ring(vectors: list[list[float]]) -> tuple[list[list[float]], list[CommCount]]:
    """Run :func:`ring_all_reduce` for ``len(vectors)`` ranks inside one process, step by step.

    Returns every rank's final vector and its :class:`CommCount`; used to check the algorithm
    without processes and to tabulate the costs for other numbers of machines.
    """
    n = len(vectors)
    data = [torch.tensor(v, dtype=torch.float64) for v in vectors]
    counts = [CommCount() for _ in range(n)]
    chunks = chunk_slices(data[0].numel(), n)
    schedules = [ring_schedule(r, n) for r in range(n)]
    for step in range(2 * (n - 1)):
        outgoing = [data[r][chunks[schedules[r][step][1]]].clone() for r in range(n)]  # everybody sends first
        for r in range(n):
            phase, _, recv_i = schedules[r][step]
            incoming = outgoing[(r - 1) % n]
            counts[r].sent_messages += 1
            counts[r].sent_numbers += outgoing[r].numel()
            counts[r].recv_messages += 1
            counts[r].recv_numbers += incoming.numel()
            if phase == "scatter-reduce":
                data[r][chunks[recv_i]] += incoming
            else:
                data[r][chunks[recv_i]] = incoming
    return [d.tolist() for d in data], counts


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=10, help="length of the random vector of the second test")
    args = parser.parse_args(argv)
    with distributed(args.device) as info:
        r, n, dev = info.rank, info.world_size, info.device
        naive_count, ring_count = CommCount(), CommCount()

        def counted(count: CommCount) -> tuple[Send, Recv]:
            def send(buf: torch.Tensor, dst: int) -> None:
                count.sent_messages += 1
                count.sent_numbers += buf.numel()
                dist.send(buf.contiguous(), dst)

            def recv(buf: torch.Tensor, src: int) -> None:
                count.recv_messages += 1
                count.recv_numbers += buf.numel()
                dist.recv(buf, src)
            return send, recv

        def exchange_with(count: CommCount):
            _, recv = counted(count)

            def exchange(send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int) -> None:
                count.sent_messages += 1
                count.sent_numbers += send_buf.numel()
                request = dist.isend(send_buf, dst)  # non-blocking send, then blocking receive
                recv(recv_buf, src)
                request.wait()
            return exchange

        mine = torch.arange(4 * r + 1, 4 * r + 5, dtype=torch.float32, device=dev)  # the notes' numbers
        expected = mine.clone()
        dist.all_reduce(expected)
        naive = naive_all_reduce(mine.clone(), r, n, *counted(naive_count))
        trace: list[list[float]] = []
        ring = ring_all_reduce(mine.clone(), r, n, exchange_with(ring_count), trace)
        report(f"data {mine.int().tolist()} -> naive {naive.int().tolist()}, ring {ring.int().tolist()}; "
               f"both == dist.all_reduce: {torch.equal(naive, expected) and torch.equal(ring, expected)}")
        report(f"numbers sent/received: naive {naive_count.sent_numbers}/{naive_count.recv_numbers}, "
               f"ring {ring_count.sent_numbers}/{ring_count.recv_numbers}")

        gen = torch.Generator().manual_seed(r)
        vec = torch.randn(args.length, generator=gen).to(dev)  # uneven chunks when length % n != 0
        ref = vec.clone()
        dist.all_reduce(ref)
        ring_vec = ring_all_reduce(vec.clone(), r, n, exchange_with(CommCount()))
        report(f"random vector of length {args.length} (chunks {[s.stop - s.start for s in chunk_slices(args.length, n)]}): "
               f"ring == dist.all_reduce up to rounding: {torch.allclose(ring_vec, ref, atol=1e-6)}")
        save_result(args.out, {"data": mine.cpu(), "naive": naive.cpu(), "ring": ring.cpu(), "expected": expected.cpu(),
                               "trace": trace, "naive_count": naive_count.as_dict(), "ring_count": ring_count.as_dict(),
                               "ring_vec": ring_vec.cpu(), "ref_vec": ref.cpu()})


if __name__ == "__main__":
    main()

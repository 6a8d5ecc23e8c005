# %% [markdown]
# # 08 · DataParallel and DistributedDataParallel (数据并行与分布式数据并行)
#
# **You will learn to** train one model on several devices (or machines) at once by splitting every batch
# between them — **data parallelism** (数据并行) — and to do it for real:
#
# 1. use `nn.DataParallel`, reach your model through `model.module`, strip the `module.` prefix, and say why
#    PyTorch recommends DDP instead;
# 2. name the parts of a job — process group, rank, local rank, world size — on a job of two "machines" × two
#    processes; start it with `torchrun` (and know why it sets `OMP_NUM_THREADS=1`), with `mp.spawn`, and with
#    the older `torch.distributed.launch`; make a missing process fail with a `timeout` instead of hanging;
# 3. write a complete **DistributedDataParallel** (分布式数据并行, DDP) program and prove that it equals one
#    process with a batch twice as big; see what DDP sends besides gradients (parameters once, BatchNorm buffers
#    every forward) and how it packs gradients into buckets; accumulate gradients with `no_sync()`, with the
#    all-reduces counted; shard data with `DistributedSampler` and `set_epoch`; write a checkpoint on rank 0 and
#    load it everywhere with `map_location`; run the same program under `autocast` (bfloat16) and see where
#    `nn.SyncBatchNorm` runs;
# 4. write synchronised BatchNorm (同步批归一化) by hand with **one** `all_reduce`, and the ring all-reduce with
#    `send`/`recv`, with the communication of the naive and the ring way *measured*;
# 5. survive a crash with **fault tolerance** (容错): `--max_restarts` and a resume that continues every rank's
#    random stream; scale the learning rate with the batch, with warm-up; order work on CUDA streams.
#
# **Before this notebook.** A training loop with an optimizer (notebooks 02–05), saving/loading a `state_dict`
# and RNG states (notebook 06), and `autocast` (notebook 07). No GPU is needed: every distributed program here
# runs as real processes on the CPU. The lesson grew out of a teacher's study notes written for PyTorch 1.x; the
# last section lists what has changed since for readers who know them.
#
# **Study time:** about 195 min (35 of them for the exercises).
# Almost all of its run time is starting processes: five launches start 21 processes (16 workers, the restart of
# section 6 included, and 5 `torchrun` agents), and each one imports PyTorch (about 2 s of CPU each); the training itself takes
# milliseconds.
#
# **On a GPU.** The programs choose the NCCL backend and the device `cuda:LOCAL_RANK` when the machine has a
# GPU for every process of the node, and gloo on the CPU otherwise (so a 1-GPU machine runs the 2-process
# demos on the CPU). `DataParallel` splits batches over all visible GPUs. The stored outputs were made on the
# CPU.

# %%
# Opened alone? (单独打开) In the course's own folder this cell does nothing. Opened alone (in Colab, or
# downloaded without the rest of the course), it fetches the course (its helpers, data and pinned packages) from
# COURSE and runs this notebook inside it.
try:
    import utils.syllabus  # noqa: F401 - the course's helpers: found when this notebook runs in its course
except ModuleNotFoundError:
    import os
    from pathlib import Path
    from urllib.request import urlopen

    COURSE = os.environ.get("TORCH_COURSE_REPOSITORY", "").rstrip("/").removesuffix(".git")
    beside = Path.cwd().parent / "tools" / "opened_alone.py"  # the course is here, but not installed
    if not (beside.is_file() or COURSE):
        raise ModuleNotFoundError(
            "opened without its course, which names no repository to fetch it from: set the environment variable "
            "TORCH_COURSE_REPOSITORY to the course's location (a GitHub address), or get the whole course"
        ) from None
    raw = "/raw/HEAD" if COURSE.startswith("https://github.com/") else ""
    code = beside.read_bytes() if beside.is_file() else urlopen(f"{COURSE}{raw}/tools/opened_alone.py").read()
    exec(code, {"__name__": "opened_alone", "COURSE": COURSE})

# %% [markdown]
# ## Setup
#
# Which GPUs a process may use is decided by the environment variable `CUDA_VISIBLE_DEVICES` (for example `'0,1'`,
# or `'0,3'`, with `CUDA_DEVICE_ORDER=PCI_BUS_ID` so that the numbers match `nvidia-smi`): the listed GPUs
# are renumbered 0, 1, ... inside the process, and it must be set before PyTorch first touches CUDA. The stored
# outputs were made with it set to `""`: no GPU at all.
#
# The distributed programs of this notebook are written by its cells with `%%writefile` into `notebooks/runs/`
# (a folder git ignores), because worker processes are separate Python interpreters: they can run a file or
# import a module, but cannot see functions defined in a notebook. `utils.launch.run_torchrun` runs a program
# the way you would in a shell (`torchrun --standalone --nproc_per_node=2 runs/ddp_train.py`), captures what it
# prints, and returns its `[rank N]` lines sorted by rank. Results that need checking (parameters, gradients)
# come back as files that each rank writes (`--out DIR`), read with `load_rank_results`. The next cell is the
# plumbing; every line says why it is there.
#
# **On Windows and macOS** the programs are the same; three things differ, and the course takes care of them:
# * the backend there is always gloo, even on Windows with an NVIDIA GPU (NCCL exists only on Linux); this notebook
#   uses gloo on the CPU everywhere, so nothing changes here;
# * DataLoader workers (notebook 04, §5) start there with the `spawn` start method (on Linux too from Python
#   3.14, with `forkserver`): fresh interpreters, so a dataset must be importable. `mp.spawn` uses `spawn` on
#   every system, and `torchrun` starts fresh interpreters too, which is why this notebook's workers live in files;
# * PyTorch's Windows builds have no libuv, which `torchrun`'s store uses by default: on Windows,
#   `run_torchrun` sets `USE_LIBUV=0` (in a terminal: `set USE_LIBUV=0` in cmd, `$env:USE_LIBUV = "0"` in
#   PowerShell, before `torchrun`).

# %%
import inspect
import logging
import math
import os
import pickle
import sys
import tempfile
import textwrap
import time
import warnings
from datetime import timedelta
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from utils import NOTEBOOKS_DIR, REPO_ROOT, get_device, relpath, seed_everything
from utils.launch import (
    free_port,
    leftover_processes,
    load_rank_results,
    port_is_free,
    run_torchrun,
    run_torchrun_nodes,
)

assert Path.cwd() == NOTEBOOKS_DIR  # the %%writefile cells below write to runs/, relative to this folder
RUNS = NOTEBOOKS_DIR / "runs"  # ignored by git: the programs this notebook writes
RUNS.mkdir(exist_ok=True)
sys.path.insert(0, str(RUNS))  # so this kernel, and processes started by mp.spawn, can import them by name
work = tempfile.TemporaryDirectory()  # checkpoints and result files of this notebook's launches
WORK = Path(work.name)
launch_seconds = {}  # wall-clock time of every launch, shown at the end
seed_everything(0)
device = get_device()
print(
    "device:",
    device.type,
    "| CUDA_VISIBLE_DEVICES =",
    repr(os.environ.get("CUDA_VISIBLE_DEVICES")),
    "| visible GPUs:",
    torch.cuda.device_count(),
    "| programs written to",
    relpath(RUNS),
)
print(
    "backends available: gloo",
    dist.is_gloo_available(),
    "| nccl",
    dist.is_nccl_available(),
    "| mpi",
    dist.is_mpi_available(),
)


def shell(result) -> list[str]:
    """The launch's command lines as typed in a shell, with repository-relative paths."""
    return [line.replace(str(WORK), "$WORK").replace(str(REPO_ROOT) + "/", "") for line in result.shell_lines()]


# %% [markdown]
# ## 1. `nn.DataParallel`: one process, many GPUs
#
# `nn.DataParallel(model)` keeps one Python process. On every forward call it **scatters** the batch along
# dimension 0 into one piece per GPU, **replicates** the model onto every GPU, runs the pieces in parallel
# threads, and **gathers** the outputs back on the first GPU (`device_ids[0]`, where the model's parameters must
# live). Only one line of code changes, which is why it is popular in older code. Its full signature is
# `nn.DataParallel(module, device_ids=None, output_device=None, dim=0)`: `device_ids` defaults to every visible
# GPU, `output_device` (where the gathered output lands) to `device_ids[0]`, and `dim` is the dimension the
# batch is split along.
#
# The classic demo (from PyTorch's old DataParallel tutorial): a dataset of 100 random vectors of size 5,
# batches of 30, and a `Model` that prints the size of the input it receives ("In Model") next to the size the
# caller sees ("Outside").


# %%
class RandomDataset(Dataset):
    """`length` random vectors of size `size`."""

    def __init__(self, size: int, length: int):
        self.data = torch.randn(length, size)

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return len(self.data)


class Model(nn.Module):
    """One linear layer that reports the size of the input each replica sees."""

    def __init__(self, input_size: int, output_size: int):
        super().__init__()
        self.fc = nn.Linear(input_size, output_size)

    def forward(self, x):
        out = self.fc(x)
        print("\tIn Model: input size", tuple(x.shape), "output size", tuple(out.shape))
        return out


rand_loader = DataLoader(RandomDataset(5, 100), batch_size=30, shuffle=True)
model = Model(5, 2)
if torch.cuda.device_count() > 1:
    print("Let's use", torch.cuda.device_count(), "GPUs!")
    model = nn.DataParallel(model)
model.to(device)
outside = []
for data in rand_loader:
    inp = data.to(device)
    output = model(inp)
    outside.append(len(inp))
    print("Outside: input size", tuple(inp.shape), "output size", tuple(output.shape))
assert outside == [30, 30, 30, 10]

# %% [markdown]
# With no GPU (or one), "In Model" and "Outside" agree: there is one replica. With several GPUs, DataParallel
# splits each batch the way `tensor.chunk(n_gpus)` does: pieces of `ceil(30 / n)` rows and a smaller last
# piece. That is what the tutorial printed for 2 and 8 GPUs, including the surprise that a batch of 10 on
# 8 GPUs uses only **5** of them (pieces of 2). (On a real 8-GPU machine the "In Model" lines come out in a
# jumbled order: the replicas run in threads and print whenever they finish.)


# %%
def dataparallel_split(batch: int, n_gpus: int) -> list[int]:
    """The batch sizes DataParallel's scatter gives each GPU (it chunks dimension 0)."""
    return [len(piece) for piece in torch.empty(batch, 5).chunk(n_gpus)]


for n_gpus in (2, 8):
    for batch in (30, 10):
        print(f"{n_gpus} GPUs, batch {batch:2}: In Model sizes {dataparallel_split(batch, n_gpus)}")
assert dataparallel_split(30, 2) == [15, 15] and dataparallel_split(10, 2) == [5, 5]
assert dataparallel_split(30, 8) == [4] * 7 + [2] and dataparallel_split(10, 8) == [2] * 5

# %% [markdown]
# **`model.module`.** The wrapper is a new module; your model is its attribute `module`. Attributes of your
# model (its layers, custom methods) are reached through `.module`, and the wrapper's `state_dict` keys all start
# with `module.` — the classic "saved with DataParallel, cannot load on one GPU/CPU" problem. Older code strips
# the first 7 characters of every key (`k[7:]`); PyTorch has a helper for it,
# `consume_prefix_in_state_dict_if_present`. Better still, save `wrapped.module.state_dict()` in the first place.
#
# On a machine without GPUs `DataParallel` has no devices (`device_ids == []`) and simply calls the module.

# %%
plain = Model(5, 2)
wrapped = nn.DataParallel(plain)
try:
    wrapped.fc
except AttributeError as err:
    print(f"{type(err).__name__}: {err}")
print("wrapped.module.fc:", wrapped.module.fc)
keys = list(wrapped.state_dict())
print("wrapper's state_dict keys:", keys)
try:
    Model(5, 2).load_state_dict(wrapped.state_dict())
except RuntimeError as err:
    print(f"loading them into a plain Model: {type(err).__name__}: {' '.join(str(err).split())}")
old_way = {k[len("module.") :]: v for k, v in wrapped.state_dict().items()}  # older code's k[7:]
sd = wrapped.state_dict()
torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, "module.")  # in place
print("after consume_prefix_in_state_dict_if_present:", list(sd))
Model(5, 2).load_state_dict(sd)
assert keys == ["module.fc.weight", "module.fc.bias"] and list(sd) == list(old_way) == ["fc.weight", "fc.bias"]
if device.type == "cpu":
    assert wrapped.device_ids == []
    x = torch.randn(3, 5)
    assert torch.equal(wrapped(x), plain(x))  # it just calls the module (so "In Model" is printed twice)

# %% [markdown]
# **The model must sit on `device_ids[0]`.** DataParallel moves the *inputs* for you, but not the model: before
# every forward it checks that each parameter and buffer is on the first of its devices and refuses otherwise.
# A common older example builds `DataParallel(model, [0, 1])` around a model still on the CPU (or on `cuda:2`)
# and expects it to work because "the input may be anywhere": the input may be, the model may not. The check
# needs GPUs, so on this machine the cell reads it from `DataParallel.forward`'s source (`inspect.getsource`,
# Python's way to print a function's code) instead of triggering it:

# %%
dp_source = inspect.getsource(nn.DataParallel.forward)
first = dp_source.rindex("\n", 0, dp_source.index("for t in chain(")) + 1  # the start of that line
check = textwrap.dedent(  # dedent: remove the indentation the lines share
    dp_source[first : dp_source.index("inputs, module_kwargs = ")]
).rstrip()
print(check)
assert "module must have its parameters and buffers" in check and "(device_ids[0]) but found one of" in check
if torch.cuda.device_count() > 1:  # on a machine with 2 GPUs, the error itself
    try:
        nn.DataParallel(Model(5, 2), device_ids=[0, 1])(torch.randn(4, 5))  # model left on the CPU
    except RuntimeError as err:
        print(f"{type(err).__name__}: {err}")

# %% [markdown]
# Four words of section 2, used from here on: the processes of a job are numbered by their *rank* (0, 1,
# …); the *world size* is how many there are; a *broadcast* copies one process's tensor to all the others,
# and an *all-reduce* sums (or averages) a tensor over all processes and leaves the result in each of them.
#
# **Why PyTorch recommends DDP instead, even on one machine:**
#
# * DataParallel is *one process with one thread per GPU*: the Python parts of every replica's forward pass
#   compete for Python's **global interpreter lock** (全局解释器锁, GIL).
# * It **replicates the model on every forward pass** (parameters are broadcast from GPU 0 every step), and
#   scatters inputs and gathers outputs through GPU 0, which therefore needs more memory and does more work:
#   low GPU utilisation, with communication as the bottleneck.
# * It works on one machine only, and only when each replica fits on one GPU: a model already split across
#   GPUs (model parallelism, notebook 09) cannot be replicated by it, while DDP wraps such a model as it is.
#
# DistributedDataParallel runs **one process per GPU**. Each process has its own model copy and reads its own
# share of the data. Three things travel between the processes, and section 3 shows each of them:
#
# * **parameters, once**: DDP's constructor broadcasts rank 0's parameters *and buffers* to every rank, so all
#   copies start equal (unless you pass `init_sync=False`, which turns every collective of the constructor off);
# * **buffers, before every forward** (by default, `forward_sync_buffers=True`): rank 0's buffers, such as
#   BatchNorm's running mean and variance, overwrite everybody else's — "only gradients travel" is a common
#   but wrong summary of DDP. (The argument was called `broadcast_buffers` until PyTorch 2.13, which deprecated
#   it with a `FutureWarning`, shown in section 3. It is not a plain rename: `broadcast_buffers=False` also left
#   the buffers out of the constructor's broadcast, while `forward_sync_buffers=False` only stops the
#   per-forward one; the constructor copies rank 0's in both cases, unless `init_sync=False`.)
# * **gradients, during every backward**: DDP packs the gradients into **buckets** (桶) and all-reduces each
#   bucket, asynchronously, as soon as all its gradients are computed, while autograd keeps computing the
#   gradients of earlier layers — communication overlaps with the backward pass. Each bucket is divided by the
#   world size and then summed over the ranks (dividing first keeps float16 sums from overflowing), so each
#   process ends `backward()` with the same **average** gradient, and the same optimizer step keeps the copies
#   equal. How the buckets are formed changes after the first iteration. With the default
#   `find_unused_parameters=False`, the **first** backward uses **one bucket holding every gradient** (no
#   overlap yet: DDP does not know in which order the gradients will arrive). During it DDP records that order,
#   and then **rebuilds** the buckets: each is filled until it reaches `bucket_cap_mb` (25 MiB) — the gradient
#   that crosses the cap stays in it, so a bucket may exceed the cap by up to one parameter — and the first one
#   only until 1 MiB (when you leave `bucket_cap_mb` at its default), so that communication starts early; filled
#   in the order the gradients arrived (roughly the reverse of
#   `model.parameters()`: the last layer's gradients come first). Only with `find_unused_parameters=True` does
#   DDP start, from the first iteration, with capped buckets in reverse `parameters()` order. Section 3 counts
#   the buckets of both iterations.

# %% [markdown]
# ## 2. Processes, ranks, and how to start them
#
# A DDP program is one script started N times, as N processes. They form a **process group** (进程组): the set
# of processes that take part in **collective communication** (集合通信). Its vocabulary, where two words are
# often confused with machines:
#
# * **world size** (世界大小): the number of *processes* in the job — not of machines: with 2 machines of 8 GPUs
#   and one process per GPU the world size is 16, not 2.
# * **rank** (秩): the global index of a process, 0 .. world size − 1 — not the machine's number, which is the
#   *node rank* (`--node_rank`, `GROUP_RANK`). Rank 0 usually logs and saves.
# * **local rank** (本地秩): the index of the process on its own machine (node), 0 .. processes per node − 1; with one
#   process per GPU, it is the GPU index `cuda:LOCAL_RANK`.
#
# **One process, one GPU, and no GPU shared by two processes.** PyTorch does not decide which process uses which
# GPU: your program does, from `LOCAL_RANK`. If two processes of a job pick the same GPU (a forgotten
# `set_device`, or every process using `cuda:0`), NCCL refuses to build the communicator: the first collective
# (or `DDP(...)`, which starts with one) raises `torch.distributed.DistBackendError` with NCCL's
# `ncclInvalidUsage` and the line `Duplicate GPU detected : rank 1 and rank 0 both on CUDA device ...` — NCCL
# needs one GPU per rank. (That error needs several processes on a GPU machine; it cannot be shown here.)
#
# `torchrun` (the command-line name of `python -m torch.distributed.run`, built on TorchElastic) starts the
# worker processes on a node and gives each these environment variables (`dist.init_process_group()` reads the
# global ones, `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`; the others are for your program):
#
# | variable | meaning |
# |---|---|
# | `RANK` | global index of the process, 0 .. `WORLD_SIZE`-1 |
# | `LOCAL_RANK` | index on this node: the GPU to use, `cuda:LOCAL_RANK` |
# | `WORLD_SIZE` | number of processes in the whole job (all nodes) |
# | `LOCAL_WORLD_SIZE` | processes on this node (`--nproc_per_node`) |
# | `GROUP_RANK` | index of this node (`--node_rank`) |
# | `MASTER_ADDR`, `MASTER_PORT` | where the **rendezvous** (会合) store runs (node 0) |
#
# `--standalone` means "a single node: pick a free port yourself". On a cluster you start one `torchrun` per
# machine with the same `--nnodes`, `--nproc_per_node`, `--master_addr` (machine 0's address) and
# `--master_port`, and a different `--node_rank`. Machine 0 hosts the rendezvous store; the others connect to it.
# (`--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=JOB` is the elastic alternative, which assigns node
# ranks itself.) The backend is **gloo** on CPUs and **NCCL** on NVIDIA GPUs.
#
# The smallest program, written by the next cell into `runs/hello.py`, reports its variables and runs three
# collectives:
# **all-reduce** (全归约; `all_reduce`: every rank ends with the sum), `all_gather` (every rank ends with everybody's value) and
# `broadcast` (广播: rank 0's value is copied to everyone). It joins and leaves the process group through
# `utils.ddp.common.distributed()`, a context manager that calls `destroy_process_group()` however the block
# ends. It runs here as a job of **2 "machines" × 2 processes**: two `torchrun` agents, both on this computer
# (127.0.0.1), with `--device cpu`, because two "machines" on one computer would both take `cuda:0` and `cuda:1`.

# %%
# %%writefile runs/hello.py
"""The smallest distributed program: who am I, and three collectives (notebook 08 writes this file).

    torchrun --standalone --nproc_per_node=2 runs/hello.py --device cpu

Each rank reports the variables torchrun set for it, the backend and device it chose, and the
results of ``all_reduce`` (sum), ``all_gather`` and ``broadcast``. The port number is random, so
only whether ``MASTER_PORT`` is set is printed (the value is saved with ``--out``).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from utils.ddp.common import TORCHRUN_VARS, base_parser, distributed, report, save_result


def main(argv: list[str] | None = None) -> None:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    env = {name: os.environ.get(name) for name in TORCHRUN_VARS}
    shown = {k: v for k, v in env.items() if k != "MASTER_PORT"}
    report(" ".join(f"{k}={v}" for k, v in shown.items()) + f" MASTER_PORT set: {env['MASTER_PORT'] is not None}")
    with distributed(args.device) as info:
        report(f"backend={info.backend} device={info.device}")
        x = torch.tensor([float(info.rank + 1)], device=info.device)
        dist.all_reduce(x, op=dist.ReduceOp.SUM)  # in place, on every rank
        gathered = [torch.zeros(1, dtype=torch.long, device=info.device) for _ in range(info.world_size)]
        dist.all_gather(gathered, torch.tensor([info.rank], device=info.device))
        token = torch.tensor([42 if info.rank == 0 else -1], device=info.device)
        dist.broadcast(token, src=0)  # rank 0's value overwrites everyone's
        report(
            f"all_reduce(rank+1)={x.item():g} all_gather(rank)={[int(g.item()) for g in gathered]} "
            f"broadcast from 0={token.item()}"
        )
        result = {
            "env": env,
            "backend": info.backend,
            "device": str(info.device),
            "sum": x.item(),
            "gathered": [int(g.item()) for g in gathered],
            "token": int(token.item()),
        }
    result["destroyed"] = not dist.is_initialized()
    report(f"process group destroyed: {result['destroyed']}")
    save_result(args.out, result)


if __name__ == "__main__":
    main()

# %%
hello = run_torchrun_nodes(
    RUNS / "hello.py", nnodes=2, nproc_per_node=2, args=["--device", "cpu", "--out", WORK / "hello"]
)
launch_seconds["hello, 2 nodes x 2 workers"] = hello.wall_s
for line in shell(hello):
    print("$", line)
hello.print_ranks()
res = load_rank_results(WORK / "hello")
for rank, r in res.items():
    env = {k: v if k in ("MASTER_ADDR", "MASTER_PORT") else int(v) for k, v in r["env"].items()}
    assert env["RANK"] == rank == env["GROUP_RANK"] * env["LOCAL_WORLD_SIZE"] + env["LOCAL_RANK"]
    assert env["WORLD_SIZE"] == 4 and env["LOCAL_WORLD_SIZE"] == 2 and env["MASTER_ADDR"] == "127.0.0.1"
    assert r["sum"] == 1 + 2 + 3 + 4 and r["gathered"] == [0, 1, 2, 3] and r["token"] == 42 and r["destroyed"]
port = int(res[0]["env"]["MASTER_PORT"])
print("rendezvous port released after the job:", port_is_free(port))
assert port_is_free(port)

# %% [markdown]
# Two machines, four processes: the world size is **4**, the ranks are 0–3, each machine's processes have local
# ranks 0 and 1, and the machine's own index is `GROUP_RANK`. The global rank is
# `GROUP_RANK × LOCAL_WORLD_SIZE + LOCAL_RANK`; local ranks repeat across machines, so decide who writes files
# with `RANK == 0`, not `LOCAL_RANK == 0`.

# %% [markdown]
# **A device string names one device.** Code that means "use GPUs 1 and 2" sometimes writes
# `model.cuda('cuda:1,2')` or `torch.cuda.set_device('cuda:1,2')`. There is no such device: the string is parsed
# into one `torch.device`, and a list of indices is refused. A process chooses several GPUs only through
# `CUDA_VISIBLE_DEVICES` (or `DataParallel(device_ids=[...])`); under DDP each process uses exactly one.

# %%
for text in ("cuda:1", "cuda:1,2"):
    try:
        d = torch.device(text)
        print(f"torch.device({text!r}) -> type {d.type!r}, index {d.index}")
    except RuntimeError as err:
        print(f"torch.device({text!r}) -> {type(err).__name__}: {err}")
        refused = str(err)
assert refused == "Invalid device string: 'cuda:1,2'"

# %% [markdown]
# **What older code uses instead of `torchrun`.** Scripts written for PyTorch 1.x start workers with `python -m
# torch.distributed.launch --nproc_per_node=8 ... train.py`, which passes `--local_rank=k` (spelt `--local-rank`
# since PyTorch 2.0) as a *command-line argument*, so every script had to parse it (it sets `LOCAL_RANK` in the
# environment too); and with `mp.spawn(fn, nprocs=world_size)` plus hard-coded `MASTER_ADDR`/`MASTER_PORT`
# (`'12355'`) inside the script. Since PyTorch 1.10, `torchrun` replaces `launch`:
# it sets `LOCAL_RANK` in the environment, chooses ports, and can restart failed workers.
# `torch.distributed.launch` still exists as a thin wrapper around `torchrun`'s code, but calling it emits a
# `FutureWarning`. The cell below shows both, and the command line each would run. (A `setup()` with
# `'localhost'` and a fixed port, as in older tutorials, also fails as soon as two jobs share a machine.)
# Everything after the script's name belongs to the script, even what looks like a launcher flag: below,
# `--nnodes=3` after `train.py` is passed to `train.py`, not read by the launcher.
#
# The warning is caught with `warnings.catch_warnings(record=True)` (Python's way to collect warnings into a
# list instead of printing them), so that the cell can print it and check it.

# %%
import torch.distributed.launch as legacy_launch  # noqa: E402 - imported here to show its warning

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:  # an invalid flag combination: the warning fires, then the launcher refuses before starting anything
        legacy_launch.main(["--nproc-per-node=2", "--no-python", "train.py"])
    except ValueError as err:
        print(f"{type(err).__name__}: {err}")
launch_warnings = [w for w in caught if w.category is FutureWarning]
print(f"{launch_warnings[0].category.__name__}: {str(launch_warnings[0].message).splitlines()[0]}")
assert "torch.distributed.launch is deprecated" in str(launch_warnings[0].message)
from torch.distributed.run import config_from_args  # noqa: E402 - the code both launchers share
from torch.distributed.run import parse_args as torchrun_args  # noqa: E402

launcher = ["--nproc-per-node=1", f"--log-dir={WORK / 'launcher_logs'}"]  # (a log folder, else one in /tmp)
script = ["train.py", "--lr", "0.2", "--nnodes=3"]
_, _, legacy_cmd = config_from_args(legacy_launch.parse_args(launcher + script))  # builds, starts nothing
_, _, torchrun_cmd = config_from_args(torchrun_args(launcher + script))
print("launch   runs: python", " ".join(legacy_cmd))
print("torchrun runs: python", " ".join(torchrun_cmd))
assert legacy_cmd == ["-u", "train.py", "--local-rank=${local_rank}", "--lr", "0.2", "--nnodes=3"]  # agent fills rank
assert torchrun_cmd == ["-u", "train.py", "--lr", "0.2", "--nnodes=3"]  # LOCAL_RANK only in the environment

# %% [markdown]
# **Why `torchrun` sets `OMP_NUM_THREADS=1`.** PyTorch's CPU operations run on a pool of threads, by default
# one per CPU core (`torch.get_num_threads()`), and the size of that pool is read from the environment
# variable `OMP_NUM_THREADS` when the process starts. One process per machine uses every core that way. But N
# processes on one machine, each starting one thread per core, run N × cores threads on `cores` cores: they
# take turns, evict each other's caches and wait for each other inside every parallel operation
# (**oversubscription**, 超额订阅) — a job can become much slower than with fewer threads. So when it
# starts more than one process per node and `OMP_NUM_THREADS` is not set, `torchrun` sets it to **1** for its
# workers and warns that it did (a block of stars in every job's log). The safe value is 1; the fast one is
# usually about `cores // nproc_per_node`, which you set yourself (`OMP_NUM_THREADS=8 torchrun ...`); programs
# that compute on GPUs do little math on the CPU, so 1 usually costs them nothing. The launcher of this notebook sets it to 1 before
# starting `torchrun`, so the warning does not fill the outputs. The cell below runs `torchrun`'s own
# configuration code once more, with 2 processes and the variable unset, and catches the warning from
# `torchrun`'s logger (Python's `logging` module; a `logging.Handler` is where its records go):

# %%
records = []
catcher = logging.Handler()
catcher.emit = records.append  # keep each record instead of printing it
run_logger = logging.getLogger("torch.distributed.run")
saved = (run_logger.handlers[:], run_logger.propagate, os.environ.pop("OMP_NUM_THREADS", None))
run_logger.handlers, run_logger.propagate = [catcher], False
try:
    config_from_args(torchrun_args(["--nproc-per-node=2", *launcher[1:], *script]))  # builds, starts nothing
    set_by_torchrun = os.environ.get("OMP_NUM_THREADS")
finally:
    run_logger.handlers, run_logger.propagate = saved[0], saved[1]
    os.environ.pop("OMP_NUM_THREADS", None)
    if saved[2] is not None:
        os.environ["OMP_NUM_THREADS"] = saved[2]
message = " ".join(records[0].getMessage().replace("*", "").split())
print(f"torchrun's warning: {message}")
print("OMP_NUM_THREADS that its workers would get:", set_by_torchrun)
assert set_by_torchrun == "1" and "Setting OMP_NUM_THREADS environment variable" in message

# %% [markdown]
# **`mp.spawn`, and the process group's `timeout`.** `torch.multiprocessing.spawn(fn, args, nprocs)` starts
# `nprocs` fresh Python interpreters and calls `fn(i, *args)` in each, with `i` = 0 .. nprocs − 1. A fresh
# interpreter receives `fn` *pickled*, and Python pickles a function **by name** (module + function name); the
# new process imports that module to find it. A function defined in a notebook cell lives in the kernel's
# `__main__`, and a spawned process has a `__main__` of its own, a fresh one that never ran the notebook's cells, so it
# fails with `AttributeError: Can't get attribute
# 'worker' on <module '__main__' ...>`. The worker must live in a module: here one written by the next cell.
# (In a script run with `python train.py` it works, because the child re-runs the script's top level under the
# name `__mp_main__` — which is also why such scripts need `if __name__ == "__main__":`.)
#
# The worker also shows the **timeout** (超时) of `init_process_group(..., timeout=...)`: how long a collective (or `barrier`) waits
# for the other ranks before it fails, instead of hanging for ever. Rank 1 never enters the barrier; rank 0's
# barrier raises after 2 s. The defaults in PyTorch 2.14 (`torch.distributed.constants`) are **30 minutes**
# for gloo and other backends and **10 minutes** for NCCL (`None` in a PyTorch built without NCCL), whose
# watchdog then aborts the process rather than letting it continue after a failed GPU collective.


# %%
def notebook_worker(rank):
    print("hello from process", rank)


data = pickle.dumps(notebook_worker)
print(
    f"notebook_worker pickles into {len(data)} bytes: its module {notebook_worker.__module__!r} and its name, no code"
)
assert b"__main__" in data and b"notebook_worker" in data and notebook_worker.__code__.co_code not in data

# %%
# %%writefile runs/spawn_timeout.py
"""Notebook 08: a worker for mp.spawn that shows the process group's timeout."""
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist


def worker(rank, world_size, init_method, out_dir, timeout_s):
    # mp.spawn passes the process index first; the rest are spawn's args
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    out = Path(out_dir)
    if rank == 0:
        start = time.perf_counter()
        try:
            dist.barrier()  # rank 1 never comes: the barrier gives up after timeout_s
            message = "no error"
        except RuntimeError as err:
            message = f"{type(err).__name__}: {str(err).split('] ', 1)[-1]}"  # drop the C++ source location
        (out / "rank0.txt").write_text(f"{time.perf_counter() - start:.3f}\n{message}")
    else:
        while not (out / "rank0.txt").exists():  # skip the barrier; wait until rank 0 has given up
            time.sleep(0.05)
    dist.destroy_process_group()


# %%
from spawn_timeout import worker  # noqa: E402 - the module the previous cell wrote

(WORK / "spawn").mkdir()
start = time.perf_counter()
mp.spawn(worker, args=(2, f"tcp://127.0.0.1:{free_port()}", str(WORK / "spawn"), 2.0), nprocs=2, join=True)
launch_seconds["mp.spawn (2 processes)"] = time.perf_counter() - start
waited, message = (WORK / "spawn" / "rank0.txt").read_text().split("\n", 1)
print(f"rank 0's barrier, with timeout=2 s, raised: {message}")
assert 1.9 <= float(waited) < 30 and "Timed out" in message
from torch.distributed.constants import default_pg_nccl_timeout, default_pg_timeout  # noqa: E402

print("default timeout: gloo and others", default_pg_timeout)
assert default_pg_timeout == timedelta(minutes=30) and default_pg_nccl_timeout in (timedelta(minutes=10), None)

# %% [markdown]
# ## 3. A DDP program, written here and run by `torchrun`
#
# The next five cells write one program, `runs/ddp_train.py`, piece by piece (`%%writefile` creates the file,
# `%%writefile -a` appends to it); the launch follows. It trains the `ToyModel` of PyTorch's DDP tutorial (Linear 10→10, ReLU,
# Linear 10→5) with MSE loss and SGD with momentum on 64 fixed samples, for 3 epochs, with **batch 8 per
# rank**, and adds Gaussian noise to the inputs as a random augmentation drawn from each rank's own random
# stream. First the model, the data, and two helpers that compare tensors across ranks with `all_gather`.

# %%
# %%writefile runs/ddp_train.py
"""DDP training written out: notebook 08 writes this file (%%writefile) and runs it with torchrun."""
import argparse
import contextlib
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from utils import get_device
from utils.checkpoint_files import atomic_torch_save, load_rng_state_dict, rng_state_dict
from utils.ddp.common import report, save_result


class ToyModel(nn.Module):
    """PyTorch's DDP tutorial example: Linear(10, 10) -> ReLU -> Linear(10, 5)."""

    def __init__(self):
        super().__init__()
        self.net1, self.relu, self.net2 = nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def make_data(n=64, seed=0):
    """n inputs of size 10 and targets of size 5, the same on every rank (a shared seed)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    y = torch.tanh(x @ (torch.randn(10, 5, generator=g) / 10**0.5)) + 0.1 * torch.randn(n, 5, generator=g)
    return x, y


def gather(t):
    """Every rank's copy of tensor t, in rank order (all_gather)."""
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return out


def same_everywhere(module):
    """True when every rank holds exactly rank 0's parameters."""
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    return all(torch.equal(flat, other) for other in gather(flat))


# %% [markdown]
# **Buffers travel too.** The first piece of the program makes the claim of section 1 visible. A
# `Linear → BatchNorm1d` network is wrapped twice, once with the default `forward_sync_buffers=True` and once
# with `False`. Before wrapping, each rank fills BatchNorm's `running_mean` with its own rank number; right after
# `DDP(...)` the piece gathers it again. Then the ranks feed the network different data (rank 1's inputs are
# shifted by 10), and a forward pre-hook on the BatchNorm layer records its `running_mean` as each forward
# *starts*, after DDP has done its pre-forward work.

# %%
# %%writefile -a runs/ddp_train.py


def buffers_demo(device, rank):
    """BatchNorm's running mean seen on entry to each forward, with and without forward_sync_buffers."""
    seen = {}
    for sync in (True, False):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(device)
        net[1].running_mean.fill_(float(rank))  # the ranks' buffers differ before DDP() ...
        ddp = DDP(net, device_ids=[device.index] if device.type == "cuda" else None, forward_sync_buffers=sync)
        constructed = gather(net[1].running_mean)  # ... and after it? (the constructor's broadcast)
        entering = []  # running_mean as BatchNorm starts its forward, per step
        net[1].register_forward_pre_hook(lambda m, args: entering.append(m.running_mean.clone()))
        for _step in range(2):
            x = torch.randn(8, 4, device=device) + 10 * rank  # each rank sees different data
            ddp(x).sum().backward()
        after = net[1].running_mean.clone()
        seen[sync] = {"after DDP()": constructed, "entering step 2": gather(entering[1]), "after step 2": gather(after)}
    return seen


# %% [markdown]
# **Accumulating gradients with `no_sync()`.** To train with a global batch too big for memory,
# run k micro-batches and step once: **gradient accumulation** (梯度累加). Under DDP every `backward()` would all-reduce; the context manager
# `ddp.no_sync()` turns that off, so the gradients simply add up in each rank's `.grad`, and the *last*
# micro-batch's normal backward all-reduces the accumulated sum once. DDP decides whether a backward will
# synchronise **during the forward** (its forward prepares the reducer), so the forward must be inside
# `no_sync()` too. The piece below tries three ways on 16 samples (8 per rank, k = 4 micro-batches of 2),
# counts the all-reduces with a **communication hook** (通信钩子), registered with `register_comm_hook` (DDP calls it for
# every bucket whose gradients are ready and uses the future it returns; this one counts, then does what DDP does by
# default through `default_hooks.allreduce_hook`), and keeps the gradients to compare with one process
# computing the whole batch of 16.

# %%
# %%writefile -a runs/ddp_train.py


def no_sync_demo(ddp, module, x, y, k, device):
    """Gradient accumulation over k micro-batches, with and without no_sync; all-reduces counted."""
    calls = {"n": 0}

    def counting_hook(state, bucket):  # DDP calls it once per bucket, when the bucket's gradients are ready
        state["n"] += 1
        return default_hooks.allreduce_hook(None, bucket)  # what DDP does anyway: divide by world size, all-reduce

    ddp.register_comm_hook(calls, counting_hook)
    rank, world = dist.get_rank(), dist.get_world_size()
    n_local = len(x) // world
    mine_x, mine_y = x[rank * n_local : (rank + 1) * n_local], y[rank * n_local : (rank + 1) * n_local]
    micro_x, micro_y = mine_x.chunk(k), mine_y.chunk(k)
    result = {}
    for way in ("sync every micro-batch", "no_sync: forward and backward", "no_sync: backward only"):
        ddp.zero_grad()
        calls["n"] = 0
        for i in range(k):
            skip = way != "sync every micro-batch" and i < k - 1  # the last micro-batch always syncs
            with ddp.no_sync() if skip and way == "no_sync: forward and backward" else contextlib.nullcontext():
                loss = F.mse_loss(ddp(micro_x[i]), micro_y[i]) / k  # /k: the k micro-batches make one mean
                with ddp.no_sync() if skip and way == "no_sync: backward only" else contextlib.nullcontext():
                    loss.backward()  # without an all-reduce, gradients add up in .grad
        result[way] = {"allreduces": calls["n"], "grads": [p.grad.clone() for p in module.parameters()]}
    ref = ToyModel().to(device)
    ref.load_state_dict(module.state_dict())
    F.mse_loss(ref(x), y).backward()  # one process, the whole global batch
    result["full batch"] = [p.grad for p in ref.parameters()]
    calls["n"] = 0
    ddp.zero_grad()
    F.mse_loss(ddp(micro_x[0]), micro_y[0]).backward()
    result["buckets"] = calls["n"]
    ddp.zero_grad()
    calls["n"] = 0
    return result, calls


# %% [markdown]
# **Mixed precision and SyncBN under DDP.** DDP and `autocast` (notebook 07) combine without any new code:
# `autocast` changes the dtype of the *operations* inside the forward, not of the parameters, so the gradients
# are float32 and DDP all-reduces float32 buckets as always. On the CPU `autocast` uses bfloat16 (which needs no
# `GradScaler`, notebook 07); on a GPU the same lines with `torch.float16` also need a `GradScaler`, and its
# `scaler.scale(loss).backward()` is the backward that DDP hooks into. The piece below does one step under
# `torch.autocast(device.type, dtype=torch.bfloat16)` and compares the synchronised gradient with the float32
# gradient of the whole batch.
#
# It then tries `nn.SyncBatchNorm` (section 4 builds SyncBN by hand) inside DDP: convert the model with
# `nn.SyncBatchNorm.convert_sync_batchnorm(model)` *before* wrapping it, then wrap. On GPUs (NCCL) that runs;
# on the CPU DDP's constructor refuses, and the piece records the error.

# %%
# %%writefile -a runs/ddp_train.py


def amp_syncbn_demo(device, rank, world):
    """One DDP step under autocast(bfloat16); then whether nn.SyncBatchNorm runs under DDP on this device."""
    torch.manual_seed(0)
    model = ToyModel().to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    x, y = make_data(16, seed=1)
    x, y = x.to(device), y.to(device)
    mine = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = ddp(x[mine])  # the Linear layers run in bfloat16
        loss = F.mse_loss(out, y[mine])  # autocast runs mse_loss in float32
    loss.backward()  # float32 gradients, all-reduced by DDP
    ref = ToyModel().to(device)
    ref.load_state_dict(model.state_dict())
    F.mse_loss(ref(x), y).backward()  # float32, one process, the whole batch
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    full = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
    result = {
        "dtypes": [str(t.dtype) for t in (out, loss, model.net1.weight, model.net1.weight.grad)],
        "equal on all ranks": all(torch.equal(grads, g) for g in gather(grads)),
        "max diff to float32": (grads - full).abs().max().item(),
        "grad scale": full.abs().max().item(),
    }
    net = nn.Sequential(nn.Linear(10, 4), nn.BatchNorm1d(4))
    net = nn.SyncBatchNorm.convert_sync_batchnorm(net).to(device)  # convert first, then wrap
    try:
        sbn = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
        sbn(x[mine]).sum().backward()
        stats = gather(net[1].running_mean)
        result["syncbn"] = f"ran; running_mean equal on all ranks: {all(torch.equal(stats[0], s) for s in stats)}"
    except ValueError as err:
        result["syncbn"] = f"{type(err).__name__}: {err}"
    return result


# %% [markdown]
# **The program itself**, the part every DDP program has:
#
# 1. **join the process group** with `init_process_group(backend)`. `torchrun` set `RANK`, `WORLD_SIZE`,
#    `MASTER_ADDR` and `MASTER_PORT`, which the default `init_method="env://"` reads. On GPUs: pick
#    `cuda:LOCAL_RANK`, make it the current device, and pass it as `device_id`, which binds the process group
#    to that GPU (NCCL then creates its communicator at once, so errors show up here rather than at the first
#    collective, and `barrier()` knows which GPU to use). gloo on the CPU needs no device;
# 2. wrap the model: `DDP(model, device_ids=[local_rank])` on a GPU, **no `device_ids`** for a CPU model;
# 3. give each rank its **shard** (分片) of the data with `DistributedSampler`, and call `set_epoch(epoch)` before
#    each epoch so that the shuffle changes;
# 4. after each epoch, the usual checkpoint protocol: **rank 0** writes it (the parameters are equal
#    everywhere; written to a temporary file and renamed, so it is never half-written), `dist.barrier()` makes
#    everybody wait until it exists, then **every rank** loads it with `torch.load(..., map_location=device)`,
#    so that each process maps the tensors onto its *own* device (without `map_location`, tensors saved from
#    `cuda:0` would all land on GPU 0). The checkpoint also holds **every rank's RNG state**, gathered with
#    `all_gather_object` (section 6 uses it);
# 5. `destroy_process_group()` at the end, in a `finally:` so that it also runs after an error.
#
# `--crash-at-step` makes the last rank die in the middle of training on the first attempt; section 6 uses it.

# %%
# %%writefile -a runs/ddp_train.py


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--noise", type=float, default=0.1, help="std of the random noise added to inputs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ckpt", required=True, help="checkpoint file, written by rank 0")
    parser.add_argument("--out", required=True, help="folder for each rank's results")
    parser.add_argument("--crash-at-step", type=int, default=-1)
    args = parser.parse_args()

    # --- join the process group: torchrun set RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT ---
    local_rank = int(os.environ["LOCAL_RANK"])
    if get_device().type == "cuda" and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        device = torch.device("cuda", local_rank)  # one GPU per process, chosen by LOCAL_RANK
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)  # device_id: NCCL connects now, bound to this GPU
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    try:
        if attempt == 0:  # the demos of the cells above, on the first attempt only
            seen = buffers_demo(device, rank)
            amp = amp_syncbn_demo(device, rank, world)
        torch.manual_seed(args.seed + rank)  # every rank its own random stream (noise, init)
        x, y = make_data(64, args.seed)
        model = ToyModel().to(device)  # different initial weights on every rank ...
        before = same_everywhere(model)
        ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
        after = same_everywhere(model)  # ... until DDP's constructor broadcast rank 0's
        report(f"attempt {attempt}: parameters equal on all ranks before DDP() {before}, after DDP() {after}")
        if attempt == 0:  # registers the counting hook, which then also counts the training's all-reduces
            acc, calls = no_sync_demo(ddp, model, x[:16].to(device), y[:16].to(device), k=4, device=device)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        dataset = TensorDataset(x, y)
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

        start_epoch, step = 0, 0
        ckpt = Path(args.ckpt)
        if ckpt.exists():  # a restarted job: carry on from the last checkpoint
            state = torch.load(ckpt, map_location=device, weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            load_rng_state_dict(state["rng"][rank])  # this rank's own random stream, where it stopped
            start_epoch, step = state["epoch"] + 1, state["step"]
            report(f"attempt {attempt}: resumed from the checkpoint of epoch {state['epoch']} (step {step})")
        noise_log = {}
        shards = {}
        for epoch in range(start_epoch, args.epochs):
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on all ranks
            shards[epoch] = list(sampler)
            for xb, yb in loader:
                if step == args.crash_at_step and attempt == 0 and rank == world - 1:
                    report(f"attempt 0: simulated crash before step {step}")
                    os._exit(1)  # a hard crash: no cleanup, like a killed process
                xb, yb = xb.to(device), yb.to(device)
                noise = args.noise * torch.randn_like(xb)  # random augmentation from this rank's stream
                noise_log[step] = noise.cpu()
                loss = F.mse_loss(ddp(xb + noise), yb)
                opt.zero_grad()
                loss.backward()  # DDP all-reduces the gradients bucket by bucket, averaged over ranks
                opt.step()
                step += 1
            rngs = [None] * world
            dist.all_gather_object(rngs, rng_state_dict())  # every rank's RNG state, in rank order
            if rank == 0:  # the parameters are equal everywhere: one writer is enough
                atomic_torch_save(
                    {
                        "model": model.state_dict(),
                        "optimizer": opt.state_dict(),
                        "epoch": epoch,
                        "step": step,
                        "rng": rngs,
                    },
                    ckpt,
                )
            dist.barrier()  # nobody reads before rank 0 has finished writing
            state = torch.load(ckpt, map_location=device, weights_only=True)  # onto *this* rank's device
            same = all(torch.equal(v, state["model"][k]) for k, v in model.state_dict().items())
            report(
                f"epoch {epoch}: checkpoint written by rank 0, loaded with map_location={device}: "
                f"equals my parameters {same}"
            )
        final = same_everywhere(model)
        report(f"attempt {attempt}: done after {step} steps; parameters equal on all ranks {final}")
        result = {
            "params": {k: v.cpu() for k, v in model.state_dict().items()},
            "shards": shards,
            "noise": noise_log,
            "attempt": attempt,
            "before": before,
            "after": after,
            "final": final,
        }
        if attempt == 0:
            result["amp"] = amp
            result["buffers"] = {b: {k: [t.cpu() for t in v] for k, v in d.items()} for b, d in seen.items()}
            result["accumulate"] = {
                w: {"allreduces": v["allreduces"], "grads": [g.cpu() for g in v["grads"]]}
                for w, v in acc.items()
                if isinstance(v, dict)
            }
            result["full batch"] = [g.cpu() for g in acc["full batch"]]
            result["buckets"], result["training allreduces"] = acc["buckets"], calls["n"]
        save_result(args.out, result)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

# %% [markdown]
# The launch: `torchrun --standalone --nproc_per_node=2 runs/ddp_train.py ...`, 2 processes.

# %%
train = run_torchrun(RUNS / "ddp_train.py", nproc=2, args=["--ckpt", WORK / "ckpt.pt", "--out", WORK / "train"])
launch_seconds["ddp_train (2 workers)"] = train.wall_s
print("$", shell(train)[0])
train.print_ranks()
ddp_res = load_rank_results(WORK / "train")
assert all(not r["before"] and r["after"] and r["final"] for r in ddp_res.values())
assert (WORK / "ckpt.pt").exists()

# %% [markdown]
# The first line of each rank: the ranks built their models from different seeds (`torch.manual_seed(seed +
# rank)`), and right after `DDP(model)` the parameters are equal — the constructor broadcast rank 0's (so
# the common advice to seed every process the same way is not needed for the initial weights).
#
# **Proof (1): DDP with batch B on 2 ranks = 1 process with batch 2B.** Each rank's loss is the mean over its 8
# samples; DDP *averages* the two gradients, which is exactly the gradient of the mean over all 16 samples. The
# sampler's shuffle is a permutation seeded with `seed + epoch`; rank `r` takes positions `r, r+2, r+4, ...`, so
# the two ranks' `s`-th batches together are exactly positions `16s .. 16s+15` of that permutation. Each rank
# saved the noise it drew at every step, so a single process that walks the same permutation in batches of 16,
# with the same noise, must end with the same parameters (up to float rounding: the two gradients are added in
# another order).

# %%
from ddp_train import ToyModel, make_data  # noqa: E402 - the program's own model and data

x_all, y_all = make_data(64, seed=0)
torch.manual_seed(0)
single = ToyModel()  # rank 0's initial parameters (seed 0 + rank 0), which DDP broadcast
opt = torch.optim.SGD(single.parameters(), lr=0.05, momentum=0.9)
step = 0
for epoch in range(3):
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0 + epoch))  # DistributedSampler's shuffle
    assert ddp_res[0]["shards"][epoch] == perm[0::2].tolist() and ddp_res[1]["shards"][epoch] == perm[1::2].tolist()
    for s in range(4):
        rows = torch.stack([perm[2 * (8 * s + i) + r] for r in (0, 1) for i in range(8)])  # rank 0's 8, then rank 1's
        noise = torch.cat([ddp_res[r]["noise"][step] for r in (0, 1)])
        loss = F.mse_loss(single(x_all[rows] + noise), y_all[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
diffs = {k: (v - ddp_res[0]["params"][k]).abs().max().item() for k, v in single.state_dict().items()}
print(
    "DDP (2 x batch 8) vs one process (batch 16), largest parameter difference below 1e-6:", max(diffs.values()) < 1e-6
)
tol = 1e-6 if device.type == "cpu" else 1e-5  # the programs ran on GPUs: other kernels, other rounding
for k, v in single.state_dict().items():
    torch.testing.assert_close(ddp_res[0]["params"][k], v, rtol=0, atol=tol)
    assert torch.equal(ddp_res[0]["params"][k], ddp_res[1]["params"][k])  # the two ranks: bit for bit

# %% [markdown]
# **Proof (2): buffers are broadcast by the constructor, and before every forward.** What each rank's BatchNorm
# held right after `DDP(...)` (it was filled with the rank number before), as its second forward started, and
# after it:

# %%
for sync in (True, False):
    seen = ddp_res[0]["buffers"][sync]
    constructed = [[round(v, 2) for v in t.tolist()] for t in seen["after DDP()"]]
    entering = [[round(v, 2) for v in t.tolist()] for t in seen["entering step 2"]]
    after = [[round(v, 2) for v in t.tolist()] for t in seen["after step 2"]]
    print(
        f"forward_sync_buffers={sync}:\n  running_mean after DDP(),         rank 0 | rank 1: {constructed[0]} | {constructed[1]}"
        f"\n  running_mean entering forward 2, rank 0 | rank 1: {entering[0]} | {entering[1]}"
        f"\n  running_mean after forward 2,    rank 0 | rank 1: {after[0]} | {after[1]}"
    )
on, off = ddp_res[0]["buffers"][True], ddp_res[0]["buffers"][False]
for b in (on, off):  # the constructor copied rank 0's zeros over rank 1's ones, whatever forward_sync_buffers says
    assert all(torch.equal(t, torch.zeros(4)) for t in b["after DDP()"])
assert torch.equal(on["entering step 2"][0], on["entering step 2"][1])  # rank 1 got rank 0's buffer
assert not torch.allclose(off["entering step 2"][0], off["entering step 2"][1], atol=0.1)  # kept its own
assert not torch.allclose(on["after step 2"][0], on["after step 2"][1], atol=0.1)  # then updated with its own data
assert torch.equal(on["after step 2"][0], off["after step 2"][0])  # rank 0 never receives anything

# %% [markdown]
# The constructor copied rank 0's buffers to rank 1 in both cases: `forward_sync_buffers` is about the forwards
# only. With the default, every rank *starts* each forward with rank 0's running statistics; the forward then updates
# them with the rank's own batch, so between steps they differ again, and what rank 0 saves at the end is its
# own. With `forward_sync_buffers=False` every rank keeps its own running statistics all along. Either way the
# statistics come from *one rank's* data: the broadcast makes them identical, not global. (In a training-mode
# forward BatchNorm normalises with the batch's own statistics anyway; the running ones matter in `eval()`.)
# Synchronised BatchNorm, written in section 4, goes further: it computes each batch's mean and variance over
# **all** ranks' samples, so the normalisation and the running statistics are those of the global batch, the
# same on every rank without any broadcast.
#
# **Proof (3): gradient accumulation with `no_sync()`.** All-reduce calls counted by the hook, and the
# accumulated gradients compared with the gradient of one process on the whole batch of 16:

# %%
for way, r in ddp_res[0]["accumulate"].items():
    same = all(torch.allclose(g, f, atol=1e-6) for g, f in zip(r["grads"], ddp_res[0]["full batch"]))
    print(f"{way:31}: {r['allreduces']} all-reduce calls for 4 micro-batches; gradient == full batch: {same}")
print(
    "buckets per synchronised backward:",
    ddp_res[0]["buckets"],
    "| all-reduce calls in the 12 training steps:",
    ddp_res[0]["training allreduces"],
)
acc = ddp_res[0]["accumulate"]
assert [acc[w]["allreduces"] for w in acc] == [4, 1, 4] and ddp_res[0]["buckets"] == 1
assert ddp_res[0]["training allreduces"] == 12 * ddp_res[0]["buckets"]
for r in (0, 1):
    for way in acc:
        for g, f in zip(ddp_res[r]["accumulate"][way]["grads"], ddp_res[r]["full batch"]):
            torch.testing.assert_close(g, f)

# %% [markdown]
# The model is small (165 parameters), so its gradients fit in one bucket and each synchronised backward makes
# exactly one all-reduce; a large model makes one per bucket. All three ways give the full-batch gradient, but
# only `no_sync()` around forward *and* backward saves communication: 1 all-reduce instead of 4. Wrapped around
# the backward alone it changes nothing, because the forward had already told DDP to synchronise.
#
# Two more `DDP(...)` arguments in the same spirit: `find_unused_parameters=True` is needed when some
# parameters get no gradient in an iteration (a branch not taken): otherwise their bucket never becomes ready
# and DDP raises an error at the next iteration; it costs a traversal of the autograd graph after every
# forward. (The cheapest fix is often not to create layers that `forward` never uses: a layer built in
# `__init__` "for later" is exactly such a parameter.) `static_graph=True` promises that the set of used parameters never changes, which lets DDP skip that
# work after the first iteration (and allows activation checkpointing: recomputing a block's activations during backward instead of storing
# them, which notebook 11 teaches). The error, in this kernel with a process
# group of one process (a `HashStore` instead of a rendezvous; collectives still run), for a model whose second
# layer is never used:


# %%
class Branchy(nn.Module):
    """Two layers, of which forward uses only the first."""

    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(2, 2), nn.Linear(2, 2)

    def forward(self, x):
        return self.used(x)


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
errors = {}
for find_unused in (False, True):
    branchy = nn.parallel.DistributedDataParallel(Branchy(), find_unused_parameters=find_unused)
    try:
        for iteration in range(2):  # noqa: B007 - the error message below names the failing iteration
            branchy(torch.randn(3, 2)).sum().backward()
        errors[find_unused] = None
        print(
            f"find_unused_parameters={find_unused}: 2 iterations, unused layer's grad {branchy.module.unused.weight.grad}"
        )
    except RuntimeError as err:
        errors[find_unused] = (iteration, str(err))
        print(
            f"find_unused_parameters={find_unused}: iteration {iteration} -> {type(err).__name__}: "
            f"{str(err).split('. ')[0]}."
        )
dist.destroy_process_group()
assert errors[False][0] == 1 and "Expected to have finished reduction in the prior iteration" in errors[False][1]
assert errors[True] is None

# %% [markdown]
# **The buckets of the first and the second iteration.** The same kind of one-process group shows how DDP packs
# the gradients (section 1). The model has four `Linear(512, 512)` layers (262,656 numbers, about 1 MiB, each;
# in the `find_unused_parameters=True` run also a small layer that is never used, for the flag to find).
# A communication hook sees every bucket: `bucket.buffer()` is the flat tensor that is all-reduced and
# `bucket.parameters()` the parameters whose gradients it holds (both public parts of the `GradBucket` a hook
# receives). The cell records, for each backward, the buckets in the order they were all-reduced, each as its
# size and the names of its first and last parameters.


# %%
class Stack(nn.Module):
    """Four Linear(512, 512) layers; with spare=True also a small layer that forward never uses."""

    def __init__(self, spare: bool = False):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)])
        self.spare = nn.Linear(2, 2) if spare else None

    def forward(self, x):
        return self.layers(x)


def bucket_log(iterations: int = 2, spare: bool = False, **ddp_kwargs) -> list[list[tuple]]:
    """(size, first parameter, last parameter) of every bucket all-reduced, per backward, for a Stack under DDP."""
    torch.manual_seed(0)
    net = Stack(spare)
    names = {p: n.removeprefix("layers.") for n, p in net.named_parameters()}
    wrapped = nn.parallel.DistributedDataParallel(net, **ddp_kwargs)
    seen = []

    def hook(state, bucket):  # called once per bucket, when its gradients are ready
        names_in = [names[p] for p in bucket.parameters()]
        seen.append((bucket.buffer().numel(), names_in[0], names_in[-1]))
        return default_hooks.allreduce_hook(None, bucket)  # then do what DDP does by default

    wrapped.register_comm_hook(None, hook)
    log = []
    for _ in range(iterations):
        seen.clear()
        wrapped(torch.randn(2, 512)).sum().backward()
        log.append(list(seen))
    return log


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
logs = {
    "defaults": bucket_log(),
    "bucket_cap_mb=1": bucket_log(bucket_cap_mb=1),
    "find_unused_parameters=True, bucket_cap_mb=1": bucket_log(
        spare=True, find_unused_parameters=True, bucket_cap_mb=1
    ),
}
dist.destroy_process_group()
for name, log in logs.items():
    print(name)
    for it, buckets in enumerate(log, 1):
        print(f"  backward {it}: {len(buckets)} bucket(s):", ", ".join(f"{n} [{a} .. {b}]" for n, a, b in buckets))
every = 4 * 262_656
assert logs["defaults"][0] == [(every, "0.weight", "3.bias")]  # iteration 1: one bucket, everything
assert logs["defaults"][1] == [(262_656, "3.bias", "3.weight"), (3 * 262_656, "2.bias", "0.weight")]
assert logs["bucket_cap_mb=1"][0] == [(every, "0.weight", "3.bias")]
assert [n for n, _, _ in logs["bucket_cap_mb=1"][1]] == [262_656] * 4
assert len(logs["find_unused_parameters=True, bucket_cap_mb=1"][0]) > 1  # capped buckets from the start

# %% [markdown]
# With the defaults, the first backward all-reduces **one** bucket holding all 1,050,624 gradients, only after
# the whole backward has finished: no overlap. From the second backward on, the buckets follow the order in which
# the gradients arrived — the last layer first (`3.bias`, then `3.weight`) — with a small first bucket (cap 1 MiB, closed by the first layer to reach it:
# 262,656 floats = 1,050,624 bytes, a little over 1 MiB) and the rest in one bucket (cap 25 MiB, never reached);
# with `bucket_cap_mb=1`, one bucket per layer, each again just over 1 MiB. Only `find_unused_parameters=True` starts with capped buckets in the first iteration. A one-bucket first
# iteration is why the first step of a DDP job is slower, and one reason to leave a step or two out of timings.
# Those `find_unused_parameters=True` buckets were cut in `parameters()` order and are all-reduced last to first,
# so they straddle layers (`2.bias .. 3.weight`: one layer's bias with the next layer's weight); and DDP never
# rebuilds them, because with `find_unused_parameters=True` (and no `static_graph=True`) it does not trust the
# arrival order of one backward.

# %% [markdown]
# **Proof (4): `DistributedSampler`.** It needs no processes to study: give it `num_replicas` and `rank`
# yourself. Each rank gets a disjoint shard, together they cover the dataset, and when the dataset does not
# divide evenly the sampler **pads** by repeating indices so that every rank runs the same number of steps (a
# rank with fewer batches would leave the others waiting in `all_reduce`); `drop_last=True` drops the
# tail instead. The shuffle is seeded with `seed + epoch`: forget `set_epoch(epoch)` and every epoch repeats
# epoch 0's order.

# %%
data10 = list(range(10))
shards = [list(DistributedSampler(data10, num_replicas=2, rank=r, shuffle=True, seed=0)) for r in range(2)]
print("2 ranks, 10 samples:", shards)
assert set(shards[0]).isdisjoint(shards[1]) and sorted(shards[0] + shards[1]) == data10
padded = [list(DistributedSampler(data10, num_replicas=4, rank=r, shuffle=False)) for r in range(4)]
dropped = [list(DistributedSampler(data10, num_replicas=4, rank=r, shuffle=False, drop_last=True)) for r in range(4)]
print("4 ranks, 10 samples, padded:   ", padded)
print("4 ranks, 10 samples, drop_last:", dropped)
assert sum(map(len, padded)) == 12 and sum(map(len, dropped)) == 8

sampler = DistributedSampler(data10, num_replicas=2, rank=0, shuffle=True, seed=0)
no_set_epoch = [list(sampler) for epoch in range(3)]
with_set_epoch = []
for epoch in range(3):
    sampler.set_epoch(epoch)
    with_set_epoch.append(list(sampler))
print("rank 0 without set_epoch:", no_set_epoch)
print("rank 0 with set_epoch:   ", with_set_epoch)
assert no_set_epoch[0] == no_set_epoch[1] == no_set_epoch[2]
assert len({tuple(s) for s in with_set_epoch}) == 3
assert ddp_res[0]["shards"][0] != ddp_res[0]["shards"][1]  # the program did call set_epoch


# %% [markdown]
# **Proof (5): checkpoint on rank 0, `barrier`, load with `map_location` everywhere** is in the lines above
# ("equals my parameters True" on both ranks after every epoch). The file holds the *unwrapped* model's
# `state_dict` (no `module.` prefix), so it loads into a plain model as well, and one RNG state per rank. Each
# RNG state is what `utils.checkpoint_files.rng_state_dict()` (notebook 06) collects: the states of Python's
# `random`, NumPy's global generator and PyTorch's CPU generator, plus the CUDA (or MPS) generators on a GPU
# machine — every source of randomness a training step may draw from.

# %%
ckpt = torch.load(WORK / "ckpt.pt", map_location="cpu", weights_only=True)
print(
    "checkpoint keys:",
    sorted(ckpt),
    "| epoch",
    ckpt["epoch"],
    "| step",
    ckpt["step"],
    "| RNG states:",
    len(ckpt["rng"]),
    "(one per rank)",
)
print("model keys:", list(ckpt["model"]))
print("rank 0's RNG state holds:", sorted(ckpt["rng"][0]))
assert {"python", "numpy", "torch"} <= set(ckpt["rng"][0])
restored = ToyModel()
restored.load_state_dict(ckpt["model"])
assert all(torch.equal(v, ddp_res[1]["params"][k]) for k, v in restored.state_dict().items())
assert len(ckpt["rng"]) == 2 and not torch.equal(ckpt["rng"][0]["torch"], ckpt["rng"][1]["torch"])

# %% [markdown]
# **Mixed precision and SyncBN under DDP, checked.** The dtypes in the autocast step (output, loss, parameter,
# gradient), whether the synchronised gradient is the same on both ranks, how far it is from the float32
# full-batch gradient (bfloat16 keeps about 3 significant digits, notebook 07), and what `nn.SyncBatchNorm` did:

# %%
amp = ddp_res[0]["amp"]
print("autocast(bfloat16) dtypes: output, loss, parameter, gradient:", amp["dtypes"])
print("gradient equal on both ranks:", amp["equal on all ranks"] and ddp_res[1]["amp"]["equal on all ranks"])
print(
    f"largest difference to the float32 gradient, relative to its largest entry: below 5%: "
    f"{amp['max diff to float32'] < 0.05 * amp['grad scale']}"
)
print("nn.SyncBatchNorm under DDP here:", amp["syncbn"])
assert amp["dtypes"] == ["torch.bfloat16", "torch.float32", "torch.float32", "torch.float32"]
assert all(r["amp"]["equal on all ranks"] for r in ddp_res.values())
assert 0 < amp["max diff to float32"] < 0.05 * amp["grad scale"]
if device.type == "cpu":
    assert amp["syncbn"] == "ValueError: SyncBatchNorm layers only work with GPU modules"

# %% [markdown]
# Where each BatchNorm runs:
#
# | | CPU, gloo | GPU, NCCL (or gloo) |
# |---|---|---|
# | `nn.SyncBatchNorm` inside DDP | refused by DDP's constructor (above) | runs: global statistics |
# | `nn.SyncBatchNorm`, training mode, in a process group, no DDP | `ValueError` (section 4) | runs |
# | `nn.SyncBatchNorm` in `eval()` or without a process group | plain BatchNorm | plain BatchNorm |
# | the hand-written SyncBN of section 4 | runs | runs |

# %% [markdown]
# **One GPU per process: several `device_ids` are refused.** Older tutorials (PyTorch 1.x) give each process
# several GPUs, `DDP(model, device_ids=list(range(rank * n, (rank + 1) * n)))`, so that
# DDP would also replicate the model across them inside the process, as DataParallel does. That mode was
# deprecated and then removed (PyTorch 1.9); `torch/nn/parallel/distributed.py` now raises before looking at the
# devices:
#
# ```python
# if device_ids is not None and len(device_ids) > 1:
#     self._log_and_throw(ValueError, "device_ids can only be None or contain a single element.")
# ```
#
# Because the check comes first, it can be shown on the CPU, in this kernel, with a process group of one
# process (a `HashStore` instead of a rendezvous). The same group also shows the right way for a CPU model (no
# `device_ids` at all), and the warning that the old name of `forward_sync_buffers` now gives; its text
# also says that the new `False` still syncs buffers at init, which Proof (2) showed.

# %%
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    nn.parallel.DistributedDataParallel(nn.Linear(2, 2), device_ids=[0, 1])
    refused = "no error"
except ValueError as err:
    refused = f"{type(err).__name__}: {err}"
print(f"DDP(model, device_ids=[0, 1]) -> {refused}")
assert refused == "ValueError: device_ids can only be None or contain a single element."
cpu_ddp = nn.parallel.DistributedDataParallel(nn.Linear(2, 2))
print("DDP(cpu_model).device_ids:", cpu_ddp.device_ids, "| world size", dist.get_world_size())
assert cpu_ddp.device_ids is None
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    nn.parallel.DistributedDataParallel(nn.Linear(2, 2), broadcast_buffers=False)  # the pre-2.13 name
print(f"DDP(model, broadcast_buffers=False) -> {caught[0].category.__name__}: {str(caught[0].message).split('. ')[0]}")
assert len(caught) == 1 and caught[0].category is FutureWarning and "forward_sync_buffers" in str(caught[0].message)
assert "`forward_sync_buffers=False` still syncs buffers at init" in str(caught[0].message)  # not a plain rename
dist.destroy_process_group()
assert not dist.is_initialized()

# %% [markdown]
# ## 4. Synchronised BatchNorm, written by hand
#
# BatchNorm normalises with the mean and variance of the batch. Under DDP each process sees only its shard, so
# plain BatchNorm uses the statistics of B samples instead of the global batch — harmless for large per-GPU
# batches, harmful for small ones (detection and segmentation, often with 2 images per GPU).
# The cure is **synchronised BatchNorm** (同步批归一化, SyncBN), which computes the statistics of the whole global batch.
#
# The derivation: with $m$ samples in total,
# $\mu = \frac1m\sum_i x_i$ and $\sigma^2 = \frac1m\sum_i (x_i-\mu)^2 = \frac1m\sum_i x_i^2 - \mu^2$.
# So each rank needs only three numbers per channel that *add up* across ranks: $\sum x_i$, $\sum x_i^2$ and the
# count. Packed into one tensor they travel in **one** `all_reduce`, instead of one for the mean and a second
# one for the variance. The backward pass needs two more global sums per channel, $\sum \partial L/\partial y$
# and $\sum \partial L/\partial y \cdot \hat x$: one more `all_reduce` (PyTorch's CUDA implementation all-reduces
# the same two sums, the second as $\sum \partial L/\partial y \cdot (x-\mu)$, i.e. without the
# $1/\sqrt{\sigma^2+\epsilon}$ factor). With $\hat x = (x-\mu)/\sqrt{\sigma^2+\epsilon}$ and $y=\gamma\hat x+\beta$:
#
# $$\frac{\partial L}{\partial x_i} = \frac{\gamma}{m\sqrt{\sigma^2+\epsilon}}\Big(m\,\frac{\partial L}{\partial y_i}
#   - \sum_j \frac{\partial L}{\partial y_j} - \hat x_i \sum_j \frac{\partial L}{\partial y_j}\hat x_j\Big).$$
#
# (One caveat: $E[x^2]-E[x]^2$ loses precision when the mean is large compared with the spread; PyTorch's
# `nn.SyncBatchNorm` all-gathers each rank's mean, inverse standard deviation and count and combines them, which
# is more robust. Its code, in `torch/nn/modules/_functions.py`, names the steps: `torch.batch_norm_stats` (this
# rank's mean and invstd), an all-gather, `torch.batch_norm_gather_stats_with_counts` (the merge, which also
# updates the running statistics) and `torch.batch_norm_elemt` (normalise); backward,
# `torch.batch_norm_backward_reduce` (the two sums), one `all_reduce` of them, and
# `torch.batch_norm_backward_elemt` (the formula above). Like `nn.BatchNorm`, it accepts `momentum=None`, which
# replaces the exponential running average by a cumulative one: the running statistics become the plain mean
# over all batches seen so far.)
#
# The next cell writes it as a `torch.autograd.Function` (forward and backward by hand, each with its one
# `all_reduce`, counted) and a module `HandSyncBatchNorm` with BatchNorm's parameters and buffers.

# %%
# %%writefile runs/hand_syncbn.py
"""Notebook 08: synchronised BatchNorm written by hand: one all_reduce forward, one backward."""
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

COLLECTIVES = Counter()  # all_reduce calls and the numbers they carried, forward and backward


def all_reduce_counted(t, phase):
    COLLECTIVES[f"{phase} calls"] += 1
    COLLECTIVES[f"{phase} numbers"] += t.numel()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)  # in place: every rank ends with the sum
    return t


class SyncBatchNormFunction(torch.autograd.Function):
    """Batch normalisation with statistics summed over every rank of the default process group."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        c = x.shape[1]
        dims = [0, *range(2, x.dim())]  # every dimension except the channels
        count = torch.full((1,), x.numel() // c, dtype=x.dtype, device=x.device)
        stats = all_reduce_counted(torch.cat([x.sum(dims), (x * x).sum(dims), count]), "forward")  # ONE collective
        total, total_sq, n = stats[:c], stats[c : 2 * c], stats[2 * c]
        mean = total / n
        var = total_sq / n - mean * mean  # biased variance: BatchNorm normalises with it
        invstd = torch.rsqrt(var + eps)
        shape = [1, c] + [1] * (x.dim() - 2)
        x_hat = (x - mean.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(x_hat, weight, invstd)
        ctx.n, ctx.dims, ctx.shape = n, dims, shape
        ctx.mark_non_differentiable(mean, var, n)
        return x_hat * weight.view(shape) + bias.view(shape), mean, var, n

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar, _dn):
        x_hat, weight, invstd = ctx.saved_tensors
        dims, shape, n = ctx.dims, ctx.shape, ctx.n
        c = x_hat.shape[1]
        grad_bias = dy.sum(dims)  # this rank's share; DDP's all-reduce averages it with the other ranks'
        grad_weight = (dy * x_hat).sum(dims)
        sums = all_reduce_counted(torch.cat([grad_bias, grad_weight]), "backward")  # ONE collective
        sum_dy, sum_dy_xhat = sums[:c].view(shape), sums[c:].view(shape)
        grad_x = (weight * invstd).view(shape) / n * (n * dy - sum_dy - x_hat * sum_dy_xhat)
        return grad_x, grad_weight, grad_bias, None


class HandSyncBatchNorm(nn.Module):
    """BatchNorm for inputs (N, C, *) that synchronises statistics in training mode; same state_dict keys."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x):
        if not (self.training and dist.is_initialized()):  # eval mode, or no process group: plain BatchNorm
            return F.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, self.training, self.momentum, self.eps
            )
        y, mean, var, n = SyncBatchNormFunction.apply(x, self.weight, self.bias, self.eps)
        with torch.no_grad():  # running statistics of the global batch, unbiased variance like nn.BatchNorm
            self.running_mean.lerp_(mean, self.momentum)  # lerp_(v, m): old <- (1 - m) * old + m * v
            self.running_var.lerp_(var * n / (n - 1), self.momentum)
            self.num_batches_tracked += 1
        return y


def make_inputs(world_size, per_rank=2, channels=3, length=5, seed=0):
    """The global batch x (mean 3, std 2), an upstream gradient g, and BatchNorm's weight and bias."""
    gen = torch.Generator().manual_seed(seed)
    x = 3 + 2 * torch.randn(world_size * per_rank, channels, length, generator=gen)
    g = torch.randn(world_size * per_rank, channels, length, generator=gen)
    weight = 1 + 0.1 * torch.randn(channels, generator=gen)
    bias = 0.1 * torch.randn(channels, generator=gen)
    return x, g, weight, bias


# %% [markdown]
# ## 5. The ring all-reduce, and what it saves
#
# `all_reduce` is what DDP calls on the gradients. Here are two ways to implement it, for 4 machines
# holding `[1,2,3,4]`, `[5,6,7,8]`, `[9,10,11,12]`, `[13,14,15,16]`:
#
# * **naive**: machine 0 receives the other three vectors (12 numbers), adds, and sends the sum back to each
#   (12 numbers). Machine 0's traffic grows with the number of machines: it is the bottleneck.
# * **ring all-reduce** (环形全归约): cut each vector into 4 chunks. In 3 *reduce-scatter* steps every machine sends one
#   chunk to its right neighbour and adds the chunk arriving from its left; then each machine holds one complete
#   sum. (A reduce-scatter is a collective of its own, `torch.distributed.reduce_scatter`: reduce, then leave
#   each rank one piece of the result. `Tensor.scatter_reduce` is an unrelated indexing operation.) In 3 *all-gather* steps the complete chunks travel round the ring. Every machine sends 2·(N−1)·L/N
#   numbers and receives as many: for large N about 2L each way, whatever N is.
#
# The next cell writes both. Each step of the ring, for rank `r` of `n`: in reduce-scatter step `t` it sends
# chunk `(r − t) mod n` and receives chunk `(r − t − 1) mod n`, which it *adds*; in all-gather step `t` it sends
# chunk `(r + 1 − t) mod n` and receives chunk `(r − t) mod n`, which it *copies*. `exchange` is "send to the
# right, receive from the left" at the same time; in the real program it is a non-blocking `isend` plus a `recv`
# (two blocking sends would wait for each other for ever), and `simulate_ring` runs the same steps for n
# "machines" inside one process.

# %%
# %%writefile runs/ring_allreduce.py
"""Notebook 08: all-reduce by hand, the naive way and the ring, with every message counted."""
from dataclasses import dataclass

import torch


@dataclass
class CommCount:
    """Messages and numbers (tensor elements) one rank sent and received."""

    sent_messages: int = 0
    recv_messages: int = 0
    sent_numbers: int = 0
    recv_numbers: int = 0


def chunk_slices(length, n):
    """Split range(length) into n contiguous chunks whose sizes differ by at most one."""
    base, extra = divmod(length, n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append(slice(start, stop))
        start = stop
    return bounds


def ring_schedule(rank, n):
    """(phase, chunk sent to rank+1, chunk received from rank-1) for each of the 2(n-1) steps."""
    steps = [("reduce-scatter", (rank - t) % n, (rank - t - 1) % n) for t in range(n - 1)]
    steps += [("all-gather", (rank + 1 - t) % n, (rank - t) % n) for t in range(n - 1)]
    return steps


def ring_all_reduce(t, rank, n, exchange, trace=None):
    """Sum t over all ranks, in place. exchange(send_buf, recv_buf) sends right while receiving from the left."""
    chunks = chunk_slices(t.numel(), n)
    for phase, send_i, recv_i in ring_schedule(rank, n):
        incoming = torch.empty_like(t[chunks[recv_i]])
        exchange(t[chunks[send_i]].clone(), incoming)
        if phase == "reduce-scatter":
            t[chunks[recv_i]] += incoming
        else:
            t[chunks[recv_i]] = incoming
        if trace is not None:
            trace.append(t.tolist())
    return t


def naive_all_reduce(t, rank, n, send, recv):
    """Sum t over all ranks, in place: everybody sends to rank 0, which adds and sends the sum back."""
    if rank == 0:
        incoming = torch.empty_like(t)
        for src in range(1, n):
            recv(incoming, src)
            t += incoming
        for dst in range(1, n):
            send(t, dst)
    else:
        send(t, 0)
        recv(t, 0)
    return t


def simulate_ring(vectors):
    """ring_all_reduce for len(vectors) ranks in one process: each step, everybody sends, then receives."""
    n = len(vectors)
    data = [torch.tensor(v, dtype=torch.float64) for v in vectors]
    counts = [CommCount() for _ in range(n)]
    chunks = chunk_slices(data[0].numel(), n)
    schedules = [ring_schedule(r, n) for r in range(n)]
    for step in range(2 * (n - 1)):
        outgoing = [data[r][chunks[schedules[r][step][1]]].clone() for r in range(n)]
        for r in range(n):
            phase, _, recv_i = schedules[r][step]
            incoming = outgoing[(r - 1) % n]  # from the left neighbour
            counts[r].sent_messages += 1
            counts[r].sent_numbers += outgoing[r].numel()
            counts[r].recv_messages += 1
            counts[r].recv_numbers += incoming.numel()
            if phase == "reduce-scatter":
                data[r][chunks[recv_i]] += incoming
            else:
                data[r][chunks[recv_i]] = incoming
    return [d.tolist() for d in data], counts


# %% [markdown]
# **One program for both, on 4 processes.** The worker program below runs the hand-written SyncBN on a global
# batch of 8 (shape `(8, 3, 5)`, mean 3, std 2; 2 samples per rank) and checks it against BatchNorm over the
# whole batch, which every rank can compute because the batch comes from a shared seed; then the naive and the
# ring all-reduce on the four vectors above, with real `send`/`recv`/`isend` between the processes, counted,
# and checked against `dist.all_reduce`. It runs with **4** processes, one per "machine" of the example.

# %%
# %%writefile runs/by_hand.py
"""Notebook 08: hand-written SyncBN and all-reduce, run by torchrun on 4 processes."""
import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from hand_syncbn import COLLECTIVES, HandSyncBatchNorm, make_inputs  # written next to this file
from ring_allreduce import CommCount, naive_all_reduce, ring_all_reduce

from utils.ddp.common import report, save_result

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
dist.init_process_group("gloo")  # point-to-point send/recv of CPU tensors: gloo (NCCL would need GPUs)
rank, n = dist.get_rank(), dist.get_world_size()
try:
    # --- SyncBN: my 2 samples of the global batch ---
    x, g, weight, bias = make_inputs(n)
    mine = slice(rank * 2, rank * 2 + 2)
    bn = HandSyncBatchNorm(3)
    with torch.no_grad():
        bn.weight.copy_(weight)
        bn.bias.copy_(bias)
    x_mine = x[mine].clone().requires_grad_()
    y = bn(x_mine)
    (y * g[mine]).sum().backward()  # this rank's part of the global loss
    y_full = F.batch_norm(x, None, None, weight, bias, training=True)  # the reference: the whole batch
    report(
        f"hand SyncBN on my 2 samples == BatchNorm over all {len(x)}: {torch.allclose(y, y_full[mine], atol=1e-5)}"
        f"; plain BatchNorm on my 2 == it: {torch.allclose(F.batch_norm(x[mine], None, None, weight, bias, training=True), y_full[mine], atol=1e-5)}"
    )
    syncbn = {
        "y": y.detach(),
        "grad_x": x_mine.grad,
        "grad_w": bn.weight.grad,
        "grad_b": bn.bias.grad,
        "running_mean": bn.running_mean,
        "running_var": bn.running_var,
        "collectives": dict(COLLECTIVES),
    }

    # --- all-reduce by hand: the vectors [1,2,3,4], [5,6,7,8], ... ---
    naive_count, ring_count = CommCount(), CommCount()

    def send(buf, dst):
        naive_count.sent_messages += 1
        naive_count.sent_numbers += buf.numel()
        dist.send(buf.contiguous(), dst)

    def recv(buf, src):
        naive_count.recv_messages += 1
        naive_count.recv_numbers += buf.numel()
        dist.recv(buf, src)

    def exchange(send_buf, recv_buf, count=ring_count):
        request = dist.isend(send_buf, (rank + 1) % n)  # non-blocking: the send does not wait for the receiver
        dist.recv(recv_buf, (rank - 1) % n)
        request.wait()
        count.sent_messages += 1
        count.sent_numbers += send_buf.numel()
        count.recv_messages += 1
        count.recv_numbers += recv_buf.numel()

    data = torch.arange(4 * rank + 1, 4 * rank + 5, dtype=torch.float32)
    expected = data.clone()
    dist.all_reduce(expected)
    naive = naive_all_reduce(data.clone(), rank, n, send, recv)
    trace = []
    ring = ring_all_reduce(data.clone(), rank, n, exchange, trace)
    report(
        f"data {data.int().tolist()} -> naive {naive.int().tolist()}, ring {ring.int().tolist()}; "
        f"both == dist.all_reduce: {torch.equal(naive, expected) and torch.equal(ring, expected)}"
    )
    vec = torch.randn(10, generator=torch.Generator().manual_seed(rank))  # 10 numbers: chunks of 3, 3, 2, 2
    ref = vec.clone()
    dist.all_reduce(ref)
    ring_vec = ring_all_reduce(vec.clone(), rank, n, lambda s, r: exchange(s, r, CommCount()))
    save_result(
        args.out,
        {
            "syncbn": syncbn,
            "naive": naive,
            "ring": ring,
            "expected": expected,
            "trace": trace,
            "naive_count": vars(naive_count),
            "ring_count": vars(ring_count),
            "ring_vec": ring_vec,
            "ref_vec": ref,
        },
    )
finally:
    dist.destroy_process_group()

# %%
hand = run_torchrun(RUNS / "by_hand.py", nproc=4, args=["--out", WORK / "by_hand"])
launch_seconds["by_hand (4 workers)"] = hand.wall_s
print("$", shell(hand)[0])
hand.print_ranks()
hres = load_rank_results(WORK / "by_hand")

# %% [markdown]
# **Proof (6): the hand-written SyncBN**, checked here from the tensors the ranks saved: concatenated in rank
# order, their outputs equal BatchNorm over the whole batch; so do the input gradients; the *sum* of the ranks'
# weight and bias gradients (what DDP's all-reduce adds up, before dividing by the world size) equals the
# full-batch gradient; and the running statistics are those of the global batch, identical on every rank.

# %%
from hand_syncbn import make_inputs  # noqa: E402

x, g, weight, bias = make_inputs(world_size=4)
x_ref = x.clone().requires_grad_()
w_ref, b_ref = weight.clone().requires_grad_(), bias.clone().requires_grad_()
ref_bn = nn.BatchNorm1d(3)
y_ref = F.batch_norm(x_ref, ref_bn.running_mean, ref_bn.running_var, w_ref, b_ref, training=True)
(y_ref * g).sum().backward()
sb = [hres[r]["syncbn"] for r in range(4)]
checks = {
    "forward": torch.allclose(torch.cat([s["y"] for s in sb]), y_ref, atol=1e-5),
    "grad x": torch.allclose(torch.cat([s["grad_x"] for s in sb]), x_ref.grad, atol=1e-5),
    "grad weight (sum over ranks)": torch.allclose(sum(s["grad_w"] for s in sb), w_ref.grad, atol=1e-4),
    "grad bias (sum over ranks)": torch.allclose(sum(s["grad_b"] for s in sb), b_ref.grad, atol=1e-4),
    "running mean/var, every rank": all(
        torch.allclose(s["running_mean"], ref_bn.running_mean, atol=1e-5)
        and torch.allclose(s["running_var"], ref_bn.running_var, atol=1e-5)
        for s in sb
    ),
}
for name, ok in checks.items():
    print(f"hand SyncBN vs global BatchNorm, {name}: {ok}")
print("all_reduce calls per rank:", sb[0]["collectives"])
assert all(checks.values())
assert all(
    s["collectives"] == {"forward calls": 1, "forward numbers": 7, "backward calls": 1, "backward numbers": 6}
    for s in sb
)

# %% [markdown]
# **PyTorch's own.** `nn.SyncBatchNorm.convert_sync_batchnorm(model)` replaces every `BatchNorm*d` by
# `nn.SyncBatchNorm` (copying weights and running statistics); do it *before* wrapping the model in DDP. Its
# synchronised forward runs only on GPUs (and XPU/HPU): in training mode inside a process group, a CPU tensor
# raises `ValueError` (shown with a group of one process). Outside a process group, or in `eval()` mode, it is
# ordinary BatchNorm, so the conversion itself can be shown here. (In PyTorch 1.x it also ran only inside DDP,
# with one GPU per process; that check is gone, and any process group will do. Inside DDP on the CPU it is
# DDP's constructor that refuses, as section 3 showed.)

# %%
net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Linear(4, 4), nn.BatchNorm1d(8))
converted = nn.SyncBatchNorm.convert_sync_batchnorm(net)
print([type(m).__name__ for m in converted])
assert sum(isinstance(m, nn.SyncBatchNorm) for m in converted) == 2
x_img = torch.randn(2, 3, 6, 6)
print("no process group: output shape", tuple(converted(x_img).shape), "(plain BatchNorm)")
if device.type == "cpu":
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        converted(x_img)
        on_cpu = "no error"
    except ValueError as err:
        on_cpu = f"{type(err).__name__}: {err}"
    finally:
        dist.destroy_process_group()
    print(f"in a process group, training mode, on the CPU: {on_cpu}")
    assert on_cpu.startswith("ValueError:") and "expected input tensor to be on GPU" in on_cpu

# %% [markdown]
# **Proof (7): the ring.** The buffers after each step, next to the table of the reduce-scatter phase as it is
# usually drawn for this example (its machine 1 is rank 0): after step 3 each rank holds one finished chunk (rank 0: 32, rank 1: 36,
# rank 2: 40, rank 3: 28), and the all-gather steps spread them.

# %%
TEXTBOOK_REDUCE_SCATTER = [  # the three reduce-scatter steps as usually tabulated, machines 1..4
    [[1, 2, 3, 20], [6, 6, 7, 8], [9, 16, 11, 12], [13, 14, 26, 16]],
    [[1, 2, 29, 20], [6, 6, 7, 28], [15, 16, 11, 12], [13, 30, 26, 16]],
    [[1, 32, 29, 20], [6, 6, 36, 28], [15, 16, 11, 40], [28, 30, 26, 16]],
]
for step in range(6):
    phase = "reduce-scatter" if step < 3 else "all-gather    "
    row = [[int(v) for v in hres[r]["trace"][step]] for r in range(4)]
    print(f"step {step + 1} {phase}: " + "  ".join(f"r{r}={row[r]}" for r in range(4)))
    if step < 3:
        assert row == TEXTBOOK_REDUCE_SCATTER[step]
assert all(r["ring"].tolist() == [28, 32, 36, 40] and torch.equal(r["naive"], r["expected"]) for r in hres.values())
assert all(torch.allclose(r["ring_vec"], r["ref_vec"], atol=1e-6) for r in hres.values())  # uneven chunks too

# %% [markdown]
# **The communication counts, measured** (each rank counted what it really sent and received):

# %%
print("rank | naive: messages sent/recv, numbers sent/recv | ring: messages sent/recv, numbers sent/recv")
for r, res_r in hres.items():
    n_, g_ = res_r["naive_count"], res_r["ring_count"]
    print(
        f"  {r}  |        {n_['sent_messages']}/{n_['recv_messages']}            {n_['sent_numbers']:2}/{n_['recv_numbers']:2}"
        f"        |        {g_['sent_messages']}/{g_['recv_messages']}            {g_['sent_numbers']}/{g_['recv_numbers']}"
    )
busiest_naive = max(r["naive_count"]["sent_numbers"] + r["naive_count"]["recv_numbers"] for r in hres.values())
busiest_ring = max(r["ring_count"]["sent_numbers"] + r["ring_count"]["recv_numbers"] for r in hres.values())
print(f"busiest machine moves: naive {busiest_naive} numbers, ring {busiest_ring} numbers")
assert [hres[r]["naive_count"]["recv_numbers"] for r in range(4)] == [12, 4, 4, 4]
assert all(r["ring_count"]["sent_numbers"] == r["ring_count"]["recv_numbers"] == 6 for r in hres.values())
assert (busiest_naive, busiest_ring) == (24, 12)
assert all(r["ring_count"]["sent_messages"] == r["ring_count"]["recv_messages"] == 2 * (4 - 1) for r in hres.values())
assert sum(r["naive_count"]["sent_messages"] for r in hres.values()) == 2 * (4 - 1)  # 3 in, 3 out of machine 0

# %% [markdown]
# Naive, machine 0 receives 12 and sends 12 (24 numbers through one machine) while
# the others move 4 + 4; ring, every machine receives 6 and sends 6 (12). The arithmetic is spread the same way:
# naive, machine 0 does all 12 additions while the others wait; ring, every machine does 3 additions (its
# reduce-scatter steps) and 3 copies (its all-gather steps), at the same time. The ring pays in *messages*: every
# machine sends 2·(N−1) = 6 of them, 24 in all against the naive 6, in 2·(N−1) steps that run one after another,
# so the fixed cost of a message (its latency) is paid 2·(N−1) times. For small tensors that latency dominates —
# one reason NCCL also has tree algorithms (about 2·log₂N steps) and DDP packs gradients into buckets of about
# 25 MiB.
#
# How it scales: the same algorithm simulated in one process (`simulate_ring`, the same schedule as the workers,
# minus the processes) for N = 2 … 8 machines and a vector of L = 840 numbers. Counting sent + received numbers, the
# naive machine 0 moves 2·(N−1)·L, growing with every machine added; a ring machine moves 4·(N−1)·L/N, which
# approaches 4L and hardly grows.

# %%
from ring_allreduce import simulate_ring  # noqa: E402 - the module written above

L = 840
ns = list(range(2, 9))
ring_traffic, naive_traffic = [], []
for n in ns:
    vectors = [[float(r * L + i) for i in range(L)] for r in range(n)]
    result, counts = simulate_ring(vectors)
    assert all(v == [float(sum(r * L + i for r in range(n))) for i in range(L)] for v in result)
    ring_traffic.append(max(c.sent_numbers + c.recv_numbers for c in counts))
    naive_traffic.append(2 * (n - 1) * L)
print("machines:              ", ns)
print("ring, per machine:     ", ring_traffic)
print("naive, machine 0:      ", naive_traffic)
assert ring_traffic == [4 * (n - 1) * L // n for n in ns]  # 2(N-1)L/N each way
plt.figure(figsize=(5, 3))
plt.plot(ns, naive_traffic, "o-", label="naive: machine 0")
plt.plot(ns, ring_traffic, "s-", label="ring: every machine")
plt.xlabel("machines N")
plt.ylabel(f"numbers sent + received (L={L})")
plt.legend()
plt.tight_layout()
plt.show()


# %% [markdown]
# ## 6. Fault tolerance: a worker crashes, torchrun restarts the job, training resumes
#
# DDP itself cannot survive a failed process: the others would wait in their next `all_reduce` (until the
# process-group timeout of section 2, or until gloo notices the closed connection). TorchElastic, inside
# `torchrun`, handles it from the outside: with `--max_restarts=1`, when a worker dies the agent stops the
# others and starts the whole group again (the environment variable `TORCHELASTIC_RESTART_COUNT` tells the new
# workers which attempt this is). The program must do the rest: **resume from the last checkpoint**.
#
# The same program as in section 3, but on the first attempt the last rank exits abruptly (`os._exit(1)`, like
# a killed process) just before global step 6 — in the middle of epoch 1. The agent sees a worker exit with an
# error and stops the survivors (rank 0 may have failed on its own first, its next `all_reduce` reporting
# "Connection closed by peer"; which comes first is a race); then it starts both again, they load the
# checkpoint of epoch 0 (step 4), and train epochs 1 and 2 again. Three things make the result **bit for bit** that of the
# run without a crash: the data order depends only on `(seed, epoch)` (`set_epoch`); the checkpoint holds the
# optimizer's momentum; and it holds **each rank's own RNG state**, which each rank restores
# (`load_rng_state_dict(state["rng"][rank])`). Without that, a restarted rank would re-seed and start its random stream
# from the beginning again; with one state saved for everybody (rank 0's), both ranks would draw the *same* noise.
#
# One practical detail, found the hard way while writing this notebook: by default the restarted workers reuse
# the agent's rendezvous store, and a restarted worker sometimes reads the address its peer had in the *failed*
# attempt, then gives up with "Gloo connectFullMesh failed ... Connection refused" (about half of the restarts
# here; PyTorch issue #135712, reported for NCCL). `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` gives every attempt a
# fresh store. This notebook's launcher (`utils.launch`) sets it whenever `--max_restarts` is used, as the printed
# command shows; plain `torchrun` does not, so set it yourself (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun
# --max_restarts=...`).

# %%
crash = run_torchrun(
    RUNS / "ddp_train.py",
    nproc=2,
    max_restarts=1,
    timeout=300,
    args=["--ckpt", WORK / "ckpt_crash.pt", "--out", WORK / "crash", "--crash-at-step", "6"],
)
launch_seconds["ddp_train, crash + restart"] = crash.wall_s
print("$", shell(crash)[0])
crash.print_ranks()
cres = load_rank_results(WORK / "crash")
same = all(torch.equal(cres[r]["params"][k], ddp_res[r]["params"][k]) for r in (0, 1) for k in ddp_res[r]["params"])
print(
    "exit status",
    crash.returncode,
    "| attempt that finished",
    cres[0]["attempt"],
    "| final parameters identical to the run without a crash:",
    same,
)
assert crash.returncode == 0 and cres[0]["attempt"] == cres[1]["attempt"] == 1 and same
assert ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1") in crash.env
assert "Connection closed by peer" in crash.stderr or "exitcode: 1" in crash.stderr  # the failure was real

# %% [markdown]
# **Every rank's random stream continued.** The restarted attempt drew its noise from step 4 on; on each rank
# it is exactly the noise of the uninterrupted run at the same steps (not a repeat of step 0's), and the two
# ranks' streams differ:

# %%
resumed_steps = sorted(cres[0]["noise"])
print("steps trained by the restarted attempt:", resumed_steps)
for r in (0, 1):
    continued = all(torch.equal(cres[r]["noise"][s], ddp_res[r]["noise"][s]) for s in resumed_steps)
    print(f"rank {r}: noise at steps 4-11 == the uninterrupted run's: {continued}")
    assert continued and not torch.equal(cres[r]["noise"][4], ddp_res[r]["noise"][0])
assert resumed_steps == list(range(4, 12)) and not torch.equal(cres[0]["noise"][4], cres[1]["noise"][4])


# %% [markdown]
# ## 7. Bigger global batch, bigger learning rate: linear scaling with warm-up
#
# With N processes and batch B each, one step sees N·B samples, and an epoch has N times fewer steps. The
# **linear scaling rule** (线性缩放规则; Goyal et al., *Training ImageNet in 1 Hour*): multiply the learning rate by the same factor,
# lr = base_lr × (global batch / base batch). A large learning rate at the very start, when the weights are
# random, can make training diverge, so it is reached by a linear **warm-up** (预热) over the first epochs. In
# practice the full factor is not always best; half of it sometimes works as well. (For
# Adam-type optimizers a square-root rule is often used instead.)
#
# Below: base lr 0.1 for a global batch of 256, 5 warm-up epochs, then a step decay at epochs 30 and 60, for 1,
# 2 and 8 GPUs with 256 samples each. Built with the modern schedulers: `LinearLR` for the warm-up followed by
# `MultiStepLR`, chained by `SequentialLR` (read the rate with `get_last_lr()`; older code calls `get_lr()`, which
# is meant for the scheduler's own use and warns when called from outside). Notebook 10 teaches schedulers fully.


# %%
def lr_schedule(
    n_gpus: int,
    per_gpu_batch: int = 256,
    base_lr: float = 0.1,
    base_batch: int = 256,
    warmup_epochs: int = 5,
    epochs: int = 90,
) -> list[float]:
    """Learning rate of every epoch: linear scaling of base_lr, linear warm-up, step decay x0.1 at 30 and 60."""
    peak = base_lr * n_gpus * per_gpu_batch / base_batch
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / n_gpus, total_iters=warmup_epochs)
    decay = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[30 - warmup_epochs, 60 - warmup_epochs], gamma=0.1)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, decay], milestones=[warmup_epochs])
    lrs = []
    for _ in range(epochs):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return lrs


plt.figure(figsize=(6, 3))
for n_gpus in (1, 2, 8):
    lrs = lr_schedule(n_gpus)
    plt.plot(lrs, label=f"{n_gpus} GPU(s), global batch {256 * n_gpus}")
    print(
        f"{n_gpus} GPU(s): epochs 0-6 lr {[round(v, 3) for v in lrs[:7]]}, epoch 30 {lrs[30]:.3f}, epoch 60 {lrs[60]:.4f}"
    )
    assert math.isclose(lrs[0], 0.1) and math.isclose(lrs[5], 0.1 * n_gpus) and math.isclose(lrs[30], 0.01 * n_gpus)
plt.xlabel("epoch")
plt.ylabel("learning rate")
plt.legend()
plt.tight_layout()
plt.show()


# %% [markdown]
# ## 8. CUDA streams: ordering work on one GPU
#
# DDP overlaps the gradient all-reduce with the backward pass by running NCCL on its own CUDA **stream** (流):
# a queue of GPU work that runs in order, while work in *different* streams may run at the same time. Every GPU
# has a default stream, and everything in this course so far ran on it, in order. With a side stream you get
# the concurrency and the duty to order things yourself. A classic example computes a wrong
# result: the default stream fills a tensor `A`, and `A.sum()` on a side stream may read it before the fill
# has run, because the host only *queues* GPU work and the side stream does not wait for the default one.
#
# The tools: `s2.wait_stream(s1)` (work queued on `s2` from now on waits for everything queued on `s1` so far),
# an event (`e = torch.cuda.Event(); e.record()` marks a point in the current stream; `s2.wait_event(e)` waits
# for it), and `t.record_stream(s2)` (tell the caching allocator that `t`, allocated by another stream, is in use
# on `s2`, so its memory is not handed out again before `s2`'s work is done). `torch.cuda._sleep` keeps the
# default stream busy, so that the missing wait matters: it is a **private** helper (the leading underscore)
# that PyTorch's own tests use, for looking inside only, and it may move in a later version; the cell checks
# that it exists and says so clearly if not.
#
# The cell runs on a CUDA device; on this CPU-only machine it says why it skipped. It asserts only the
# correctly ordered results: the unordered one *may* be wrong (it usually is, with the sleep), but a race is not
# something to assert.

# %%
if device.type == "cuda":
    if not hasattr(torch.cuda, "_sleep"):
        raise RuntimeError(f"torch.cuda._sleep, a private helper, is missing in PyTorch {torch.__version__}")
    n = 1 << 22  # 2**22 twos: the sum, 2**23, is exact in float32
    side = torch.cuda.Stream()
    main_stream = torch.cuda.current_stream()

    A = torch.zeros(n, device=device)
    main_stream.synchronize()
    torch.cuda._sleep(50_000_000)  # the default stream is busy for a while ...
    A.fill_(2.0)  # ... before it writes A
    with torch.cuda.stream(side):
        racy = A.sum()  # queued on the side stream: nothing makes it wait for the fill
    main_stream.wait_stream(side)
    print("no ordering: sum =", racy.item(), "(may be 0, the value before the fill)")

    A = torch.zeros(n, device=device)
    torch.cuda._sleep(50_000_000)
    A.fill_(2.0)
    side.wait_stream(main_stream)  # fix 1: the side stream waits for what the default stream has queued
    with torch.cuda.stream(side):
        B = A.sum()
    A.record_stream(side)  # A is used on side: keep its memory until side's work is done
    main_stream.wait_stream(side)  # and the default stream waits before it uses B
    print("wait_stream: sum =", B.item())
    assert B.item() == 2.0 * n

    A = torch.zeros(n, device=device)
    torch.cuda._sleep(50_000_000)
    A.fill_(2.0)
    filled = torch.cuda.Event()
    filled.record()  # fix 2: mark the point right after the fill ...
    side.wait_event(filled)  # ... and make the side stream wait for that point only
    with torch.cuda.stream(side):
        C = A.sum()
    A.record_stream(side)
    done = torch.cuda.Event()
    done.record(side)
    done.synchronize()  # the host waits until C is computed
    print("event: sum =", C.item())
    assert C.item() == 2.0 * n
else:
    print(
        f"device {device.type}: no CUDA device here (torch.cuda.is_available() = {torch.cuda.is_available()}); "
        "the stream example runs only on a GPU"
    )
    assert device.type != "cuda"

# %% [markdown]
# ## 9. Nothing left behind
#
# Every program destroyed its process group (`destroy_process_group()` in a `finally:` block, or through
# `utils.ddp.common.distributed()`; hello printed "process group destroyed: True"), and every process of every
# launch has exited: the launcher marks its processes with an id in their environment, and
# `leftover_processes()` looks for any that are still alive. The rendezvous port of the two-node job was
# released (checked in section 2).

# %%
print("processes still alive from this notebook's launches:", leftover_processes())
assert leftover_processes() == [] and not dist.is_initialized()
work.cleanup()

# %% [markdown]
# How long each launch took here (wall clock; it depends on the machine and on what else runs on it — each
# process spends about 2 s of CPU importing PyTorch):

# %%
# NBVAL_IGNORE_OUTPUT
for name, seconds in launch_seconds.items():
    print(f"{name:32} {seconds:5.1f} s")
assert len(launch_seconds) == 5 and all(0 < s < 120 for s in launch_seconds.values())

# %% [markdown]
# ## Exercises (练习)
#
# Four exercises: predict, write a function, a stretch that combines this notebook with notebook 07, then a DDP
# program of your own, launched on 2 processes. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it
# and run it. The **check cell** below it then says *correct*, or *not yet* with a hint and the section to re-read,
# or *not attempted yet* while the stub is untouched. The first three start no process: the distributed ideas are
# checked as plain functions, in a second or two. The check of exercise 4 runs your program with `torchrun` on 2
# CPU processes, as section 3 runs `ddp_train.py` (5 to 15 s, most of it two processes importing PyTorch). This
# section does not depend on the lesson's cells: after a kernel restart, run its first cell and go on.
# `make progress` (without make, e.g. on Windows: `python tools/course.py progress`) lists which exercises of every
# notebook pass.

# %%
import torch

from utils.exercises import Checker

ex = Checker("08")

# %% [markdown]
# ### Exercise 1 · Ranks, all-reduces and the learning rate of a 2-machine job
#
# A job trains on **2 machines with 4 GPUs each**, one process per GPU: each machine runs
# `torchrun --nnodes=2 --nproc_per_node=4 --node_rank=K --master_addr=... train.py` with its own `K`. Look at the
# process on the second machine (`--node_rank=1`) whose `LOCAL_RANK` is 2. Predict, on paper:
#
# 1. its `RANK`, `WORLD_SIZE` and `LOCAL_WORLD_SIZE` (section 2: processes, not machines);
# 2. every process runs micro-batches of 32 samples and accumulates gradients over **4 micro-batches** per
#    optimizer step; from the second optimizer step on, DDP packs the model's gradients into **3 buckets**. How
#    many all-reduce calls does one rank make per optimizer step (a) with `no_sync()` around the forward *and*
#    backward of micro-batches 1–3, (b) with `no_sync()` around their backward only? (Section 3, Proof (3).)
# 3. the learning rate was tuned as 0.1 for a batch of 256 on one GPU: what peak learning rate does the linear
#    scaling rule give this job? (Section 7; here the global batch is every sample one optimizer step averages
#    over, the accumulated micro-batches included.)

# %%
# ✏️ Exercise 1: replace each ... with a number
RANK = ...
WORLD_SIZE = ...
LOCAL_WORLD_SIZE = ...
allreduces_no_sync = ...  # (a) no_sync() around forward and backward of micro-batches 1-3
allreduces_no_sync_backward = ...  # (b) no_sync() around their backward only
peak_lr = ...

# %%
ex.check(1, RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, allreduces_no_sync, allreduces_no_sync_backward, peak_lr)

# %% [markdown]
# ### Exercise 2 · `DistributedSampler`, written by hand
#
# Write `shard_indices(n, rank, world_size, shuffle, seed, epoch, drop_last)`: the list of indices that
# `DistributedSampler` yields on rank `rank` for a dataset of length `n`, after `set_epoch(epoch)` — without
# using `DistributedSampler`. Everything it does was shown in section 3: the order (`range(n)`, or with
# `shuffle=True` the permutation of Proof (1)), made the same length on every rank (Proof (4): padded by
# repeating indices from the start of the order, or cut with `drop_last=True`), then split between the ranks
# (Proof (1)). The check compares your function with the real sampler on a few hundred cases, including a
# dataset smaller than the number of ranks.


# %%
# ✏️ Exercise 2: write the body of the function
def shard_indices(
    n: int, rank: int, world_size: int, shuffle: bool = False, seed: int = 0, epoch: int = 0, drop_last: bool = False
) -> list[int]:
    raise NotImplementedError("your code here")


# %%
ex.check(2, shard_indices)

# %% [markdown]
# ### Exercise 3 · Merge the ranks' BatchNorm statistics like `nn.SyncBatchNorm` (stretch)
#
# **为何在多卡训练的情况下需要对BN进行同步？** — why synchronise BatchNorm across GPUs? Because each
# GPU normalises with the statistics of its own few samples, which can be far from the global batch's (section
# 4). Section 4's hand-written SyncBN all-reduced Σx, Σx² and the count and used σ² = E[x²] − E[x]². PyTorch's
# `nn.SyncBatchNorm` instead all-gathers each rank's **mean, inverse standard deviation (so, its variance) and
# count** and merges them. Write that merge: `merge_bn_stats(means, variances, counts)` gets `means` and
# `variances` of shape `(ranks, channels)` (rank r's per-channel mean and *biased* variance over its own
# `counts[r]` samples, as `torch.var_mean(x, dim=0, correction=0)` gives them) and returns `(mean, var)`, each of
# shape `(channels,)`: the mean and biased variance of all ranks' samples together, in the inputs' dtype. The
# ranks' batches may have different sizes.
#
# The stretch: the check also feeds activations around **10,000** with a spread of 1, in float32. Section 4's
# E[x²] − E[x]² fails there (notebook 07, section 1: how many digits float32 keeps); find a merge that does not
# subtract two huge numbers. Computing in float64 is no way out: the check then feeds float64 activations around
# 10¹⁵⁵, whose squares overflow even float64.


# %%
# ✏️ Exercise 3: write the body of the function
def merge_bn_stats(
    means: torch.Tensor, variances: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError("your code here")


# %%
ex.check(3, merge_bn_stats)

# %% [markdown]
# ### Exercise 4 · A DDP program, launched on 2 processes
#
# Complete the DDP program below: the cell defines `main(out)`, the training of section 3's `ToyModel` on 64
# samples, 3 epochs, batch 8 per rank, with the lines that make it distributed left as `...` (marked ✏️). Fill
# them in as section 3's program does, for the CPU:
#
# 1. join the process group (the gloo backend: the program runs on the CPU, whatever the machine has);
# 2. wrap the model in `DDP`;
# 3. give each rank its shard of the dataset, shuffled (`DistributedSampler`'s default, seed 0);
# 4. a different shuffle in every epoch;
# 5. save `model.state_dict()` to `out / "model.pt"`, one file, written once;
# 6. leave the process group, also when training fails.
#
# The check writes the whole cell to `runs/ex4_ddp.py`, adds a few lines that call `main` and note what each rank
# did, runs it with `torchrun --standalone --nproc_per_node=2`, setting `LOCAL_RANK` to 0 in both processes (as on
# 2 machines with one process each: choose the writer by the global rank), and compares the saved model with one process trained with batch 16 (Proof (1)). It also
# looks at each rank's shards and where they came from, at who saved and how often, and whether the ranks left the
# group.


# %%
# ✏️ Exercise 4: replace each `...` marked ✏️ with a line of code (run this cell, then the check)
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: F401 - for your ✏️ lines
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler  # noqa: F401 - for your ✏️ lines

from utils.ddp.exercise import ToyModel, make_dataset


def main(out):
    ...  # ✏️ join the process group (gloo)
    rank = dist.get_rank()
    try:
        torch.manual_seed(rank)  # a different initial model on each rank
        model = ToyModel()  # noqa: F841 - for your ✏️ lines
        ddp = ...  # ✏️ wrap the model (a CPU model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        dataset = make_dataset()  # 64 samples, the same on every rank
        sampler = ...  # ✏️ this rank's shard of the dataset, shuffled
        loader = DataLoader(dataset, batch_size=8, sampler=sampler)
        for epoch in range(3):  # noqa: B007 - for your ✏️ line
            ...  # ✏️ a different shuffle in every epoch
            for x, y in loader:
                loss = F.mse_loss(ddp(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        ...  # ✏️ rank 0 saves model.state_dict() to out / "model.pt"
    finally:
        ...  # ✏️ leave the process group


# %%
ex.check(4, main)

# %% [markdown]
# ## Summary
#
# * **DataParallel** (one process, threads, model replicated every step, one machine) needs one line, but
#   **DistributedDataParallel** (one process per device) is faster and is what PyTorch recommends. Reach your
#   model's attributes through `.module`, and save `model.module.state_dict()` so the keys carry no `module.`
#   prefix. DataParallel's model must already sit on `device_ids[0]`.
# * A job is a **process group** (进程组) of **world size** (世界大小) processes — not machines — each with a
#   **rank** (秩), its global index, and a local rank, its index on its machine (its GPU). A device string names
#   one device (`'cuda:1,2'` is an error), and a DDP process uses one GPU (`device_ids` with two entries is
#   refused); no two processes may share a GPU.
# * Start DDP programs with **`torchrun`** (`--standalone --nproc_per_node=N` on one machine; `--nnodes`,
#   `--node_rank`, `--master_addr`, `--master_port` on several), or with `mp.spawn` and a worker that lives in a
#   module. The DDP program: `init_process_group(backend, device_id=...)`, `DDP(model, device_ids=[local_rank])`
#   (none on the CPU), `DistributedSampler` + `set_epoch`, rank-0 checkpoint + `barrier` + `map_location`,
#   `destroy_process_group()`. The process group's `timeout` (30 min for gloo, 10 min for NCCL) turns a missing
#   peer into an error. `torchrun` sets `OMP_NUM_THREADS=1` for several workers per node, to avoid
#   oversubscribing the cores; tune it yourself for CPU-heavy jobs.
# * DDP broadcasts parameters and buffers once (constructor, whatever `forward_sync_buffers` says, unless
#   `init_sync=False`), **buffers
#   before every forward** (`forward_sync_buffers=True`, the default), and all-reduces (全归约) gradients in
#   buckets during backward, averaged: one bucket for everything in the first backward, then buckets filled
#   until they reach `bucket_cap_mb` (25 MiB; one parameter may take a bucket past it) in the order the gradients
#   arrived. A parameter that gets no gradient needs
#   `find_unused_parameters=True`. With batch B on N processes it trains exactly like one process with batch
#   N·B (proved above to 1e-6). `autocast` works inside DDP unchanged (the gradients stay float32).
# * Gradient accumulation (梯度累加): put the forward *and* backward of all but the last micro-batch inside
#   `no_sync()`: 1 all-reduce instead of k, the same gradient.
# * Checkpoints for a restartable job hold the model, the optimizer and **every rank's RNG state**; with `torchrun
#   --max_restarts` and a resume at start, a crashed job finishes bit for bit like an uninterrupted one.
# * Synchronised BatchNorm (同步批归一化) needs one all-reduce of (sum, sum of squares, count) forward and one
#   backward, and gives global statistics on every rank; `nn.SyncBatchNorm.convert_sync_batchnorm` (before
#   `DDP(...)`) does it on GPUs; on the CPU both DDP and SyncBN refuse.
# * The ring all-reduce sends and receives 2(N−1)L/N numbers per machine, where the naive way pushes (N−1)L
#   each way through one machine: measured 6 + 6 = 12 against 12 + 12 = 24 for 4 machines.
# * Scale the learning rate with the global batch, and warm up to it. On a GPU, work on a side stream must be
#   ordered by hand (`wait_stream`, events, `record_stream`).
#
# **Which tool when.** One GPU is enough until training is too slow. Then, on one machine with several GPUs, go
# straight to DDP with `torchrun --standalone` (DataParallel only for a quick experiment); on several machines,
# the same program with `--nnodes` and a rendezvous; when machines may fail or come and go, add
# `--max_restarts` (and elastic `--nnodes=MIN:MAX`) and a resume from checkpoints. When the model itself no
# longer fits on one GPU, its parameters must be *sharded* across processes rather than copied: notebook 09,
# sharding and distributed checkpoints. PyTorch's own guides: the
# [distributed overview](https://docs.pytorch.org/tutorials/beginner/dist_overview.html), the
# [DDP design note](https://docs.pytorch.org/docs/stable/notes/ddp.html) (buckets and the reducer, drawn) and
# [CUDA semantics](https://docs.pytorch.org/docs/stable/notes/cuda.html) (streams).

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# This lesson was built from a teacher's study notes written for PyTorch 1.x. Where the notes say something
# that is wrong, or no longer true in PyTorch 2.14, the lesson teaches the current behaviour; this table lists
# each case.
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | The world size is the number of machines; the rank is the machine's number; the local rank is "the GPU number within a process" | The world size counts *processes* (2 machines × 8 GPUs = 16); the rank is a process's global index; the machine's index is the node rank (`GROUP_RANK`); a DDP process uses one GPU | §2 · Processes, ranks, and how to start them |
# | `model.cuda('cuda:1,2')`, `torch.cuda.set_device('cuda:1,2')` to use two GPUs | `RuntimeError: Invalid device string: 'cuda:1,2'`; choose GPUs with `CUDA_VISIBLE_DEVICES` | §2 · Processes, ranks, and how to start them |
# | Start workers with `python -m torch.distributed.launch` and parse `--local_rank` | `torchrun`; `LOCAL_RANK` is in the environment; `launch` emits a `FutureWarning` and passes `--local-rank` | §2 · Processes, ranks, and how to start them |
# | `setup()` with `MASTER_ADDR='localhost'`, `MASTER_PORT='12355'` in the script | `torchrun` sets both (`--standalone` picks a free port); a fixed port fails when two jobs share a machine | §2 · Processes, ranks, and how to start them |
# | CPU backend: MPI | gloo ships with PyTorch and is the CPU backend; MPI needs a PyTorch built from source | §2 · Processes, ranks, and how to start them |
# | Seed every process the same way so that the models start equal | DDP's constructor broadcasts rank 0's parameters and buffers | §3 · A DDP program, written here and run by `torchrun` |
# | Only gradients are synchronised | Buffers are broadcast before every forward too (`forward_sync_buffers=True`, named `broadcast_buffers` before 2.13) | §3 · A DDP program, written here and run by `torchrun` |
# | `DDP(model, device_ids=list(range(rank * n, (rank + 1) * n)))`: several GPUs per process | Removed in 1.9: `ValueError: device_ids can only be None or contain a single element.` | §3 · A DDP program, written here and run by `torchrun` |
# | The training loop calls no `sampler.set_epoch(epoch)` | Without it every epoch repeats epoch 0's shuffle | §3 · A DDP program, written here and run by `torchrun` |
# | The complete Apex DDP + AMP + SyncBN script (uses `optimizer` before defining it; `images` undefined) | A complete program that runs, with `torch.autocast` instead of Apex AMP and `nn.SyncBatchNorm.convert_sync_batchnorm` instead of Apex's `convert_syncbn_model` | §3 · A DDP program, written here and run by `torchrun` |
# | `nn.SyncBatchNorm` works only inside DDP with one GPU per process (the 1.x `ddp_gpu_size` check) | That check is gone: any process group will do, but only on GPUs (XPU, HPU); on the CPU DDP's constructor and SyncBN's forward refuse | §3 · A DDP program, written here and run by `torchrun`; §4 · Synchronised BatchNorm, written by hand |
# | The DataParallel example with `timm`: `DataParallel(model, [0, 1])` with the input on `cuda:2`, "the model may be anywhere" | The input may be anywhere, the model may not: its parameters and buffers must be on `device_ids[0]` | §1 · `nn.DataParallel`: one process, many GPUs |
# | Strip the `module.` prefix with `k[7:]` | `consume_prefix_in_state_dict_if_present`, or save `model.module.state_dict()` | §1 · `nn.DataParallel`: one process, many GPUs |
# | SyncBN's variance: σ² = (1/m) Σ (xᵢ² + μ² − 2xᵢμ)², a stray square on the expansion | σ² = (1/m) Σ xᵢ² − μ², computed from Σx, Σx² and the count | §4 · Synchronised BatchNorm, written by hand |
# | Read the learning rate with `scheduler.get_lr()` | `get_last_lr()`; `get_lr()` is for the scheduler itself and warns when called from outside | §7 · Bigger global batch, bigger learning rate: linear scaling with warm-up |

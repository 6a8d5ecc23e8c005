# %% [markdown]
# # 09 · Beyond DDP: sharding and distributed checkpoints (分片与分布式检查点)
#
# DDP (notebook 08) keeps a full copy of the model, its gradients and its optimizer state on every process. That
# stops working when one copy no longer fits on one device. **You will learn to** go beyond it with PyTorch 2.14,
# on real processes, and to check each method against one process:
#
# 1. **ZeRO and FSDP2**: **sharding** (分片) parameters, gradients and optimizer states across ranks —
#    **fully sharded data parallel** (完全分片数据并行). `fully_shard` on a **device mesh** (设备网格), parameters that
#    each become a **distributed tensor** (分布式张量, `DTensor`), the all-gathers and reduce-scatters it runs, proved equal
#    to one process; the bytes each rank holds, from the real shards; FSDP2's **mixed precision** (混合精度,
#    `MixedPrecisionPolicy`): bfloat16 compute over float32 shards;
# 2. a **distributed checkpoint** (分布式检查点, `torch.distributed.checkpoint`): two ranks write their own shards
#    in parallel; one process reads them back with another sharding — **resharding** (重分片), 2 → 1 — and a
#    freshly sharded model loads them on 2 ranks;
# 3. why evaluating with a padded `DistributedSampler` gives a **wrong metric**, and the fix;
# 4. splitting the **model** instead of the batch: **data parallelism** (数据并行), **tensor parallelism** (张量并行) and
#    **pipeline parallelism** (流水线并行): DDP over a model split across two devices (`ToyMpModel`), a
#    column/row-parallel MLP and a two-stage GPipe pipeline on two ranks, each equal to the unsplit model;
# 5. `torch.compile` with DDP: how the graph is cut at bucket boundaries so communication overlaps backward.
#
# The lesson grew out of a teacher's study notes written for PyTorch 1.x (the DDP tutorial's `ToyMpModel` comes
# from there); the last section lists what changed since, for readers of those notes.
#
# **You should know:** notebook 08 (`torchrun`, ranks, DDP, `DistributedSampler`, the ring all-reduce as
# reduce-scatter + all-gather) and notebook 06 (`state_dict`, checkpoints). Section 5 also uses `torch.compile`,
# which notebook 11 teaches in full; the section introduces what it needs.
#
# **Study time:** about 165 min (35 of them for the exercises).
# Almost all of its run time is starting processes: three `torchrun` launches of 2 workers, each importing PyTorch,
# so each script packs several demonstrations.
#
# **On a GPU.** The scripts use NCCL and `cuda:LOCAL_RANK` when the machine has a GPU for every process, and
# gloo on the CPU otherwise; the device mesh is built on the same device type. `ToyMpModel` puts its two halves
# on two GPUs when each process has two (4 GPUs for 2 processes; its NCCL group is then not bound to one GPU);
# here both halves are on the CPU. The outputs shown were made on a CPU; on GPUs the printed lines name `cuda`
# devices and `nccl` where these say `cpu` and gloo.

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
# The distributed programs are written by this notebook (`%%writefile`) into `notebooks/runs/` (ignored by git)
# and started with `torchrun` through `utils.launch.run_torchrun`, as in notebook 08: workers report with
# `report()` (lines `[rank N] ...`, sorted by rank) and return tensors through `save_result()` files read with
# `load_rank_results`. Each launch prints its command line first: in a terminal in `notebooks/`, the same
# `torchrun` command runs the script by hand (`$WORK` stands for this notebook's temporary folder).
# On Windows and macOS the programs are the same; what differs there (gloo, spawned workers, `USE_LIBUV=0` on
# Windows, which `run_torchrun` sets by itself) is in notebook 08's setup section.
#
# All of these programs talk through **c10d** (通信层, `torch.distributed`'s communication layer: process groups and
# collectives over gloo or NCCL). DDP, FSDP2, DTensor, the checkpoint planner and the pipeline schedules below
# are all built on it; none has a transport of its own.

# %%
import os
import tempfile
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from matplotlib.patches import Rectangle
from torch.utils.data.distributed import DistributedSampler

from utils import get_device, seed_everything
from utils.launch import leftover_processes, load_rank_results, run_torchrun

seed_everything(0)
device = get_device()
Path("runs").mkdir(exist_ok=True)  # the notebook runs in notebooks/: scripts go to notebooks/runs/
work = tempfile.TemporaryDirectory()  # checkpoints and result files of this notebook's launches
WORK = Path(work.name)
launch_seconds = {}


def shell(result) -> list[str]:
    """The launch's command lines as typed in a shell in notebooks/, with the temporary folder shown as $WORK."""
    return [line.replace(str(WORK), "$WORK").replace(f"{Path.cwd()}/", "") for line in result.shell_lines()]


print("torch", torch.__version__.split("+")[0], "| device:", device.type, "| gloo:", dist.is_gloo_available())

# %% [markdown]
# ## 1. ZeRO and FSDP2: shard everything, gather just in time
#
# **What DDP stores.** Training with Adam in float32 keeps, per parameter, 4 bytes of weight, 4 of gradient and
# 8 of optimizer state (`exp_avg` and `exp_avg_sq`): 16 bytes. DDP keeps all of it on **every** rank, so N GPUs
# hold N identical copies. The ZeRO paper (Rajbhandari et al., 2020) removes the copies in three stages:
#
# | stage | sharded across the N ranks | bytes per rank (float32 Adam, Ψ parameters) |
# |---|---|---|
# | DDP | nothing | 4Ψ + 4Ψ + 8Ψ = 16Ψ |
# | ZeRO-1 | optimizer states | 4Ψ + 4Ψ + 8Ψ/N |
# | ZeRO-2 | + gradients | 4Ψ + 12Ψ/N |
# | ZeRO-3 | + parameters | 16Ψ/N |
#
# (The paper counts mixed precision: 2Ψ + 2Ψ + KΨ with K = 12 for Adam's float32 master weights and states.)
#
# **How ZeRO-3 still computes with full layers.** Each rank keeps 1/N of every parameter. Just before a layer
# runs forward, the ranks **all-gather** (全收集) its shards into the full weight, compute, and free it again;
# backward gathers it once more, computes gradients for the rank's own batch, and the ranks **reduce-scatter** (归约散射)
# them: each rank receives the reduction (FSDP2: the average) of everyone's gradients, but only for
# its own shard. The optimizer then updates the local shards only. Count the traffic per step in units of Ψ
# (one copy of the model): notebook 08 built DDP's all-reduce as a reduce-scatter followed by an all-gather,
# Ψ + Ψ = 2Ψ. ZeRO-3 reduce-scatters the gradients (Ψ) and all-gathers the parameters twice, for forward and
# again for backward (2Ψ): 3Ψ, 1.5× DDP's traffic, for N× less memory. (ZeRO-1 and -2 keep DDP's 2Ψ:
# reduce-scatter the gradients, then all-gather the updated parameters.)
#
# **FSDP2** is PyTorch's ZeRO-3: `torch.distributed.fsdp.fully_shard(module, mesh=...)`. It replaces every
# parameter of `module` by a `DTensor` (`torch.distributed.tensor`) — a tensor that knows its **global** shape and
# how it is laid out over a `DeviceMesh` (here a 1-D mesh of the 2 ranks, `init_device_mesh("cpu", (2,))`):
# the **placement** (放置方式) `Shard(0)` means "cut along dimension 0, one piece per rank" (`torch.chunk` pieces,
# so a dimension of 3 becomes 2 + 1 rows). `.to_local()` is the piece this rank stores; `.full_tensor()`
# all-gathers the whole. The two other placements appear in section 4: `Replicate()`, a whole copy on every
# rank, and `Partial()`, every rank holds a summand and the value is their sum, still to be all-reduced.
# Calling `fully_shard` on each layer first and then on the whole model makes each layer its own unit, gathered
# only while it runs (the root picks up parameters not already in a unit).
#
# The script trains a small MLP for 3 Adam steps on 2 ranks, each with half of a batch of 16, and a
# reference copy in the same process on the whole batch; `CommDebugMode` (`torch.distributed.tensor.debug`)
# counts the collectives of the first step. It then runs the same MLP with `reshard_after_forward=False` and with a
# mixed-precision policy (both explained below), writes a distributed checkpoint and loads it back into a new
# sharded model (section 2). The cells after it read its lines one topic at a time.

# %%
# %%writefile runs/fsdp_dcp.py
"""Notebook 09, sections 1-2: FSDP2 (fully_shard) on 2 processes, its mixed precision, a distributed checkpoint."""
import argparse
import warnings

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

from utils.ddp.common import distributed, report, save_result

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--ckpt", required=True)
args = parser.parse_args()
# CommDebugMode makes the root's output a view, and FSDP2 warns about in-place ops on views (not without it)
warnings.filterwarnings("ignore", message="FSDP2-wrapped module")


def make_mlp() -> nn.Sequential:
    torch.manual_seed(0)  # the same initial weights on every rank and in the reference
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def count(comm: CommDebugMode) -> dict[str, int]:
    return {str(op).split(".")[-1]: n for op, n in sorted(comm.get_comm_counts().items(), key=str)}


with distributed() as info:
    dev = info.device
    mesh = init_device_mesh(dev.type, (info.world_size,))  # 设备网格: a 1-D mesh of all ranks
    model = make_mlp().to(dev)
    reference = make_mlp().to(dev)  # unsharded, sees the whole batch: what one process would do
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)  # one FSDP unit per Linear
    fully_shard(model, mesh=mesh)  # the root
    for name, p in model.named_parameters():
        report(f"{name:8} {type(p).__name__} global {tuple(p.shape)} {p.placements} local {tuple(p.to_local().shape)}")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 6, generator=g).to(dev), torch.randn(16, 3, generator=g).to(dev)
    mine = slice(info.rank * 16 // info.world_size, (info.rank + 1) * 16 // info.world_size)
    for step in range(3):
        with CommDebugMode() as comm:
            loss = F.mse_loss(model(x[mine]), y[mine])
            forward_counts = count(comm)
            loss.backward()
        opt.step()  # Adam on the local shards: no communication
        opt.zero_grad()
        F.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        if step == 0:
            report(f"step 1 forward: {forward_counts} | forward + backward: {count(comm)}")
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}  # all-gather every parameter
    for k, v in reference.state_dict().items():
        torch.testing.assert_close(full[k], v)
    report(f"after 3 steps the gathered parameters equal the 1-process reference: {sorted(full)}")

    # what this rank holds: local shards of parameters, gradients (after a backward) and Adam states
    F.mse_loss(model(x[mine]), y[mine]).backward()

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    sizes = {
        "param": sum(local(p).nbytes for p in model.parameters()),
        "grad": sum(local(p.grad).nbytes for p in model.parameters()),
        "adam": sum(local(s[k]).nbytes for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq")),
        "step": sum(s["step"].nbytes for s in opt.state.values()),
        "grad_is_dtensor": all(isinstance(p.grad, DTensor) for p in model.parameters()),
    }
    opt.zero_grad()

    # the same model with reshard_after_forward=False: full layers kept from forward to backward (ZeRO-2 style)
    model2 = make_mlp().to(dev)
    for layer in (model2[0], model2[2]):
        fully_shard(layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(model2, mesh=mesh, reshard_after_forward=False)
    with CommDebugMode() as comm:
        F.mse_loss(model2(x[mine]), y[mine]).backward()
    report(f"reshard_after_forward=False, forward + backward: {count(comm)}")

    # 混合精度: compute in bfloat16, keep float32 shards, reduce gradients in float32
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model3 = make_mlp().to(dev)
    seen = []  # what each Linear computes with: (input, weight, output) dtypes
    for layer in (model3[0], model3[2]):
        layer.register_forward_hook(lambda mod, inp, out: seen.append((inp[0].dtype, mod.weight.dtype, out.dtype)))
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model3, mesh=mesh, mp_policy=policy)
    out3 = model3(x[mine])  # a float32 input: fully_shard casts it to param_dtype
    F.mse_loss(out3.float(), y[mine]).backward()
    short = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
    report(
        f"mixed precision, forward of each Linear (input, weight, output): {[tuple(short[d] for d in t) for t in seen]}"
    )
    w3 = model3[0].weight
    report(
        f"mixed precision, after backward: stored {type(w3).__name__} {short[w3.dtype]}, "
        f"grad {type(w3.grad).__name__} {short[w3.grad.dtype]}"
    )

    # 分布式检查点: every rank writes its own shards; the plan and .metadata are agreed through rank 0
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=args.ckpt)

    # loading into a sharded model: the new model's own sharded state dict says which pieces this rank wants
    with torch.device("meta"):  # shapes only, no memory: the full model never exists in one process
        fresh = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    for layer in (fresh[0], fresh[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(fresh, mesh=mesh)
    on_meta = fresh[0].weight.to_local().device.type
    fresh.to_empty(device=dev)  # allocate this rank's shards only (uninitialised memory, overwritten below)
    wanted = {"model": get_model_state_dict(fresh)}  # DTensors: this rank's shards, in the new layout
    dcp.load(wanted, checkpoint_id=args.ckpt)  # each rank reads only its own rows, in place
    set_model_state_dict(fresh, wanted["model"])
    for k, v in fresh.state_dict().items():
        torch.testing.assert_close(v.full_tensor(), full[k], rtol=0, atol=0)
    report(
        f"dcp.load into a fully_shard model built on {on_meta}: equal to the saved model; "
        f"local 2.weight {tuple(fresh[2].weight.to_local().shape)}"
    )
    save_result(
        args.out,
        {
            "full": {k: v.cpu() for k, v in full.items()},
            "sizes": sizes,
            "local_shapes": {k: tuple(v.to_local().shape) for k, v in model_sd.items()},
        },
    )

# %%
fsdp = run_torchrun("runs/fsdp_dcp.py", nproc=2, args=["--out", WORK / "fsdp", "--ckpt", WORK / "ckpt"])
launch_seconds["fsdp_dcp"] = fsdp.wall_s
print(*shell(fsdp))
fsdp.print_ranks()
lines = fsdp.by_rank()
assert shell(fsdp) == ["torchrun --standalone --nproc_per_node=2 runs/fsdp_dcp.py --out $WORK/fsdp --ckpt $WORK/ckpt"]
assert lines[0][0] == "0.weight DTensor global (8, 6) (Shard(dim=0),) local (4, 6)"
assert lines[0][2].endswith("local (2, 8)") and lines[1][2].endswith("local (1, 8)")  # 3 rows: 2 + 1

# %% [markdown]
# Every rank sees the same **global** shapes and stores half the rows; `2.weight` has 3 rows, so rank 0 stores 2
# and rank 1 stores 1 (FSDP2 pads the smaller shard internally so that the all-gather moves equal pieces).
#
# **The collectives of one step**, per rank: in forward, one all-gather per unit (`_allgather_base_`: the
# c10d op behind `dist.all_gather_single`, which FSDP2 calls; `all_gather_into_tensor` is its older,
# deprecated name); in backward, each unit is gathered **again** (the forward freed it) and its gradients are
# reduce-scattered (`_reduce_scatter_base_`, behind `dist.reduce_scatter_single`). That is 4 all-gathers and 2
# reduce-scatters for 2 units. CommDebugMode counts these c10d ops, so the names and counts are the same with
# NCCL on GPUs. With `reshard_after_forward=False` the gathered layers stay in memory from forward until
# backward: 2 all-gathers instead of 4 (traffic 2Ψ, like DDP), and full layers in memory between forward and
# backward. FSDP1 called this `SHARD_GRAD_OP` and it is often called ZeRO-2; unlike the paper's ZeRO-2, the
# parameters are still freed after backward and gathered again at the next forward.
#
# After 3 Adam steps the gathered parameters equal the unsharded reference on the whole batch (`assert_close`
# in the script): each rank's gradient shard is the **average** over ranks of the gradients of their half
# batches, which is the gradient of the whole batch's mean loss.

# %%
ag, rs = "_allgather_base_", "_reduce_scatter_base_"
for r in (0, 1):
    step1 = lines[r][4]
    assert step1 == f"step 1 forward: {{'{ag}': 2}} | forward + backward: {{'{ag}': 4, '{rs}': 2}}", step1
    assert lines[r][6] == f"reshard_after_forward=False, forward + backward: {{'{ag}': 2, '{rs}': 2}}", lines[r][6]
print("per rank and step: forward 2 all-gathers; forward + backward 4 all-gathers and 2 reduce-scatters")
print("with reshard_after_forward=False: 2 all-gathers and 2 reduce-scatters")

# %% [markdown]
# **Bytes per rank**, measured on the local shards the script found after a backward (`param`: the sharded
# parameters; `grad`: their gradients, which are `DTensor`s with the same sharding; `adam`: `exp_avg` +
# `exp_avg_sq`; Adam's `step` counters are one float32 scalar per parameter tensor, kept whole on every rank).
# DDP's column is what each rank would hold with full copies.

# %%
fres = load_rank_results(WORK / "fsdp")
full = fres[0]["full"]
n_params = sum(v.numel() for v in full.values())
ddp_bytes = {"param": 4 * n_params, "grad": 4 * n_params, "adam": 8 * n_params, "step": 4 * len(full)}
print(f"{n_params} parameters in {len(full)} tensors")
print(f"{'bytes':7} {'DDP rank 0/1':>13} {'FSDP2 rank 0':>13} {'FSDP2 rank 1':>13}")
for kind in ("param", "grad", "adam", "step"):
    print(f"{kind:7} {ddp_bytes[kind]:13} {fres[0]['sizes'][kind]:13} {fres[1]['sizes'][kind]:13}")
totals = [sum(fres[r]["sizes"][k] for k in ddp_bytes) for r in (0, 1)]
print(f"{'total':7} {sum(ddp_bytes.values()):13} {totals[0]:13} {totals[1]:13}")
for kind in ("param", "grad", "adam"):  # the shards add up to exactly one copy
    assert fres[0]["sizes"][kind] + fres[1]["sizes"][kind] == ddp_bytes[kind]
assert fres[0]["sizes"]["grad_is_dtensor"] and fres[0]["sizes"]["step"] == ddp_bytes["step"]
assert fres[0]["sizes"]["param"] == 4 * (4 * 6 + 4 + 2 * 8 + 2) and fres[1]["sizes"]["param"] == 4 * (
    4 * 6 + 4 + 1 * 8 + 1
)

# %% [markdown]
# The stage formulas for a big model: the ZeRO paper's example, 7.5 billion parameters on 64 GPUs with mixed
# precision (K = 12), and the same model in float32 Adam (16 bytes per parameter) on 8 GPUs.


# %%
def zero_bytes(psi: float, n: int, p: int = 2, g: int = 2, k: int = 12) -> dict[str, float]:
    """Bytes per rank: weights p, gradients g and optimizer states k bytes per parameter, n ranks."""
    return {
        "DDP": (p + g + k) * psi,
        "ZeRO-1": (p + g) * psi + k * psi / n,
        "ZeRO-2": p * psi + (g + k) * psi / n,
        "ZeRO-3": (p + g + k) * psi / n,
    }


paper = zero_bytes(7.5e9, 64)
fp32 = zero_bytes(7.5e9, 8, p=4, g=4, k=8)
for stage in paper:
    print(
        f"{stage:7} mixed precision, 64 GPUs: {paper[stage] / 1e9:6.1f} GB | float32 Adam, 8 GPUs: {fp32[stage] / 1e9:6.1f} GB"
    )
assert [round(v / 1e9, 1) for v in paper.values()] == [120.0, 31.4, 16.6, 1.9]  # the paper's Figure 1

# %% [markdown]
# Activations are not in the table: they depend on the batch and are **not** sharded by ZeRO's data-parallel
# stages (each rank computes on its own batch); activation checkpointing (recomputing a block's activations
# during backward instead of storing them, notebook 11) and smaller micro-batches deal with them. (The paper's separate "ZeRO-R" partitions saved activations too, but only across *model*-parallel
# ranks, which hold copies of the same activations; FSDP2 does not do this.) And a layer still has to fit in one
# device when it is gathered: the largest unit sets the peak, which is why one wraps each transformer block in its
# own `fully_shard`.
#
# **FSDP2 with mixed precision.** Notebook 07 kept float32 weights and let `torch.autocast` run the matrix
# products in a lower precision. FSDP2 does it at the level of its collectives instead, with
# `fully_shard(module, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
# reduce_dtype=torch.float32))`:
#
# * the **stored shards stay float32** — the master weights that Adam updates;
# * before a unit runs, each rank casts its shard to `param_dtype` and the all-gather moves bfloat16: half the
#   bytes of section 1's traffic; the forward and backward compute with bfloat16 weights (each sharded module also
#   casts the floating-point inputs of its `forward` to bfloat16: `cast_forward_inputs=True` by default);
# * the gradients are computed in bfloat16, cast to `reduce_dtype` and reduce-scattered in float32 (summing many
#   ranks' gradients in bfloat16 would lose their small bits), and land as float32 `DTensor` gradients of the
#   float32 shards.
#
# The script ran one forward and backward of the same MLP with this policy; a forward hook on each `Linear`
# (notebook 03) recorded the dtypes of its input, its weight and its output:

# %%
for r in (0, 1):
    print(f"rank {r}:", *lines[r][7:9], sep="\n  ")
    assert lines[r][7] == (
        "mixed precision, forward of each Linear (input, weight, output): "
        "[('bfloat16', 'bfloat16', 'bfloat16'), ('bfloat16', 'bfloat16', 'bfloat16')]"
    )
    assert lines[r][8] == "mixed precision, after backward: stored DTensor float32, grad DTensor float32"

# %% [markdown]
# All of this runs on the CPU with gloo in PyTorch 2.14: `init_device_mesh("cpu", ...)`, `fully_shard`, the
# mixed-precision policy, backward (gloo's reduce-scatter), Adam on `DTensor` shards, `full_tensor()` and the
# checkpoints below. What only a GPU shows is the payoff: bfloat16 matrix products that are faster, and the
# all-gathers of the next unit overlapping the computation of this one on separate CUDA streams. On GPUs the
# same script runs unchanged with NCCL (`init_device_mesh("cuda", ...)`).
#
# With DDP there is no such policy: DDP all-reduces whatever gradients backward produces, so notebook 07's
# `torch.autocast` + `GradScaler` inside the training loop is all it takes (section 4 runs it: the gradients
# DDP all-reduces are float32, because the weights are). Older code often used NVIDIA's Apex library
# (`amp.initialize`, `apex.parallel.DistributedDataParallel`) for this; `torch.amp` replaced it. A sharded
# model in float16 (bfloat16 needs no scaler) uses `ShardedGradScaler` (`torch.distributed.fsdp.sharded_grad_scaler`):
# each rank sees only its shards' gradients, so it all-reduces the "found inf" flag, and all ranks skip the same
# steps.

# %% [markdown]
# ## 2. Distributed checkpoints: every rank writes its shard, any world size reads
#
# Saving a sharded model the notebook-06 way needs the full tensors in one process (`full_tensor()` on every
# parameter, then `torch.save` on rank 0): a gather of the whole model through one device, and one writer.
# `torch.distributed.checkpoint` (DCP) instead lets **every rank write its own shards, in parallel**, into a
# folder. `get_state_dict(model, optimizer)` (`torch.distributed.checkpoint.state_dict`) returns the model's and
# the optimizer's state dicts keyed by parameter names (not the optimizer's numeric ids) with `DTensor` values.
# `dcp.save` then plans who writes what: each rank's **planner** (规划器, `DefaultSavePlanner`) lists the pieces
# it holds; rank 0, the coordinator, gathers these local plans, removes duplicates (an item every rank holds
# whole, such as Adam's `step`, is kept in one rank's plan) and sends each rank its final plan; each rank writes
# one file `__<rank>_0.distcp`; then rank 0 gathers what was written where and writes the `.metadata` file:

# %%
ckpt = WORK / "ckpt"
print("files in the checkpoint folder:", sorted(os.listdir(ckpt)))
print("local shapes in the state_dict given to dcp.save, rank 0:", fres[0]["local_shapes"])
print("                                                    rank 1:", fres[1]["local_shapes"])
assert sorted(os.listdir(ckpt)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]

# %% [markdown]
# The `.metadata` file records, for every tensor, its global size and the chunks it was written in (offset and
# size of each piece), and which file holds each chunk. That is what lets a job with a **different** number of
# ranks — or a single process — read it: each reader asks for the pieces that overlap what it needs.

# %%
meta = dcp.FileSystemReader(ckpt).read_metadata()
where = {}
for index, info in meta.storage_data.items():
    where.setdefault(index.fqn, []).append(
        (tuple(index.offset) if index.offset is not None else None, info.relative_path)
    )
for fqn in ("model.2.weight", "optim.state.2.weight.exp_avg", "optim.state.2.weight.step"):
    md = meta.state_dict_metadata[fqn]
    chunks = [(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks]
    print(f"{fqn:30} global {tuple(md.size)} chunks (offset, size) {chunks} in {sorted(f for _, f in where[fqn])}")
assert [tuple(c.sizes) for c in meta.state_dict_metadata["model.2.weight"].chunks] == [(2, 8), (1, 8)]
assert sorted(f for _, f in where["model.2.weight"]) == ["__0_0.distcp", "__1_0.distcp"]
assert len(where["optim.state.2.weight.step"]) == 1  # a replicated scalar is written once, not by every rank

# %% [markdown]
# **Resharding 2 → 1.** This notebook process has no process group at all. `dcp.load` fills a state
# dict **in place**, so we hand it a plain, freshly initialised model's `state_dict()` (its tensors say which
# keys and shapes we want), then `load_state_dict` as usual. Only the model's keys are requested: the
# optimizer's entries in the checkpoint are simply not read. `dcp.load` warns that it runs without
# `torch.distributed`, which is what we want here:

# %%
plain = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))  # other random weights
wanted = {"model": plain.state_dict()}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    dcp.load(wanted, checkpoint_id=ckpt)
plain.load_state_dict(wanted["model"])
print(f"{caught[0].category.__name__}: {str(caught[0].message).split(', assuming')[0]}")
for k, v in plain.state_dict().items():
    torch.testing.assert_close(v, full[k], rtol=0, atol=0)
print("the 1-process model equals the gathered 2-rank model:", list(plain.state_dict()))
assert len(caught) == 1 and caught[0].category is UserWarning

# %% [markdown]
# For a single ordinary file (to share a model, or to inspect it), `dcp_to_torch_save` converts the whole folder,
# optimizer included, into one `torch.save` file with full tensors (its inverse is `torch_save_to_dcp`). The
# Adam states come back whole: the two ranks' halves put together.

# %%
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

dcp_to_torch_save(ckpt, WORK / "one_file.pt")
one = torch.load(WORK / "one_file.pt", weights_only=True)
state = one["optim"]["state"]
print("keys:", list(one), "| optimizer state of '2.weight':", {k: tuple(v.shape) for k, v in state["2.weight"].items()})
for k in full:
    torch.testing.assert_close(one["model"][k], full[k], rtol=0, atol=0)
assert sorted(state) == sorted(full) and int(state["0.weight"]["step"]) == 3

# %% [markdown]
# Training does not have to wait for the disk: `dcp.async_save` (same arguments; marked experimental in 2.14)
# copies the state into CPU memory, returns a future (wait on it before the next save), and writes in a
# background thread while the next steps run.
#
# **Loading into a sharded model** is the same in-place pattern, run by every rank of the new job. At the end
# of its script, after `dcp.save`, each rank built a new MLP and loaded it. A model too big for one device cannot
# even be *created* whole, so it is built on the **meta device** (元设备, `torch.device("meta")`: tensors with a
# shape and a dtype but no memory), sharded there, and only then given memory: `to_empty(device=...)` allocates
# each rank's shards, uninitialised, which the load then overwrites:
#
# ```python
# with torch.device("meta"):                         # every tensor created in this block is on "meta"
#     fresh = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
# fully_shard(fresh[0], mesh=mesh); fully_shard(fresh[2], mesh=mesh); fully_shard(fresh, mesh=mesh)
# fresh.to_empty(device=dev)                         # allocate this rank's shards only
# wanted = {"model": get_model_state_dict(fresh)}   # DTensors: which rows this rank holds, in the new layout
# dcp.load(wanted, checkpoint_id=ckpt)              # each rank reads only the byte ranges of its own shards
# set_model_state_dict(fresh, wanted["model"])      # copy them into the sharded parameters
# ```
#
# `get_model_state_dict` / `set_model_state_dict` (`torch.distributed.checkpoint.state_dict`) are the
# model-only halves of `get_state_dict` / `set_state_dict`. The new mesh may have any number of ranks: the
# `.metadata` tells each rank which chunks overlap its rows. With the optimizer, call
# `get_state_dict(model, opt)` before the load: an optimizer without state yet gets one (it runs one `step()`
# with zero gradients and the learning rate set to 0, so that the Adam tensors exist to be loaded into); then
# `set_state_dict(model, opt, model_state_dict=..., optim_state_dict=...)`.

# %%
for r in (0, 1):
    print(f"rank {r}: {lines[r][9]}")
loaded = "dcp.load into a fully_shard model built on meta: equal to the saved model; local 2.weight"
assert lines[0][9] == f"{loaded} (2, 8)" and lines[1][9] == f"{loaded} (1, 8)"

# %% [markdown]
# ## 3. Evaluation with a padded `DistributedSampler` is biased
#
# `DistributedSampler` gives every rank the same number of samples, `ceil(N / world_size)`, so that every rank
# runs the same number of steps (DDP needs that: each step is a collective). When N is not divisible, it
# **pads** by repeating samples from the start (`drop_last=False`, the default). In training a few repeats per
# epoch hardly matter; in evaluation they change the metric. Ten samples on four ranks (without shuffling, to
# see the pattern; `num_replicas` and `rank` can be given explicitly, so no process group is needed):

# %%
N, WORLD = 10, 4
samples = list(range(N))
padded = {r: list(DistributedSampler(samples, num_replicas=WORLD, rank=r, shuffle=False)) for r in range(WORLD)}
for r, idx in padded.items():
    print(f"rank {r}: {idx}")
assert padded == {0: [0, 4, 8], 1: [1, 5, 9], 2: [2, 6, 0], 3: [3, 7, 1]}  # 0 and 1 are evaluated twice

# %% [markdown]
# A model that classifies samples 0, 1, 4 and 6 correctly has accuracy 4/10 = 0.4. Each rank computes its
# accuracy; the usual two ways to combine them — the mean of the ranks' accuracies, or all-reducing the counts —
# agree with each other (padded shards all have the same size) and are both wrong: samples 0 and 1 count twice,
# 6 correct out of 12.

# %%
correct = torch.tensor([1, 1, 0, 0, 1, 0, 1, 0, 0, 0])  # which samples the model gets right
true_acc = correct.sum().item() / N
per_rank = {r: correct[idx] for r, idx in padded.items()}
mean_of_ranks = sum(c.float().mean().item() for c in per_rank.values()) / WORLD
pooled = sum(c.sum().item() for c in per_rank.values()) / sum(len(c) for c in per_rank.values())
print(
    f"true accuracy {true_acc:.4f} | mean of the ranks' accuracies {mean_of_ranks:.4f} | "
    f"all-reduced counts with padding {pooled:.4f}"
)
assert true_acc == 0.4 and mean_of_ranks != true_acc and pooled != true_acc
assert pooled == 6 / 12 and abs(mean_of_ranks - 6 / 12) < 1e-6

# %% [markdown]
# **The fix:** shard without padding — `indices[rank::world_size]`, so ranks get 3, 3, 2, 2 samples — and
# all-reduce **counts**, not averages: `dist.all_reduce(torch.tensor([n_correct, n_seen]), op=SUM)` (below, the
# sum over ranks is what that all-reduce returns on every rank). The ranks now run different numbers of
# batches, which is fine for evaluation as long as nothing inside the loop is a collective: evaluate the plain
# module (`ddp_model.module`), not the DDP wrapper, and communicate once at the end.
#
# `drop_last=True` is not a fix: the sampler then *drops* the tail (each rank gets `N // world_size`), and
# samples 8 and 9 are never evaluated.

# %%
unpadded = {r: samples[r::WORLD] for r in range(WORLD)}
counts = torch.stack([torch.tensor([correct[idx].sum(), len(idx)]) for idx in unpadded.values()])
n_correct, n_seen = counts.sum(dim=0).tolist()  # = dist.all_reduce(counts_of_this_rank, op=SUM)
dropped = {
    r: list(DistributedSampler(samples, num_replicas=WORLD, rank=r, shuffle=False, drop_last=True))
    for r in range(WORLD)
}
print("unpadded shards:", unpadded, f"-> {n_correct}/{n_seen} = {n_correct / n_seen:.4f}")
print(
    "drop_last=True:", dropped, "-> never evaluated:", sorted(set(samples) - {i for v in dropped.values() for i in v})
)
assert n_seen == N and n_correct / n_seen == true_acc
assert sorted(i for v in unpadded.values() for i in v) == samples
assert sorted(set(samples) - {i for v in dropped.values() for i in v}) == [8, 9]

# %% [markdown]
# With `shuffle=True` the repeated samples are different ones each epoch, but the bias is there all the same.
# Libraries such as TorchMetrics do exactly this — sum states across ranks, then divide — which is unbiased
# provided each sample is seen once: they cannot undo the padding of a `DistributedSampler`.

# %% [markdown]
# ## 4. Splitting the model: data, tensor and pipeline parallelism
#
# DDP and FSDP split the **batch**; every rank computes whole layers (FSDP only *stores* them in pieces). When a
# single layer's computation is too big, or activations are, the **model** is split instead:
#
# | | each rank holds | each rank computes | communicated |
# |---|---|---|---|
# | data parallel (数据并行), DDP | the whole model | its part of the batch, all layers | gradients: one all-reduce per bucket in backward |
# | fully sharded (ZeRO-3, FSDP2) | 1/N of every layer | its part of the batch, all layers | parameters: all-gather per unit in forward and backward; gradients: reduce-scatter |
# | tensor parallel (张量并行) | a slice of every layer's weight matrices | the whole batch, its slice of each matrix product | activations: an all-reduce (or all-gather) inside every layer pair, forward and backward |
# | pipeline parallel (流水线并行) | whole layers: a consecutive group of them | micro-batches through its stage only | activations forward and their gradients backward, point-to-point between neighbouring stages |
#
# Tensor parallelism talks inside every layer, so it is kept within one machine's fast links; pipelines talk
# little but leave stages idle unless the batch is cut into micro-batches (the pipeline bubble, 流水线气泡); large models combine
# all of them on a multi-dimensional `DeviceMesh`, e.g. `init_device_mesh("cuda", (n_nodes, 8),
# mesh_dim_names=("dp", "tp"))`.


# %%
def draw_parallelism(ax):
    """Which rank holds which part of a two-layer model (L1, L2) and which part of the batch.

    FSDP2 and ColwiseParallel shard a weight's dim 0 (output units, drawn across); RowwiseParallel dim 1 (drawn up).
    """
    rows = [
        ("DDP", [(0, 1), (0, 1)], [(0, 1), (0, 1)], "half batch each"),
        ("FSDP2 / ZeRO-3", [(0, 0.5), (0.5, 1)], [(0, 0.5), (0.5, 1)], "half batch each; layers gathered to run"),
        (
            "tensor parallel",
            [(0, 0.5), (0.5, 1)],
            [(0, 0.5), (0.5, 1)],
            "whole batch; L1 by output units, L2 by input units",
        ),
        ("pipeline parallel", [(0, 1), None], [None, (0, 1)], "micro-batches flow rank 0 → rank 1"),
    ]
    colours = ["tab:blue", "tab:orange"]
    for i, (name, l1, l2, note) in enumerate(rows):
        y = -i * 1.6
        ax.text(-0.2, y + 0.35, name, ha="right", va="center", fontsize=10, weight="bold")
        for rank in (0, 1):
            x0 = rank * 3.0
            for j, (layer, part) in enumerate((("L1", l1[rank]), ("L2", l2[rank]))):
                x = x0 + j * 1.3
                ax.add_patch(Rectangle((x, y), 1.1, 0.7, fill=False, ec="grey", ls=":"))
                if part is not None:
                    shaded_axis_is_rows = name == "tensor parallel" and layer == "L2"
                    if shaded_axis_is_rows:  # a row slice of L2's weight: the input features
                        ax.add_patch(
                            Rectangle(
                                (x, y + 0.7 * (1 - part[1])),
                                1.1,
                                0.7 * (part[1] - part[0]),
                                color=colours[rank],
                                alpha=0.6,
                            )
                        )
                    else:
                        ax.add_patch(
                            Rectangle(
                                (x + 1.1 * part[0], y), 1.1 * (part[1] - part[0]), 0.7, color=colours[rank], alpha=0.6
                            )
                        )
                ax.text(x + 0.55, y + 0.35, layer, ha="center", va="center", fontsize=9)
        ax.text(6.0, y + 0.35, note, va="center", fontsize=9)
    for rank in (0, 1):
        ax.text(rank * 3.0 + 1.2, 1.0, f"rank {rank}", ha="center", fontsize=10, color=colours[rank])
    ax.text(
        -3.2,
        -5.1,
        "each box is a layer's weight matrix: across = its output units, up = its input units",
        fontsize=8,
        color="grey",
    )
    ax.set_xlim(-3.2, 10.5)
    ax.set_ylim(-5.2, 1.4)
    ax.axis("off")


fig, ax = plt.subplots(figsize=(11, 5))
draw_parallelism(ax)
ax.set_title("what each of 2 ranks stores (coloured) of a 2-layer model")
plt.show()
assert len(ax.patches) == 4 * 2 * 2 + 4 * 2 * 2 - 2  # every slot outlined, all filled but pipeline's two

# %% [markdown]
# PyTorch 2.14 has all of them, built on `DTensor` and c10d: `torch.distributed.tensor.parallel`
# (`parallelize_module` with the styles `ColwiseParallel`, `RowwiseParallel`, `SequenceParallel`) and
# `torch.distributed.pipelining` (`pipeline`, `SplitPoint`, `PipelineStage`, schedules such as `ScheduleGPipe` and
# `Schedule1F1B`). Older code sometimes splits a model with `torch.distributed.rpc` (remote procedure calls between
# processes, a general framework for parameter servers and hand-built pipelines); these two libraries are today's
# tools for splitting layers. One script runs four demonstrations on two ranks, each checked against the unsplit
# model:
#
# **DDP over a model split across devices.** The PyTorch DDP tutorial's `ToyMpModel` puts `net1` on one GPU and
# `net2` on another and moves the activation between them in `forward` — the simplest model parallelism (a
# pipeline with no micro-batches: one GPU idles while the other works). DDP accepts such a multi-device module,
# with one rule: **`device_ids` (and `output_device`) must be `None`**, because the module itself decides where its
# layers and outputs live; DDP all-reduces each gradient on the device of its parameter. (`nn.DataParallel`
# cannot do this: it copies the whole module to each of its GPUs and needs all parameters on `device_ids[0]`.)
# The tutorial's program needs 2 GPUs per process (8 GPUs for 4 processes). Here the two "devices" are both the
# CPU: the pattern is the same, and the same rule holds for CPU modules, which is what the error shows.
#
# **Tensor parallelism in two lines.** `ColwiseParallel` on the first `Linear` cuts its weight by output
# features (`Shard(0)` of the `(out, in)` matrix): each rank computes half of the hidden units. `RowwiseParallel`
# on the second cuts its weight by input features (`Shard(1)`), so each rank multiplies its half of the hidden
# units and produces a **partial sum** of the output; one all-reduce adds them. Both ranks get the same input and
# the same output. (The script's last check builds a DTensor by hand: `DTensor.from_local(t, mesh, placements)`
# declares the ordinary tensor `t` to be this rank's piece of a DTensor laid out as `placements`, without any
# communication.) The script checks both against unsplit models and counts the collectives.
#
# **A two-stage pipeline.** `pipeline(module, mb_args=(one_micro_batch,), split_spec={"l2": SplitPoint.BEGINNING})`
# traces the model (with `torch.export`, which captures a model's forward as one whole graph of operations,
# notebook 06) on one example micro-batch and cuts the graph before `l2`; rank r's
# `pipe.build_stage(r, device)` keeps only the layers of stage r and knows its neighbours. A **schedule**
# (调度) then drives the stages: `ScheduleGPipe(stage, n_microbatches=4, loss_fn=F.mse_loss)` cuts the batch into
# 4 **micro-batches** (微批次), runs all forwards (each stage sends its activation to the next with point-to-point
# `isend`/`irecv`), then all backwards (gradients flow back the same way), accumulating the parameter gradients.
# Rank 0 calls `schedule.step(x)`, the last rank `schedule.step(target=y, losses=[])` and gets the output. Each
# micro-batch's loss is a mean; the schedule divides the accumulated gradients by the number of micro-batches
# (`scale_grads=True`, its default), so they equal the gradients of the whole batch's mean loss (with a
# `reduction="sum"` loss, pass `scale_grads=False`).
#
# The script also trains a DDP model under notebook 07's `torch.autocast` (section 1 explains why nothing else is
# needed).

# %%
# %%writefile runs/model_parallel.py
"""Notebook 09, section 4: DDP over a two-device model, a tensor-parallel MLP, DDP + autocast, a 2-stage pipeline."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

from utils.ddp.common import distributed, env_int, report, save_result

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()


class ToyMpModel(nn.Module):
    """The DDP tutorial's model: net1 on dev0, net2 on dev1, the activation moved between them."""

    def __init__(self, dev0, dev1):
        super().__init__()
        self.dev0, self.dev1 = dev0, dev1
        self.net1 = nn.Linear(10, 10).to(dev0)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5).to(dev1)

    def forward(self, x):
        x = self.relu(self.net1(x.to(self.dev0)))
        return self.net2(x.to(self.dev1))


# the tutorial's setup: each process drives 2 GPUs (cuda:2k, cuda:2k+1); otherwise both halves on the CPU with gloo.
# A process that uses 2 GPUs needs an NCCL group not bound to one of them (bind_device=False).
two_gpus_each = torch.cuda.device_count() >= 2 * env_int("LOCAL_WORLD_SIZE", 1)
with distributed(prefer="auto" if two_gpus_each else "cpu", bind_device=not two_gpus_each) as info:
    r = info.rank
    dev0, dev1 = (f"cuda:{2 * info.local_rank}", f"cuda:{2 * info.local_rank + 1}") if two_gpus_each else ("cpu", "cpu")
    torch.manual_seed(0)
    mp_model = ToyMpModel(dev0, dev1)
    torch.manual_seed(0)
    reference = ToyMpModel(dev0, dev1)  # one process, the whole batch
    try:
        DDP(mp_model, device_ids=[0])
    except ValueError as err:
        report(f"DDP(mp_model, device_ids=[0]): ValueError: {err}")
    ddp_mp_model = DDP(mp_model)  # device_ids=None: the module places its own layers
    report(
        f"ToyMpModel on {dev0} and {dev1}; ddp.device_ids = {ddp_mp_model.device_ids}, "
        f"multi-device module: {ddp_mp_model.is_multi_device_module}"
    )
    g = torch.Generator().manual_seed(1)
    x, labels = torch.randn(40, 10, generator=g), torch.randn(40, 5, generator=g)
    mine = slice(20 * r, 20 * (r + 1))  # the tutorial's batch of 20 on each rank
    opt = torch.optim.SGD(ddp_mp_model.parameters(), lr=0.001)
    F.mse_loss(ddp_mp_model(x[mine]), labels[mine].to(dev1)).backward()
    opt.step()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.001)
    F.mse_loss(reference(x), labels.to(dev1)).backward()
    ref_opt.step()
    for p, q in zip(mp_model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
    report("DDP over ToyMpModel, 2 x 20 samples = 1 process with 40: parameters equal after one SGD step")

    # tensor parallel: the same 2-layer MLP, its weights split over a 1-D mesh
    mesh = init_device_mesh(info.device.type, (info.world_size,))
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 4)).to(info.device)
    torch.manual_seed(0)
    whole = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 4)).to(info.device)
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    for name, p in mlp.named_parameters():
        report(f"tp {name:8} {p.placements} local {tuple(p.to_local().shape)}")
    x = torch.randn(3, 4, generator=g).to(info.device).requires_grad_()  # the same input on every rank
    x_whole = x.detach().clone().requires_grad_()  # as if it came from earlier layers
    with CommDebugMode() as comm:
        out = mlp(x)
        forward_counts = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}
        out.sum().backward()
    report(
        f"tp output {type(out).__name__} {tuple(out.shape)}; collectives forward {forward_counts}, "
        f"forward + backward { {str(k).split('.')[-1]: v for k, v in comm.get_comm_counts().items()} }"
    )
    reference_out = whole(x_whole)
    reference_out.sum().backward()
    torch.testing.assert_close(out, reference_out)
    torch.testing.assert_close(x.grad, x_whole.grad)
    for p, q in zip(mlp.parameters(), whole.parameters()):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad)
    report("tp output and gradients (parameters and input) equal the unsplit MLP")

    # where the row-parallel bias goes: run the second Linear on this rank's hidden units, stopping before the
    # all-reduce (F.linear on DTensors, no output redistribution): the result is Partial, bias / 2 on each rank
    with torch.no_grad():
        h = torch.relu(mlp[0](x))  # ColwiseParallel returns the local (3, 3) slice of the hidden units
        w, b = mlp[2].weight, mlp[2].bias
        y = F.linear(DTensor.from_local(h, mesh, [Shard(1)]), w, b)
        bias_split = torch.allclose(y.to_local(), h @ w.to_local().T + b.to_local() / info.world_size)
    report(
        f"row-parallel Linear before the all-reduce: {y.placements}; local = partial product + bias / "
        f"{info.world_size}: {bias_split}"
    )

    # DDP with notebook 07's autocast: nothing DDP-specific, the gradients DDP all-reduces are float32
    torch.manual_seed(0)
    amp_ddp = DDP(nn.Linear(10, 5).to(info.device))
    with torch.autocast(info.device.type, dtype=torch.bfloat16):
        amp_out = amp_ddp(torch.randn(4, 10, generator=g).to(info.device))
    amp_out.float().square().mean().backward()
    report(
        f"DDP + autocast(bfloat16): output {amp_out.dtype}, weight {amp_ddp.module.weight.dtype}, grad {amp_ddp.module.weight.grad.dtype}"
    )

    # pipeline parallel: stage 0 = l1 on rank 0, stage 1 = l2, l3 on rank 1; 4 micro-batches through GPipe
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.l1, self.l2, self.l3 = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))

    xb = torch.randn(8, 6, generator=torch.Generator().manual_seed(2)).to(info.device)  # the same on every rank
    yb = torch.randn(8, 3, generator=torch.Generator().manual_seed(3)).to(info.device)
    pipe = pipeline(Net().to(info.device), mb_args=(xb.chunk(4)[0],), split_spec={"l2": SplitPoint.BEGINNING})
    stage = pipe.build_stage(r, info.device)  # this rank's stage: a submodule with only its layers
    report(f"pp stage {r} of {pipe.num_stages} holds {[n for n, _ in stage.submod.named_parameters()]}")
    # each micro-batch's loss is a mean over its 2 samples; scale_grads=True (the default) divides the summed
    # gradients by the 4 micro-batches, which makes them the gradients of the whole batch's mean loss
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=F.mse_loss)
    unsplit = Net().to(info.device)  # the same weights, in one process, on the whole batch
    ref_out = unsplit(xb)
    F.mse_loss(ref_out, yb).backward()
    if r == 0:
        schedule.step(xb)  # the first stage feeds the inputs (cut into 4 micro-batches)
    else:
        losses = []
        pp_out = schedule.step(target=yb, losses=losses)  # the last stage gets the outputs and the losses
        torch.testing.assert_close(pp_out, ref_out)
        torch.testing.assert_close(sum(losses) / 4, F.mse_loss(ref_out, yb))
        report(f"pp output {tuple(pp_out.shape)} and mean loss of {len(losses)} micro-batches = unsplit Net")
    for n, p in stage.submod.named_parameters():
        torch.testing.assert_close(p.grad, unsplit.get_parameter(n).grad)
    report(f"pp stage {r}: gradients = unsplit Net's")
    save_result(args.out, {"done": True})

# %%
mp = run_torchrun("runs/model_parallel.py", nproc=2, args=["--out", WORK / "mp"])
launch_seconds["model_parallel"] = mp.wall_s
print(*shell(mp))
assert shell(mp) == ["torchrun --standalone --nproc_per_node=2 runs/model_parallel.py --out $WORK/mp"]
mlines = mp.by_rank()
for r in (0, 1):  # DDP over ToyMpModel and tensor parallelism; the script's other lines are shown below
    print(*(f"[rank {r}] {line}" for line in mlines[r][:10]), sep="\n")
assert mlines[0][0].startswith(
    "DDP(mp_model, device_ids=[0]): ValueError: DistributedDataParallel device_ids "
    "and output_device arguments only work with single-device/multiple-device GPU modules or CPU modules, "
    "but got device_ids [0], output_device None, and module parameters {"
)
assert "ddp.device_ids = None" in mlines[0][1] and mlines[0][2].startswith("DDP over ToyMpModel")
assert (
    mlines[0][3] == "tp 0.weight (Shard(dim=0),) local (3, 4)"
    and mlines[0][5] == "tp 2.weight (Shard(dim=1),) local (4, 3)"
)
assert mlines[1][7].endswith("collectives forward {'all_reduce': 1}, forward + backward {'all_reduce': 2}")
assert mlines[1][8] == "tp output and gradients (parameters and input) equal the unsplit MLP"
assert (
    mlines[1][9]
    == "row-parallel Linear before the all-reduce: (Partial(sum),); local = partial product + bias / 2: True"
)

# %% [markdown]
# The column-parallel bias is sharded too (3 of the 6 hidden units on each rank). The row-parallel bias is
# stored `Replicate()`d (whole on each rank), but it is *not* added after the all-reduce: the second layer's
# product is a `Partial` (partial-sum) DTensor, and to add a replicated bias to it DTensor turns the bias into a
# `Partial` one as well, by dividing it by the mesh size. Each rank adds bias / 2 to its partial sum, and the
# all-reduce adds the halves back up (the script's last line checks that redistribution). The output is an
# `AsyncCollectiveTensor`: a tensor subclass whose all-reduce may still be in flight, waited for when it is
# first used. Forward needed **one** all-reduce (the partial sums of the second layer); backward needed one
# more, because the gradient with respect to the replicated input is again a sum of the two ranks' partial
# gradients (the input requires grad here, as it would coming from earlier layers). In a transformer block the
# same pair (attention's or the MLP's two projections) costs one all-reduce forward and one backward, in every
# block — which is why tensor parallelism stays inside a machine.
#
# The rest of the script's lines: DDP under autocast, and the pipeline.

# %%
for r in (0, 1):
    print(*(f"[rank {r}] {line}" for line in mlines[r][10:]), sep="\n")
for r in (0, 1):
    assert mlines[r][10] == (
        "DDP + autocast(bfloat16): output torch.bfloat16, weight torch.float32, grad torch.float32"
    )
assert mlines[0][11:] == ["pp stage 0 of 2 holds ['l1.weight', 'l1.bias']", "pp stage 0: gradients = unsplit Net's"]
assert mlines[1][11:] == [
    "pp stage 1 of 2 holds ['l2.weight', 'l2.bias', 'l3.weight', 'l3.bias']",
    "pp output (8, 3) and mean loss of 4 micro-batches = unsplit Net",
    "pp stage 1: gradients = unsplit Net's",
]

# %% [markdown]
# Rank 0 holds only `l1`, rank 1 only `l2` and `l3`; the pipeline's output, loss and every gradient equal the
# unsplit model's. The price of a pipeline is the **bubble** (流水线气泡): with p stages of equal cost and m
# micro-batches, GPipe keeps each stage busy for m of the m + p − 1 time slots of the forward (and again of the
# backward), so a fraction (p − 1)/(m + p − 1) of the time is idle: here (2 − 1)/(4 + 2 − 1) = 20 %. More
# micro-batches shrink it;
# `Schedule1F1B` has the same bubble but alternates one forward and one backward per stage, so a stage keeps at
# most p micro-batches' activations instead of all m; interleaved and zero-bubble schedules shrink the bubble
# further.
#
# **The error message, in full.** `DDP(..., device_ids=[0])` on a CPU module fails with "... only work with
# single-device/multiple-device GPU modules or CPU modules, but got device_ids [0], output_device None, and
# module parameters {device(type='cpu')}": read to the end, it says that `device_ids` is only for a module on
# **one GPU**; a CPU module, or one spread over several devices, takes `device_ids=None`. On this CPU the two
# halves of `ToyMpModel` share one device, so `is_multi_device_module` is `False`; with two GPUs per process it is
# `True`, and the rule is the same.

# %%
p_stages, m_micro = 2, 4
bubble = (p_stages - 1) / (m_micro + p_stages - 1)
print(f"GPipe bubble with {p_stages} stages and {m_micro} micro-batches: {bubble:.0%}")
for m in (1, 4, 16, 64):
    print(f"  {m:3} micro-batches: {(p_stages - 1) / (m + p_stages - 1):6.1%} idle")
assert bubble == 0.2

# %% [markdown]
# ## 5. `torch.compile` with DDP: graphs cut at bucket boundaries
#
# What this section needs of `torch.compile` (notebook 11 teaches it): Dynamo captures the Python forward as
# a graph of tensor operations (a `torch.fx.GraphModule`; code it cannot capture causes a *graph break*, ending
# one graph and starting the next), AOTAutograd derives the backward of each graph ahead of time, as one
# autograd node, and a *backend* compiles each graph: it is called as `backend(gm, example_inputs)` and
# returns the function to run; the default backend is Inductor, which generates kernels.
# `torch._dynamo.reset()` forgets every compiled graph, so that the next call compiles afresh.
#
# DDP overlaps communication with backward: gradients are grouped into buckets, and as soon as the
# autograd engine has produced every gradient of a **bucket** (桶), a hook starts its all-reduce while backward
# continues. In PyTorch 2.14 the first backward runs with a single bucket; DDP then rebuilds the buckets in the
# order the gradients arrived, each bucket filled until it reaches `bucket_cap_mb` (25 MiB by default) and the
# first one until 1 MiB when you leave `bucket_cap_mb` at its default (a value you set applies to the first bucket too). The script
# prints the eager DDP bucket sizes after the first and the second step, read with
# `model.reducer._get_zeros_like_grad_buckets()`: a private method (the leading underscore), fine for looking
# inside, not for code that must survive the next PyTorch release (the script checks that it is there and says what
# to use instead if a release removes it).
#
# A compiled model breaks the overlap: `torch.compile` turns the forward into one graph, and AOTAutograd's
# backward of it is one opaque autograd node that produces **all** gradients at once — no all-reduce could
# start before the whole backward is done.
#
# **DDPOptimizer** (`torch/_dynamo/backends/distributed.py`) fixes that. When Dynamo compiles a module inside a
# DDP forward, it walks the traced graph in reverse (the order gradients become ready), adds up parameter sizes
# up to DDP's `bucket_bytes_cap`, cuts the graph there, and compiles each piece separately: each piece's
# backward is its own autograd node, and the bucket's all-reduce can start when it finishes. It is on by
# default (`torch._dynamo.config.optimize_ddp = True`, i.e. `"ddp_optimizer"`; the script prints the default).
#
# The script wraps four `Linear(512, 512)` layers (1 MiB of weights each) in DDP with `bucket_cap_mb=1`, compiles
# with a backend that only records the graphs it is given (nothing is generated, so it is fast on a CPU), once
# with the default and once with `optimize_ddp = False`, and checks the gradients against eager DDP.

# %%
# %%writefile runs/compiled_ddp.py
"""Notebook 09, section 5: torch.compile of a DDP model; DDPOptimizer splits the graph at bucket boundaries."""
import argparse

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from utils.ddp.common import distributed, report, save_result

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()


class Deep(nn.Module):  # a module of our own: Dynamo does not trace into torch.nn's Sequential as a whole frame
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(512, 512) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def grads_after_one_step(optimize_ddp, graphs: list | None, bucket_cap_mb=1.0):
    torch._dynamo.reset()
    torch._dynamo.config.optimize_ddp = optimize_ddp
    torch.manual_seed(0)
    model = DDP(Deep().to(info.device), bucket_cap_mb=bucket_cap_mb)

    def recording_backend(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is torch._C._nn.linear))
        return gm.forward  # run the captured graph as it is

    run = torch.compile(model, backend=recording_backend) if graphs is not None else model
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(info.rank)).to(info.device)
    run(x).sum().backward()
    return [p.grad for p in model.parameters()]


def eager_bucket_bytes(bucket_cap_mb=None):
    """Sizes of an eager DDP model's gradient buckets after its first and its second backward."""
    kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    model = DDP(Deep().to(info.device), **kwargs)
    if not hasattr(model.reducer, "_get_zeros_like_grad_buckets"):  # private: it may move in a later release
        raise RuntimeError(
            f"PyTorch {torch.__version__} has no Reducer._get_zeros_like_grad_buckets, the private method this "
            "lesson reads the buckets with: a DDP communication hook (bucket.buffer()) shows them too"
        )
    sizes = []
    for _ in range(2):
        model(torch.randn(2, 512, device=info.device)).sum().backward()
        sizes.append([b.buffer().nbytes for b in model.reducer._get_zeros_like_grad_buckets()])
    return sizes


with distributed() as info:
    report(f"default torch._dynamo.config.optimize_ddp = {torch._dynamo.config.optimize_ddp}")
    for cap in (None, 1):
        first, second = eager_bucket_bytes(cap)
        report(f"eager DDP, bucket_cap_mb={cap}: bucket bytes after step 1 {first}, after step 2 {second}")
    eager = grads_after_one_step(True, None)
    for mode in (True, False):
        graphs = []
        compiled = grads_after_one_step(mode, graphs)
        for a, b in zip(compiled, eager):
            torch.testing.assert_close(a, b)
        report(f"optimize_ddp={mode}: {len(graphs)} graph(s), Linear layers in each: {graphs}; gradients = eager DDP")
    try:  # DDPOptimizer assumes DDP's default first bucket (1 MiB) is not larger than the others
        grads_after_one_step(True, [], bucket_cap_mb=0.25)
    except AssertionError as err:
        report(f"bucket_cap_mb=0.25: {type(err).__name__}: {err}")
    save_result(args.out, {"done": True})

# %%
comp = run_torchrun("runs/compiled_ddp.py", nproc=2, args=["--out", WORK / "compiled"])
launch_seconds["compiled_ddp"] = comp.wall_s
print(*shell(comp))
comp.print_ranks()
layer_bytes = 4 * (512 * 512 + 512)
for r in (0, 1):
    assert comp.by_rank()[r][:3] == [
        "default torch._dynamo.config.optimize_ddp = True",
        f"eager DDP, bucket_cap_mb=None: bucket bytes after step 1 {[4 * layer_bytes]}, "
        f"after step 2 {[layer_bytes, 3 * layer_bytes]}",
        f"eager DDP, bucket_cap_mb=1: bucket bytes after step 1 {[4 * layer_bytes]}, after step 2 {4 * [layer_bytes]}",
    ]
    assert comp.by_rank()[r][3:] == [
        "optimize_ddp=True: 4 graph(s), Linear layers in each: [1, 1, 1, 1]; gradients = eager DDP",
        "optimize_ddp=False: 1 graph(s), Linear layers in each: [4]; gradients = eager DDP",
        "bucket_cap_mb=0.25: AssertionError: First bucket should be smaller/equal to "
        "other buckets to get comms warmed up ASAP",
    ]

# %% [markdown]
# Eager DDP first: one bucket of all 4 layers (4 × 1,050,624 bytes, weights and biases) in the first step; from
# the second step on, the last layer alone in the first bucket (cap 1 MiB; closed by the first layer to reach it,
# at 1,050,624 bytes; its gradients arrive first) and the other
# three together by default, or one layer per bucket with `bucket_cap_mb=1`. The compiled model is cut the same
# way: one graph per bucket with DDPOptimizer, one graph for the whole model without it; the gradients are the same
# either way (the all-reduce is still DDP's), only *when* communication may start differs. With the real
# backend (`torch.compile(model)`, Inductor) each piece becomes its own compiled kernel set; the cut also limits
# how much Inductor can fuse across bucket boundaries, the price of overlap.
# DDPOptimizer always assumes DDP's default first bucket of 1 MiB, so a compiled DDP model with `bucket_cap_mb`
# below 1 fails at its first call with the assertion above (seen here in PyTorch 2.14.1).
#
# **FSDP2 and compile.** FSDP2's all-gathers and reduce-scatters run in hooks around each `fully_shard`ed module,
# so PyTorch's own large-model trainer (torchtitan) compiles each block and then shards it, leaving the
# communication between compiled regions (GPU code, not run here):
#
# ```python
# for block in model.layers:               # e.g. transformer blocks
#     block.compile()                      # torch.compile in place, one graph per block
#     fully_shard(block, mesh=mesh)
# fully_shard(model, mesh=mesh)
# ```

# %% [markdown]
# ## 6. Nothing left behind

# %%
print("processes still alive from this notebook's launches:", leftover_processes())
assert leftover_processes() == []
work.cleanup()

# %%
# NBVAL_IGNORE_OUTPUT
for name, seconds in launch_seconds.items():
    print(f"{name:16} {seconds:5.1f} s")
assert len(launch_seconds) == 3 and all(0 < s < 120 for s in launch_seconds.values())

# %% [markdown]
# ## Exercises (练习)
#
# Four exercises, easiest first: predict, write a function, write a program that runs on 2 processes, then a stretch
# that combines this notebook with notebook 06. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it
# and run it. The **check cell** below it then says *correct*, or *not yet* with a hint and the section to re-read,
# or *not attempted yet* while the stub is untouched. Exercises 1, 2 and 4 are tensor code, checked in a second or
# two; the check of exercise 3 launches your program with `torchrun` on 2 processes, as the lesson did (about 10 s,
# longer on a busy machine). This section does not depend on the lesson's cells: after a kernel restart, run its
# first cell and go on. `make progress` (without make, e.g. on Windows: `python tools/course.py progress`) lists
# which exercises of every notebook pass.

# %%
import torch
import torch.nn as nn

from utils.exercises import Checker

ex = Checker("09")

# %% [markdown]
# ### Exercise 1 · Bytes per rank under ZeRO-1/2/3, and ZeRO-3's traffic
#
# A model of **2 billion parameters** (Ψ = 2·10⁹) trains in float32 with Adam on **8 GPUs**. Predict, with the
# table of section 1, how many GB (10⁹ bytes) of weights, gradients and optimizer states each GPU holds under DDP,
# ZeRO-1, ZeRO-2 and ZeRO-3 (activations aside). Then: how much does one rank move per training step under
# ZeRO-3 (FSDP2 with the default `reshard_after_forward=True`), in units of Ψ, counted as section 1 counts DDP's
# 2Ψ?

# %%
# ✏️ Exercise 1: replace each ... with a number
ddp_gb = ...
zero1_gb = ...
zero2_gb = ...
zero3_gb = ...
zero3_traffic = ...  # in units of Ψ (one copy of the model)

# %%
ex.check(1, ddp_gb, zero1_gb, zero2_gb, zero3_gb, zero3_traffic)

# %% [markdown]
# ### Exercise 2 · FSDP2's padded dim-0 shard
#
# `fully_shard` (section 1) cuts every parameter along dimension 0 the way `torch.chunk` does — 3 rows on 2 ranks
# became 2 + 1 — and pads the smaller shards, so that the all-gather moves pieces of equal size. Write
# `fsdp_shard(param, rank, world_size)`: the padded shard that rank `rank` stores, of shape
# `(ceil(rows / world_size), *param.shape[1:])` and the parameter's dtype — its `torch.chunk` rows of `param`
# first, then rows of zeros — in memory of its own (not a view of `param`, which the rank then frees). Careful:
# `torch.chunk` may return *fewer* pieces than you ask for (try `torch.arange(5).chunk(4)`); a rank left without a
# piece has no real row and stores only padding.
#
# Then look at `torch.cat([fsdp_shard(w, r, 4) for r in range(4)])` for a 5-row `w`: what all-gathering the
# padded shards gives. Where is the padding, and how do you get `w` back?


# %%
# ✏️ Exercise 2: write the body of the function
def fsdp_shard(param: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    raise NotImplementedError("your code here")


# %%
ex.check(2, fsdp_shard)

# %% [markdown]
# ### Exercise 3 · Shard, save and reload a model on 2 processes
#
# Write the three pieces of section 1's and section 2's script that a training job of your own needs. The check
# writes this exercise's cell into a program, `runs/09_exercise3.py` (after `import torch` and `import torch.nn as
# nn`, so import in the cell whatever else your functions use), and launches it with `torchrun` on 2 processes. On
# each rank it builds a model of three `nn.Linear` layers, calls your `shard` (on a second model too, whose
# `nn.Linear` layers sit at other positions: find them with `model.modules()`, not by index), trains it for 2 Adam steps, calls your `save`, then your `load` on a checkpoint of the same
# layout that the check writes after your `save`, with every weight changed (so that only what `load` reads from its
# folder counts); finally it reads your checkpoint in this notebook's process, without a process group.
#
# * `shard(model, mesh)`: make each `nn.Linear` of `model` its own FSDP2 unit, then the whole model, on `mesh`
#   (a 1-D mesh of the 2 ranks), with `fully_shard`'s defaults; it returns nothing.
# * `save(model, optimizer, folder)`: write a distributed checkpoint of the sharded model and its Adam state into
#   `folder`, keyed like section 2's: `{"model": ..., "optim": ...}`, the optimizer's entries by parameter name.
# * `load(make_model, folder, mesh)`: return a new model that holds the checkpoint's weights, sharded on `mesh`
#   like `shard` does. `make_model()` builds the (unsharded) model; build it on the meta device, as a model too
#   big for one device would have to be, so that no rank ever holds the whole model or reads all of the checkpoint.


# %%
# ✏️ Exercise 3: write the bodies of the three functions (import here what they use; they run on 2 processes)
def shard(model: nn.Module, mesh) -> None:
    raise NotImplementedError("your code here")


def save(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str) -> None:
    raise NotImplementedError("your code here")


def load(make_model, folder: str, mesh) -> nn.Module:
    raise NotImplementedError("your code here")


# %%
ex.check(3, shard, save, load)

# %% [markdown]
# ### Exercise 4 · Reshard a checkpoint saved by 2 ranks onto 3 (stretch)
#
# Section 2 read a checkpoint written by 2 ranks into one process with `dcp.load`. Do the resharding by hand, for
# any number of ranks. `reshard(shards, world_size)` gets the state dicts the old ranks saved: `shards[r]` maps each
# key of section 2's checkpoint (`"model.0.weight"`, `"model.0.bias"`, ..., `"optim.state.2.weight.exp_avg"`) to
# rank r's `Shard(0)` piece — its `torch.chunk` rows, not padded: what `to_local()` returns and `dcp.save` writes —
# except `"optim.state.2.weight.step"`, Adam's step counter (notebook 06, section 5), a 0-dim tensor that every rank
# holds whole. Return `world_size` state dicts in the same layout for the new ranks. An empty shard keeps the other
# dimensions: shape `(0, 8)`, like `t[:0]`.
#
# The check reshards 2 → 3, 2 → 1, 4 → 2, 2 → 5 and 3 → 3, then loads the full state dict of 2 → 1 into a plain
# model with `load_state_dict`, as section 2 did. For more: do it the way DCP does, where each new rank copies
# only the rows of the old shards that overlap its own range, without building any full tensor.


# %%
# ✏️ Exercise 4: write the body of the function
def reshard(shards: list[dict[str, torch.Tensor]], world_size: int) -> list[dict[str, torch.Tensor]]:
    raise NotImplementedError("your code here")


# %%
ex.check(4, reshard)

# %% [markdown]
# ## Summary
#
# * **ZeRO** removes DDP's N copies: stage 1 shards the optimizer states, stage 2 also the gradients, stage 3
#   also the parameters (16Ψ → 16Ψ/N bytes per rank with float32 Adam). **FSDP2** (`fully_shard`) is PyTorch's
#   ZeRO-3: parameters become `DTensor`s with `Shard(0)` placement on a `DeviceMesh`; each unit is all-gathered
#   before its forward and again before its backward, and gradients are reduce-scattered (4 all-gathers and 2
#   reduce-scatters per step for 2 units, counted): 3Ψ of traffic against DDP's 2Ψ; `reshard_after_forward=False`
#   skips the backward all-gather at the price of memory. It runs on the CPU with gloo in PyTorch 2.14 and equals
#   one process on the whole batch.
# * **FSDP2 mixed precision**: `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`
#   gathers and computes in bfloat16, reduce-scatters gradients in float32, and keeps float32 shards and
#   gradients (run here on the CPU). DDP needs only notebook 07's `autocast`.
# * **Distributed checkpoints** (`torch.distributed.checkpoint`): `get_state_dict` + `dcp.save` let every rank
#   write its shards in parallel (`__0_0.distcp`, `__1_0.distcp`) with a `.metadata` file that maps chunks to
#   files; `dcp.load` (in place) reads them into any sharding — one process without a process group, or a
#   freshly `fully_shard`ed model (`get_model_state_dict` → `dcp.load` → `set_model_state_dict`) — and
#   `dcp_to_torch_save` makes one ordinary file.
# * A padded `DistributedSampler` repeats samples: evaluation metrics averaged over ranks are **biased** (0.5
#   instead of 0.4 above). Shard without padding and all-reduce counts; `drop_last=True` skips samples instead.
# * Split the **model** when a layer or its activations do not fit: tensor parallelism (`parallelize_module`,
#   `ColwiseParallel` + `RowwiseParallel`: one all-reduce per pair in forward and one in backward; the partial
#   sums are `Partial` DTensors, and the replicated bias is split into them) and pipeline parallelism
#   (`torch.distributed.pipelining`: `pipeline` + `SplitPoint` cut the model into stages, `ScheduleGPipe` runs
#   micro-batches through them; equal to the unsplit model; idle fraction (p − 1)/(m + p − 1)). DDP wraps a
#   multi-device model like `ToyMpModel` with `device_ids=None`.
# * `torch.compile` + DDP: **DDPOptimizer** cuts the graph at bucket boundaries so all-reduces overlap backward
#   (4 graphs instead of 1 above; eager DDP's buckets are rebuilt after the first step); with FSDP2, compile each
#   block before sharding it.

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# The study notes this course grew from were written for PyTorch 1.x. Where they touch this lesson's topics, this
# is what changed or needs correcting:
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | DataParallel, DDP and TorchElastic are data parallelism; RPC is *the* model parallelism | Model parallelism is mainly tensor parallelism (`DTensor`, `parallelize_module`) and pipeline parallelism (`torch.distributed.pipelining`); `torch.distributed.rpc` is a general remote-call framework, not the usual way to split a model | §4 · Splitting the model |
# | DDP with mixed precision goes through NVIDIA Apex (`amp.initialize`, `apex.parallel.DistributedDataParallel`) | `torch.autocast` (+ `GradScaler` for float16) inside a plain DDP loop; for sharded models FSDP2's `MixedPrecisionPolicy`, which runs on the CPU too | §1 · ZeRO and FSDP2 (mixed precision), §4 (DDP + autocast) |
# | `demo_model_parallel` (DDP over `ToyMpModel`) needs 2 GPUs per process, 8 GPUs for 4 processes | The same program runs with both halves on the CPU under gloo; `device_ids` must be `None` for CPU modules as well as multi-device ones | §4 · Splitting the model |
# | Model parallelism (`ToyMpModel`) is the answer when the model does not fit | One device's layers idle while the other works; sharding (FSDP2) keeps data parallelism and splits the memory, and pipelines need micro-batches to avoid the bubble | §1 · ZeRO and FSDP2, §4 · Splitting the model |

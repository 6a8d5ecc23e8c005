# %% [markdown]
# # 11 · Memory and speed (内存与速度)
#
# A model that does not fit in memory, or trains too slowly, is the everyday problem this lesson attacks. Each
# technique is measured or asserted, never just recommended. (The lesson grew out of a teacher's study notes on
# memory and speed tips for PyTorch 1.x; what changed since is listed in the last section.)
#
# **You will learn to**
#
# 1. trade computation for memory with **activation checkpointing** (激活重计算): count the saved activations with
#    saved-tensor hooks, find the √N optimum, read peak memory on CUDA, choose `use_reentrant=False`, and keep the
#    expensive matrix products with **selective activation checkpointing** (选择性激活重计算);
# 2. use an **in-place operation** (原地操作) such as `ReLU(inplace=True)` and say what it does and does not save;
# 3. keep the model fed: DataLoader **worker processes**, `persistent_workers`, pinned memory, `channels_last`;
# 4. compile with **`torch.compile`**: a whole training step, its **graph breaks** (图中断), recompiles for new
#    shapes, the logs and stances that show and control them, the compile modes, and the **operator fusion**
#    (算子融合) it buys;
# 5. fold **Conv+BN** into one convolution for inference;
# 6. **quantise** (量化) Linear layers to int8 with torchao, and measure what that buys in size and in speed;
# 7. **profile** (性能剖析): operators with `torch.profiler` (a trace file, memory), FLOPs with `FlopCounterMode`,
#    Python code with `cProfile`.
#
# **You should know:** autograd and a training loop (notebooks 02–04); hooks (notebook 03) help in section 1.
# `zero_grad(set_to_none=True)` and why optimizers skip `None` gradients are in [notebook 02](02_autograd.ipynb),
# §4; the in-place errors of autograd in [notebook 03](03_dynamic_graphs_and_hooks.ipynb), §8; worker processes
# and samplers in [notebook 04](04_mnist_cnn.ipynb), §3–5.
#
# **Study time:** about 130 min (20 of them for the exercises). The first run on a machine spends about 15 s more than
# later runs while Inductor builds its C++ kernels (it keeps them on disk).
#
# **On a GPU:** activation memory is also measured with `torch.cuda.max_memory_allocated`, batches are pinned and
# copied with `non_blocking=True`, Inductor generates Triton kernels, and the profiled optimizer step shows the
# foreach implementation that `torch.optim` picks on CUDA. The stored outputs were made on the CPU.

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
# Besides the imports, five settings that quiet or speed up tools used later (each line says why):

# %%
import contextlib
import copy
import cProfile
import inspect
import io
import logging
import math
import os
import pstats
import time
import timeit
import warnings

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # the profiler's C++ library (Kineto) prints status lines otherwise

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from utils import get_device, seed_everything  # noqa: E402
from utils.data import SlowImages  # noqa: E402

inductor_config.compile_threads = 1  # on 2 cores a pool of compile worker processes costs more than it saves
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "No CUDA runtime is found" on CPU machines
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao's import logs torch-internal deprecations
logging.getLogger("torch._dynamo.variables.ctx_manager").setLevel(logging.ERROR)  # "record_function ... ignored"
seed_everything(0)
device = get_device()
print("torch", torch.__version__.split("+")[0], "| device:", device.type)

# %% [markdown]
# ## 1. Activation checkpointing (激活重计算)
#
# During the forward pass autograd **saves** the tensors each backward formula needs (the "activations"): for a
# chain of N layers that is O(N) memory, and it grows with the batch size, so for large batches and images it is
# often far more than the weights. **Activation checkpointing**, also
# called activation recomputation (激活重计算; older Chinese texts say "checkpoint 技术"), keeps only the inputs of some
# segments and recomputes the rest during `backward()`. It has nothing to do with the training checkpoints
# (检查点) of [notebook 06](06_save_load_checkpoints.ipynb), files that save a run's state to disk: here nothing
# is written anywhere, memory is traded for computation inside one step. The idea comes from "Training Deep Nets
# with Sublinear Memory Cost" (Chen et al., 2016): with √N segments of √N layers each, you keep √N segment inputs
# plus one segment's activations while it is recomputed, O(√N) memory for about one extra forward pass.
#
# ### 1.1 Saved activations, counted
#
# How much does autograd save? `torch.autograd.graph.saved_tensors_hooks(pack, unpack)` calls `pack` on every
# tensor saved for backward (notebook 03 introduces hooks). We add up the bytes of each distinct storage,
# skipping the parameters (they exist anyway). That measures activation memory on the CPU, where there are no
# allocator statistics; on CUDA `torch.cuda.max_memory_allocated` measures it too (below).
#
# `torch.utils.checkpoint.checkpoint_sequential(model, segments, x, use_reentrant=False)` checkpoints all segments
# but the last. Section 1.3 shows why `use_reentrant=False` is passed.

# %%
from torch.utils.checkpoint import checkpoint, checkpoint_sequential


@contextlib.contextmanager
def saved_activation_bytes(model):
    """Count the bytes of the distinct non-parameter tensors autograd saves inside the block."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    result = {}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield result
    result["bytes"] = sum(storages.values())


def deep_mlp(n_layers, width=256):
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(n_layers)]).to(device)


seed_everything(0)
n_layers, batch, width = 16, 128, 256
deep = deep_mlp(n_layers)
x = torch.randn(batch, width, device=device)
forward_calls = 0


def count_call(module, args, output):
    global forward_calls
    forward_calls += 1


for blk in deep:
    blk[0].register_forward_hook(count_call)  # counts the Linear layers' forward passes


def run(segments):
    global forward_calls
    forward_calls = 0
    deep.zero_grad()
    with saved_activation_bytes(deep) as saved:
        if segments is None:
            out = deep(x)
        else:
            out = checkpoint_sequential(deep, segments, x, use_reentrant=False)
    out.square().mean().backward()
    return saved["bytes"], forward_calls, [p.grad.clone() for p in deep.parameters()]


def same_grads(grads_a, grads_b):
    """Bit-for-bit on the CPU; CUDA kernels may pick another summation order when rerun."""
    if device.type == "cpu":
        return all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
    return all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(grads_a, grads_b))


act = batch * width * 4  # bytes of one activation
plain_bytes, plain_calls, plain_grads = run(None)
print(
    f"no checkpointing: {plain_bytes / 2**10:.0f} KiB saved = {plain_bytes / act:.0f} activations, "
    f"{plain_calls} Linear forwards"
)
for segments in (2, 4, 8):
    saved_bytes, calls, grads = run(segments)
    same = same_grads(grads, plain_grads)
    print(
        f"{segments} segments:      {saved_bytes / 2**10:.0f} KiB saved = {saved_bytes / act:.0f} activations, "
        f"{calls} Linear forwards, same gradients: {same}"
    )
    assert same and saved_bytes < plain_bytes
    assert calls == n_layers + (n_layers - n_layers // segments)  # every checkpointed Linear runs twice
assert run(4)[0] == 8 * act  # sqrt(16) = 4 segments: 3 kept inputs + the last segment (4 outputs + its input)

# %% [markdown]
# Sixteen layers need 17 saved activations (the input and every `Tanh` output; each `Linear` saves its input, which
# is the previous output). With 4 segments only 8 remain, and the gradients are bit-for-bit identical. The cost is
# the recomputation: 12 extra `Linear` forwards: every checkpointed `Linear` runs twice, because the last tensor
# a segment saves is its final `Tanh`'s output, saved only after that `Tanh` has computed it, so recomputation
# must rerun the whole segment (section 1.4 shows a block where it stops earlier). Too many segments keep too many boundaries, too few make the
# unfinished last segment (and the one being recomputed) large: the sum k + N/k is smallest at k = √N. The plot
# measures this for N = 16 and N = 64.

# %%
segment_counts = {}
for n in (16, 64):
    deep_n = deep_mlp(n)
    xs = torch.randn(batch, width, device=device)
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= n]
    measured = []
    for k in ks:
        with saved_activation_bytes(deep_n) as saved:
            out = checkpoint_sequential(deep_n, k, xs, use_reentrant=False)
        measured.append(saved["bytes"] / act)
        del out
    segment_counts[n] = (ks, measured)
    best = ks[int(np.argmin(measured))]
    print(
        f"N={n:2}: saved activations per segment count {dict(zip(ks, [int(m) for m in measured]))}"
        f" -> best k={best} (sqrt(N)={math.isqrt(n)})"
    )
    assert best == math.isqrt(n)
fig, ax = plt.subplots(figsize=(6, 3))
for n, (ks, measured) in segment_counts.items():
    ax.plot(ks, measured, "o-", label=f"N = {n} layers")
    ax.axvline(math.isqrt(n), ls=":", color="gray")
ax.set(
    xscale="log",
    xlabel="segments k (dotted: sqrt(N))",
    ylabel="saved activations",
    title="checkpoint_sequential: memory is smallest at k = sqrt(N)",
)
ax.set_xticks([1, 2, 4, 8, 16, 32, 64], labels=["1", "2", "4", "8", "16", "32", "64"])
ax.legend()
plt.show()

# %% [markdown]
# ### 1.2 Peak memory on CUDA
#
# On CUDA the same comparison can be read from the **caching allocator** (缓存分配器), PyTorch's manager of GPU
# memory: it requests large blocks from the CUDA driver, hands pieces of them to tensors, and keeps the pieces of
# freed tensors for reuse instead of returning them to the driver (asking the driver is slow). Its statistics
# say how much memory tensors use: `torch.cuda.reset_peak_memory_stats()`,
# then `torch.cuda.max_memory_allocated()` is the largest amount of memory held by live tensors since the reset
# (older code calls `reset_max_memory_allocated`, the deprecated name). Mind *when* the peak happens. With the shape above
# the 16 weight gradients (16 × 257 KiB = 4.0 MiB) outweigh the saved activations (17 × 128 KiB = 2.1 MiB), so
# both runs would peak at the end of `backward()`, when every gradient exists and most activations are freed,
# and checkpointing would hardly change the peak. Two fixes, both used below: read the peak **after the
# forward pass** (activations saved, no gradients yet), and use an activation-heavy batch (4096 rows: one
# activation is 4 MiB, 17 of them 68 MiB against 4 MiB of gradients). Counting activations: the plain forward
# holds 16 `Tanh` outputs plus one transient `Linear` output (about 17 × 4 MiB); with 4 segments, 3 segment
# inputs plus the last segment's 4 outputs plus transients (about 9 × 4 MiB). Over the whole step the
# checkpointed run peaks while a segment is recomputed (about 11 activations against 19). The asserts leave
# room around those ratios (0.53 and 0.6). On the CPU the saved-tensor count above is the measurement (the
# CPU allocator keeps no peak statistics; section 7.1's `profile_memory=True` records CPU allocations per operator).
#
# Two habits from older tuning guides, and what they really do. `torch.cuda.empty_cache()` hands cached but unused
# blocks back to the driver, so `nvidia-smi` (or `gpustat`) shows less memory in use, but it does not change what the
# program needs at its peak: the caching allocator would have reused those blocks anyway. `del out` (or `del loss`)
# frees memory only when it drops the **last reference** to a tensor: a Python name that still points at the output
# of the previous iteration keeps that output, and through its `grad_fn` the whole saved graph, alive while the next
# forward pass runs. That is why the code below deletes `out` once it is done with it. For a picture of where the
# memory goes over time, `torch.cuda.memory._record_memory_history()` and `torch.cuda.memory._dump_snapshot(path)`
# (private, but the documented way) record every allocation for the viewer at pytorch.org/memory_viz.


# %%
def cuda_peaks_mib(segments, inputs):
    """Peak memory above the starting point (weights, inputs): after the forward, and over the whole step."""
    deep.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()  # the weights and the input
    torch.cuda.reset_peak_memory_stats()
    out = deep(inputs) if segments is None else checkpoint_sequential(deep, segments, inputs, use_reentrant=False)
    torch.cuda.synchronize()
    after_forward = torch.cuda.max_memory_allocated() - start
    out.square().mean().backward()
    del out
    torch.cuda.synchronize()
    whole_step = torch.cuda.max_memory_allocated() - start
    return after_forward / 2**20, whole_step / 2**20


if device.type == "cuda":
    x_heavy = torch.randn(4096, width, device=device)
    for segments in (None, 4):
        cuda_peaks_mib(segments, x_heavy)  # warm-up: cuBLAS workspaces and cached blocks exist before measuring
    (plain_fwd, plain_step), (ckpt_fwd, ckpt_step) = cuda_peaks_mib(None, x_heavy), cuda_peaks_mib(4, x_heavy)
    print(
        f"CUDA peak after forward: {plain_fwd:.0f} MiB without, {ckpt_fwd:.0f} MiB with 4 segments | "
        f"whole step: {plain_step:.0f} MiB without, {ckpt_step:.0f} MiB with"
    )
    assert ckpt_fwd < 0.7 * plain_fwd and ckpt_step < 0.8 * plain_step
    reserved = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()  # returns unused cached blocks to the driver: nvidia-smi shows less
    print(f"empty_cache: reserved {reserved / 2**20:.0f} -> {torch.cuda.memory_reserved() / 2**20:.0f} MiB")
    assert torch.cuda.memory_reserved() <= reserved
else:
    print("CPU run: torch.cuda.max_memory_allocated needs a GPU; the saved-tensor count above is the CPU measure")

# %% [markdown]
# ### 1.3 Random numbers, and `use_reentrant`
#
# `checkpoint` also works on any function, and `preserve_rng_state=True` (the default) replays the random number
# generator during recomputation, so Dropout drops the same elements twice and the gradients still match.

# %%
seed_everything(0)
block = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 32)).to(device)
inp = torch.randn(8, 32, device=device)
grads = []
for use_ckpt in (False, True):
    block.zero_grad()
    torch.manual_seed(123)
    out = checkpoint(block, inp, use_reentrant=False) if use_ckpt else block(inp)
    out.sum().backward()
    grads.append([p.grad.clone() for p in block.parameters()])
print("with Dropout inside, checkpointed gradients equal the plain ones:", same_grads(*grads))
assert same_grads(*grads)

# %% [markdown]
# `checkpoint` has two implementations. The old **reentrant** one (`use_reentrant=True`) runs the segment under
# `no_grad` and, in backward, recomputes it inside a nested (re-entered) `backward()` call; it only passes
# gradients to the segment's **tensor inputs that require grad**, so when no input requires grad (a network's
# first segment gets the data, which does not) the parameters inside that segment get no gradient, and only a
# warning says so.
# It also does not work with `torch.autograd.grad`. The **non-reentrant** one (`use_reentrant=False`) records
# the segment with saved-tensor hooks that drop each saved tensor and recompute it on demand: gradients reach
# every parameter, `autograd.grad` works, and recomputation stops as soon as the needed tensors exist. PyTorch
# recommends it.
#
# What does PyTorch 2.14 do when the argument is left out? `torch/utils/checkpoint.py` still falls back to the
# reentrant implementation and issues a `UserWarning`, whose text announces an exception "in version 2.9" that
# 2.14 has not introduced. The cell records the warnings (the reentrant run adds a second one, that
# no input requires grad) and shows the lost gradients: the first segment's four parameter tensors.

# %%
small = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4)]).to(device)
inp = torch.randn(2, 8, device=device)  # data: requires_grad is False
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    checkpoint_sequential(small, 2, inp).sum().backward()  # use_reentrant not passed
missing_default = [p.grad is None for p in small.parameters()]
small.zero_grad(set_to_none=True)
checkpoint_sequential(small, 2, inp, use_reentrant=False).sum().backward()
missing_non_reentrant = [p.grad is None for p in small.parameters()]
for w in caught:
    print(f"{w.category.__name__}: {str(w.message).split('. ')[0]}.")
print("parameters without a gradient, argument left out (reentrant):", sum(missing_default), "of 8")
print("parameters without a gradient, use_reentrant=False:          ", sum(missing_non_reentrant), "of 8")
announced = [str(w.message) for w in caught if "use_reentrant parameter should be passed explicitly" in str(w.message)]
assert announced and "In version 2.9 we will raise an exception" in announced[0]
assert tuple(int(v) for v in torch.__version__.split(".")[:2]) > (2, 9)  # and yet it only warns
assert missing_default == [True] * 4 + [False] * 4 and not any(missing_non_reentrant)

# %% [markdown]
# ### 1.4 Selective activation checkpointing: keep the matrix products
#
# Plain checkpointing recomputes *everything* in a segment, the expensive matrix products included: one extra
# forward pass. Yet most saved tensors are usually the outputs of cheap element-wise operations (activations,
# normalisations, the eight steps of a hand-written GELU), and the matrix products are where the time goes.
# **Selective activation checkpointing** (选择性激活重计算, SAC) decides per operator: a **policy** function is
# called for every **ATen** operator inside the checkpointed region (ATen is PyTorch's C++ tensor library: every
# `torch` function and `Tensor` method ends in calls to its operators, named `aten::add`, `aten::addmm`, ... and
# reachable from Python as `torch.ops.aten.add`, ...). The policy returns a `CheckpointPolicy` value; of the six
# (`MUST_` or `PREFER_` with `SAVE`, `RECOMPUTE` or `CPU_OFFLOAD`) this lesson uses two: `MUST_SAVE` (keep the
# operator's output) and `PREFER_RECOMPUTE` (drop it, recompute it in backward).
# `create_selective_checkpoint_contexts(policy)` turns the policy into the pair of contexts that `checkpoint`
# accepts as `context_fn` (a function returning them, hence `functools.partial`).
#
# We compare three ways to train one Linear → hand-written GELU → Linear block. Two measurements: the saved
# activations (section 1.1's counter; `respect_saved_tensors_hooks=True` routes the tensors SAC keeps through our
# hook too, otherwise SAC stores them aside and PyTorch 2.14 warns that this will change), and the **FLOPs**
# (floating-point operations) of the backward pass, counted by `torch.utils.flop_counter.FlopCounterMode`, which
# adds up the FLOPs of every matrix product run inside its block (section 7 uses it again).

# %%
import functools  # noqa: E402

from torch.utils.checkpoint import (  # noqa: E402
    CheckpointPolicy,
    create_selective_checkpoint_contexts,
    set_checkpoint_early_stop,
)
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402


class GeluBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 1024), nn.Linear(1024, 64)

    def forward(self, x):
        h = self.fc1(x)
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))  # GELU, tanh form
        return self.fc2(h)


def keep_matmuls(ctx, op, *args, **kwargs):
    """SAC policy: save the outputs of matrix products, recompute everything else."""
    if op in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


seed_everything(0)
gelu_block = GeluBlock().to(device)
x_gelu = torch.randn(256, 64, device=device)
act_gelu = 256 * 1024 * 4  # bytes of one 256 x 1024 float32 activation
sac_results = {}
for name in ("no checkpointing", "full checkpoint", "selective (SAC)"):
    gelu_block.zero_grad()
    with saved_activation_bytes(gelu_block) as saved:
        if name == "no checkpointing":
            out = gelu_block(x_gelu)
        elif name == "full checkpoint":
            out = checkpoint(gelu_block, x_gelu, use_reentrant=False)
        else:
            sac_context = functools.partial(create_selective_checkpoint_contexts, keep_matmuls)
            out = checkpoint(
                gelu_block, x_gelu, use_reentrant=False, context_fn=sac_context, respect_saved_tensors_hooks=True
            )
    with FlopCounterMode(display=False) as flops:
        out.square().mean().backward()
    sac_results[name] = (
        saved["bytes"] / act_gelu,
        flops.get_total_flops(),
        [p.grad.clone() for p in gelu_block.parameters()],
    )
    print(
        f"{name:17}: {saved['bytes'] / act_gelu:4.2f} activations saved | backward {flops.get_total_flops() / 1e6:5.1f} MFLOP"
    )
(plain_act, plain_flops, plain_g), (full_act, full_flops, full_g), (sac_act, sac_flops, sac_g) = sac_results.values()
gelu_block.zero_grad()
with set_checkpoint_early_stop(False):  # needed only around the forward pass
    out = checkpoint(gelu_block, x_gelu, use_reentrant=False)
with FlopCounterMode(display=False) as flops:
    out.square().mean().backward()
no_early_stop_flops = flops.get_total_flops()
print(f"full checkpoint, early stop off: backward {no_early_stop_flops / 1e6:5.1f} MFLOP")
one_product = 2 * 256 * 64 * 1024  # FLOPs of one forward matrix product of the block (fc1's or fc2's)
assert plain_flops == 3 * one_product  # backward: two products for fc2 (its input's and weight's grads), one for fc1
assert full_flops == plain_flops + one_product  # early stop: only fc1's product is recomputed
assert no_early_stop_flops == plain_flops + 2 * one_product  # both products rerun
assert sac_flops == plain_flops  # SAC recomputes no matrix product
assert full_act < sac_act < 0.3 * plain_act  # memory: full < SAC, and SAC well below no checkpointing
assert same_grads(plain_g, full_g) and same_grads(plain_g, sac_g)

# %% [markdown]
# Without checkpointing the block saves about five 256 × 1024 activations (the GELU's intermediate results); a full
# checkpoint saves only the small input, but its backward recomputes `fc1`'s product: a third more FLOPs (the
# backward's own three products plus one). `fc2`'s product is not recomputed, because recomputation stops once the
# last tensor the block saves exists (early stopping, section 1.3): `fc2` saves its input *before* running its
# product, so that product is never needed again. With `set_checkpoint_early_stop(False)` both products rerun, for
# two-thirds more (the last line of the output). SAC keeps one large activation, `fc1`'s output, and its backward costs exactly as many FLOPs as no
# checkpointing: only the cheap element-wise GELU steps are recomputed. Same gradients in all three cases. This is
# the trade large language model training makes (a typical policy saves the matrix products and attention outputs).
# `torch.compile` can make a similar choice automatically (`torch._functorch.config.activation_memory_budget`), and
# `torch.autograd.graph.save_on_cpu()` is a third option: keep every activation, but in (pinned) CPU memory,
# copied back to the GPU in backward.

# %% [markdown]
# ## 2. In-place operations (原地操作)
#
# `nn.ReLU(inplace=True)` overwrites its input instead of allocating a new output tensor. When is that allowed?
# Only when backward does not need the overwritten values: ReLU's derivative can be computed from its **output**
# (`y > 0`), so its input may be destroyed. Autograd checks this with a **version counter** (版本计数器) on every
# tensor: each in-place write bumps `t._version` (a private attribute, fine for inspection), and `backward()`
# refuses to use a saved tensor whose version changed. The refusals (a `sigmoid` output modified in place, an
# in-place operation on a leaf) are shown in [notebook 03](03_dynamic_graphs_and_hooks.ipynb), §8.
#
# What does it save? Not what section 1 counted. ReLU saves its output either way, and the `BatchNorm1d` before it
# in the stack measured below (or a `Linear`, in a network without normalisation) saves its own *input*, not its
# output; so the tensors autograd keeps for backward are the same with and without
# `inplace=True` (the cell measures it). What in-place saves is one **transient** allocation: the pre-activation
# tensor and the ReLU output share memory instead of both existing for a moment, which lowers the peak of the
# forward pass, and in inference (`torch.no_grad()`, nothing saved) it halves the memory of that step. A common
# recipe in older code switches every ReLU of a model to in-place with `model.apply(...)` and a test on the class
# *name* (`classname.find('ReLU') != -1`); an `isinstance` test is more robust (it does not match `ReLU6` or
# `LeakyReLU` by accident, and it follows subclasses).

# %%
seed_everything(0)
lin = nn.Linear(8, 8)
x = torch.randn(4, 8)
h = lin(x)
version = h._version
out = F.relu(h, inplace=True)
print("in-place ReLU wrote into its input:", out.data_ptr() == h.data_ptr(), "| version", version, "->", h._version)
out.sum().backward()
grad_inplace = lin.weight.grad.clone()
lin.zero_grad()
F.relu(lin(x)).sum().backward()
torch.testing.assert_close(grad_inplace, lin.weight.grad)


def inplace_relu(module):
    if isinstance(module, nn.ReLU):
        module.inplace = True


cnn = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Sequential(nn.Conv2d(8, 8, 3), nn.ReLU()))
cnn.apply(inplace_relu)
print("ReLUs switched to in-place:", [m.inplace for m in cnn.modules() if isinstance(m, nn.ReLU)])
assert all(m.inplace for m in cnn.modules() if isinstance(m, nn.ReLU))

saved_kib = {}
for inplace in (False, True):
    seed_everything(0)
    stack = nn.Sequential(
        *[nn.Sequential(nn.Linear(256, 256), nn.BatchNorm1d(256), nn.ReLU(inplace=inplace)) for _ in range(4)]
    )
    with saved_activation_bytes(stack) as saved:
        stack(torch.randn(128, 256)).sum().backward()
    saved_kib[inplace] = saved["bytes"] / 2**10
print(f"saved for backward: {saved_kib[False]:.0f} KiB with ReLU(), {saved_kib[True]:.0f} KiB with ReLU(inplace=True)")
assert saved_kib[False] == saved_kib[True]

# %% [markdown]
# ## 3. DataLoader throughput, pinned memory, `cudnn.benchmark`, `channels_last`
#
# Speed starts with **data loading** (数据加载): reading and decoding files in the main process leaves
# the model waiting. **`num_workers=k`** starts k processes that prepare batches in parallel;
# **`persistent_workers=True`** keeps them alive between epochs instead of starting new ones each epoch;
# **`batch_size`** sets how much work each transfer carries; **`pin_memory=True`** puts batches in page-locked
# host memory, **pinned memory** (固定内存), which a GPU can copy from asynchronously.
#
# We use a synthetic image data set that spends 1 ms per sample "reading a file" (a sleep, so the measurement does
# not depend on how busy the shared CPU is) and reports which process loaded each sample. It lives in
# `utils/data.py` because worker processes started with `spawn` (macOS, Windows) must import the data set by name
# ([notebook 04](04_mnist_cnn.ipynb), §5); `benchmarks/dataloader_throughput.py` runs the full sweep with it. Its
# `__getitem__`, and the timer used below:

# %%
print(inspect.getsource(SlowImages.__getitem__))


def samples_per_second(loader):
    """One pass over the loader: samples delivered per second of wall-clock time."""
    start, count = time.perf_counter(), 0
    for batch in loader:
        count += len(batch[0])
    return count / (time.perf_counter() - start)


image, label, pid = SlowImages(4)[1]
print(tuple(image.shape), label, "loaded by this process:", pid == os.getpid())
assert image.shape == (3, 32, 32) and label == 1

# %% [markdown]
# A small table, measured now (the numbers depend on the machine, so the cell asserts instead). The first epoch
# includes starting the worker processes; the second shows the steady state, where two workers roughly double
# the rate of the main process alone because their waiting overlaps.

# %%
# NBVAL_IGNORE_OUTPUT
rates = {}
print("batch_size  num_workers  samples/s epoch 1  epoch 2")
for batch_size in (32, 128):
    for workers in (0, 2):
        loader = DataLoader(
            SlowImages(512, io_ms=1),
            batch_size=batch_size,
            num_workers=workers,
            persistent_workers=workers > 0,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),
        )
        epoch1, epoch2 = samples_per_second(loader), samples_per_second(loader)
        rates[batch_size, workers] = epoch2
        print(f"{batch_size:10}  {workers:11}  {epoch1:16.0f}  {epoch2:7.0f}")
        del loader
# The exact ratio depends on the machine and its load (benchmarks/dataloader_throughput.py measures it side by
# side); that overlapping waits make two workers faster at all is what this cell checks.
for batch_size in (32, 128):
    assert rates[batch_size, 2] > rates[batch_size, 0]

# %% [markdown]
# Which processes loaded the samples over three epochs? Without `persistent_workers` every epoch starts fresh
# worker processes (six process ids for two workers); with it the same two serve every epoch.

# %%
for workers, persistent in ((0, False), (2, False), (2, True)):
    loader = DataLoader(SlowImages(8), batch_size=4, num_workers=workers, persistent_workers=persistent)
    pids = {int(p) for _ in range(3) for *_, batch_pids in loader for p in batch_pids}
    print(f"num_workers={workers} persistent_workers={persistent!s:5}: {len(pids)} distinct loading process(es)")
    assert len(pids) == {(0, False): 1, (2, False): 6, (2, True): 2}[workers, persistent]
    del loader

# %% [markdown]
# **On a GPU.** `pin_memory=True` makes the DataLoader return page-locked batches, and
# `batch.to("cuda", non_blocking=True)` then returns immediately while the copy runs, so the copy of the next
# batch overlaps the computation on the current one (on the CPU there is nothing to copy, and `pin_memory=True`
# only warns). `torch.backends.cudnn.benchmark = True` times several convolution algorithms on the first batch of
# each input shape and keeps the fastest: good for fixed shapes, wasted for shapes that change every batch, and
# not bit-for-bit repeatable from run to run ([notebook 12](12_reproducibility.ipynb), §2). `channels_last` stores
# images as N, H, W, C in memory (the logical shape stays N, C, H, W), the layout tensor cores prefer; on the CPU
# we can still check the strides and that the results agree.

# %%
images = torch.randn(8, 3, 32, 32)
nhwc = images.contiguous(memory_format=torch.channels_last)
print("shape", tuple(nhwc.shape), "| strides NCHW", images.stride(), "-> channels_last", nhwc.stride())
conv = nn.Conv2d(3, 16, 3, padding=1)
conv_cl = copy.deepcopy(conv).to(memory_format=torch.channels_last)
torch.testing.assert_close(conv_cl(nhwc), conv(images), atol=1e-5, rtol=1e-5)
if device.type == "cuda":
    torch.backends.cudnn.benchmark = True
    batch = images.pin_memory()
    on_gpu = batch.to(device, non_blocking=True)  # returns before the copy finishes
    out = conv_cl.to(device)(on_gpu.contiguous(memory_format=torch.channels_last))
    torch.cuda.synchronize()
    torch.backends.cudnn.benchmark = False
    print("pinned:", batch.is_pinned(), "| non_blocking copy and channels_last conv on", out.device.type)
else:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        next(iter(DataLoader(SlowImages(2), pin_memory=True)))
    assert any("pin_memory" in str(w.message) for w in caught)
    print("CPU run: pin_memory=True only warns; non_blocking copies and cudnn.benchmark act when a GPU is present")

# %% [markdown]
# ## 4. `torch.compile`
#
# Eager PyTorch builds its graph anew on every call (a **dynamic graph**, 动态图, notebook 03): any Python control
# flow works, but each operation runs on its own, with no chance to optimise across operations. Frameworks with a
# **static graph** (静态图) build the graph once and can then optimise it as a whole, for instance fuse a convolution
# with the ReLU after it. `torch.compile` gives PyTorch the second without giving up the first.
# `torch.compile(fn)` turns Python into graphs in three stages: **TorchDynamo** reads the function's bytecode as
# it runs and captures the PyTorch operations into **FX graphs** (`torch.fx.Graph`: a list of nodes, one per
# operation, each naming its function and its inputs, which Python code can read and rewrite); **AOTAutograd** traces each graph's backward ahead
# of time, so the backward pass runs compiled code too; a **backend** turns the graphs into code. The default
# backend, **Inductor**, generates fused kernels (C++/OpenMP on the CPU, Triton on GPUs); `backend="eager"` and
# `backend="aot_eager"` stop after capture (and after AOTAutograd) and run the graphs with ordinary PyTorch
# operators, which is all we need to study graphs and costs far less time to compile. Whatever Dynamo cannot
# capture (unsupported Python, some library calls) causes a **graph break** (图中断): the graph so far is
# compiled, the offending code runs as plain Python, and a new graph starts after it.
#
# ### 4.1 Compiling a training step, and its graph breaks
#
# A whole training step, forward + loss + `backward()` + `optimizer.step()`, compiled with `aot_eager`. To see
# what gets compiled, we build the backend with `aot_autograd` and two compilers that count the forward and the
# backward graphs they are given, then run three steps next to an eager copy of the same model. (`aot_autograd`,
# `make_boxed_func` and the `counters` dictionary are internals of `torch._dynamo` and `torch._functorch`, good for
# looking inside; section 4.4 shows the public switches for your own code.)

# %%
import torch._dynamo  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch._functorch.aot_autograd import make_boxed_func  # noqa: E402

graphs_compiled = {"forward": 0, "backward": 0}


def counting_compiler(kind):
    def compiler(graph_module, example_inputs):
        graphs_compiled[kind] += 1
        return make_boxed_func(graph_module.forward)  # run the graph as it is, like aot_eager

    return compiler


counting_backend = aot_autograd(fw_compiler=counting_compiler("forward"), bw_compiler=counting_compiler("backward"))


def train_step(model, optimizer, xb, yb):
    loss = F.mse_loss(model(xb), yb)
    loss.backward()
    optimizer.step()
    return loss


seed_everything(0)
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
net_eager = copy.deepcopy(net)
opt, opt_eager = torch.optim.SGD(net.parameters(), lr=0.1), torch.optim.SGD(net_eager.parameters(), lr=0.1)
compiled_step = torch.compile(train_step, backend=counting_backend)
torch._dynamo.reset()
counters.clear()
for xb, yb in zip(torch.randn(3, 32, 8), torch.randn(3, 32, 1)):
    opt.zero_grad()
    compiled_step(net, opt, xb, yb)
    opt_eager.zero_grad()
    train_step(net_eager, opt_eager, xb, yb)
for p, q in zip(net.parameters(), net_eager.parameters()):
    torch.testing.assert_close(p, q)
print("graphs compiled:", graphs_compiled, "| graph breaks:")
breaks = {reason.splitlines()[0]: n for reason, n in counters["graph_break"].items()}
for reason, n in breaks.items():
    print(f"  {n} x {reason}")
print("after 3 steps the parameters equal the eager run's (within float rounding)")
assert graphs_compiled == {"forward": 2, "backward": 1}
assert breaks == {"Unsupported Tensor.backward() call": 1, "Call to `torch._dynamo.graph_break()`": 2}

# %% [markdown]
# Two forward graphs and one backward graph, from three graph breaks:
#
# * `loss.backward()` is not traced (Dynamo does not capture the autograd engine by default). Graph 1 is
#   forward + loss; `backward()` runs in Python, but what it executes is the **backward graph that AOTAutograd
#   compiled** for graph 1, so the backward pass is compiled after all.
# * `optimizer.step()` breaks the graph on purpose, twice: `torch/optim/optimizer.py` calls
#   `torch._dynamo.graph_break()` before and after the update so that the update is captured as its own graph
#   with gradients disabled (an inference graph AOTAutograd can update in place). Graph 2 is the parameter
#   update; it has no backward.
#
# `fullgraph=True` turns the first graph break into an error instead, which is how you check that a model (or a
# step) compiles as one graph. The error names the break and the line of our code:

# %%
torch._dynamo.reset()
try:
    torch.compile(train_step, backend="eager", fullgraph=True)(net, opt, xb, yb)
except torch._dynamo.exc.Unsupported as err:
    text = str(err)
    print(f"{type(err).__name__}: {text.splitlines()[0]}")
    print("  in user code:", [line.strip() for line in text.splitlines() if "loss.backward()" in line][0])
assert "Unsupported Tensor.backward() call" in text

# %% [markdown]
# ### 4.2 A new input shape: one recompile, then a dynamic graph
#
# Dynamo specialises a graph to what it saw (shapes, dtypes, `requires_grad`, `training`, Python constants) and
# guards those assumptions; when a guard fails on a later call, it compiles again. For shapes it is economical:
# with `automatic_dynamic_shapes` (on by default), the first call compiles for its exact sizes; when a second
# distinct size arrives, Dynamo recompiles **once** with **dynamic shapes** (动态形状): that dimension becomes a
# symbolic size, a `SymInt`; later sizes reuse that graph. (Sizes 0 and 1 are always specialised.) A backend that records what it
# is given shows it; it is called once per compiled graph.

# %%
print(
    "automatic_dynamic_shapes:",
    torch._dynamo.config.automatic_dynamic_shapes,
    "| recompile_limit:",
    torch._dynamo.config.recompile_limit,
)
compiles = []


def recording_backend(graph_module, example_inputs):
    compiles.append([type(i).__name__ for i in example_inputs])
    return graph_module.forward


def scaled_tanh(x):
    return 2 * torch.tanh(x)


torch._dynamo.reset()
f = torch.compile(scaled_tanh, backend=recording_backend)
for rows in (8, 16, 32, 8, 64):
    before = len(compiles)
    f(torch.randn(rows, 4))
    new = f"compiled, inputs {compiles[-1]}" if len(compiles) > before else "reused a compiled graph"
    print(f"rows = {rows:2}: {new}")
assert compiles == [["Tensor"], ["SymInt", "Tensor"]]

torch._dynamo.reset()
compiles.clear()
f_static = torch.compile(scaled_tanh, backend=recording_backend, dynamic=False)
for rows in (8, 16, 32, 8, 64):
    f_static(torch.randn(rows, 4))
print("with dynamic=False every new size compiles:", len(compiles), "graphs for 4 distinct sizes")
assert len(compiles) == 4

# %% [markdown]
# The second graph takes the number of rows as an extra input (`SymInt`): one compiled graph now serves every
# size. `dynamic=False` turns this off (one graph per size, until `recompile_limit` graphs for one function,
# after which Dynamo stops compiling it and runs it eagerly); `dynamic=True` makes sizes symbolic from the first
# call. `torch._dynamo.mark_dynamic(x, 0)` marks one dimension ahead of time.
#
# ### 4.3 Inductor: what fusion buys
#
# Eager PyTorch runs one kernel per operation, each reading and writing the whole tensor. Our small model writes
# GELU out by hand (its tanh approximation, as research code often does): eight element-wise operations on a
# 1024 × 1024 activation, which Inductor fuses (算子融合) into a single loop. (With the default settings the matrix
# products are handed to the same BLAS library either way: the profiler below sees `aten::addmm` in both runs.) This is the expensive backend: the **first call compiles** C++ (seconds to
# tens of seconds on a laptop), later calls with the same shapes run the compiled code. Inductor caches compiled
# kernels and graphs on disk (in the system's temporary directory unless `TORCHINDUCTOR_CACHE_DIR` says
# otherwise), so a second run of this notebook on the same machine compiles much faster: the run time in the
# header assumes that warm cache. We compile a small inference model once.


# %%
# NBVAL_IGNORE_OUTPUT
class TanhGeluMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 1024), nn.Linear(1024, 10)

    def forward(self, x):
        h = self.fc1(x)
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
        return self.fc2(h)


seed_everything(0)
mlp = TanhGeluMLP().to(device).eval()
compiled = torch.compile(mlp)
x = torch.randn(1024, 64, device=device)


def timed(fn, repeat=1):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return out, float(np.median(times))


with torch.no_grad():
    cpu_start = time.process_time()
    out_compiled, first = timed(compiled)
    compile_cpu = time.process_time() - cpu_start
    _, later = timed(compiled, repeat=10)
    out_eager, eager = timed(mlp, repeat=10)
if later <= eager:
    verdict = f"compiled is {eager / later:.1f}x faster"
else:
    verdict = f"compiled is {later / eager:.1f}x slower"
print(
    f"first call {first:.1f} s ({compile_cpu:.1f} s CPU in this process; the C++ compiler runs in child "
    f"processes) | later calls {later * 1e3:.1f} ms | eager {eager * 1e3:.1f} ms ({verdict})"
)
assert first > 20 * later  # the first call pays for the compilation
# Whether the fused code also beats eager depends on the CPU and on what else runs: on a model this small, on a
# busy CPU, compiled calls can even be slower than eager ones, so the speed-up is not asserted; the next cell
# checks the fusion itself.
torch.testing.assert_close(out_compiled, out_eager, atol=1e-5, rtol=1e-5)

# %% [markdown]
# Read the timing line with care: fusion saves memory traffic, but on a model this small, on a laptop CPU that is
# busy with other work, the later compiled calls may be only a little faster than eager, or even slower. Time the
# compiled model on your own machine and workload before you count on a speed-up; what fusion changes for certain
# is the number of operations dispatched, which the next cell counts.
#
# The compiled module wraps the original (`compiled._orig_mod` is `mlp`, sharing its parameters), and its outputs
# equal eager mode up to float rounding (a fused kernel may round intermediate results differently). A new input
# of the same shape reuses the compiled code. The fusion itself can be seen with the profiler:
# `with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:` records every operator called inside
# the block as an event, and `prof.events()` lists them by name (section 7 teaches the profiler fully). Each ATen
# operator call goes through PyTorch's **dispatcher** (分发器), the C++ layer that picks the kernel for the
# tensors' device and dtype and records the operation for autograd. Eager mode dispatches one ATen operator per
# element-wise step of the hand-written GELU; the compiled call dispatches none of them, only the two matrix
# products (`addmm`) around one generated loop.

# %%
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

ELEMENTWISE = {"aten::add", "aten::mul", "aten::pow", "aten::tanh"}
with torch.no_grad():
    x2 = torch.randn(1024, 64, device=device)
    same = torch.allclose(compiled(x2), mlp(x2), atol=1e-5, rtol=1e-5)
    dispatched = {}
    for name, fn in (("eager", mlp), ("compiled", compiled)):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn(x2)
        dispatched[name] = sorted({e.name for e in prof.events() if e.name in ELEMENTWISE | {"aten::addmm"}})
print("compiled wraps the same module:", compiled._orig_mod is mlp, "| outputs match eager:", same)
for name, ops in dispatched.items():
    print(f"{name:8} dispatches {ops}")
assert same and compiled._orig_mod is mlp
assert ELEMENTWISE <= set(dispatched["eager"]) and not ELEMENTWISE & set(dispatched["compiled"])

# %% [markdown]
# Element-wise operations cost far more time than their FLOPs suggest: each reads and writes a whole tensor to do
# one or two arithmetic operations per element, so their speed is set by **memory traffic** (访存量), not by
# arithmetic (`FlopCounterMode`, section 7.1, does not even count them). The ShuffleNetV2 paper (Ma et al., 2018)
# turned this into four design rules for fast networks, measured by memory access cost rather than FLOPs: equal
# input and output channel counts in convolutions, few groups in grouped convolutions, few parallel branches,
# and few element-wise operations. Fusion attacks the last one after the fact: one fused loop reads the input
# once and writes the output once.

# %% [markdown]
# ### 4.4 Seeing and steering the compiler: logs, stances, modes
#
# Sections 4.1 and 4.2 counted graphs with home-made backends and read `torch._dynamo.utils.counters`; both, like
# `make_boxed_func`, are private APIs (a leading underscore: fine for looking inside, but they may change in any
# release). In your own code use the public switches. The environment variable
# **`TORCH_LOGS="graph_breaks,recompiles"`** (set before starting Python: `TORCH_LOGS=graph_breaks,recompiles python
# train.py`) makes Dynamo log every graph break with its reason and user-code line, and every recompile with the
# guard that failed. From inside a notebook, `torch._logging.set_logs(graph_breaks=True, recompiles=True)` (a
# documented function, despite the underscore) does the same (and `set_logs()` with no argument resets). The log lines go to standard error with a timestamp prefix; the
# cell catches them and prints their text without it.


# %%
def with_print(x):
    y = x.sin()
    print("  (printed by the compiled function)")  # Python side effect: Dynamo cannot put it in a graph
    return y.cos()


torch._dynamo.reset()
log_text = io.StringIO()
torch._logging.set_logs(graph_breaks=True, recompiles=True)
try:
    with contextlib.redirect_stderr(log_text):
        f = torch.compile(scaled_tanh, backend="eager")
        f(torch.randn(8, 4))
        f(torch.randn(16, 4))  # a new size: recompile
        torch.compile(with_print, backend="eager")(torch.randn(3))  # a graph break
finally:
    torch._logging.set_logs()
log_lines = [line.split("] ", 2)[-1] for line in log_text.getvalue().splitlines()]
wanted = ("Recompiling function", "size mismatch", "Explanation:")
for line in log_lines:
    if any(w in line for w in wanted):
        print(line.split(" in ")[0].rstrip())  # without the file path
assert any("Recompiling function scaled_tanh" in line for line in log_lines)
assert any("size mismatch at index 0. expected 8, actual 16" in line for line in log_lines)
assert any("builtin operator `print`" in line for line in log_lines)

# %% [markdown]
# `torch.compiler.set_stance(...)` changes how compiled functions behave without touching the code that compiled
# them, as a function call or a `with` block. `"fail_on_recompile"` turns any recompile into an error, a cheap
# guard in a training loop that must not recompile (say, after a warm-up step); `"force_eager"` runs every
# compiled function eagerly, which tells you quickly whether a bug comes from compilation; `"default"` restores
# normal behaviour.

# %%
torch._dynamo.reset()
f_fixed = torch.compile(scaled_tanh, backend="eager", dynamic=False)
f_fixed(torch.randn(8, 4))  # compiled for 8 rows
with torch.compiler.set_stance("fail_on_recompile"):
    f_fixed(torch.randn(8, 4))  # same shape: the compiled graph is reused, no error
    try:
        f_fixed(torch.randn(16, 4))
        refused = False
    except RuntimeError as err:
        refused = True
        print(f"{type(err).__name__}: {str(err).split('. filename')[0]}")
        print("  because:", [line.strip() for line in str(err).splitlines() if "mismatch" in line][0])
with torch.compiler.set_stance("force_eager"):
    eager_out = f_fixed(torch.randn(32, 4))  # a fourth size, run eagerly: nothing compiled
print("force_eager ran a new shape without compiling:", tuple(eager_out.shape))
assert refused

# %% [markdown]
# **Compile modes.** `torch.compile(model, mode=...)` picks a preset of Inductor options; the cell prints them
# (`torch._inductor.list_mode_options()`).
#
# * `"default"`: fused kernels, reasonable compile time.
# * `"reduce-overhead"`: adds **CUDA graphs** (CUDA 图): the whole sequence of kernel launches is recorded once and
#   replayed with one call, which removes the per-kernel launch cost of small batches. It needs static input
#   addresses (Inductor copies inputs into fixed buffers) and does nothing on the CPU.
# * `"max-autotune"`: also benchmarks several implementations of each matrix product and convolution (Triton
#   templates on GPUs, C++ GEMM templates on CPUs) and keeps the fastest, plus CUDA graphs: the fastest code and
#   by far the longest compile (minutes for a large model). `"max-autotune-no-cudagraphs"` is the same without
#   CUDA graphs, the one that makes sense on a CPU.
#
# This notebook compiles only with the default mode on the CPU; with max-autotune (or `freezing=True`) the matrix
# products would no longer go to the same BLAS library as in eager mode (section 4.3). Two more recent features
# are worth knowing by name: **compiled autograd** (`torch._dynamo.config.compiled_autograd = True`) compiles the
# backward pass itself, hooks included, as one graph when it runs; `loss.backward()` inside a compiled function
# still breaks the graph (section 4.1), so the usual pattern compiles the model or the loss and calls `backward()`
# outside; and **regional compilation** compiles one
# repeated block (`for layer in model.layers: layer.compile()`) instead of the whole model, so a 48-layer
# transformer compiles one layer's code, not 48.

# %%
modes = torch._inductor.list_mode_options()
for mode in ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"):
    print(f"{mode:27} {modes[mode]}")
assert modes["reduce-overhead"] == {"triton.cudagraphs": True}
assert modes["max-autotune"]["max_autotune"] and modes["max-autotune"]["triton.cudagraphs"]

# %% [markdown]
# ## 5. Fusing Conv and BatchNorm for inference (Conv 层和 BN 层融合)
#
# In `eval()` mode BatchNorm is a fixed per-channel affine map, `γ (z − μ) / √(σ² + ε) + β`, applied right after a
# convolution that is also affine. The two fold into one convolution with
# `W' = W · γ/√(σ² + ε)` (per output channel) and `b' = (b − μ) · γ/√(σ² + ε) + β`, saving a pass over the
# activations. `torch.nn.utils.fusion.fuse_conv_bn_eval` does it; we check the outputs and the formula. It refuses
# modules in training mode, where BatchNorm uses the batch statistics instead.

# %%
from torch.nn.utils.fusion import fuse_conv_bn_eval

seed_everything(0)
conv, bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
with torch.no_grad():  # statistics as after training
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.uniform_(0.5, 1.5)
    bn.bias.uniform_(-0.5, 0.5)
try:
    fuse_conv_bn_eval(conv, bn)
    refused = False
except AssertionError as err:
    refused = True
    print(f"in training mode: {type(err).__name__}: {err}")
assert refused
conv.eval()
bn.eval()
fused = fuse_conv_bn_eval(conv, bn)
images = torch.randn(4, 3, 16, 16)
torch.testing.assert_close(fused(images), bn(conv(images)), atol=1e-5, rtol=1e-5)
scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
torch.testing.assert_close(fused.weight, conv.weight * scale.view(-1, 1, 1, 1))
torch.testing.assert_close(fused.bias, (conv.bias - bn.running_mean) * scale + bn.bias)
print("fused:", fused, "| outputs equal conv -> bn, weights match the formula")

# %% [markdown]
# ## 6. Int8 quantisation (量化)
#
# **Quantisation** stores weights (and possibly activations) as 8-bit integers plus a floating-point **scale**
# (缩放因子): a quarter of the float32 size, and faster integer matrix products on hardware that has them. Two common
# **post-training quantisation** (训练后量化) modes for `nn.Linear`, which need no retraining:
#
# * **weight-only int8**: weights stored in int8 with one scale per output channel, dequantised on the fly;
#   activations stay float;
# * **dynamic int8**: weights in int8 (one scale per output channel), and each **row** of the activation (each
#   sample, or each token of a sequence) is quantised on the fly with its own scale, computed from that row's
#   largest absolute value, so the matrix product itself runs in int8. "Dynamic" means the activation scales are
#   measured at run time, for every batch.
#
# The classic API `torch.ao.quantization.quantize_dynamic` still runs in PyTorch 2.14 but is deprecated in favour
# of the **torchao** library (`quantize_(model, config)`). (Importing torchao makes torch log a deprecation about
# torchao's own internals; the setup cell raised that logger's level.)
#
# We train a small classifier on synthetic data, quantise copies of it, and compare size (serialised `state_dict`)
# and test accuracy.

# %%
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

seed_everything(0)
centers = 0.4 * torch.randn(10, 64)


def make_data(n):
    labels = torch.randint(0, 10, (n,))
    return centers[labels] + torch.randn(n, 64), labels


X_train, y_train = make_data(8192)
X_test, y_test = make_data(4096)
classifier = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
optimizer = torch.optim.Adam(classifier.parameters(), lr=1e-3)
for _step in range(400):
    idx = torch.randint(0, len(X_train), (128,))
    optimizer.zero_grad()
    F.cross_entropy(classifier(X_train[idx]), y_train[idx]).backward()
    optimizer.step()
classifier.eval()


def size_kib(model):
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell() / 2**10


@torch.no_grad()
def accuracy(model):
    return (model(X_test).argmax(1) == y_test).float().mean().item()


with torch.no_grad():
    reference_pred = classifier(X_test).argmax(1)
results = {"float32": (size_kib(classifier), accuracy(classifier), 1.0)}
for name, config in (
    ("int8 weight-only", Int8WeightOnlyConfig()),
    ("int8 dynamic", Int8DynamicActivationInt8WeightConfig()),
):
    quantized = copy.deepcopy(classifier)
    quantize_(quantized, config)
    with torch.no_grad():
        agree = (quantized(X_test).argmax(1) == reference_pred).float().mean().item()
    results[name] = (size_kib(quantized), accuracy(quantized), agree)
weight = quantized[0].weight  # the first Linear of the int8 dynamic model
print(
    f"weight after quantize_: {type(weight).__name__}, values {weight.qdata.dtype} {tuple(weight.qdata.shape)},"
    f" scales {tuple(weight.scale.shape)} (one per output channel)"
)
print("activation scales:", weight.act_quant_kwargs.granularity, "(one per row, computed at run time)")
assert weight.qdata.dtype == torch.int8 and tuple(weight.scale.shape) == (256, 1)
assert type(weight.act_quant_kwargs.granularity).__name__ == "PerRow"
# int8 kernels differ between CPU models (AVX2, AVX-512, AMX), so a prediction near a tie may flip on another
# machine: the table prints the accuracy loss and the agreement as checks rather than exact percentages
# (int8 dynamic agreed on 98.8 % of the predictions on an Intel Xeon with oneDNN capped at AVX2, on 99.9 % with
# its AMX kernels, and on more than 99 % on an AMD EPYC: the check leaves room below all three).
# (the float32 accuracy itself moves by a few test samples when the training run's rounding changes: 90.41-90.48 %
# over six runs with the initial weights perturbed by one part in a million, too close to 90.5 to print whole percents)
print(f"float32 test accuracy: {5 * round(20 * results['float32'][1])} % (to the nearest 5 points)")
print("model              size      accuracy within 0.5 points of float32   predictions equal to float32 >= 97 %")
for name, (size, acc, agree) in results.items():
    print(
        f"{name:17} {size:5.0f} KiB   {str(acc > results['float32'][1] - 0.005):>10}"
        f"                             {str(agree >= 0.97):>10}"
    )
for name in ("int8 weight-only", "int8 dynamic"):
    size, acc, agree = results[name]
    assert size < 0.3 * results["float32"][0]
    assert acc > results["float32"][1] - 0.005 and agree >= 0.97

# %% [markdown]
# The deprecated path, for comparison: older code quantises with `torch.ao.quantization.quantize_dynamic`. It still
# produces a similar model, with a `DeprecationWarning` that the cell records to read its text. Read the warning's text: it says
# `torch.ao.quantization` "will be removed in 2.10", yet PyTorch 2.14 still ships it. The announced release has
# passed and the text was never updated; treat it as "deprecated, may go any release", and use torchao.

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    old_style = torch.ao.quantization.quantize_dynamic(copy.deepcopy(classifier), {nn.Linear}, dtype=torch.qint8)
deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
print(
    f"quantize_dynamic emitted {len(deprecations)} deprecation warning(s), e.g. "
    f"{str(deprecations[0].message).splitlines()[0].strip()!r}"
)
print(
    "layer:",
    old_style[0]._get_name(),
    "| accuracy within 0.5 points of float32:",
    accuracy(old_style) > results["float32"][1] - 0.005,
)
assert deprecations and accuracy(old_style) > results["float32"][1] - 0.005
assert "removed in 2.10" in str(deprecations[0].message)  # a release this PyTorch is already past:
assert tuple(int(v) for v in torch.__version__.split(".")[:2]) > (2, 10)

# %% [markdown]
# **And the speed?** Smaller is not automatically faster. The cell times the three models on the 4096 test rows
# side by side (the fastest of 5 calls each, on one thread, eager mode, no `torch.compile`), with `timeit.repeat`
# from Python's standard library, which calls a function `repeat` times and returns each duration.

# %%
# NBVAL_IGNORE_OUTPUT
quantized_models = {"float32": classifier}
for name, config in (
    ("int8 weight-only", Int8WeightOnlyConfig()),
    ("int8 dynamic", Int8DynamicActivationInt8WeightConfig()),
):
    quantized_models[name] = copy.deepcopy(classifier)
    quantize_(quantized_models[name], config)
threads = torch.get_num_threads()
torch.set_num_threads(1)
try:
    with torch.no_grad():
        eager_ms = {
            name: 1e3 * min(timeit.repeat(lambda m=model: m(X_test), number=1, repeat=5))
            for name, model in quantized_models.items()
        }
finally:
    torch.set_num_threads(threads)
for name, ms in eager_ms.items():
    print(f"{name:17} {ms:6.1f} ms per 4096 rows   ({ms / eager_ms['float32']:.1f}x the float32 time)")
assert all(ms > 0 for ms in eager_ms.values())

# %% [markdown]
# In our runs (a shared 2-core Intel server), eager int8 dynamic took 2 to 4 times as long as float32, and
# weight-only int8 1 to 1.6 times as long; the cell above prints the ratios on your machine. The reasons are worth knowing before you quantise for speed:
#
# * **overhead around small matrices**: every call first computes the per-row scales of the activation, rounds it
#   to int8, runs the int8 product, then rescales the int32 result back to float. These are separate passes over
#   the data, and with 64 × 256 and 256 × 256 weights the product itself is too small to pay for them;
# * **nothing fused in eager mode**: torchao expects `torch.compile`, which fuses the quantise and rescale steps into
#   the matrix product's neighbours; without it each step is its own kernel;
# * **the hardware**: int8 pays off where the CPU has fast int8 dot-product instructions (VNNI, AMX) and the library
#   uses them, or on GPUs with int8 tensor cores; weight-only int8 mainly helps when loading the weights from
#   memory is the bottleneck (large models, batch size 1), which a 4096-row batch through small layers is not.
#
# So int8 is first a **size and memory-bandwidth** win; measure speed on the target machine, compiled, before
# counting on it.
#
# Two further kinds of quantisation, in one paragraph each:
#
# * **Static quantisation with calibration** (静态量化 / 校准): the activation scales are fixed ahead of time instead
#   of measured per batch. You run a few hundred representative inputs through the model with **observers**
#   (观察器) that record each activation's range, compute the scales once, and then every layer runs int8 → int8
#   with no scale computation at run time (faster, and what integer-only accelerators need), at the risk of
#   inputs whose range the calibration data did not cover. torchao offers `Int8StaticActivationInt8WeightConfig`
#   (you pass the calibrated activation scale) and the PT2E flow (`torchao.quantization.pt2e`:
#   `prepare_pt2e`, calibrate, `convert_pt2e`) for whole exported graphs; TensorRT's INT8 mode does the same
#   calibration for NVIDIA GPUs.
# * **Quantisation-aware training** (量化感知训练, QAT): when post-training quantisation loses too much accuracy
#   (typically below 8 bits, or small models), you fine-tune with **fake quantisation** (伪量化): the forward pass
#   rounds weights and activations to the int8 (or int4) grid but keeps float tensors, the backward pass lets the
#   gradient pass through the rounding (the straight-through estimator), so the weights learn to sit where rounding
#   hurts least. Afterwards the model is converted to real integers. torchao does both steps with `quantize_`:
#   `QATConfig(base_config, step="prepare")` inserts fake quantisation before training, and
#   `QATConfig(base_config, step="convert")` produces the quantised model (in torchao 0.18 the base config can be
#   `Int4WeightOnlyConfig`; other schemes are given as fake-quantisation configs).

# %% [markdown]
# ## 7. Profiling (性能剖析): `torch.profiler` and `cProfile`
#
# Before optimising, measure. `torch.profiler.profile` records every operator (and CUDA kernel with
# `ProfilerActivity.CUDA`) run inside the block; `record_function("name")` labels a region. `key_averages()`
# aggregates by operator. (The setup cell set `KINETO_LOG_LEVEL=6` before the first profile: the profiler's C++
# library otherwise prints timestamped status lines to standard error.)
#
# Which operators does one training step of a two-layer MLP run? The counts are deterministic: two `addmm` in the
# forward pass (Linear = matrix product plus bias), three `mm` in the backward pass (the first layer's input needs
# no gradient). For the update, `SGD(..., foreach=None)` (the default) lets `torch.optim` choose: on the CPU it runs
# the per-parameter loop, four `add_` (one per parameter); on CUDA it picks the **foreach** implementation, one
# `_foreach_add_` that updates all four tensors in one call (`_default_to_fused_or_foreach` in
# `torch/optim/optimizer.py` picks foreach only for tensors on CUDA, XPU, MTIA or a custom backend, where one
# call launches few kernels instead of one per tensor; the `_foreach_` operators also run on the CPU, but there
# they only loop over the tensors, so nothing is gained).

# %%
seed_everything(0)
mlp = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
optimizer = torch.optim.SGD(mlp.parameters(), lr=0.1)
xb, yb = torch.randn(64, 256, device=device), torch.randn(64, 10, device=device)


def mlp_step():
    optimizer.zero_grad()
    F.mse_loss(mlp(xb), yb).backward()
    optimizer.step()


mlp_step()  # warm-up: the first call allocates
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
with profile(activities=activities) as prof:
    with record_function("mlp_step"):
        mlp_step()
events = {e.key: e for e in prof.key_averages()}
for op in (
    "mlp_step",
    "aten::addmm",
    "aten::relu",
    "aten::mse_loss",
    "aten::mm",
    "aten::threshold_backward",
    "Optimizer.step#SGD.step",
    "aten::add_",
    "aten::_foreach_add_",
):
    print(f"{op:28} calls {events[op].count if op in events else 0}")
assert events["aten::addmm"].count == 2 and events["aten::mm"].count == 3
if device.type == "cuda":
    assert events["aten::_foreach_add_"].count == 1
else:
    assert events["aten::add_"].count == 4 and "aten::_foreach_add_" not in events

# %% [markdown]
# And where does the time go? Sorted by self CPU time (the numbers depend on the machine). In the table,
# *Self CPU* is the time spent in an operator's own code, and *CPU total* adds the time of the operators it
# called (so the `mlp_step` range's CPU total is the whole step, 100 %, and its self CPU is only the time between
# the operators inside it):

# %%
# NBVAL_IGNORE_OUTPUT
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
top = max(prof.key_averages(), key=lambda e: e.self_cpu_time_total)
assert top.self_cpu_time_total > 0

# %% [markdown]
# ### 7.1 A trace file, memory, and FLOPs
#
# The table sums; a **trace** (追踪) shows the timeline: every operator as a bar on its thread, nested under its
# caller, with GPU kernels on their own streams. `prof.export_chrome_trace(path)` writes it as JSON in the Chrome
# trace format; open it in `https://ui.perfetto.dev` (or `chrome://tracing`). For a long training job, pass
# `schedule=torch.profiler.schedule(wait=1, warmup=1, active=3)` and
# `on_trace_ready=torch.profiler.tensorboard_trace_handler(folder)` so that only a few steps are recorded.
# `profile_memory=True` also records every allocation and free, attributed to the operator that made it, and
# works on the CPU. The cell profiles one forward pass with it, writes the trace, and reads the file back: each
# operator is one event (`"ph": "X"`, a complete event with a start `ts` and a duration `dur` in microseconds).

# %%
import json  # noqa: E402
import tempfile  # noqa: E402

mlp_cpu, xb_cpu = copy.deepcopy(mlp).cpu(), xb.cpu()  # CPU memory is what this profile records
with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof_mem:
    mlp_cpu(xb_cpu)
memory = {e.key: e.self_cpu_memory_usage for e in prof_mem.key_averages() if e.key.startswith("aten::")}
print("bytes allocated by each operator itself (self CPU memory):")
for op in ("aten::addmm", "aten::clamp_min"):
    print(f"  {op:16} {memory[op]:7,}")
assert memory["aten::addmm"] == (64 * 512 + 64 * 10) * 4  # the two Linear outputs, float32
assert memory["aten::clamp_min"] == 64 * 512 * 4  # ReLU's output (relu calls clamp_min)

with tempfile.TemporaryDirectory() as folder:
    trace_path = os.path.join(folder, "trace.json")
    prof_mem.export_chrome_trace(trace_path)
    with open(trace_path) as file:
        trace = json.load(file)
ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
addmm_events = [e for e in ops if e["name"] == "aten::addmm"]
print(
    f"trace: {len(ops)} operator events; aten::addmm twice, with input shapes {[e['args']['Input Dims'][:2] for e in addmm_events]}"
)
assert len(addmm_events) == 2 and all(e["ph"] == "X" and e["dur"] >= 0 for e in addmm_events)

# %% [markdown]
# How much work is a model? `FlopCounterMode` (met in section 1.4) counts the FLOPs of every matrix product and
# convolution run inside it; a Linear layer with a batch of B rows, `in_features` n and `out_features` m costs
# 2·B·n·m FLOPs (a multiply and an add per term). Backward usually costs about twice the forward: one product for
# the input's gradient and one for the weight's. Here it costs barely more than the forward, because the first
# layer, which holds most of the work, needs no gradient for its input (the data).
# Divide FLOPs by the measured time and compare with the hardware's peak to see how far from it a model runs.

# %%
with FlopCounterMode(display=False) as forward_flops:
    loss = F.mse_loss(mlp(xb), yb)
with FlopCounterMode(display=False) as backward_flops:
    loss.backward()
expected = 2 * 64 * 256 * 512 + 2 * 64 * 512 * 10
print(f"forward  {forward_flops.get_total_flops():>10,} FLOPs (2·B·n·m summed over the layers: {expected:,})")
print(
    f"backward {backward_flops.get_total_flops():>10,} FLOPs ({backward_flops.get_total_flops() / expected:.2f}x the forward)"
)
print("per operator:", {str(op): n for op, n in backward_flops.get_flop_counts()["Global"].items()})
assert forward_flops.get_total_flops() == expected
assert backward_flops.get_total_flops() == 2 * 64 * 512 * 10 * 2 + 2 * 64 * 256 * 512  # no grad for the input

# %% [markdown]
# ### 7.2 Python code: `cProfile`
#
# For Python code around the model (data preparation, augmentation, logging), use the standard
# library's `cProfile`. Here a per-sample Python loop is compared with one vectorised operation doing the same
# flip. `pstats` gives the call counts, which are deterministic and already tell the story: the loop calls
# `Tensor.flip` once per image, and each call pays Python and dispatcher overhead for a tiny amount of work, while
# the vectorised version calls it once per batch. It also gives the time spent in each function (`cumtime`, which
# adds up every call, including one that waited for a busy core); the next cell times the two versions.

# %%
batch = torch.randn(1024, 3, 8, 8)  # many small images: per-sample Python overhead dominates


def flip_per_sample(b):
    return torch.stack([img.flip(-1) for img in b])


def flip_vectorised(b):
    return b.flip(-1)


def pipeline():
    for _ in range(10):
        flip_per_sample(batch)
        flip_vectorised(batch)


profiler = cProfile.Profile()
profiler.runcall(pipeline)
stats = pstats.Stats(profiler)
calls = {}
for (_file, _line, name), (_cc, ncalls, *_times_and_callers) in sorted(stats.stats.items()):
    # not `pipeline` itself: under nbval, Python 3.13.0's cProfile counted its one call twice
    if name in ("flip_per_sample", "flip_vectorised") or "'flip'" in name:
        key = "Tensor.flip" if "'flip'" in name else name
        calls[key] = ncalls
        print(f"{key:16} called {ncalls:6,} time(s)")
assert calls == {"flip_per_sample": 10, "flip_vectorised": 10, "Tensor.flip": 10 * len(batch) + 10}
torch.testing.assert_close(flip_per_sample(batch), flip_vectorised(batch))

# %% [markdown]
# Timed (the fastest of 7 calls each, on one thread so that the vectorised flip cannot wait for a second, busy
# core) with `timeit.repeat` from the standard library: the loop is far slower, by a factor that depends on the
# machine and its load (between 30 and 100 in our runs; the cell prints yours). The cell asserts only that the
# loop is at least 5 times slower, a margin that holds everywhere. (For timing PyTorch code in your own projects,
# `torch.utils.benchmark.Timer` does the warm-up, fixes the thread count and synchronises CUDA for you.)

# %%
# NBVAL_IGNORE_OUTPUT
threads = torch.get_num_threads()
torch.set_num_threads(1)
try:
    fastest = {
        f.__name__: min(timeit.repeat(lambda f=f: f(batch), number=1, repeat=7))
        for f in (flip_per_sample, flip_vectorised)
    }
finally:
    torch.set_num_threads(threads)
print(
    f"per-sample loop {fastest['flip_per_sample'] * 1e3:.2f} ms | vectorised {fastest['flip_vectorised'] * 1e3:.2f} ms"
    f" | ratio {fastest['flip_per_sample'] / fastest['flip_vectorised']:.0f}x"
)
assert fastest["flip_per_sample"] > 5 * fastest["flip_vectorised"]

# %% [markdown]
# ## Exercises (练习)
#
# Three exercises, easiest first: predict, write a function, then a stretch that combines section 5 with the
# convolutions and BatchNorm of notebook 04. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it
# and run it. The **check cell** below it then says *correct*, or *not yet* with a hint and the section to
# re-read, or *not attempted yet* while the stub is untouched. This section does not depend on the lesson's
# cells: after a kernel restart, run its first cell and go on. `make progress` (without make, e.g. on Windows:
# `python tools/course.py progress`) lists which exercises of every notebook pass.

# %%
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from utils.exercises import Checker

ex = Checker("11")

# %% [markdown]
# ### Exercise 1 · Which in-place operation breaks backward?
#
# Section 2 states the rule: an operation may overwrite a tensor in place only if backward does not
# need that tensor, which is why ReLU may be in place. Each snippet below starts from
# `x = torch.randn(4, requires_grad=True)` and `h = x * 3`, and ends with `y.sum().backward()`. Which ones
# raise the version-counter error? Decide from what each backward formula needs, then check.
#
# | snippet | code between `h = x * 3` and `y.sum().backward()` |
# |---|---|
# | A | `y = h.exp(); y.add_(1)` |
# | B | `y = h.sigmoid(); h.mul_(2)` |
# | C | `y = h ** 2; h.mul_(2)` |
# | D | `y = torch.relu(h); h.mul_(2)` |
# | E | `y = torch.relu(h); y.mul_(2)` |
# | F | `y = h + 1; h.mul_(2)` |

# %%
# ✏️ Exercise 1: replace ... with the set of letters whose backward() raises, e.g. {"A", "B"}
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · Checkpoint every block
#
# Write `checkpointed(blocks, x)`: it runs `x` through every block of the `nn.ModuleList` `blocks`, in order,
# and checkpoints **each block separately** with `torch.utils.checkpoint.checkpoint`, so that autograd keeps only
# each block's input (section 1.1 counts them). The blocks contain Dropout, and `x` is usually data that does not
# require grad (the check also passes an `x` that does, as an activation from earlier layers would): the gradients,
# of the parameters and of `x` when it requires grad, must still equal those of the plain loop (section 1.3 says
# which argument makes that true).


# %%
# ✏️ Exercise 2: write the body of the function
def checkpointed(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("your code here")


# %%
ex.check(2, checkpointed)

# %% [markdown]
# ### Exercise 3 · Fold BatchNorm into the convolution (stretch)
#
# Section 5 folded BatchNorm into the preceding convolution with the library. Do it by hand:
# `fuse_conv_bn(conv, bn)` returns a **new** `nn.Conv2d` whose output equals `bn(conv(x))` in eval mode, without
# changing `conv` or `bn`. You need the layout of a convolution's weight, `(out_channels, in_channels / groups,
# kh, kw)` ([notebook 04](04_mnist_cnn.ipynb), §10), BatchNorm's eval-mode formula with its running statistics
# ([notebook 04](04_mnist_cnn.ipynb), §13; they are buffers, [notebook 06](06_save_load_checkpoints.ipynb), §1),
# and the convolution's other settings (`stride`, `padding`, `dilation`, `groups`). Convolutions followed by
# BatchNorm are often built with `bias=False` ([notebook 04](04_mnist_cnn.ipynb), §12 says why). The check refuses
# the library's folding (`fuse_conv_bn_eval`, `fuse_conv_bn_weights`, whatever name they are imported under).


# %%
# ✏️ Exercise 3: write the body of the function
def fuse_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    raise NotImplementedError("your code here")


# %%
ex.check(3, fuse_conv_bn)

# %% [markdown]
# ## Summary
#
# * Activation checkpointing (激活重计算, unrelated to notebook 06's checkpoint files) trades one extra forward pass
#   for memory: measured with saved-tensor hooks, √N segments minimise it, and the gradients are identical. On
#   CUDA, compare peaks where activations dominate (after the forward, or an activation-heavy batch). Pass
#   `use_reentrant=False`: left out, 2.14 warns and uses the reentrant version, which loses the gradients of a
#   segment whose inputs do not require grad. Selective checkpointing (`create_selective_checkpoint_contexts`)
#   keeps the matrix products and recomputes only the cheap element-wise steps: most of the memory saving at no
#   extra matrix FLOPs.
# * In-place ops avoid a transient allocation when autograd allows them (the version counter checks); they do not
#   shrink what autograd saves. `del` frees memory only with the last reference; `empty_cache()` lowers what
#   `nvidia-smi` shows, not the peak.
# * Workers overlap data loading; `persistent_workers` keeps them; pinned memory and `non_blocking` overlap GPU
#   copies.
# * `torch.compile` compiles a whole training step: forward + loss as one graph whose backward AOTAutograd
#   compiles, the optimizer update as another; `loss.backward()` and the optimizer's deliberate breaks split
#   them, and `fullgraph=True` turns a break into an error. A second input size costs one recompile to a
#   dynamic graph, then none. `TORCH_LOGS="graph_breaks,recompiles"` (or `torch._logging.set_logs`) says why;
#   `torch.compiler.set_stance("fail_on_recompile")` guards against recompiles. Inductor fuses element-wise chains;
#   `mode="reduce-overhead"` adds CUDA graphs, `"max-autotune"` searches kernels; the first call compiles (cached
#   on disk).
# * Fuse Conv+BN for inference. Quantise Linear layers to int8 with torchao for ~4× smaller weights at the same
#   accuracy (dynamic int8 scales each activation row at run time); in eager mode on a CPU it is not faster, so
#   measure. Static calibration fixes activation scales ahead of time; QAT trains with fake quantisation
#   (`torch.ao.quantization` is deprecated).
# * Profile before optimising: `torch.profiler` for operators (a Chrome trace to read, memory with
#   `profile_memory=True`; foreach updates on CUDA), `FlopCounterMode` for FLOPs, `cProfile` for the Python around
#   them.

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# This lesson started from a set of Chinese study notes on saving memory and gaining speed in PyTorch 1.x. Where
# they are wrong, incomplete or out of date for PyTorch 2.14:
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | Checkpointing (the Sublinear Memory Cost method) saves memory "and the speed does not drop noticeably" | It costs about one extra forward pass (12 extra `Linear` forwards for 16 layers in 4 segments), or none of the matrix products with selective checkpointing | §1.1 · Saved activations, counted; §1.4 · Selective activation checkpointing |
# | `torch.utils.checkpoint` is used without arguments (1.3 docs) | Leaving out `use_reentrant` warns and falls back to the reentrant version, which loses the gradients of a segment whose inputs do not require grad; pass `use_reentrant=False` | §1.3 · Random numbers, and `use_reentrant` |
# | `torch.cuda.reset_max_memory_allocated()` resets the peak | Deprecated name: `torch.cuda.reset_peak_memory_stats()` | §1.2 · Peak memory on CUDA |
# | `empty_cache()` is "an advanced `del`"; deleting `loss` saves "a little" memory | `empty_cache()` returns cached blocks to the driver without lowering the peak; `del` frees only the last reference (a kept output keeps its whole graph) | §1.2 · Peak memory on CUDA |
# | Use in-place ops "as much as possible" to save memory; find ReLUs with `classname.find('ReLU')` | In-place ReLU saves a transient allocation, not a saved activation (measured equal); `isinstance` is the robust test | §2 · In-place operations |
# | PyTorch's `fuse_modules` exists "but I never used it" | `torch.nn.utils.fusion.fuse_conv_bn_eval` folds an eval-mode BN into the conv (formula checked), and refuses training mode | §5 · Fusing Conv and BatchNorm |
# | Quantisation: PyTorch 1.3's QNNPACK-based tools, Distiller, NNI, TensorRT | `torch.ao.quantization` is deprecated; torchao's `quantize_` with int8 weight-only / dynamic configs (per-row activation scales), static calibration and QAT configs; eager int8 was not faster on the CPU | §6 · Int8 quantisation |
# | Memory tools: `pytorch-memonger`, `Pytorch-Memory-Utils`, `gpustat` | Built in: `torch.utils.checkpoint`, saved-tensor hooks, `torch.cuda.max_memory_allocated`, memory snapshots, `profile_memory=True` (`gpustat` still works as a nicer `nvidia-smi`) | §1 · Activation checkpointing; §7.1 · A trace file, memory, and FLOPs |
# | Time analysis with `cProfile` (or `profile`, `hotshot`) | `hotshot` is gone (Python 2 only); `cProfile` for Python code, `torch.profiler` for operators | §7 · Profiling |

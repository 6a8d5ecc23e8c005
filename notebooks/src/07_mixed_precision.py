# %% [markdown]
# # 07 · Automatic mixed precision (自动混合精度)
#
# **What you learn.** How to train with 16-bit floating point where it is safe and 32-bit where it is needed,
# which is what **automatic mixed precision** (自动混合精度; AMP) does:
#
# 1. why 16 bits at all, and what can go wrong: float16's **overflow** (上溢) above 65504, small gradients that
#    **underflow** (下溢) to zero, bfloat16's wide range but coarse precision, and the memory per parameter;
# 2. `torch.amp.autocast(device_type, dtype)`: which operations run in low precision and which in float32 — a
#    table generated on your device, since the lists differ between CPU and CUDA;
# 3. `torch.amp.GradScaler`: the notes' walk-through (scale → backward → `unscale_` → clip → `step` → `update`),
#    its state machine, a step that is skipped because of an `inf`, and saving and resuming its state;
# 4. the recipes: gradient clipping (梯度裁剪), gradient accumulation (梯度累加), a gradient penalty, the `enabled=`
#    switch, and TF32 with the `fp32_precision` settings;
# 5. a small model trained in float32 and under autocast: the same loss curve, and what autocast really saves in
#    memory: each **activation** (激活值) takes half the bytes, but autocast adds a 16-bit copy of each weight.
#
# **Before this notebook.** A training loop (notebooks 02–05): forward, `backward()`, `optimizer.step()`;
# checkpoints with `utils.checkpoint_files` (notebook 06).
#
# **Study time:** about 70 min, 20 of them for the exercises at the end. Most of its run time is the autocast run of section 5, because bfloat16 matrix products are *emulated* in
# those runs: the course machine has no bfloat16 instructions, and `make execute` pins PyTorch's kernels to AVX2
# on every x86 CPU anyway (`ATEN_CPU_CAPABILITY=avx2`, `ONEDNN_MAX_CPU_ISA=AVX2`, so that outputs agree between
# machines; README, "Which outputs are compared"). Run by hand on a CPU with bfloat16 instructions (AVX-512 BF16,
# AMX), without that pin, the autocast steps of section 5 are faster than the float32 ones instead of over ten
# times slower.
#
# **On a GPU.** The low-precision type is bfloat16 where the GPU computes it natively (Ampere and newer:
# `torch.cuda.is_bf16_supported(including_emulation=False)`; without the argument older GPUs answer `True` too,
# because bfloat16 tensors can be *emulated* there, slowly), with no `GradScaler` needed; on older GPUs it is
# float16 with the `GradScaler` switched on (the notes' setting). Section 3 runs float16 with a `GradScaler` on
# every device. CUDA's autocast computes softmax, `log_softmax`, `layer_norm`, `group_norm`, `sum` and `exp` in
# float32, where the CPU follows the input (the table in section 2 shows it), and section 5 also reports
# `torch.cuda.max_memory_allocated`. The stored outputs were made on the CPU.
#
# **What changed since the notes.** The notes use `torch.cuda.amp.autocast()` and `torch.cuda.amp.GradScaler()`,
# say that mixed precision only works on GPUs, and that TF32 matrix products are on by default. Today the API is
# device-generic, `torch.amp.autocast("cpu" | "cuda", dtype=...)` and `torch.amp.GradScaler("cpu" | "cuda")`
# (the `torch.cuda.amp` names emit a `FutureWarning`), the CPU supports bfloat16 and float16 autocast, bfloat16
# is the usual choice where the hardware has it, TF32 for matrix products has been **off** by default since
# PyTorch 1.12, and it is set with `torch.backends.cuda.matmul.fp32_precision`. The notes' Apex section also says
# mixed precision "stores weights and gradients in FP16": with autocast both stay float32 (section 2). Each point
# is shown below.

# %% [markdown]
# ## Setup
#
# `amp_dtype` is the low-precision type used throughout: bfloat16 on the CPU (CPU autocast supports bfloat16 and
# float16, and bfloat16 is the one CPU kernels are fast at) and on GPUs that support it, float16 on older GPUs.
# `use_scaler` says whether training needs a `GradScaler`: only with float16 (section 1 shows why).

# %%
import tempfile
import time
import warnings

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from utils import fmt, get_device, seed_everything
from utils.checkpoint_files import load_checkpoint, save_checkpoint

seed_everything(0)
device = get_device()
if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
    amp_dtype = torch.float16  # pre-Ampere GPUs: float16 tensor cores, and a GradScaler
else:
    amp_dtype = torch.bfloat16
use_scaler = amp_dtype == torch.float16
print("device:", device.type, "| low-precision dtype for autocast:", amp_dtype, "| GradScaler needed:", use_scaler)
assert amp_dtype in (torch.bfloat16, torch.float16)

# %% [markdown]
# ## 1. Why 16 bits, and what breaks
#
# A float stores a sign, an **exponent** (指数; how big: the range) and a **mantissa** (尾数; how many significant digits: the precision).
# In **half precision** (半精度), float16 ("half") spends 5 bits on the exponent, bfloat16 ("brain float") keeps
# float32's 8 exponent bits and cuts the mantissa to 7 bits. `torch.finfo` tells the consequences:

# %%
print(f"{'dtype':9} {'bits':>4} {'exp':>3} {'mant':>4} {'max':>10} {'smallest normal':>15} {'eps (1+eps > 1)':>15}")
layout = {torch.float32: (8, 23), torch.float16: (5, 10), torch.bfloat16: (8, 7)}
for dt, (e_bits, m_bits) in layout.items():
    fi = torch.finfo(dt)
    print(
        f"{str(dt).removeprefix('torch.'):9} {fi.bits:4} {e_bits:3} {m_bits:4} {fi.max:10.3e} {fi.tiny:15.3e} {fi.eps:15.3e}"
    )
    assert fi.eps == 2.0**-m_bits
assert torch.finfo(torch.float16).max == 65504 and torch.finfo(torch.bfloat16).max > 3e38

# %% [markdown]
# **float16 overflows at 65504.** Anything larger becomes `inf`; values up to 65519 still round down to 65504.
# Squaring an activation of 300 already overflows, and one `inf` in a loss turns every gradient into `inf`/`nan`.
# bfloat16 has float32's range, so the same numbers are fine there (only rounded).

# %%
big = torch.tensor([65504.0, 65519.0, 65520.0, 1e5])
print("float16: ", big.half().tolist())
print("bfloat16:", big.bfloat16().tolist())
act = torch.tensor(300.0)
print("300**2 in float16:", (act.half() ** 2).item(), "| in bfloat16:", (act.bfloat16() ** 2).item())
assert big.half().tolist() == [65504.0, 65504.0, float("inf"), float("inf")]
assert torch.isinf(act.half() ** 2) and torch.isfinite(act.bfloat16() ** 2)

# %% [markdown]
# **Small gradients underflow to zero in float16.** Below its smallest normal number (6.1e-5) float16 still stores
# values down to 2⁻²⁴ ≈ 6e-8, each a **subnormal number** (非规格化数) with fewer and fewer significant bits, and anything below about 3e-8 becomes
# exactly 0. Gradients of a deep network are often that small. Take a million gradient magnitudes spread evenly
# (in log scale) between 1e-10 and 1e-2: in float16 almost a third of them vanish. The cure is **loss scaling** (损失缩放):
# multiply the loss by S = 65536 = 2¹⁶ before `backward()`, so every gradient is 65536 times larger while it
# travels through float16, and divide by S afterwards in float32. Multiplying by a power of two only changes the
# exponent, so nothing is lost by the scaling itself.

# %%
g = torch.logspace(-10, -2, 1_000_000)
zero_fp16 = (g.half() == 0).float().mean().item()
S = 2.0**16
zero_scaled = ((g * S).half() == 0).float().mean().item()
recovered = (g * S).half().float() / S
print(f"gradients that become 0 in float16: {zero_fp16:.1%}; after scaling by 2**16: {zero_scaled:.1%}")
print(f"in bfloat16: {(g.bfloat16() == 0).float().mean().item():.1%}")
print(
    "2**-26 in float16:",
    torch.tensor(2.0**-26).half().item(),
    "| scaled, stored in float16, unscaled in float32:",
    ((torch.tensor(2.0**-26) * S).half().float() / S).item(),
)
assert 0.30 < zero_fp16 < 0.32 and zero_scaled == 0 and (g.bfloat16() == 0).sum() == 0
assert torch.allclose(recovered[g > 1e-8], g[g > 1e-8], rtol=1e-3)

# %% [markdown]
# **bfloat16 has range but little precision.** With 8 significant bits, 257 is stored as 256, and adding 1 to
# a running total stops working at 256. This is why long reductions (sums, means, softmax, norms, losses) must
# accumulate in float32 — the notes warn that "unsafe operations like mean and sum" need care — and why the
# weights themselves stay in float32: an update of 1e-4 to a weight of 1.0 is *lost* in both 16-bit types
# (their step near 1.0 is 2⁻¹⁰ or 2⁻⁷), so pure 16-bit training (Apex's "O3") would stop learning.

# %%
print("257 in bfloat16:", torch.tensor(257.0).bfloat16().item(), "| in float16:", torch.tensor(257.0).half().item())
total = torch.tensor(0.0, dtype=torch.bfloat16)
for _ in range(300):
    total += 1
print("adding 1.0 three hundred times in bfloat16:", total.item())
for dt in (torch.float32, torch.float16, torch.bfloat16):
    w = torch.tensor(1.0, dtype=dt)
    print(f"{str(dt).removeprefix('torch.'):9} weight 1.0 + update 1e-4 = {(w + 1e-4).item():.6f}")
assert total.item() == 256 and (torch.tensor(1.0, dtype=torch.float16) + 1e-4).item() == 1.0

# %% [markdown]
# **Memory per parameter.** A 16-bit number takes 2 bytes instead of 4. But AMP keeps the *parameters*, their
# *gradients* and the optimizer state in float32 (the notes' question "are the parameters float32 under mixed
# precision?" — yes, proved in section 2), so with Adam training still costs 4 + 4 + 8 = 16 bytes per parameter.
# What AMP can save is the memory of the **activations** (the tensors saved for backward, often the largest part)
# — at most half of it, and section 5 shows when it saves nothing — and, on a GPU that has **tensor cores** (张量核心), time.

# %%
for dt in (torch.float32, torch.float16, torch.bfloat16):
    print(f"{str(dt).removeprefix('torch.'):9} {torch.empty(0, dtype=dt).element_size()} bytes per number")
n_params = 25_000_000  # a ResNet-50-sized model
print(
    f"training state with Adam (weights, grads, 2 moments in float32) for 25M parameters: {n_params * 16 / 2**20:.0f} MiB"
)
assert torch.empty(0, dtype=torch.bfloat16).element_size() == 2

# %% [markdown]
# ## 2. `torch.amp.autocast`: low precision where it is safe
#
# Inside `with torch.amp.autocast(device_type, dtype=...)` each operation chooses its own precision from three
# lists kept per device (the "Autocast Op Reference" in PyTorch's AMP documentation prints them):
#
# * **lower precision**: matrix products and convolutions (`matmul`, `linear`, `conv*`, `bmm`, ...) — the bulk of
#   the work, and they tolerate it — cast their float32 inputs to the low-precision type;
# * **float32**: precision-sensitive operations (most losses, some norms, ...) cast their low-precision inputs to
#   float32;
# * **promote**: operations with several inputs of different types run in the widest one, by
#   **type promotion** (类型提升; autocast's promote list, plus ordinary type promotion of elementwise operations such as `+`).
#
# Everything else (ReLU, `+` of equal types, ...) runs in the type of its inputs. The lists differ between
# devices: CUDA puts softmax, `log_softmax`, `layer_norm`, `group_norm`, `sum`, `exp` and `pow` in its float32
# list, the CPU does not, so there they follow their input. Rather than copying a list, the next cell asks this device: each
# operation runs under autocast once on float32 inputs and once on low-precision inputs.


# %%
def autocast_dtypes(op, x: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """Output dtypes of `op` under autocast for a float32 input and for a low-precision input."""
    with torch.amp.autocast(device_type=device.type, dtype=amp_dtype):
        return op(x).dtype, op(x.to(amp_dtype)).dtype


x8 = torch.randn(8, 8, device=device)
target = torch.randint(0, 8, (8,), device=device)
ops = {
    "x @ x (matmul)": lambda t: t @ t,
    "F.linear": lambda t: F.linear(t, t),
    "F.conv1d": lambda t: F.conv1d(t[None], t[:, :, None]),
    "relu": torch.relu,
    "softmax": lambda t: torch.softmax(t, dim=-1),
    "log_softmax": lambda t: F.log_softmax(t, dim=-1),
    "layer_norm": lambda t: F.layer_norm(t, (8,)),
    "sum": torch.sum,
    "exp": torch.exp,
    "cross_entropy": lambda t: F.cross_entropy(t, target),
    "mse_loss": lambda t: F.mse_loss(t, t.detach()),
    "group_norm": lambda t: F.group_norm(t[None], 2),
}
table = {}
print(f"{'operation':16} {'float32 in':>11} {'low in':>9}   list on {device.type}")
for name, op in ops.items():
    from_fp32, from_low = autocast_dtypes(op, x8)
    if from_fp32 == amp_dtype:
        kind = "lower precision"
    elif from_low == torch.float32:
        kind = "float32"
    else:
        kind = "follows input"
    table[name] = kind
    print(f"{name:16} {str(from_fp32).removeprefix('torch.'):>11} {str(from_low).removeprefix('torch.'):>9}   {kind}")
with torch.amp.autocast(device_type=device.type, dtype=amp_dtype):
    low = x8.to(amp_dtype)
    mixed = {"low + float32": (low + x8).dtype, "torch.cat([low, float32])": torch.cat([low, x8]).dtype}
for name, dt in mixed.items():
    print(f"{name:26} -> {str(dt).removeprefix('torch.'):8}   promote")
assert all(table[op] == "lower precision" for op in ("x @ x (matmul)", "F.linear", "F.conv1d"))
assert table["relu"] == "follows input" and set(mixed.values()) == {torch.float32}
sensitive = ("softmax", "log_softmax", "layer_norm", "group_norm", "sum", "exp")
if device.type in ("cpu", "cuda"):  # the two lists this notebook describes
    assert table["cross_entropy"] == table["mse_loss"] == "float32"
    expected = "follows input" if device.type == "cpu" else "float32"
    assert all(table[op] == expected for op in sensitive)

# %% [markdown]
# On the CPU, softmax and `log_softmax` of a bfloat16 tensor stay bfloat16 — but `cross_entropy` (which contains
# a `log_softmax`) is in the float32 list on both devices, so a loss computed with it is float32. If you write
# the loss yourself from `log_softmax`, cast the logits with `.float()` first; that is what CUDA's list does for
# you.
#
# Three things to notice. (1) Autocast only changes how operations *compute*; tensors you create, parameters and
# gradients keep their dtype — with the model below, the weights and their `.grad` are float32 even though the
# forward pass ran in low precision. (2) A low-precision result leaves the region as it is: call `.float()` if you
# continue outside. (3) To force float32 for a sensitive piece *inside* a region, nest
# `autocast(..., enabled=False)` and cast its inputs with `.float()`. Do the backward pass outside the region:
# autograd runs each backward op in the dtype of its forward op anyway.

# %%
layer = nn.Linear(8, 4).to(device)
with torch.amp.autocast(device_type=device.type, dtype=amp_dtype):
    hidden = layer(x8)
    with torch.amp.autocast(device_type=device.type, enabled=False):
        precise = hidden.float() @ torch.ones(4, 2, device=device)  # this product in float32
    loss = F.mse_loss(precise, torch.zeros_like(precise))
loss.backward()
print("hidden:", hidden.dtype, "| inner region:", precise.dtype, "| loss:", loss.dtype)
print("weight:", layer.weight.dtype, "| weight.grad:", layer.weight.grad.dtype)
assert hidden.dtype == amp_dtype and precise.dtype == torch.float32
assert layer.weight.dtype == layer.weight.grad.dtype == torch.float32

# %% [markdown]
# **The notes' names are deprecated.** `torch.cuda.amp.autocast()` and `torch.cuda.amp.GradScaler()` still exist
# as wrappers but warn (on a machine without CUDA they also switch themselves off, with a `UserWarning`). Use
# `torch.amp.autocast("cuda", ...)` and `torch.amp.GradScaler("cuda")`. (The notes' Apex `amp.initialize(...,
# opt_level="O1")` is the ancestor of autocast; Apex is no longer needed.)

# %%
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # "CUDA is not available ... Disabling" on CPU-only machines
    with pytest.warns(FutureWarning, match=r"torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated") as w1:
        torch.cuda.amp.autocast()
    with pytest.warns(FutureWarning, match=r"torch\.cuda\.amp\.GradScaler\(args\.\.\.\)` is deprecated") as w2:
        torch.cuda.amp.GradScaler()
for record in (*w1, *w2):
    if record.category is FutureWarning:
        print("the warning says:", str(record.message))

# %% [markdown]
# ## 3. `torch.amp.GradScaler`: the notes' walk-through
#
# The notes' example, run on this device (`GradScaler("cpu")` exists since PyTorch 2.3). Two parameter vectors,
# $y = \sum x + \sum z = 8$, so every gradient is 1:
#
# * `scaler.scale(y).backward()` is `(y * scale).backward()`: the gradients arrive multiplied by 65536;
# * `scaler.unscale_(opt)` multiplies them in place by 1/scale (one fused call,
#   `torch._amp_foreach_non_finite_check_and_unscale_`, which also records whether any is `inf`/`nan`; the notes
#   name its older one-tensor form); now they can be inspected or clipped — the notes clip `x` and `z` separately
#   to norm 1, giving 1/√2 = 0.7071 each;
# * `scaler.step(opt)` calls `opt.step()` — unless an `inf`/`nan` was found — and `scaler.update()` adjusts the
#   scale. (The notes print 65535 as the scale after `unscale_`; it is 65536.)
#
# The private field `scaler._per_optimizer_states[id(opt)]["stage"]` shows the notes' state machine:
# `update` → READY, `unscale_`: READY → UNSCALED, `step`: READY/UNSCALED → STEPPED.


# %%
def stage(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer) -> str:
    """The scaler's state for `opt` (an internal field, read here only to watch the state machine)."""
    return scaler._per_optimizer_states[id(opt)]["stage"].name


scaler = torch.amp.GradScaler(device.type)
x = torch.tensor([1.0, 2.0], requires_grad=True, device=device)
z = torch.tensor([2.0, 3.0], requires_grad=True, device=device)
y = torch.sum(x) + torch.sum(z)
opt = torch.optim.SGD([x, z], lr=0.001)
print("start:             stage", stage(scaler, opt))
scaler.scale(y).backward()
print("scale + backward:  x.grad", fmt(x.grad, 1), "| y", y.item(), "| stage", stage(scaler, opt))
scaler.unscale_(opt)
print("unscale_:          x.grad", fmt(x.grad, 1), "| scale", scaler.get_scale(), "| stage", stage(scaler, opt))
torch.nn.utils.clip_grad_norm_(x, 1.0)  # with [x, z] together the four gradients would share one norm: 0.5 each
torch.nn.utils.clip_grad_norm_(z, 1.0)
print("clip each to 1:    x.grad", fmt(x.grad), "| z.grad", fmt(z.grad))
scaler.step(opt)
print("step:              x", fmt(x), "| stage", stage(scaler, opt))
scaler.update()
print("update:            scale", scaler.get_scale(), "| stage", stage(scaler, opt))
assert torch.allclose(x.detach().cpu(), torch.tensor([1 - 0.001 / 2**0.5, 2 - 0.001 / 2**0.5]))
assert scaler.get_scale() == 65536.0 and stage(scaler, opt) == "READY"

# %% [markdown]
# **Why the order matters.** `unscale_` twice, or `step` twice, without an `update` in between is refused: the
# scaler would divide the gradients twice or step twice with one scale. And calling `opt.step()` directly after a
# scaled backward uses gradients 65536 times too large — effectively a learning rate 65536 times too big.

# %%
y = torch.sum(x) + torch.sum(z)
opt.zero_grad()
scaler.scale(y).backward()
scaler.unscale_(opt)
for action in ("unscale_", "step", "step"):
    try:
        getattr(scaler, action)(opt)
        print(f"{action}: ok, stage {stage(scaler, opt)}")
    except RuntimeError as err:
        print(f"{action} again: {type(err).__name__}: {err}")
scaler.update()

wrong_x = torch.tensor([1.0, 2.0], requires_grad=True, device=device)
wrong_opt = torch.optim.SGD([wrong_x], lr=0.001)
scaler.scale(wrong_x.sum()).backward()
wrong_opt.step()  # bypasses the scaler
print("opt.step() on scaled gradients moves x by", fmt(1.0 - wrong_x[0].item(), 3), "instead of 0.001")
assert abs((1.0 - wrong_x[0].item()) - 65.536) < 1e-3

# %% [markdown]
# **A skipped step and the scale's growth and backoff.** The scale is not a constant: this is
# **dynamic loss scaling** (动态损失缩放). `update()` halves the scale (`backoff_factor=0.5`)
# after a step with `inf`/`nan` gradients, which `step()` skipped, and doubles it (`growth_factor=2`) after
# `growth_interval` clean steps in a row (2000 by default; 3 here to see it happen); an overflow also resets the
# count of clean steps (the *growth tracker*). Below, the loss of step 2 is
# multiplied by `inf` on purpose — on a GPU with float16 the same happens when an activation overflows. The scaler
# turns an overflow into one lost step and a smaller scale instead of `nan` weights; a scale that keeps growing
# finds the largest scale that does not overflow.

# %%
scaler = torch.amp.GradScaler(device.type, init_scale=2.0**16, growth_interval=3)
w = nn.Parameter(torch.ones(2, device=device))
opt = torch.optim.SGD([w], lr=0.1)
history = []
for step in range(7):
    loss = (w * torch.tensor([1.0, 2.0], device=device)).sum()
    if step == 2:
        loss = loss * float("inf")  # injected overflow
    opt.zero_grad()
    scaler.scale(loss).backward()
    before = w.detach().clone()
    scaler.step(opt)
    scaler.update()
    stepped = not torch.equal(before, w.detach())
    history.append((stepped, scaler.get_scale()))
    print(
        f"step {step}: grads finite {step != 2}, parameters updated {stepped}, scale after update {scaler.get_scale():.0f}"
    )
assert [h[0] for h in history] == [True, True, False, True, True, True, True]
assert [h[1] for h in history] == [65536, 65536, 32768, 32768, 32768, 65536, 65536]
assert torch.isfinite(w).all()

# %% [markdown]
# **float16 with a scaler, saved and resumed.** The scale and the growth tracker are training state: a run that
# is stopped and resumed with a fresh `GradScaler` restarts its search for the scale (and, with the default
# 65536, may lose its first steps to overflows again). So a **checkpoint** (检查点) holds `scaler.state_dict()` — scale,
# `growth_factor`, `backoff_factor`, `growth_interval` and `_growth_tracker` — beside the model and the optimizer;
# `save_checkpoint(directory, model=..., optimizer=..., scaler=..., step=...)` and `load_checkpoint(directory,
# model=..., optimizer=..., scaler=...)` from `utils.checkpoint_files` (notebook 06) do it. Below, a small model trains
# under float16 autocast (on every device, whatever `amp_dtype` is) with a scaler of `init_scale=1024` and
# `growth_interval=3`, and an overflow injected at step 1: once for 8 steps straight, once stopped after step 3,
# saved as a checkpoint (检查点), rebuilt from scratch, loaded and continued.

# %%
gen = torch.Generator().manual_seed(0)
xs, ys = torch.randn(8, 32, 16, generator=gen).to(device), torch.randn(8, 32, 1, generator=gen).to(device)


def fp16_setup() -> tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt, torch.amp.GradScaler(device.type, init_scale=2.0**10, growth_interval=3)


def fp16_steps(model, opt, scaler, steps) -> list[float]:
    """The AMP loop in float16; returns the scale after each step."""
    scales = []
    for step in steps:
        with torch.amp.autocast(device_type=device.type, dtype=torch.float16):
            out = model(xs[step])
            loss = F.mse_loss(out, ys[step])
        assert out.dtype == torch.float16
        if step == 1:
            loss = loss * float("inf")  # injected overflow: step 1 is skipped, the scale halves
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


straight = fp16_setup()
straight_scales = fp16_steps(*straight, range(8))
first = fp16_setup()
first_scales = fp16_steps(*first, range(4))
with tempfile.TemporaryDirectory() as ckpt_dir:
    path = save_checkpoint(ckpt_dir, model=first[0], optimizer=first[1], scaler=first[2], step=4)
    saved_state = first[2].state_dict()
    resumed, no_scaler_state = fp16_setup(), fp16_setup()  # fresh objects
    info = load_checkpoint(ckpt_dir, model=resumed[0], optimizer=resumed[1], scaler=resumed[2])
    load_checkpoint(ckpt_dir, model=no_scaler_state[0], optimizer=no_scaler_state[1])  # scaler left fresh
print("scale after each of 8 steps, straight:  ", straight_scales)
print(f"saved {path.name} after 4 steps; scaler state: {saved_state}")
print("loaded into fresh objects: scaler state equal to the saved one:", resumed[2].state_dict() == saved_state)
resumed_scales = first_scales + fp16_steps(*resumed, range(4, 8))
fresh_scales = first_scales + fp16_steps(*no_scaler_state, range(4, 8))
same_weights = all(torch.equal(p, q) for p, q in zip(straight[0].parameters(), resumed[0].parameters()))
gap_without = max((p - q).abs().max().item() for p, q in zip(straight[0].parameters(), no_scaler_state[0].parameters()))
print("scale after each step, resumed:         ", resumed_scales)
print("scale after each step, scaler not saved:", fresh_scales)
print(
    "resumed run == straight run: weights bit for bit",
    same_weights,
    "| final scaler state",
    resumed[2].state_dict() == straight[2].state_dict(),
)
print(
    "scaler not saved: weights within 1e-3",
    gap_without < 1e-3,
    "| final scaler state",
    no_scaler_state[2].state_dict() == straight[2].state_dict(),
)
assert saved_state["scale"] == 512 and saved_state["_growth_tracker"] == 2
assert resumed[2].state_dict() == straight[2].state_dict() and resumed_scales == straight_scales and same_weights
assert (
    gap_without < 1e-3
    and fresh_scales != straight_scales
    and no_scaler_state[2].state_dict() != straight[2].state_dict()
)

# %% [markdown]
# The run that lost its scaler state still ends with (nearly) the same weights here: multiplying the gradients by
# a power of two and dividing again is exact as long as nothing overflows or underflows — only a float16 gradient
# that falls among the subnormals (below 6.1e-5) at one scale and not at the other is rounded differently, so the
# cell checks the weights to 1e-3 rather than bit for bit (on the machine that stored this output they were even
# bit-identical). But its scale is wrong from the resume on: it restarted from `init_scale` with a growth tracker
# of 0. With real float16 overflows that means other skipped steps, and so other weights.

# %% [markdown]
# ## 4. Recipes
#
# **Gradient clipping** (梯度裁剪) must see the *true* gradients, so call `scaler.unscale_(opt)` first (the
# commented-out lines in the notes' loop). Clipping the still-scaled gradients would clip to a norm 65536 times too
# small in real units:


# %%
def grad_norm_after_step(unscale_first: bool) -> float:
    """Clip to max_norm=1 with or without unscale_ first; return the norm of the gradient the optimizer used."""
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(10, device=device))
    o = torch.optim.SGD([p], lr=0.0)
    sc = torch.amp.GradScaler(device.type)
    sc.scale((p**2).sum()).backward()
    if unscale_first:
        sc.unscale_(o)
    torch.nn.utils.clip_grad_norm_([p], max_norm=1.0)
    sc.step(o)  # step() unscales if unscale_ was not called
    return p.grad.norm().item()


right, wrong = grad_norm_after_step(True), grad_norm_after_step(False)
print(f"norm of the gradient used by the optimizer: unscale_ then clip {right:.4f}; clip then unscale {wrong:.2e}")
assert abs(right - 1.0) < 1e-5 and abs(wrong - 2.0**-16) < 1e-9

# %% [markdown]
# **Gradient accumulation** (梯度累加), from the notes' memory-saving tips: split a batch of 64 into 4 micro-batches
# of 16, divide each loss by 4, and call `backward()` four times; gradients add up. With a scaler, all micro-batches
# of one effective batch must use the *same* scale, so `step()` and `update()` are called once per effective batch.
# The accumulated gradient equals the full batch's (shown with autocast off so the comparison is exact up to float
# rounding; under autocast it holds up to bfloat16/float16 rounding).

# %%
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
xb, yb = torch.randn(64, 8, device=device), torch.randn(64, 1, device=device)
F.mse_loss(net(xb), yb).backward()
full = [p.grad.clone() for p in net.parameters()]
net.zero_grad()

use_amp = False  # autocast off for an exact comparison; the scaler is on
scaler = torch.amp.GradScaler(device.type)
opt = torch.optim.SGD(net.parameters(), lr=0.0)
accum = 4
for i, (xm, ym) in enumerate(zip(xb.chunk(accum), yb.chunk(accum))):
    with torch.amp.autocast(device_type=device.type, dtype=amp_dtype, enabled=use_amp):
        loss = F.mse_loss(net(xm), ym) / accum
    scaler.scale(loss).backward()
    if (i + 1) % accum == 0:
        scaler.unscale_(opt)  # only so that we can look at the true gradients
        accumulated = [p.grad.clone() for p in net.parameters()]
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
same = all(torch.allclose(a_, f_, atol=1e-6) for a_, f_ in zip(accumulated, full))
print(f"4 micro-batches of 16, accumulated under the scaler == one batch of 64: {same}")
assert same

# %% [markdown]
# **Gradient penalty under AMP.** A penalty on the gradient norm needs `torch.autograd.grad(..., create_graph=True)`.
# With a scaler those gradients come out *scaled*: divide them by the scale before computing the penalty (the
# recipe of PyTorch's AMP examples), compute the penalty inside autocast, then scale the total loss as usual.
# Forgetting the division makes the penalty 65536 times too large. (The cell passes `enabled=False` to both
# autocast regions, so that the runs with and without a scaler can be compared exactly.)


# %%
def penalised_loss(use_scaler: bool, unscale: bool = True) -> torch.Tensor:
    """Loss + norm of its parameter gradients, computed as the AMP recipe says (autocast off: exact check)."""
    torch.manual_seed(0)
    model = nn.Linear(8, 1).to(device)
    sc = torch.amp.GradScaler(device.type, enabled=use_scaler)
    with torch.amp.autocast(device_type=device.type, dtype=amp_dtype, enabled=False):
        loss = F.mse_loss(model(xb), yb)
    grads = torch.autograd.grad(sc.scale(loss), model.parameters(), create_graph=True)
    if unscale:
        grads = [g_ / sc.get_scale() for g_ in grads] if use_scaler else grads
    with torch.amp.autocast(device_type=device.type, dtype=amp_dtype, enabled=False):
        penalty = torch.sqrt(sum(g_.pow(2).sum() for g_ in grads))
    return loss + penalty


plain_total, amp_total = penalised_loss(False), penalised_loss(True)
forgot = penalised_loss(True, unscale=False)
print(
    f"loss + penalty: without scaler {plain_total.item():.4f}, with scaler {amp_total.item():.4f}; "
    f"forgetting to unscale makes it over 1000 times larger: {(forgot > 1000 * amp_total).item()}"
)
assert torch.allclose(plain_total, amp_total) and forgot > 1000 * amp_total

# %% [markdown]
# **The `enabled=` switch.** `autocast(..., enabled=False)` and `GradScaler(enabled=False)` turn themselves into
# no-ops (`scale(loss)` returns the loss itself, `step` just calls `opt.step()`, `update` does nothing), so one
# training loop serves both modes — the notes' `use_amp` flag. With it off, the AMP loop gives bit for bit the
# result of the plain loop.


# %%
def few_steps(amp_loop: bool, use_amp: bool) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sc = torch.amp.GradScaler(device.type, enabled=use_amp)
    for _ in range(5):
        opt.zero_grad()
        if amp_loop:
            with torch.amp.autocast(device_type=device.type, dtype=amp_dtype, enabled=use_amp):
                loss = F.mse_loss(model(xb), yb)
            scaled = sc.scale(loss)
            assert (scaled is loss) == (not use_amp)
            scaled.backward()
            sc.step(opt)
            sc.update()
        else:
            F.mse_loss(model(xb), yb).backward()
            opt.step()
    return model.weight.detach()


identical = torch.equal(few_steps(amp_loop=True, use_amp=False), few_steps(amp_loop=False, use_amp=False))
print("AMP loop with enabled=False == plain loop, bit for bit:", identical)
assert identical

# %% [markdown]
# **TF32 (TensorFloat-32).** On NVIDIA GPUs since Ampere, float32 matrix products and convolutions can run on
# tensor cores in TF32: inputs rounded to 10 mantissa bits (float16's precision) with float32's 8-bit exponent (no
# overflow problem), products accumulated in float32 — much faster than true float32 with no code change, at the
# cost of about 3 decimal digits. It is a switch on the *float32* path, independent of autocast. The notes say it
# is on by default, with `torch.backends.cuda.matmul.allow_tf32 = True`: that was true for PyTorch 1.7–1.11; since
# 1.12 matrix products use true float32 unless you ask, while cuDNN convolutions still use TF32 by default.
#
# Today's settings are strings, one per backend and operation, each `"ieee"` (true float32), `"tf32"`, or `"none"`
# (inherit from the level above):
#
# * `torch.backends.fp32_precision` — the global default (`"none"`: true float32);
# * `torch.backends.cuda.matmul.fp32_precision` — cuBLAS matrix products, default `"none"`, so IEEE float32;
# * `torch.backends.cudnn.conv.fp32_precision` and `torch.backends.cudnn.rnn.fp32_precision` — cuDNN, default
#   `"tf32"`.
#
# The older switches still work in 2.14, without a warning, and set the same state:
# `torch.backends.cuda.matmul.allow_tf32`, `torch.backends.cudnn.allow_tf32`, and
# `torch.set_float32_matmul_precision("high")` (TF32 for matrix products; `"highest"` is IEEE). Use one family,
# not both: after a string setting of `"tf32"`, *reading* a legacy flag raises a `RuntimeError`. The settings are
# global; the `cuda` and `cudnn` ones act only on NVIDIA GPUs, so on this CPU they are just read and set. (The
# CPU's oneDNN backend has its own, `torch.backends.mkldnn.matmul.fp32_precision`, where `"bf16"` lets float32
# matrix products use bfloat16 units.)

# %%
tb = torch.backends
settings = {
    "torch.backends.fp32_precision": lambda: tb.fp32_precision,
    "torch.backends.cuda.matmul.fp32_precision": lambda: tb.cuda.matmul.fp32_precision,
    "torch.backends.cudnn.conv.fp32_precision": lambda: tb.cudnn.conv.fp32_precision,
    "torch.backends.cudnn.rnn.fp32_precision": lambda: tb.cudnn.rnn.fp32_precision,
}
defaults = {name: get() for name, get in settings.items()}
for name, value in defaults.items():
    print(f"{name:44} = {value!r}")
assert defaults["torch.backends.cuda.matmul.fp32_precision"] == "none"
assert defaults["torch.backends.cudnn.conv.fp32_precision"] == "tf32"
assert torch.get_float32_matmul_precision() == "highest" and tb.cuda.matmul.allow_tf32 is False

tb.cuda.matmul.fp32_precision = "tf32"  # TF32 for float32 matrix products on CUDA
print("after setting 'tf32':", tb.cuda.matmul.fp32_precision)
with pytest.raises(RuntimeError, match="mix of the legacy and new APIs") as mixed_err:
    tb.cuda.matmul.allow_tf32  # a legacy read after a new-style setting
print("reading allow_tf32 now:", mixed_err.type.__name__ + ":", str(mixed_err.value).split(". ")[0] + ".")
tb.cuda.matmul.fp32_precision = "none"  # back to the default
assert tb.cuda.matmul.fp32_precision == "none" and tb.cuda.matmul.allow_tf32 is False

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.set_float32_matmul_precision("high")
    via_precision = tb.cuda.matmul.fp32_precision
    torch.set_float32_matmul_precision("highest")
    tb.cuda.matmul.allow_tf32 = True
    via_legacy = tb.cuda.matmul.fp32_precision
    tb.cuda.matmul.allow_tf32 = False
tb.cuda.matmul.fp32_precision = "none"
print(
    "set_float32_matmul_precision('high') ->",
    repr(via_precision),
    "| allow_tf32 = True ->",
    repr(via_legacy),
    "| warnings:",
    len(caught),
)
assert via_precision == via_legacy == "tf32" and not caught
assert {name: get() for name, get in settings.items()} == defaults

# %% [markdown]
# What the rounding costs, emulated on this machine: round the inputs of a 256×256 matrix product to TF32's and
# bfloat16's precision, multiply exactly (float64), and compare with the exact product of the original inputs.


# %%
def round_mantissa(t: torch.Tensor, bits: int) -> torch.Tensor:
    """Round float32 values to `bits` mantissa bits (round to nearest even), keeping float32's exponent."""
    i = t.float().view(torch.int32)
    drop = 23 - bits
    i = (i + ((1 << (drop - 1)) - 1) + ((i >> drop) & 1)) & ~((1 << drop) - 1)
    return i.view(torch.float32)


gen = torch.Generator().manual_seed(0)
A, B = torch.randn(256, 256, generator=gen), torch.randn(256, 256, generator=gen)
exact = A.double() @ B.double()
assert torch.equal(round_mantissa(A, 7), A.bfloat16().float())  # the emulation matches a real conversion
errors = {}
for name, bits in (("TF32 / float16 inputs (10 bits)", 10), ("bfloat16 inputs (7 bits)", 7)):
    approx = round_mantissa(A, bits).double() @ round_mantissa(B, bits).double()
    errors[name] = ((approx - exact).norm() / exact.norm()).item()
    print(f"{name:32}: relative error of A @ B ~ {errors[name]:.0e}")
fp32_err = (((A @ B).double() - exact).norm() / exact.norm()).item()
print("real float32 matmul on this machine: relative error below 1e-6:", fp32_err < 1e-6)
assert 1e-4 < errors["TF32 / float16 inputs (10 bits)"] < 1e-3 < errors["bfloat16 inputs (7 bits)"] < 1e-2

# %% [markdown]
# ## 5. Measured: float32 versus autocast on the same model and data
#
# A 3-layer MLP (64 → 512 → 512 → 10) learns to classify 4096 points from 10 Gaussian clusters, 200 SGD steps of
# batch 256, once in float32 and once under autocast, from the same initial weights and the same batches. The
# loop is the standard AMP loop (scale → backward → unscale_ → clip → step → update); the scaler is enabled only
# for float16 (`use_scaler`): bfloat16 has float32's range, gradients do not underflow, and PyTorch's
# documentation says no scaler is needed for it.


# %%
def make_clusters(n: int = 4096, dim: int = 64, classes: int = 10, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    centers = 0.3 * torch.randn(classes, dim, generator=gen)  # overlapping clusters: not too easy
    labels = torch.randint(0, classes, (n,), generator=gen)
    return centers[labels] + torch.randn(n, dim, generator=gen), labels


def make_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)


def train(use_amp: bool, steps: int = 200, batch: int = 256) -> dict:
    """The standard AMP training loop; returns the losses, seconds per step and peak CUDA memory."""
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=use_amp and use_scaler)
    order = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(1))
    losses = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    for step in range(steps):
        idx = order[(step * batch) % len(x_all) :][:batch]
        xb, yb = x_all[idx], y_all[idx]
        with torch.amp.autocast(device_type=device.type, dtype=amp_dtype, enabled=use_amp):
            loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=5.0)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {
        "losses": losses,
        "wall_ms": 1000 * (time.perf_counter() - start_wall) / steps,
        "cpu_ms": 1000 * (time.process_time() - start_cpu) / steps,
        "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
        "param_dtype": next(model.parameters()).dtype,
        "grad_dtype": next(model.parameters()).grad.dtype,
    }


x_all, y_all = make_clusters()
x_all, y_all = x_all.to(device), y_all.to(device)
runs = {"float32": train(use_amp=False), f"autocast {str(amp_dtype).removeprefix('torch.')}": train(use_amp=True)}
final = {name: sum(r["losses"][-20:]) / 20 for name, r in runs.items()}
(fp32_name, amp_name) = runs
first = [r["losses"][0] for r in runs.values()]
print(f"loss at step 0 close to ln(10) = 2.30 in both runs: {all(abs(v - 2.30) < 0.05 for v in first)}")
print(f"final loss (mean of the last 20 steps) below 0.3 in both runs: {max(final.values()) < 0.3}")
print(f"final losses within 0.05 of each other: {abs(final[fp32_name] - final[amp_name]) < 0.05}")
for name, r in runs.items():
    print(f"{name:17} parameters stay {r['param_dtype']}, gradients {r['grad_dtype']}")
assert max(final.values()) < 0.3 and abs(final[fp32_name] - final[amp_name]) < 0.05
assert all(r["param_dtype"] == r["grad_dtype"] == torch.float32 for r in runs.values())

# %% [markdown]
# The loss curves lie on top of each other:

# %%
plt.figure(figsize=(6, 3))
for name, r in runs.items():
    plt.plot(r["losses"], label=name, alpha=0.8)
plt.xlabel("step")
plt.ylabel("cross-entropy loss")
plt.yscale("log")
plt.legend()
plt.tight_layout()
plt.show()
gap = max(abs(p - q) for p, q in zip(runs[fp32_name]["losses"], runs[amp_name]["losses"]))
print(f"largest gap between the two curves below 0.1: {gap < 0.1}")
assert gap < 0.1

# %% [markdown]
# ### What autocast saves in memory
#
# The memory that autocast can save is what autograd keeps for the backward pass. It is measured exactly with
# `torch.autograd.graph.saved_tensors_hooks` (the tool that [notebook 11](11_memory_and_speed.ipynb), section 1.1,
# uses to count what activation checkpointing saves): every tensor that autograd saves passes through a hook,
# which counts each distinct storage once (by `untyped_storage().data_ptr()`, since several saved tensors can be
# views of one storage) and sorts it:
#
# * **inputs**: the batch and the targets, or the batch cast to 16 bits;
# * **16-bit weight copies**: a storage holding a parameter cast to the low-precision type — autocast casts a
#   weight once per forward pass (it caches the cast inside the region), and the matrix product saves that copy
#   for its backward;
# * **activations**: everything else (layer outputs, the loss's softmax, ...);
# * the parameters themselves are not counted: they exist whether or not a graph is kept.
#
# The batches are cloned first: a slice `x_all[:256]` is a view that shares — and would be charged — the storage
# of all 4096 points. The same MLP is measured at three batch sizes; only the activations and inputs grow with
# the batch.


# %%
def saved_tensor_bytes(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, use_amp: bool) -> dict[str, int]:
    """Bytes that autograd saves for backward in one forward pass, by kind; each storage counted once."""
    params = list(model.parameters())

    def is_copy_of(t: torch.Tensor, src: torch.Tensor) -> bool:
        """`t`'s whole storage holds `src` cast to `t`'s dtype (t may be a view, such as a transposed weight)."""
        whole = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
        if t.dtype == src.dtype or whole.numel() != src.numel():
            return False
        return torch.equal(whole, src.detach().to(t.dtype).flatten())

    seen: dict[int, tuple[str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            if any(ptr == p.untyped_storage().data_ptr() for p in params):
                kind = "parameters"
            elif ptr in (xb.untyped_storage().data_ptr(), yb.untyped_storage().data_ptr()) or is_copy_of(t, xb):
                kind = "inputs"
            elif any(is_copy_of(t, p) for p in params):
                kind = "16-bit weight copies"
            else:
                kind = "activations"
            seen[ptr] = (kind, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.amp.autocast(device_type=device.type, dtype=amp_dtype, enabled=use_amp):
            loss = F.cross_entropy(model(xb), yb)
    del loss  # the graph and what it saved are freed; no backward pass is needed to count
    kinds = ("inputs", "activations", "16-bit weight copies")
    return {k: sum(n for kind, n in seen.values() if kind == k) for k in kinds}


mlp = make_mlp()
memory = {}
print(f"{'batch':>5} {'run':9} {'inputs':>8} {'activations':>12} {'16-bit weights':>15} {'total KiB':>10} {'ratio':>6}")
for batch in (16, 256, 4096):
    xb, yb = x_all[:batch].clone(), y_all[:batch].clone()
    for use_amp in (False, True):
        memory[batch, use_amp] = m = saved_tensor_bytes(mlp, xb, yb, use_amp)
        ratio = sum(m.values()) / sum(memory[batch, False].values())
        cells = " ".join(f"{m[k] / 1024:{w}.1f}" for k, w in zip(m, (8, 12, 15)))
        print(
            f"{batch:5} {'autocast' if use_amp else 'float32':9} {cells} {sum(m.values()) / 1024:10.1f} "
            + (f"{ratio:6.2f}" if use_amp else "")
        )
total_ratio = {b: sum(memory[b, True].values()) / sum(memory[b, False].values()) for b in (16, 256, 4096)}
act_ratio = {b: memory[b, True]["activations"] / memory[b, False]["activations"] for b in (16, 256, 4096)}
copies = {memory[b, True]["16-bit weight copies"] for b in (16, 256, 4096)}
print("activations alone, autocast / float32:", {b: round(r, 2) for b, r in act_ratio.items()})
assert all(r < 0.6 for r in act_ratio.values())  # activations (nearly) halve at every batch size
assert len(copies) == 1 and copies.pop() > 0 and all(memory[b, False]["16-bit weight copies"] == 0 for b in act_ratio)
assert total_ratio[4096] < 0.6 and total_ratio[256] > 0.8 and total_ratio[16] > 1

# %% [markdown]
# **The rule.** Under autocast a training step keeps its activations in 16 bits — half the bytes (only what a
# float32-list operation saves, here the small log-softmax inside `cross_entropy`, stays float32) — plus one
# 16-bit copy of each weight that a low-precision operation used (half the bytes of those weights), made anew in
# every forward pass. Whether memory goes down depends on the ratio of activations to weights:
#
# * large batches or long sequences, small weights (batch 4096 here): the total nearly halves;
# * the training run above (batch 256): activations and weights are about the same size, and autocast saves 2 %;
# * small batches of a big model (batch 16): the weight copies dominate and autocast keeps *more* than float32.
#
# (The first layer's weight is not saved in either run: its input needs no gradient, so its backward needs no
# weight.) This is the notes' "AMP is not necessarily smaller". On a GPU, `torch.cuda.max_memory_allocated` also
# counts what is not saved for backward — the 16-bit copy of the first layer's weight, temporary casts; the
# time saved by tensor cores is usually the bigger win.

# %% [markdown]
# Time per step (and on CUDA, peak memory). These numbers depend on the hardware and on what else runs on the
# machine, so they are not compared by the tests; on a CPU without native bfloat16 instructions (or with them
# switched off, as in the course's pinned runs: see the first cell) autocast is often *slower* than float32 — the
# notes' remark that AMP is "not necessarily faster or smaller" — while on a GPU with tensor cores float16 is
# typically 2–3× faster for large matrices.

# %%
# NBVAL_IGNORE_OUTPUT
for name, r in runs.items():
    line = f"{name:17}: {r['wall_ms']:6.2f} ms per step (wall), {r['cpu_ms']:6.2f} ms (CPU time)"
    if r["peak_cuda_mib"] is not None:
        line += f", peak CUDA memory {r['peak_cuda_mib']:.1f} MiB"
    print(line)
assert all(r["wall_ms"] > 0 and r["cpu_ms"] >= 0 for r in runs.values())
assert device.type != "cuda" or all(r["peak_cuda_mib"] > 0 for r in runs.values())

# %% [markdown]
# ## Exercises (练习)
#
# Three exercises, easiest first: predict, write a function, then a stretch that combines this notebook with
# notebook 03's module hooks. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it and run it. The
# **check cell** below it then says *correct*, or *not yet* with a hint and the section to re-read, or *not
# attempted yet* while the stub is untouched. This section does not depend on the lesson's cells: after a kernel
# restart, run its first cell and go on. `make progress` lists which exercises of every notebook pass. The checks
# run on the CPU, whatever device you have.

# %%
import torch
import torch.nn.functional as F
from torch import nn

from utils.exercises import Checker

ex = Checker("07")

# %% [markdown]
# ### Exercise 1 · What autocast makes of each operation
#
# The notes ask whether the model's parameters are float32 in mixed-precision training (混合精度训练).
# Answer their question, and three more, by predicting the four dtypes this code prints (section 2):
#
# ```python
# layer = nn.Linear(8, 4)
# x, target = torch.randn(16, 8), torch.randint(0, 4, (16,))
# with torch.amp.autocast("cpu", dtype=torch.bfloat16):
#     h = layer(x)
#     p = torch.softmax(h, dim=-1)
#     loss = F.cross_entropy(h, target)
# loss.backward()
# print(h.dtype, p.dtype, loss.dtype, layer.weight.grad.dtype)
# ```
#
# Write them as a list of four dtypes, e.g. `[torch.float16, torch.float16, torch.float16, torch.float16]`. Careful:
# the question is about the CPU's lists.

# %%
# ✏️ Exercise 1: replace ... with [h.dtype, p.dtype, loss.dtype, layer.weight.grad.dtype]
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · One AMP training step in the right order
#
# The notes' loop has two lines commented out, `scaler.unscale_(optimizer)` and `clip_grad_norm_(...)`, "needed only
# if you modify the gradients". Here you clip them. Write `amp_step(model, optimizer, scaler, x, y, max_norm)`, one
# float16 training step with gradient clipping (梯度裁剪):
#
# * compute `F.cross_entropy(model(x), y)` under `torch.amp.autocast(x.device.type, dtype=torch.float16)`;
# * then, with the `GradScaler` you are given: zero the gradients, the scaled backward pass, `unscale_`, clip the
#   norm of all gradients to `max_norm`, step, update (sections 3 and 4);
# * return the loss (not the scaled loss).
#
# The check runs four steps on the CPU with a `GradScaler("cpu")` and a small network, and compares every step with
# the recipe's. Its third batch holds a value above 65504, so that step overflows in float16: the scaler must skip
# it and halve its scale.


# %%
# ✏️ Exercise 2: write the body of the function
def amp_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    x: torch.Tensor,
    y: torch.Tensor,
    max_norm: float,
) -> torch.Tensor:
    raise NotImplementedError("your code here")


# %%
ex.check(2, amp_step)

# %% [markdown]
# ### Exercise 3 · Find the layer that overflows (stretch)
#
# When a float16 run produces `inf` or `nan`, the first question is: which layer did it first? Combine section 1
# (float16 overflows above 65504) with notebook 03's forward hooks (sections 9 and 10) and write
# `first_overflow(model, x)`:
#
# * register a forward hook on every module of `model.named_modules()`;
# * run `model(x)` once, without gradients, under `torch.amp.autocast(x.device.type, dtype=torch.float16)`;
# * return the name of the first module, in the order the hooks fire, whose output is not finite
#   (`torch.isfinite`), or `None` if every output is finite;
# * leave the model as you found it: no hook left behind (remove them in a `finally`), parameters unchanged.
#
# The check tries a model that overflows in float16 only, one that does not overflow, one with a `Sequential` inside
# a `Sequential`, and one whose overflow is hidden by a later ReLU (−inf becomes 0).


# %%
# ✏️ Exercise 3: write the body of the function
def first_overflow(model: nn.Module, x: torch.Tensor) -> str | None:
    raise NotImplementedError("your code here")


# %%
ex.check(3, first_overflow)

# %% [markdown]
# ## Summary
#
# * float16 overflows (上溢) above 65504 and rounds gradients below ~3e-8 to zero (下溢; below 6e-5 it already
#   keeps fewer bits); bfloat16 has float32's range but only 8 significant bits. Reductions and weight updates
#   need float32.
# * `with torch.amp.autocast(device.type, dtype=...)` (bfloat16 on the CPU and on GPUs that support it, float16
#   on older GPUs) runs matrix products and convolutions in low precision, the ops of its float32 list (most
#   losses; on CUDA also softmax, `log_softmax`, norms, `sum`, `exp`) in float32, and promotes mixed inputs; the
#   lists differ per device, so ask the device (section 2). Parameters and gradients stay float32. Do the backward
#   pass outside the region.
# * `torch.amp.GradScaler(device.type)` (not `torch.cuda.amp`): loss scaling (损失缩放) with
#   `scale(loss).backward()` → optional `unscale_(opt)` + clipping → `step(opt)` (skipped on inf/nan) →
#   `update()` (dynamic loss scaling, 动态损失缩放: halve on overflow, double after `growth_interval` clean steps);
#   the order READY → UNSCALED → STEPPED → READY is enforced. Needed for float16, not for bfloat16. Its
#   `state_dict()` (scale, growth tracker) belongs in every checkpoint: `save_checkpoint(..., scaler=scaler)`.
# * Recipes: unscale before gradient clipping (梯度裁剪); accumulate with one `step`/`update` per effective batch;
#   unscale gradients by hand for a gradient penalty; `enabled=use_amp` turns everything off.
# * TF32 is a separate float32 switch on Ampere+ GPUs: `torch.backends.cuda.matmul.fp32_precision = "tf32"`
#   (off by default for matrix products since PyTorch 1.12), `torch.backends.cudnn.conv.fp32_precision` (on by
#   default); the legacy `allow_tf32` flags and `torch.set_float32_matmul_precision` still work, but do not mix
#   the two families.
# * Measured here: the autocast loss curve matches float32. Autocast halves the activations saved for backward
#   but adds a 16-bit copy of each weight it casts: memory nearly halves at batch 4096, barely changes at batch
#   256, and grows at batch 16. Speed depends on the hardware.

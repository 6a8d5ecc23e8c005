# %% [markdown]
# # 07 · Automatic mixed precision (自动混合精度)
#
# **What you learn.** How to train with 16-bit floating point where it is safe and 32-bit where it is needed,
# which is what *automatic mixed precision* (AMP) does:
#
# 1. why 16 bits at all, and what can go wrong: float16's overflow at 65504, small gradients that **underflow** to
#    zero, bfloat16's wide range but coarse precision, and the memory per parameter;
# 2. `torch.amp.autocast(device_type, dtype)`: which operations run in low precision and which stay in float32;
# 3. `torch.amp.GradScaler`: the notes' walk-through (scale → backward → `unscale_` → clip → `step` → `update`),
#    its state machine, and a step that is skipped because of an `inf`;
# 4. the recipes: gradient clipping, gradient accumulation, a gradient penalty, the `enabled=` switch, and TF32;
# 5. a small model trained in float32 and under autocast: the same loss curve, less activation memory.
#
# **Before this notebook.** A training loop (notebooks 02–05): forward, `backward()`, `optimizer.step()`.
#
# **Study time:** about 45 min. **Run time:** 40 s on the 2-core course machine (one thread, measured by
# `make execute`), an AVX2 CPU without bfloat16 instructions, where bfloat16 is emulated and the autocast run of
# section 5 alone takes about 30 s. On a CPU with bfloat16 instructions (AVX-512 BF16, AMX) the whole notebook takes
# about 10 s, most of it importing PyTorch.
#
# **On a GPU.** The low-precision type becomes float16 (the notes' setting, with tensor cores doing the matrix
# products) instead of bfloat16 on the CPU, the `GradScaler` is switched on in training, softmax and other
# reductions are listed as float32 operations by CUDA's autocast, and section 5 also reports
# `torch.cuda.max_memory_allocated`. The stored outputs were made on the CPU.
#
# **What changed since the notes.** The notes use `torch.cuda.amp.autocast()` and `torch.cuda.amp.GradScaler()`,
# say that mixed precision only works on GPUs, and that TF32 matrix products are on by default. Today the API is
# device-generic, `torch.amp.autocast("cpu" | "cuda", dtype=...)` and `torch.amp.GradScaler("cpu" | "cuda")`
# (the `torch.cuda.amp` names emit a `FutureWarning`), the CPU supports bfloat16 autocast, and TF32 for matrix
# products has been **off** by default since PyTorch 1.12. Each point is shown below.

# %% [markdown]
# ## Setup
#
# `amp_dtype` is the low-precision type used throughout: float16 on CUDA, bfloat16 on the CPU (CPU autocast
# supports only bfloat16 and float16, and bfloat16 is the one CPU kernels are fast at).

# %%
import time
import warnings

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.amp.grad_scaler import OptState

from utils import fmt, get_device, seed_everything

seed_everything(0)
device = get_device()
amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
print("device:", device.type, "| low-precision dtype for autocast:", amp_dtype)

# %% [markdown]
# ## 1. Why 16 bits, and what breaks
#
# A float stores a sign, an **exponent** (how big: the range) and a **mantissa** (how many significant digits:
# the precision). float16 ("half", 半精度) spends 5 bits on the exponent, bfloat16 ("brain float") keeps
# float32's 8 exponent bits and cuts the mantissa to 7 bits. `torch.finfo` tells the consequences:

# %%
print(f"{'dtype':9} {'bits':>4} {'exp':>3} {'mant':>4} {'max':>10} {'smallest normal':>15} {'eps (1+eps > 1)':>15}")
layout = {torch.float32: (8, 23), torch.float16: (5, 10), torch.bfloat16: (8, 7)}
for dt, (e_bits, m_bits) in layout.items():
    fi = torch.finfo(dt)
    print(f"{str(dt).removeprefix('torch.'):9} {fi.bits:4} {e_bits:3} {m_bits:4} {fi.max:10.3e} {fi.tiny:15.3e} {fi.eps:15.3e}")
    assert fi.eps == 2.0 ** -m_bits
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
# **Small gradients underflow to zero in float16.** Below its smallest normal number (6.1e-5) float16 has
# *subnormals* down to 2⁻²⁴ ≈ 6e-8 with fewer and fewer significant bits, and anything below about 3e-8 becomes
# exactly 0. Gradients of a deep network are often that small. Take a million gradient magnitudes spread evenly
# (in log scale) between 1e-10 and 1e-2: in float16 almost a third of them vanish. **Loss scaling** (损失缩放) is the
# cure: multiply the loss by S = 65536 = 2¹⁶ before `backward()`, so every gradient is 65536 times larger while it
# travels through float16, and divide by S afterwards in float32. Multiplying by a power of two only changes the
# exponent, so nothing is lost by the scaling itself.

# %%
g = torch.logspace(-10, -2, 1_000_000)
zero_fp16 = (g.half() == 0).float().mean().item()
S = 2.0 ** 16
zero_scaled = ((g * S).half() == 0).float().mean().item()
recovered = (g * S).half().float() / S
print(f"gradients that become 0 in float16: {zero_fp16:.1%}; after scaling by 2**16: {zero_scaled:.1%}")
print(f"in bfloat16: {(g.bfloat16() == 0).float().mean().item():.1%}")
print("2**-26 in float16:", torch.tensor(2.0 ** -26).half().item(),
      "| scaled, stored in float16, unscaled in float32:", ((torch.tensor(2.0 ** -26) * S).half().float() / S).item())
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
# What AMP saves is the memory of **activations** (the tensors saved for backward, often the largest part) and,
# on GPUs with tensor cores, time.

# %%
for dt in (torch.float32, torch.float16, torch.bfloat16):
    print(f"{str(dt).removeprefix('torch.'):9} {torch.empty(0, dtype=dt).element_size()} bytes per number")
n_params = 25_000_000  # a ResNet-50-sized model
print(f"training state with Adam (weights, grads, 2 moments in float32) for 25M parameters: {n_params * 16 / 2**20:.0f} MiB")
assert torch.empty(0, dtype=torch.bfloat16).element_size() == 2

# %% [markdown]
# ## 2. `torch.amp.autocast`: low precision where it is safe
#
# Inside `with torch.amp.autocast(device_type, dtype=...)` each operation chooses its own precision from lists
# kept per device:
#
# * matrix products and convolutions (`matmul`, `linear`, `conv*`, ...) run in the low-precision type — they are
#   the bulk of the work and tolerate it;
# * precision-sensitive operations (losses, `log_softmax`, norms, `exp`, `sum` on CUDA, ...) run in float32;
# * everything else (ReLU, additions, ...) runs in the type of its inputs; mixed inputs are promoted to the wider
#   type.
#
# The lists differ between devices. On the CPU, softmax and `sum` are not in the float32 list and follow their
# input; on CUDA they are computed in float32. Printed on this machine:

# %%
a, b = torch.randn(8, 8, device=device), torch.randn(8, 8, device=device)
target = torch.randint(0, 8, (8,), device=device)
with torch.amp.autocast(device_type=device.type, dtype=amp_dtype):
    mm = a @ b
    results = {
        "a @ b (matmul)": mm,
        "F.linear(a, b)": F.linear(a, b),
        "conv1d": F.conv1d(a[None], b[:, :, None]),
        "relu(a @ b)": torch.relu(mm),
        "softmax(a @ b)": torch.softmax(mm, dim=-1),
        "log_softmax(a @ b)": F.log_softmax(mm, dim=-1),
        "(a @ b).sum()": mm.sum(),
        "cross_entropy(a @ b)": F.cross_entropy(mm, target),
        "mse_loss(a @ b, a)": F.mse_loss(mm, a),
        "(a @ b) + a  (mixed)": mm + a,
    }
for name, t in results.items():
    print(f"{name:22} -> {t.dtype}")
print("outside the region, mm is still", mm.dtype, "| a new a @ b is", (a @ b).dtype)
assert results["a @ b (matmul)"].dtype == amp_dtype and results["cross_entropy(a @ b)"].dtype == torch.float32
assert results["(a @ b) + a  (mixed)"].dtype == torch.float32

# %% [markdown]
# Three things to notice. (1) Autocast only changes how operations *compute*; tensors you create, parameters and
# gradients keep their dtype — with the model below, the weights and their `.grad` are float32 even though the
# forward pass ran in low precision. (2) A low-precision result leaves the region as it is: call `.float()` if you
# continue outside. (3) To force float32 for a sensitive piece *inside* a region, nest
# `autocast(..., enabled=False)` and cast its inputs with `.float()`. Do the backward pass outside the region:
# autograd runs each backward op in the dtype of its forward op anyway.

# %%
layer = nn.Linear(8, 4).to(device)
with torch.amp.autocast(device_type=device.type, dtype=amp_dtype):
    hidden = layer(a)
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
# * `scaler.unscale_(opt)` divides them in place (and records whether any is `inf`/`nan`); now they can be
#   inspected or clipped — the notes clip `x` and `z` separately to norm 1, giving 1/√2 = 0.7071 each;
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
# **A skipped step and the scale's growth and backoff.** `update()` halves the scale (`backoff_factor=0.5`)
# after a step with `inf`/`nan` gradients, which `step()` skipped, and doubles it (`growth_factor=2`) after
# `growth_interval` clean steps in a row (2000 by default; 3 here to see it happen). Below, the loss of step 2 is
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
    print(f"step {step}: grads finite {step != 2}, parameters updated {stepped}, scale after update {scaler.get_scale():.0f}")
assert [h[0] for h in history] == [True, True, False, True, True, True, True]
assert [h[1] for h in history] == [65536, 65536, 32768, 32768, 32768, 65536, 65536]
assert torch.isfinite(w).all()

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
    sc.scale((p ** 2).sum()).backward()
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
# Forgetting the division makes the penalty 65536 times too large.

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
print(f"loss + penalty: without scaler {plain_total.item():.4f}, with scaler {amp_total.item():.4f}; "
      f"forgetting to unscale makes it over 1000 times larger: {(forgot > 1000 * amp_total).item()}")
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
# **TF32 (TensorFloat-32).** On NVIDIA GPUs since Ampere, float32 matrix products can run on tensor cores in TF32:
# inputs rounded to 10 mantissa bits (float16's precision) with float32's 8-bit exponent (no overflow problem),
# products accumulated in float32 — about as fast as float16 with no code change, at the cost of about 3 decimal
# digits. It is a switch on the *float32* path, independent of autocast. The notes say it is on by default: that
# was true for PyTorch 1.7–1.11; since 1.12 `torch.backends.cuda.matmul.allow_tf32` is `False` (the cuDNN flag
# for convolutions is still `True`). `torch.set_float32_matmul_precision("high")` turns it on for matrix products
# ("highest", the default, means true float32).
#
# What the rounding costs, emulated on this machine: round the inputs of a 256×256 matrix product to TF32's and
# bfloat16's precision, multiply exactly (float64), and compare with the exact product of the original inputs.

# %%
def round_mantissa(t: torch.Tensor, bits: int) -> torch.Tensor:
    """Round float32 values to `bits` mantissa bits (round to nearest even), keeping float32's exponent."""
    i = t.float().view(torch.int32)
    drop = 23 - bits
    i = (i + ((1 << (drop - 1)) - 1) + ((i >> drop) & 1)) & ~((1 << drop) - 1)
    return i.view(torch.float32)


print("flags: matmul.allow_tf32 =", torch.backends.cuda.matmul.allow_tf32,
      "| cudnn.allow_tf32 =", torch.backends.cudnn.allow_tf32,
      "| float32_matmul_precision =", torch.get_float32_matmul_precision())
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
assert torch.backends.cuda.matmul.allow_tf32 is False and torch.get_float32_matmul_precision() == "highest"

# %% [markdown]
# ## 5. Measured: float32 versus autocast on the same model and data
#
# A 3-layer MLP (64 → 512 → 512 → 10) learns to classify 4096 points from 10 Gaussian clusters, 200 SGD steps of
# batch 256, once in float32 and once under autocast, from the same initial weights and the same batches. The
# loop is the standard AMP loop (scale → backward → unscale_ → clip → step → update); the scaler is enabled only
# for float16: bfloat16 has float32's range, gradients do not underflow, and PyTorch's documentation says no
# scaler is needed for it.
#
# Memory is measured exactly with `torch.autograd.graph.saved_tensors_hooks`: every tensor that autograd saves for
# the backward pass (the activations) passes through a hook, which adds up the bytes of distinct storages
# (parameters excluded — they exist anyway).

# %%
def make_clusters(n: int = 4096, dim: int = 64, classes: int = 10, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    centers = 0.3 * torch.randn(classes, dim, generator=gen)  # overlapping clusters: not too easy
    labels = torch.randint(0, classes, (n,), generator=gen)
    return centers[labels] + torch.randn(n, dim, generator=gen), labels


def make_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)


def saved_activation_bytes(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, use_amp: bool) -> int:
    """Bytes of the distinct tensors autograd saves for backward in one forward pass (parameters excluded)."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in param_ptrs:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.amp.autocast(device_type=device.type, dtype=amp_dtype, enabled=use_amp):
            loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    model.zero_grad()
    return sum(seen.values())


def train(use_amp: bool, steps: int = 200, batch: int = 256) -> dict:
    """The standard AMP training loop; returns the losses, seconds per step and peak CUDA memory."""
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=use_amp and amp_dtype == torch.float16)
    order = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(1))
    losses = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    for step in range(steps):
        idx = order[(step * batch) % len(x_all):][:batch]
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
        "activation_bytes": saved_activation_bytes(model, x_all[:batch], y_all[:batch], use_amp),
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
    print(f"{name:17} parameters stay {r['param_dtype']}; activations saved for backward per step: "
          f"{r['activation_bytes'] / 2**20:.2f} MiB")
ratio = runs[amp_name]["activation_bytes"] / runs[fp32_name]["activation_bytes"]
print(f"autocast / float32 activation memory: {ratio:.2f}")
assert max(final.values()) < 0.3 and abs(final[fp32_name] - final[amp_name]) < 0.05
assert all(r["param_dtype"] == torch.float32 for r in runs.values()) and ratio < 0.75

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
# Time per step (and on CUDA, peak memory). These numbers depend on the hardware and on what else runs on the
# machine, so they are not compared by the tests; on a CPU without native bfloat16 instructions autocast is often
# *slower* than float32 — the notes' remark that AMP is "not necessarily faster or smaller" — while on a GPU with
# tensor cores float16 is typically 2–3× faster for large matrices.

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
# ## Summary
#
# * float16 overflows at 65504 and loses gradients below ~6e-8; bfloat16 has float32's range but only 8
#   significant bits. Reductions and weight updates need float32.
# * `with torch.amp.autocast(device.type, dtype=...)` (bfloat16 on CPU, float16 on CUDA) runs matrix products and
#   convolutions in low precision and losses/reductions in float32; parameters and gradients stay float32. Do the
#   backward pass outside the region.
# * `torch.amp.GradScaler(device.type)` (not `torch.cuda.amp`): `scale(loss).backward()` → optional
#   `unscale_(opt)` + clipping → `step(opt)` (skipped on inf/nan) → `update()` (halve on overflow, double after
#   `growth_interval` clean steps); the order READY → UNSCALED → STEPPED → READY is enforced. Needed for float16,
#   not for bfloat16.
# * Recipes: unscale before clipping; accumulate with one `step`/`update` per effective batch; unscale gradients
#   by hand for a gradient penalty; `enabled=use_amp` turns everything off.
# * TF32 is a separate float32 switch on Ampere+ GPUs, off by default for matrix products since PyTorch 1.12.
# * Measured here: the autocast loss curve matches float32 and the activations saved for backward take about
#   half the memory; speed depends on the hardware.

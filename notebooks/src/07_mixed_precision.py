# %% [markdown]
# # 07 · Automatic mixed precision (自动混合精度)
#
# Training in 16-bit floating point roughly halves the memory of what a network keeps for its backward pass
# and, on hardware built for it, makes matrix products many times faster. But 16 bits overflow, underflow and
# round where 32 bits do not. **Automatic mixed precision** (自动混合精度; AMP) uses 16 bits where that is safe
# and float32 where it is not. **You will learn to:**
#
# 1. say what float16 and bfloat16 can hold: float16 **overflows** (上溢) above 65504, small gradients
#    **underflow** (下溢) to zero, and both keep few significant digits; which computations that breaks (a weight
#    update smaller than half a rounding step is lost, so pure 16-bit training stalls) and which it does not
#    (PyTorch's sums accumulate in float32);
# 2. run a model under `torch.amp.autocast` and predict the dtype of every operation from autocast's lists, read
#    from your own device, including custom autograd Functions;
# 3. train with `torch.amp.GradScaler` (loss scaling): follow its steps and states, watch it skip a step and adapt
#    its scale, and keep its state in a checkpoint;
# 4. combine AMP with gradient clipping, gradient accumulation, several optimizers, a gradient penalty, and TF32;
# 5. measure what autocast changes on a small model: not the loss curve, half the saved activations, plus a 16-bit
#    copy of each weight, and a speed that depends on your hardware.
#
# **Before this notebook.** A training loop (notebook 04: forward pass, loss, `backward()`, `optimizer.step()`,
# the SGD and AdamW optimizers), custom autograd Functions and `torch.autograd.grad` (notebook 02), forward hooks
# (notebook 03, for exercise 3) and saving a `state_dict` (notebook 06).
#
# **Study time:** about 160 min, 25 of them for the exercises at the end. On a laptop the cells run in well under a
# minute; the longest one (section 5) shows a progress bar.
#
# **On a GPU.** The 16-bit type is bfloat16 where the GPU computes it natively (NVIDIA Ampere and newer) and
# float16, with a `GradScaler`, on older GPUs; section 2 reads CUDA's own lists of operations, and section 5 also
# prints the peak GPU memory. The outputs stored with this notebook were made on a CPU.
#
# This lesson grew out of a teacher's study notes written for PyTorch 1.x, when AMP meant `torch.cuda.amp` or
# NVIDIA's Apex library. Readers who know the notes find what changed since then in the closing section.

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
# `amp_dtype` is the 16-bit type used throughout: bfloat16 on the CPU (CPU autocast supports bfloat16 and
# float16, and bfloat16 is the one CPU kernels are fast at) and on GPUs that compute it natively, float16 on older
# GPUs. `torch.cuda.is_bf16_supported(including_emulation=False)` asks for native support; without the argument
# older GPUs answer `True` too, because there bfloat16 can be emulated, slowly. `use_scaler` says whether training
# needs a `GradScaler`: only with float16 (section 1 shows why). As in notebooks 02 and 03, `fmt` prints a
# tensor with a fixed number of decimals.

# %%
import sys
import tempfile
import time
import warnings

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm  # a text progress bar (tqdm.auto would draw a widget)

from utils import fmt, get_device, seed_everything

seed_everything(0)
device = get_device()
if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
    # pre-Ampere GPUs: their tensor cores (matrix-multiply units, section 1) take float16, which needs a GradScaler
    amp_dtype = torch.float16
else:
    amp_dtype = torch.bfloat16
use_scaler = amp_dtype == torch.float16
print("device:", device.type, "| low-precision dtype for autocast:", amp_dtype, "| GradScaler needed:", use_scaler)
assert amp_dtype in (torch.bfloat16, torch.float16)

# %% [markdown]
# ## 1. Why 16 bits, and what breaks
#
# A float stores a sign, an **exponent** (指数; how big: the range) and a **mantissa** (尾数; how many significant
# digits: the precision). In **half precision** (半精度), float16 ("half") spends 5 bits on the exponent and 10 on
# the mantissa; bfloat16 ("brain float") keeps float32's 8 exponent bits and cuts the mantissa to 7 bits.
# `torch.finfo` tells the consequences: `max` is the largest number, `tiny` the smallest *normal* one, and `eps`
# the gap between 1 and the next number.

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
# Squaring an activation of 300 already overflows, and one `inf` in a loss turns every gradient into `inf` or
# `nan`. bfloat16 has float32's range, so the same numbers are fine there (only rounded).

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
# values down to 2⁻²⁴ ≈ 6e-8, each a **subnormal number** (非规格化数) with fewer and fewer significant bits, and
# anything below about 3e-8 becomes exactly 0. Gradients of a deep network are often that small. Take a million
# gradient magnitudes spread evenly (in log scale) between 1e-10 and 1e-2: in float16 almost a third of them
# vanish. The cure is **loss scaling** (损失缩放): multiply the loss by S = 65536 = 2¹⁶ before `backward()`, so
# every gradient is 65536 times larger while it travels through float16, and divide by S afterwards in float32.
# Multiplying by a power of two only changes the exponent, so nothing is lost by the scaling itself.

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
# **Few significant digits: what rounds, and what does not.** bfloat16 has 8 significant bits, so 257 is stored as
# 256, and a running total *stored in bfloat16* stops growing at 256: adding 1 to 256 gives 257, which rounds back
# to 256. (float16, with 11 significant bits, stalls at 2048.) Does that make `x.sum()` of a bfloat16 tensor
# wrong? No: PyTorch's reduction kernels (`sum`, `mean`, `cumsum`, `norm`, the sums inside `softmax`, ...)
# accumulate 16-bit inputs in float32 and round only what they return. The cost is in the *result*: it has 8
# significant bits, so a sum of 301 ones comes back as 300, the nearest bfloat16 number. Ask for a float32 result
# (`dtype=torch.float32`) and you get 301. The norm of those ones and a softmax over 301 zeros also come out as
# √301 and 1/301, rounded once; had their inner sums been kept in bfloat16 they would have stopped at 256, giving
# 16 and 1/256.
#
# So the danger is not "16-bit reductions" but two narrower things: (1) a total that is stored in 16 bits after
# every step — a Python loop, an in-place running sum, and, as the next cells show, a 16-bit weight receiving its
# updates; (2) a 16-bit *result* that the rest of the computation depends on. That second point is why autocast
# computes losses in float32, and on CUDA also softmax, `log_softmax`, the norms and `sum` (section 2): their
# outputs keep float32's 24 bits.

# %%
ones = torch.ones(301, dtype=torch.bfloat16)
running = torch.tensor(0.0, dtype=torch.bfloat16)
for one in ones:
    running += one  # the total is rounded to bfloat16 after every addition
print("a loop, the total stored in bfloat16:   ", running.item())
print("ones.sum() (accumulated in float32):    ", ones.sum().item(), "| dtype", ones.sum().dtype)
print("ones.sum(dtype=torch.float32):          ", ones.sum(dtype=torch.float32).item())
print("ones.cumsum(0)[-1]:                     ", ones.cumsum(0)[-1].item())
print("ones.cumsum(0)[253:259], each rounded:  ", ones.cumsum(0)[253:259].tolist())
print("ones.norm():                            ", ones.norm().item(), "| sqrt(301) =", fmt(301**0.5, 3))
uniform = torch.zeros(301, dtype=torch.bfloat16).softmax(0)[0].item()
print("softmax of 301 zeros, each:             ", uniform, "| 1/301 =", fmt(1 / 301, 6), "| 1/256 =", fmt(1 / 256, 6))
running16 = torch.tensor(0.0, dtype=torch.float16)
for one in torch.ones(3000, dtype=torch.float16):
    running16 += one
print("float16: a loop adding 3000 ones gives", running16.item(), "| torch.ones(3000).half().sum() gives", end=" ")
print(torch.ones(3000, dtype=torch.float16).sum().item())
assert running.item() == 256 and ones.sum().item() == 300 and ones.sum(dtype=torch.float32).item() == 301
assert ones.cumsum(0)[-1].item() == 300 and running16.item() == 2048
assert ones.norm().item() == torch.tensor(301**0.5).bfloat16().item() and uniform == torch.tensor(1 / 301).bfloat16()
assert torch.ones(3000, dtype=torch.float16).sum().item() == 3000

# %% [markdown]
# **A weight update smaller than half a step is lost.** Between 1 and 2, float16's numbers are 2⁻¹⁰ ≈ 0.00098
# apart and bfloat16's 2⁻⁷ ≈ 0.0078: that gap is the **ulp** (unit in the last place, 末位单位) of a weight near
# 1. Adding an update rounds the result to the nearest representable number, so an update smaller than half an ulp
# leaves the weight unchanged, and a larger one moves it by a whole number of ulps.

# %%
print(f"{'update':>8} {'float32':>10} {'float16':>10} {'bfloat16':>10}   (how far a weight of 1.0 moves)")
moved = {}
for update in (1e-4, 4e-4, 6e-4, 3e-3, 5e-3):
    row = [((torch.tensor(1.0, dtype=dt) + update).double() - 1).item() for dt in layout]
    moved[update] = row
    print(f"{update:8.0e} " + " ".join(f"{m:10.6f}" for m in row))
assert moved[1e-4][1] == moved[4e-4][1] == 0 and moved[6e-4][1] == 2**-10  # half an ulp of float16 is 4.9e-4
assert moved[3e-3][2] == 0 and moved[5e-3][2] == 2**-7  # half an ulp of bfloat16 is 3.9e-3

# %% [markdown]
# ### 1.1 Pure 16-bit training stalls
#
# What if the weights themselves were stored in 16 bits? Early in training the updates are large and nothing is
# lost. As the loss falls, the gradients and with them the updates shrink, until each one is smaller than half an
# ulp of its weight: from then on every step is lost and the weights stop moving. The training does not *fail*;
# it *stalls* at a loss set by the weights' precision.
#
# Below, a linear least-squares model with 16 weights learns from 256 examples with plain gradient descent.
# The gradient is computed in float32 every time; the runs differ only in how the weights are *stored* between
# steps: in float32 (what AMP does: the **master weights**, 主权重), in float16, and in bfloat16. A fourth run
# stores bfloat16 weights with **stochastic rounding** (随机舍入): it rounds up or down at random, with the
# probabilities that make the rounding right *on average*, so small updates survive in expectation. (The function
# `stochastic_round` adds random bits below bfloat16's last bit, then cuts them off; `.view(torch.int32)`
# reinterprets the bits of a float32 tensor as integers, without converting. The mask `& -(1 << 16)` has its low 16
# bits zero, so it clears the 16 bits that bfloat16 drops: the value is rounded up exactly when the random noise
# carries into the kept bits, which happens with a probability equal to the dropped fraction. The bit details are
# not the point; the behaviour, right on average, is.)


# %%
def stochastic_round(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Round float32 values to bfloat16, up or down at random, so that the result is right on average."""
    bits = t.view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, generator=gen, dtype=torch.int32)  # the 16 bits bfloat16 drops
    return ((bits + noise) & -(1 << 16)).view(torch.float32).to(torch.bfloat16)


gen = torch.Generator().manual_seed(0)
X_ls = torch.randn(256, 16, generator=gen)
y_ls = X_ls @ torch.randn(16, generator=gen)


def least_squares(weight_dtype: torch.dtype, stochastic: bool = False, steps: int = 150, lr: float = 0.05):
    """Gradient descent on mean((X w - y)^2) with w stored in weight_dtype; returns losses and lost updates."""
    gen = torch.Generator().manual_seed(1)
    w = torch.zeros(16, dtype=weight_dtype)
    losses, lost = [], []
    for _ in range(steps):
        err = X_ls @ w.float() - y_ls  # computed in float32
        losses.append((err**2).mean().item())
        new = w.float() - lr * 2 * X_ls.T @ err / len(X_ls)  # the update, in float32
        stored = stochastic_round(new, gen) if stochastic else new.to(weight_dtype)
        lost.append(int(((stored == w) & (new != w.float())).sum()))  # updates that did not change the weight
        w = stored
    return losses, lost


stall = {
    "float32 weights": least_squares(torch.float32),
    "float16 weights": least_squares(torch.float16),
    "bfloat16 weights": least_squares(torch.bfloat16),
    "bfloat16, stochastic rounding": least_squares(torch.bfloat16, stochastic=True),
}
print(f"{'weights stored as':30} {'step 0':>8} {'step 50':>8} {'step 149':>8}   updates lost in the last step")
for name, (losses, lost) in stall.items():
    tail = f"{lost[-1]} of 16" if "stochastic" not in name else "(random)"
    print(f"{name:30} {losses[0]:8.1e} {losses[50]:8.1e} {losses[-1]:8.1e}   {tail}")

plt.figure(figsize=(6, 3))
for name, (losses, _) in stall.items():
    plt.plot(losses, label=name)
plt.yscale("log")
plt.xlabel("step")
plt.ylabel("mean squared error")
plt.legend(fontsize=8)
plt.tight_layout()
plt.show()

f32, f16, b16, sr = (stall[k][0] for k in stall)
assert f32[-1] < 1e-7  # float32 weights keep learning
for losses, lost in (stall["float16 weights"], stall["bfloat16 weights"]):
    assert losses[-1] < losses[0] / 1000  # learned a lot first...
    assert losses[-1] == losses[-30] and lost[-1] == 16  # ...then stalled: every update is lost, nothing moves
assert f32[-1] < f16[-1] / 1000 and f16[-1] < b16[-1] / 10  # the fewer mantissa bits, the higher the stall
assert sum(sr[-50:]) / 50 < b16[-1] / 10  # stochastic rounding keeps learning far below bfloat16's stall

# %% [markdown]
# Each 16-bit run first follows the float32 curve, then goes flat: float16 (11 significant bits) stalls about 10⁵
# below the starting loss, bfloat16 (8 bits) about 2000 below it, and in the last step all 16 updates are lost. With
# stochastic rounding the bfloat16 weights get more than a hundred times lower than with ordinary rounding, until
# their random jitter of about an ulp levels the loss off, still far above float32's. This is why mixed precision
# keeps float32 master weights, and why the pure 16-bit setups that large-model training does use add stochastic
# rounding, or keep a compensation term for what each rounding dropped (Kahan summation: a second small tensor
# holds the part of each update that the rounding lost, and adds it back at the next step). A real pure-16-bit run also
# computes its gradients in 16 bits, which adds rounding noise on top.
#
# Before `torch.amp` existed, NVIDIA's Apex library offered four "optimisation levels", and you will still meet
# them in older code (`amp.initialize(model, optimizer, opt_level="O1")`):
#
# | Apex `opt_level` | what it did | today |
# |---|---|---|
# | O0 | everything float32 | no autocast |
# | O1 | per-operation lists: 16-bit matrix products and convolutions, float32 softmax, losses, ...; float32 weights; dynamic loss scaling | `torch.amp.autocast` + `torch.amp.GradScaler` (this notebook) |
# | O2 | "almost float16": the model cast to float16 except BatchNorm, with a float32 master copy of the weights for the optimizer | no single switch; FSDP's `MixedPrecisionPolicy` (notebook 09) keeps float32 master weights and computes with 16-bit copies |
# | O3 | pure float16 (`model.half()`) | `model.half()` or `model.bfloat16()`: the stall above |

# %% [markdown]
# **Memory per parameter.** A 16-bit number takes 2 bytes instead of 4. But AMP keeps the *parameters*, their
# *gradients* and the optimizer state in float32 (section 2 proves it for the parameters and their gradients), so
# with Adam — which keeps two running averages per parameter (notebook 10 opens it up) — training still costs
# 4 + 4 + 8 = 16 bytes per parameter. What AMP can save is the memory of the **activations** (激活值; the tensors
# saved for backward, often the largest part) — at most half of it, and section 5 shows when it saves nothing —
# and, on a GPU with **tensor cores** (张量核心; dedicated units that multiply small blocks of 16-bit matrices many
# times faster than the ordinary float32 arithmetic units), time.

# %%
for dt in layout:
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
# lists kept per device (the "Autocast Op Reference" in PyTorch's AMP documentation,
# <https://pytorch.org/docs/stable/amp.html>, prints them):
#
# * **lower precision**: matrix products and convolutions (`matmul`, `linear`, `conv*`, `bmm`, ...) — the bulk of
#   the work, and they tolerate it — cast their float32 inputs to the low-precision type;
# * **float32**: precision-sensitive operations (most losses, some norms, ...) cast their low-precision inputs to
#   float32;
# * **promote**: operations with several inputs of different types run in the widest one, by **type promotion**
#   (类型提升; autocast's promote list, plus ordinary type promotion of elementwise operations such as `+`).
#
# Everything else (ReLU, `+` of equal types, ...) runs in the type of its inputs. The lists differ between
# devices: CUDA puts softmax, `log_softmax`, `layer_norm`, `group_norm`, `sum`, `exp` and `pow` in its float32
# list, the CPU does not, so there they follow their input. Rather than copying a list, the next cell asks this
# device: each operation runs under autocast once on float32 inputs and once on low-precision inputs.


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
# a `log_softmax`) computes in float32 on both devices: the CPU lists `cross_entropy` itself; CUDA lists its two
# pieces, `log_softmax` (output forced to float32) and `nll_loss`. So a loss computed with it is float32. If you write
# the loss yourself from `log_softmax`, cast the logits with `.float()` first; that is what CUDA's list does for
# you.
#
# Three things to notice. (1) Autocast only changes how operations *compute*; tensors you create, parameters and
# gradients keep their dtype — with the model below, the weights and their `.grad` are float32 even though the
# forward pass ran in low precision. (2) A low-precision result leaves the region as it is: call `.float()` if you
# continue outside. (3) To force float32 for a sensitive piece *inside* a region, nest
# `autocast(..., enabled=False)` and cast its inputs with `.float()`. Do the backward pass outside the region:
# autograd runs each backward operation in the dtype of its forward operation anyway.

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
# **A loss that CUDA's autocast refuses.** `F.binary_cross_entropy` (and `nn.BCELoss`) takes probabilities, usually
# the output of a sigmoid. In 16 bits a sigmoid saturates: sigmoid(12) = 1 − 6·10⁻⁶ is stored as exactly 1.0 in
# float16, and the loss −log(1 − p) of a wrong prediction becomes infinite (PyTorch clamps it to 100). The same
# loss computed from the *logits*, with `F.binary_cross_entropy_with_logits` (`nn.BCEWithLogitsLoss`), never forms
# 1 − p and stays exact. So CUDA's autocast raises a `RuntimeError` for `binary_cross_entropy` ("... are unsafe to
# autocast", and it names the logits version); the CPU's autocast computes it in float32 instead. Use the logits
# version everywhere.

# %%
logit = torch.tensor([12.0])
p16 = torch.sigmoid(logit.half()).float()  # a float16 sigmoid: rounds to exactly 1.0
print("sigmoid(12) in float16:", p16.item(), "| in float32:", fmt(torch.sigmoid(logit).item(), 7))
print(
    "loss of predicting 12 for a target of 0: binary_cross_entropy of the float16 sigmoid",
    F.binary_cross_entropy(p16, torch.zeros(1)).item(),
    "| binary_cross_entropy_with_logits",
    fmt(F.binary_cross_entropy_with_logits(logit, torch.zeros(1)).item()),
)
targets01 = torch.rand(8, 4, device=device).round()
with torch.amp.autocast(device_type=device.type, dtype=amp_dtype):
    logits = layer(x8)
    safe = F.binary_cross_entropy_with_logits(logits, targets01)
    try:
        outcome = f"computed in {F.binary_cross_entropy(torch.sigmoid(logits), targets01).dtype}"
    except RuntimeError as err:
        outcome = f"{type(err).__name__}: {str(err).splitlines()[0]}"
print(f"under autocast on {device.type}: binary_cross_entropy_with_logits computed in {safe.dtype}")
print(f"under autocast on {device.type}: binary_cross_entropy {outcome}")
assert p16.item() == 1.0 and F.binary_cross_entropy(p16, torch.zeros(1)).item() == 100
assert safe.dtype == torch.float32
assert outcome.startswith("RuntimeError") if device.type == "cuda" else True
assert outcome == "computed in torch.float32" if device.type == "cpu" else True

# %% [markdown]
# **The `torch.cuda.amp` names are deprecated.** Older code writes `torch.cuda.amp.autocast()` and
# `torch.cuda.amp.GradScaler()`. Both still exist as wrappers, but they warn (on a machine without CUDA they also
# switch themselves off, with a `UserWarning`). Write `torch.amp.autocast("cuda", ...)` and
# `torch.amp.GradScaler("cuda")`: the same code then works for `"cpu"` and other devices.

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.amp.autocast()
    torch.cuda.amp.GradScaler()
future = [str(w.message) for w in caught if w.category is FutureWarning]
for message in future:
    print("FutureWarning:", message)
assert len(future) == 2 and all("is deprecated" in m for m in future)

# %% [markdown]
# ### 2.1 Custom autograd Functions under autocast
#
# A custom `torch.autograd.Function` (notebook 02) needs one more step. Its `forward` runs inside the autocast
# region, so the operations in it are autocast; its `backward` runs later, during `loss.backward()`, *outside*
# the region. The two then disagree about dtypes: below, the forward's matrix product ran in bfloat16 (autocast
# cast both inputs), the backward's sees a bfloat16 gradient and a float32 saved input, and fails.
#
# Two decorators from `torch.amp` fix it. `@torch.amp.custom_fwd(device_type=...)` on `forward` records the
# autocast state, and `@torch.amp.custom_bwd(device_type=...)` on `backward` runs the backward under that same
# state. With `custom_fwd(..., cast_inputs=torch.float32)` the forward instead gets its floating-point inputs cast
# to float32 and runs with autocast off: the way to keep a numerically delicate Function in float32. (Only inside
# an autocast region: outside one, `custom_fwd` does nothing and `cast_inputs` has no effect, so cast with `.float()`
# yourself.)


# %%
class MatMul(torch.autograd.Function):
    """a @ b, with its backward written by hand (as in notebook 02)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return grad @ b.T, a.T @ grad


class AmpMatMul(torch.autograd.Function):
    """The same, decorated so that backward runs under the autocast state of forward."""

    @staticmethod
    @torch.amp.custom_fwd(device_type=device.type)
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    @torch.amp.custom_bwd(device_type=device.type)
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return grad @ b.T, a.T @ grad


class Float32MatMul(torch.autograd.Function):
    """The same, always computed in float32."""

    @staticmethod
    @torch.amp.custom_fwd(device_type=device.type, cast_inputs=torch.float32)
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    @torch.amp.custom_bwd(device_type=device.type)
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return grad @ b.T, a.T @ grad


w_mm = torch.randn(8, 8, device=device, requires_grad=True)
results = {}
for fn in (MatMul, AmpMatMul, Float32MatMul):
    w_mm.grad = None
    with torch.amp.autocast(device_type=device.type, dtype=amp_dtype):
        h = layer(x8).T  # a low-precision input, as inside a network
        out = fn.apply(h, w_mm)
    try:
        out.float().sum().backward()
        results[fn.__name__] = f"forward gives {out.dtype}, backward ok, w.grad {w_mm.grad.dtype}"
    except RuntimeError as err:
        results[fn.__name__] = f"forward gives {out.dtype}, backward fails: {type(err).__name__}"
        assert "dtype" in str(err)
    print(f"{fn.__name__:14} {results[fn.__name__]}")
assert "fails" in results["MatMul"] and "ok" in results["AmpMatMul"] and "ok" in results["Float32MatMul"]
assert results["Float32MatMul"].startswith("forward gives torch.float32")

# %% [markdown]
# ## 3. `torch.amp.GradScaler`, step by step
#
# This section uses float16 on purpose, on every device, even where the setup chose bfloat16 (which needs no
# scaler): the scaler exists for float16's narrow range, so that is where its work can be seen.
#
# The standard AMP training step with float16 is
#
# ```python
# with torch.amp.autocast(device.type, dtype=torch.float16):
#     loss = loss_fn(model(x), y)
# optimizer.zero_grad()
# scaler.scale(loss).backward()
# scaler.unscale_(optimizer)                          # only if you look at or change the gradients:
# torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)   # for example, clip them
# scaler.step(optimizer)
# scaler.update()
# ```
#
# To see what each call does, take two parameter vectors and $y = \sum x + \sum z = 8$, so that every gradient
# is 1, on this device (`GradScaler("cpu")` exists since PyTorch 2.3):
#
# * `scaler.scale(y).backward()` is `(y * scale).backward()`: the gradients arrive multiplied by 65536;
# * `scaler.unscale_(opt)` multiplies them in place by 1/scale (one fused call,
#   `torch._amp_foreach_non_finite_check_and_unscale_`, an internal function — the leading underscore marks it
#   private; you never call it yourself — which also records whether any is `inf`/`nan`); now they
#   can be inspected or clipped. Here `x` and `z` are clipped *separately* to norm 1, giving 1/√2 = 0.7071 each;
#   clipped *together*, the four gradients share one norm, 2, and become 0.5 each;
# * `scaler.step(opt)` calls `opt.step()` — unless an `inf`/`nan` was found — and `scaler.update()` adjusts the
#   scale.
#
# The scaler keeps a state per optimizer, and it enforces the order: `update` → READY, `unscale_`: READY →
# UNSCALED, `step`: READY/UNSCALED → STEPPED (if `unscale_` was not called, `step` calls it). PyTorch has no public
# way to read that state, so the cell peeks at the internal field `scaler._per_optimizer_states` to show it; do not
# rely on it in your own code.


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
together = [t.detach().clone().requires_grad_() for t in (x, z)]  # copies, to show the other way to clip
for copy, t in zip(together, (x, z)):
    copy.grad = t.grad.clone()
torch.nn.utils.clip_grad_norm_(together, 1.0)
torch.nn.utils.clip_grad_norm_(x, 1.0)
torch.nn.utils.clip_grad_norm_(z, 1.0)
print("clip each to 1:    x.grad", fmt(x.grad), "| z.grad", fmt(z.grad))
print("clip [x, z] to 1:  x.grad", fmt(together[0].grad), "| z.grad", fmt(together[1].grad), "(not used below)")
scaler.step(opt)
print("step:              x", fmt(x), "| stage", stage(scaler, opt))
scaler.update()
print("update:            scale", scaler.get_scale(), "| stage", stage(scaler, opt))
assert torch.allclose(x.detach().cpu(), torch.tensor([1 - 0.001 / 2**0.5, 2 - 0.001 / 2**0.5]))
assert torch.allclose(together[0].grad.cpu(), torch.tensor([0.5, 0.5]))
assert scaler.get_scale() == 65536.0 and stage(scaler, opt) == "READY"

# %% [markdown]
# **The order is enforced.** `unscale_` twice, or `step` twice, without an `update` in between is refused: the
# scaler would divide the gradients twice, or step twice with one scale.

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

# %% [markdown]
# **Never call `optimizer.step()` yourself on scaled gradients.** What goes wrong depends on the optimizer.
# SGD moves each weight by learning rate × gradient, so gradients 65536 times too large make a step 65536 times
# too large. Adam and AdamW (the optimizers of notebook 04) divide each step by a running average of the gradient's
# size, so a constant factor on every gradient cancels out (up to Adam's tiny `eps`): the steps come out the
# same. But the scaler's other job is lost either way: a step whose gradients overflowed is no longer skipped,
# and `inf`/`nan` lands in the weights (and, with Adam, in its running averages, for good). And any clipping
# threshold applies to the scaled values (section 4).


# %%
def three_steps(make_opt, scale: float) -> torch.Tensor:
    """Three optimizer steps on (w**2).sum() * scale, without the scaler: what opt.step() on scaled gradients does."""
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(10, device=device))
    o = make_opt([w])
    for _ in range(3):
        o.zero_grad()
        ((w**2).sum() * scale).backward()
        o.step()
    return w.detach()


optimizers = {"SGD": lambda p: torch.optim.SGD(p, lr=0.01), "Adam": lambda p: torch.optim.Adam(p, lr=0.01)}
gaps = {}
for name, make_opt in optimizers.items():
    gaps[name] = (three_steps(make_opt, 2.0**16) - three_steps(make_opt, 1.0)).abs().max().item()
    print(f"{name:4}: largest difference from the unscaled run after 3 steps: {gaps[name]:.1e}")
assert gaps["SGD"] > 1e3 and gaps["Adam"] < 1e-6

skipped = {}
for how in ("opt.step()", "scaler.step(opt)"):
    w = nn.Parameter(torch.ones(3, device=device))
    adam = torch.optim.Adam([w], lr=0.01)
    sc = torch.amp.GradScaler(device.type)
    loss = (w * torch.tensor([1.0, float("inf"), 1.0], device=device)).sum()  # one gradient overflows
    sc.scale(loss).backward()
    if how == "opt.step()":
        adam.step()
    else:
        sc.step(adam)
    skipped[how] = w.detach().cpu()
    print(f"Adam, an overflowing gradient, {how:16}: weights {fmt(skipped[how])}")
assert skipped["opt.step()"].isnan().any() and torch.equal(skipped["scaler.step(opt)"], torch.ones(3))

# %% [markdown]
# **A skipped step, and the scale's growth and backoff.** The scale is not a constant: this is **dynamic loss
# scaling** (动态损失缩放). `update()` halves the scale (`backoff_factor=0.5`) after a step with `inf`/`nan`
# gradients, which `step()` skipped, and doubles it (`growth_factor=2`) after `growth_interval` clean steps in a
# row (2000 by default; 3 here to see it happen); an overflow also resets the count of clean steps (the *growth
# tracker*). Below, the loss of step 2 is multiplied by `inf` on purpose — with float16 the same happens when an
# activation or a gradient overflows. The scaler turns an overflow into one lost step and a smaller scale instead
# of `nan` weights.

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
# Over a longer run the scale finds, and then follows, the largest value that does not overflow. Below, a layer
# runs in float16 under autocast, and the gradient that reaches its output shrinks steadily, as gradients do while
# a network trains (the learning rate is 0: only the scale is watched). The scaled gradient overflows float16
# exactly when scale × gradient > 65504. The scale starts far too high at 2²⁰, halves at each overflow, then
# doubles every 10 clean steps (`growth_interval=10`) until the next overflow halves it again: a saw-tooth just
# under the limit, at the cost of one skipped step per climb. The gaps between skips are 11 steps (10 clean steps,
# then the doubled scale, the one that just overflowed, overflows again) or 21 (meanwhile the limit has risen past
# the doubled scale, which survives 10 more steps; the next doubling overflows).

# %%
torch.manual_seed(0)
probe = nn.Linear(4, 1).to(device)
probe_opt = torch.optim.SGD(probe.parameters(), lr=0.0)
scaler = torch.amp.GradScaler(device.type, init_scale=2.0**20, growth_interval=10)
x_probe = torch.full((1, 4), 0.5, device=device)
scales, limits, overflowed = [], [], []
for step in range(150):
    grad_size = 2.0 ** (-step / 25)  # the gradient of the loss with respect to the layer's output
    with torch.amp.autocast(device_type=device.type, dtype=torch.float16):
        out = probe(x_probe)
    loss = out.float().sum() * grad_size
    probe_opt.zero_grad()
    scale = scaler.get_scale()
    scaler.scale(loss).backward()
    scaler.step(probe_opt)
    scaler.update()
    scales.append(scale)
    limits.append(65504 / grad_size)
    overflowed.append(scaler.get_scale() < scale)  # update() halved the scale: the step was skipped
print(f"skipped steps: {sum(overflowed)} of {len(scales)}, at steps {[i for i, o in enumerate(overflowed) if o]}")

plt.figure(figsize=(6, 3))
plt.step(range(len(scales)), scales, where="post", label="scale used")
plt.plot(limits, "--", label="largest scale without overflow")
skips = [i for i, o in enumerate(overflowed) if o]
plt.plot(skips, [scales[i] for i in skips], "rx", label="overflow: step skipped")
plt.yscale("log", base=2)
plt.xlabel("step")
plt.legend(fontsize=8)
plt.tight_layout()
plt.show()
assert all(o == (s > lim) for s, lim, o in zip(scales, limits, overflowed))  # skipped exactly when it overflows
assert overflowed[:4] == [True] * 4 and not overflowed[4]  # 2**20 .. 2**17 overflow, 2**16 does not
assert all(s <= 2 * lim for s, lim in zip(scales[4:], limits[4:]))  # from then on, never far above the limit

# %% [markdown]
# **Saving and resuming the scaler.** The scale and the growth tracker are training state: a run that is stopped
# and resumed with a fresh `GradScaler` restarts its search for the scale (and, with the default 65536, may lose
# its first steps to overflows again). So a **checkpoint** (检查点) holds `scaler.state_dict()` — the scale,
# `growth_factor`, `backoff_factor`, `growth_interval` and `_growth_tracker` — beside the model's and the
# optimizer's, and resuming calls `scaler.load_state_dict(...)` (notebook 06's `save_checkpoint(...,
# scaler=scaler)` and `load_checkpoint(..., scaler=scaler)` do the same inside a crash-safe file). Below, a small
# model trains under float16 autocast (on every device, whatever `amp_dtype` is) with a scaler of
# `init_scale=1024` and `growth_interval=3`, and an overflow injected at step 1: once for 8 steps straight, once
# stopped after step 3, saved, rebuilt from scratch, loaded and continued. (Its SGD uses momentum: each step
# also adds 0.9 times the previous step, a running state kept in the optimizer's `state_dict`.)

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
    path = f"{ckpt_dir}/checkpoint.pt"
    model, opt, scaler = first
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict()}, path)
    resumed, no_scaler_state = fp16_setup(), fp16_setup()  # fresh objects
    for fresh, with_scaler in ((resumed, True), (no_scaler_state, False)):
        saved = torch.load(path)  # each run loads its own copy (see below)
        fresh[0].load_state_dict(saved["model"])
        fresh[1].load_state_dict(saved["optimizer"])
        if with_scaler:
            fresh[2].load_state_dict(saved["scaler"])
momentum = no_scaler_state[1].state[no_scaler_state[1].param_groups[0]["params"][0]]["momentum_buffer"]
shared = momentum.data_ptr() == saved["optimizer"]["state"][0]["momentum_buffer"].data_ptr()
print("scale after each of 8 steps, straight:  ", straight_scales)
print("scaler state saved after 4 steps:", saved["scaler"])
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
print("the loaded optimizer's momentum buffer is the loaded tensor itself, not a copy:", shared)
assert saved["scaler"]["scale"] == 512 and saved["scaler"]["_growth_tracker"] == 2 and shared
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
# cell checks the weights to 1e-3 rather than bit for bit. But its scale is wrong from the resume on: it restarted
# from `init_scale` with a growth tracker of 0. With real float16 overflows that means other skipped steps, and so
# other weights.
#
# Why does each run load the file again? `optimizer.load_state_dict` keeps the loaded tensors as its state
# whenever they already have the right dtype and device, without copying them (the last line of output). Two
# optimizers loaded from one dictionary would share, and both update in place, the same momentum buffers.

# %% [markdown]
# ## 4. Recipes
#
# **Gradient clipping** (梯度裁剪) must see the *true* gradients, so call `scaler.unscale_(opt)` first: that is
# why the two lines stand in this order in the loop of section 3 (many AMP loops carry them commented out, to be
# switched on together when the gradients are clipped or inspected). Clipping the still-scaled gradients would
# clip to a norm 65536 times too small in real units:


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
# **Gradient accumulation** (梯度累加; notebook 02), a common way to train with a batch too big for memory: split
# a batch of 64 into 4 micro-batches of 16, divide each loss by 4, and call `backward()` four times; gradients add up.
# With a scaler, all micro-batches of one effective batch must use the *same* scale, so `step()` and `update()` are
# called once per effective batch. The accumulated gradient equals the full batch's (shown with autocast off so the
# comparison is exact up to float rounding; under autocast it holds up to bfloat16/float16 rounding).

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
# **Several losses and optimizers.** One `GradScaler` serves a whole training step, however many losses and
# optimizers it has (a GAN's generator and discriminator, say): scale each loss (or their sum) for `backward()`,
# call `scaler.step(opt)` for every optimizer, then `scaler.update()` once. Each optimizer checks only *its own*
# gradients for `inf`/`nan`, so one optimizer may skip its step while the other steps; the next `update()` halves
# the scale if any of them found an overflow.

# %%
scaler = torch.amp.GradScaler(device.type)
a = nn.Parameter(torch.ones(2, device=device))
b = nn.Parameter(torch.ones(2, device=device))
opt_a, opt_b = torch.optim.SGD([a], lr=0.1), torch.optim.SGD([b], lr=0.1)
loss_a = (a * torch.tensor([1.0, float("inf")], device=device)).sum()  # an overflow in a's gradients only
loss_b = b.sum()
scaler.scale(loss_a + loss_b).backward()
scaler.step(opt_a)
scaler.step(opt_b)
scaler.update()
print("a (its gradients overflowed):", fmt(a), "| b:", fmt(b), "| scale after update:", scaler.get_scale())
assert torch.equal(a.detach().cpu(), torch.ones(2)) and torch.allclose(b.detach().cpu(), torch.full((2,), 0.9))
assert scaler.get_scale() == 2.0**15

# %% [markdown]
# **Gradient penalty under AMP.** A penalty on the gradient norm needs `torch.autograd.grad(..., create_graph=True)`.
# With a scaler those gradients come out *scaled*: divide them by the scale before computing the penalty (the recipe
# of PyTorch's AMP examples, <https://pytorch.org/docs/stable/notes/amp_examples.html>), compute the penalty inside
# autocast, then scale the total loss as usual. Forgetting the division makes the penalty 65536 times too large. (The
# cell passes `enabled=False` to both autocast regions, so that the runs with and without a scaler can be compared
# exactly.)


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
# training loop serves both modes, switched by a single `use_amp` flag. With it off, the AMP loop gives bit for bit
# the result of the plain loop.


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
# tensor cores in TF32: inputs rounded to 10 mantissa bits (float16's precision, about 3 significant decimal
# digits instead of float32's 7) with float32's 8-bit exponent (no overflow problem), products accumulated in
# float32. It is much faster than true float32 and needs no code change; it is a switch on the *float32* path,
# independent of autocast. Since PyTorch 1.12 matrix products use true float32 unless you ask for TF32, while
# cuDNN (NVIDIA's library of neural-network kernels: convolutions, recurrent layers) convolutions use TF32 by
# default. (Older code and older documentation say TF32 is on for both; that was
# PyTorch 1.7–1.11.) The "CUDA semantics" page of PyTorch's documentation has the details:
# <https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices>.
#
# Today's settings are strings, one per backend and operation, each `"ieee"` (true float32), `"tf32"`, or `"none"`
# (inherit from the level above):
#
# * `torch.backends.fp32_precision` — the global default (`"none"`: true float32);
# * `torch.backends.cuda.matmul.fp32_precision` — cuBLAS (NVIDIA's matrix-product library) matrix products, default `"none"`, so IEEE float32;
# * `torch.backends.cudnn.conv.fp32_precision` and `torch.backends.cudnn.rnn.fp32_precision` — cuDNN, default
#   `"tf32"`;
# * `torch.backends.mkldnn.matmul.fp32_precision` — oneDNN (Intel's library of CPU kernels for matrix products and
#   convolutions, formerly MKL-DNN), where `"bf16"` lets float32 matrix products use bfloat16 units.
#
# The older switches still work in 2.14, without a warning, and set the same state:
# `torch.backends.cuda.matmul.allow_tf32`, `torch.backends.cudnn.allow_tf32`, and
# `torch.set_float32_matmul_precision("high")` (TF32 for matrix products; `"highest"` is IEEE). That last one is
# global: it sets the CUDA *and* the oneDNN setting (`"medium"` even lets oneDNN use bfloat16). Use one family,
# not both: after a string setting of `"tf32"`, *reading* a legacy flag raises a `RuntimeError`. The `cuda` and
# `cudnn` settings act only on NVIDIA GPUs, so on a CPU they are just read and set.

# %%
tb = torch.backends
settings = {
    "torch.backends.fp32_precision": lambda: tb.fp32_precision,
    "torch.backends.cuda.matmul.fp32_precision": lambda: tb.cuda.matmul.fp32_precision,
    "torch.backends.cudnn.conv.fp32_precision": lambda: tb.cudnn.conv.fp32_precision,
    "torch.backends.cudnn.rnn.fp32_precision": lambda: tb.cudnn.rnn.fp32_precision,
    "torch.backends.mkldnn.matmul.fp32_precision": lambda: tb.mkldnn.matmul.fp32_precision,
}
defaults = {name: get() for name, get in settings.items()}
for name, value in defaults.items():
    print(f"{name:44} = {value!r}")
assert defaults["torch.backends.cuda.matmul.fp32_precision"] == "none"
assert defaults["torch.backends.cudnn.conv.fp32_precision"] == "tf32"
assert torch.get_float32_matmul_precision() == "highest" and tb.cuda.matmul.allow_tf32 is False

tb.cuda.matmul.fp32_precision = "tf32"  # TF32 for float32 matrix products on CUDA
print("after setting 'tf32':", tb.cuda.matmul.fp32_precision)
try:
    tb.cuda.matmul.allow_tf32  # a legacy read after a new-style setting
except RuntimeError as err:
    mixed_err = err
print("reading allow_tf32 now:", type(mixed_err).__name__ + ":", str(mixed_err).split(". ")[0] + ".")
assert "mix of the legacy and new APIs" in str(mixed_err)
tb.cuda.matmul.fp32_precision = "none"  # back to the default
assert tb.cuda.matmul.fp32_precision == "none" and tb.cuda.matmul.allow_tf32 is False

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.set_float32_matmul_precision("high")
    via_precision = (tb.cuda.matmul.fp32_precision, tb.mkldnn.matmul.fp32_precision)
    torch.set_float32_matmul_precision("highest")
    tb.cuda.matmul.allow_tf32 = True
    via_legacy = tb.cuda.matmul.fp32_precision
    tb.cuda.matmul.allow_tf32 = False
tb.cuda.matmul.fp32_precision = tb.mkldnn.matmul.fp32_precision = "none"  # back to the defaults
print(
    "set_float32_matmul_precision('high') -> cuda",
    repr(via_precision[0]),
    "and mkldnn",
    repr(via_precision[1]),
    "| allow_tf32 = True -> cuda",
    repr(via_legacy),
    "| warnings:",
    len(caught),
)
assert via_precision == ("tf32", "tf32") and via_legacy == "tf32" and not caught
assert {name: get() for name, get in settings.items()} == defaults

# %% [markdown]
# What the rounding costs, emulated on this machine: round the inputs of a 256×256 matrix product to TF32's and
# bfloat16's precision, multiply exactly (float64), and compare with the exact product of the original inputs.
# `round_mantissa` does the rounding on the integer bits: it adds just under half of the dropped range (plus one
# when the last kept bit is 1, so that ties go to the even neighbour), then clears the `23 - bits` dropped bits
# with a mask. The bit details are not the point: the assert shows it rounds exactly as a real conversion does.


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
# documentation says no scaler is needed for it. Each run shows a progress bar while it trains.


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
    for step in tqdm(range(steps), desc="autocast" if use_amp else "float32", file=sys.stdout):
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
print(
    "loss at step 0 (ln 10 = 2.30 for a uniform guess among 10 classes):", {k: round(v, 2) for k, v in zip(runs, first)}
)
print("final loss, mean of the last 20 steps:", {k: round(v, 1) for k, v in final.items()})
for name, r in runs.items():
    print(f"{name:17} parameters stay {r['param_dtype']}, gradients {r['grad_dtype']}")
assert all(abs(v - 2.30) < 0.05 for v in first)
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
print("largest gap between the two curves, step by step:", "below 0.01" if gap < 0.01 else round(gap, 2))
assert gap < 0.1

# %% [markdown]
# ### What autocast saves in memory
#
# The memory that autocast can save is what autograd keeps for the backward pass. It is measured exactly with
# `torch.autograd.graph.saved_tensors_hooks` (introduced here in one paragraph;
# [notebook 11](11_memory_and_speed.ipynb) uses it to count what activation checkpointing saves): every tensor that autograd
# saves passes through a hook, which counts each distinct storage once (by `untyped_storage().data_ptr()`, since
# several saved tensors can be views of one storage) and sorts it:
#
# * **inputs**: the batch and the targets, or the batch cast to 16 bits;
# * **16-bit weight copies**: a storage holding a parameter cast to the low-precision type — autocast casts a
#   weight once per forward pass (it caches the cast inside the region), and the matrix product saves that copy
#   for its backward;
# * **activations**: everything else (layer outputs, the loss's softmax, ...);
# * the parameters themselves are not counted: they exist whether or not a graph is kept.
#
# The batches are cloned first: a slice `x_all[:256]` is a view that shares — and would be charged — the storage
# of all 4096 points. The function `saved_tensor_bytes` below runs one forward pass of the model (with or without
# autocast) inside such a hook and returns the bytes saved in each of these kinds. The same MLP is measured at
# three batch sizes; only the activations and inputs grow with the batch.


# %%
def saved_tensor_bytes(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, use_amp: bool) -> dict[str, int]:
    """Bytes that autograd saves for backward in one forward pass, by kind; each storage counted once."""
    params = list(model.parameters())

    def is_copy_of(t: torch.Tensor, src: torch.Tensor) -> bool:
        """`t`'s whole storage holds `src` cast to `t`'s dtype (t may be a view, such as a transposed weight)."""
        # as_strided: a view of t's storage with the shape, strides and offset given (notebook 01: strides)
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
# weight.) So autocast does not always make a step smaller. On a GPU, `torch.cuda.max_memory_allocated` also
# counts what is not saved for backward — the 16-bit copy of the first layer's weight, temporary casts; the
# time saved by tensor cores is usually the bigger win.

# %% [markdown]
# **Time per step** (and on CUDA, peak memory). It depends on the hardware and on what else the machine runs, so
# the output of the next cell is not the same twice. Autocast pays off where 16-bit arithmetic is fast:
#
# * **CPUs with bfloat16 instructions** (AVX-512 BF16, AMX). On a server CPU with AVX-512 BF16 (an AMD EPYC), an
#   autocast step of this MLP took about a third of the time of a float32 step. Without such instructions bfloat16
#   is *emulated* and an autocast step took 10–25 times *longer* than a float32 one. The output stored with this
#   notebook was made that way (with the CPU kernels capped to AVX2 instructions, so that outputs agree across
#   machines), so if your CPU has bfloat16 instructions your numbers can look the other way round.
# * **GPUs with tensor cores.** On one NVIDIA H100 (measured with PyTorch 2.11), a single 8192 × 8192 matrix
#   product took 21 ms in float32, 2.7 ms in TF32 and 1.4 ms in bfloat16 or float16: 15 times faster. This small
#   MLP, though, took about 1 ms per step in both modes: its matrices are too small to keep the GPU busy, and the
#   time goes into launching kernels, which autocast does not shorten (it adds a few casts). Mixed precision speeds
#   up large matrix products and convolutions, not small models.

# %%
# NBVAL_IGNORE_OUTPUT
for name, r in runs.items():
    line = f"{name:17}: {r['wall_ms']:6.2f} ms per step (wall), {r['cpu_ms']:6.2f} ms (CPU time)"
    if r["peak_cuda_mib"] is not None:
        line += f", peak CUDA memory {r['peak_cuda_mib']:.1f} MiB"
    print(line)
print(f"autocast step / float32 step: {runs[amp_name]['wall_ms'] / runs[fp32_name]['wall_ms']:.2f}")
assert all(r["wall_ms"] > 0 and r["cpu_ms"] >= 0 for r in runs.values())
assert device.type != "cuda" or all(r["peak_cuda_mib"] > 0 for r in runs.values())

# %% [markdown]
# **What AMP does not shrink: the gradients.** They stay float32 (asserted above), so the **all-reduce** — the
# collective operation that sums a tensor across processes and hands every process the result — with which
# distributed data parallel training (DDP, `DistributedDataParallel`; notebook 08 teaches both) averages them
# across processes still sends 4 bytes per parameter under autocast (as does FSDP, the sharded version of
# notebook 09). To halve that traffic, DDP takes a communication hook that compresses the gradients to
# 16 bits for the transfer (`bf16_compress_hook`, `fp16_compress_hook` in
# `torch.distributed.algorithms.ddp_comm_hooks.default_hooks`). The AMP loop itself runs unchanged under DDP, one
# `GradScaler` per process: DDP all-reduces the gradients during `backward()`, before `unscale_` looks at them,
# so an overflow in any process reaches every process and they all skip the same step.

# %% [markdown]
# ## Exercises (练习)
#
# Three exercises, easiest first: predict (with a function), write a function, then a stretch that combines this notebook with
# notebook 03's module hooks. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it and run it. The
# **check cell** below it then says *correct*, or *not yet* with a hint and the section to re-read, or *not
# attempted yet* while the stub is untouched. This section does not depend on the lesson's cells: after a kernel
# restart, run its first cell and go on. `make progress` (without make, e.g. on Windows: `python tools/course.py
# progress`) lists which exercises of every notebook pass. The checks run on the CPU, whatever device you have.

# %%
import torch
import torch.nn.functional as F
from torch import nn

from utils.exercises import Checker

ex = Checker("07")

# %% [markdown]
# ### Exercise 1 · What autocast makes of each operation
#
# Section 2 sorted operations into three lists, and the lists differ between devices. Predict from them, without
# running anything: write `autocast_dtype(op, device, low, input_dtype)`, the dtype of the output of `op` when it
# runs inside `torch.amp.autocast(device, dtype=low)` on inputs of dtype `input_dtype` (float32, or `low` itself).
#
# * `op` is one of `"matmul"`, `"linear"`, `"conv2d"`, `"bmm"`, `"relu"`, `"add_float32"` (`t + w` with a float32
#   tensor `w`), `"softmax"`, `"log_softmax"`, `"layer_norm"`, `"group_norm"`, `"sum"`, `"exp"`, `"pow"` (`t ** 2`),
#   `"cross_entropy"`, `"mse_loss"`;
# * `device` is `"cpu"` or `"cuda"`; `low` is `torch.float16` or `torch.bfloat16`;
# * return a dtype (`low` or `torch.float32`, say). Sets of names and `if`s are all it takes.
#
# The check asks about every operation, on both devices, for both 16-bit types and both input types, and refuses a
# function that runs operations or autocast to find out: a measurement shows one device, the lists show all (a
# laptop cannot show what a CUDA GPU does).


# %%
# ✏️ Exercise 1: write the body of the function (no tensors, no autocast: the rules of section 2)
def autocast_dtype(op: str, device: str, low: torch.dtype, input_dtype: torch.dtype) -> torch.dtype:
    raise NotImplementedError("your code here")


# %%
ex.check(1, autocast_dtype)

# %% [markdown]
# ### Exercise 2 · One AMP training step in the right order
#
# Many AMP loops carry two lines commented out, `scaler.unscale_(optimizer)` and `clip_grad_norm_(...)`, "needed only
# if you modify the gradients". Here you clip them. Write `amp_step(model, optimizer, scaler, x, y, max_norm)`, one
# float16 training step with gradient clipping (梯度裁剪):
#
# * compute `F.cross_entropy(model(x), y)` under `torch.amp.autocast(x.device.type, dtype=torch.float16)`;
# * then, after the autocast region, with the `GradScaler` you are given: zero the gradients, the scaled backward
#   pass, `scaler.unscale_(optimizer)`, clip the norm of all gradients to `max_norm`, step, update (sections 3 and
#   4);
# * return the loss (not the scaled loss).
#
# The check runs four steps on the CPU with a `GradScaler("cpu")` and a small network, and compares every step with
# the recipe's; it also watches that you call `unscale_` yourself and run the backward pass and the step outside
# autocast. Its third batch holds a value above 65504, so that step overflows in float16: the scaler must skip
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
# a `Sequential`, one whose overflow is hidden by a later ReLU (−inf becomes 0), and one whose `forward` runs its
# modules in another order than they were registered. It watches every point above: the hooks, one run of the model
# (and of each module), autocast, gradients, the `finally`.


# %%
# ✏️ Exercise 3: write the body of the function
def first_overflow(model: nn.Module, x: torch.Tensor) -> str | None:
    raise NotImplementedError("your code here")


# %%
ex.check(3, first_overflow)

# %% [markdown]
# ## Summary
#
# * float16 overflows (上溢) above 65504 and rounds gradients below ~3e-8 to zero (下溢; below 6e-5 it already keeps
#   fewer bits); bfloat16 has float32's range but only 8 significant bits. PyTorch's reductions accumulate 16-bit
#   inputs in float32 and round only their result; what stalls is a total *stored* in 16 bits after every step.
#   A weight update smaller than half an ulp of the weight is lost, so pure 16-bit training stalls: AMP keeps
#   float32 master weights (stochastic rounding is the pure-16-bit alternative).
# * `with torch.amp.autocast(device.type, dtype=...)` (bfloat16 on the CPU and on GPUs that support it, float16
#   on older GPUs) runs matrix products and convolutions in low precision, the operations of its float32 list
#   (most losses; on CUDA also softmax, `log_softmax`, norms, `sum`, `exp`) in float32, and promotes mixed inputs;
#   the lists differ per device, so ask the device (section 2). Parameters and gradients stay float32. Do the
#   backward pass outside the region. Use `binary_cross_entropy_with_logits`; decorate custom Functions with
#   `torch.amp.custom_fwd` / `custom_bwd`.
# * `torch.amp.GradScaler(device.type)` (not `torch.cuda.amp`): loss scaling (损失缩放) with
#   `scale(loss).backward()` → optional `unscale_(opt)` + clipping → `step(opt)` (skipped on inf/nan) →
#   `update()` (dynamic loss scaling, 动态损失缩放: halve on overflow, double after `growth_interval` clean steps);
#   the order READY → UNSCALED → STEPPED → READY is enforced. Never call `opt.step()` on scaled gradients: with
#   SGD the step is 65536 times too large; with Adam the step is the same, but overflowing steps are no longer
#   skipped. Needed for float16, not for bfloat16. `scaler.state_dict()` belongs in every checkpoint.
# * Recipes: unscale before gradient clipping (梯度裁剪); accumulate with one `step`/`update` per effective batch;
#   one scaler for several losses and optimizers (each optimizer skips on its own, one `update`); unscale
#   gradients by hand for a gradient penalty; `enabled=use_amp` turns everything off.
# * TF32 is a separate float32 switch on Ampere+ GPUs: `torch.backends.cuda.matmul.fp32_precision = "tf32"`
#   (off by default for matrix products since PyTorch 1.12), `torch.backends.cudnn.conv.fp32_precision` (on by
#   default); the legacy `allow_tf32` flags and `torch.set_float32_matmul_precision` still work, but do not mix
#   the two families.
# * Measured here: the autocast loss curve matches float32. Autocast halves the activations saved for backward
#   but adds a 16-bit copy of each weight it casts: memory nearly halves at batch 4096, barely changes at batch
#   256, and grows at batch 16. Speed depends on the hardware: large matrix products on tensor cores or CPUs with
#   bfloat16 instructions gain, small models and emulated bfloat16 do not.
# * Beyond this lesson: float16 with sharded training uses `ShardedGradScaler`
#   (`torch.distributed.fsdp.sharded_grad_scaler`) and FSDP's `MixedPrecisionPolicy` (notebook 09); training with
#   8-bit floats (FP8) on the newest GPUs is done with the torchao library (`torchao.float8`).

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# The notes this lesson started from were written for PyTorch 1.x and NVIDIA's Apex. What they say, and what holds
# in PyTorch 2.14:
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | Mixed precision works only on NVIDIA GPUs (float16); Apex needs a Volta GPU (V100, TITAN V) | Autocast runs on the CPU (bfloat16 or float16) and on any CUDA GPU; bfloat16 where the GPU computes it natively (Ampere and newer), float16 with a `GradScaler` on older GPUs | Setup; §2 · `torch.amp.autocast`: low precision where it is safe |
# | `torch.cuda.amp.autocast()`, `torch.cuda.amp.GradScaler()` | Deprecated (`FutureWarning`): `torch.amp.autocast("cuda", ...)`, `torch.amp.GradScaler("cuda")`, the same for `"cpu"` | §2 · `torch.amp.autocast`: low precision where it is safe |
# | Apex: `amp.initialize(model, optimizer, opt_level="O1")`, `amp.scale_loss`, `apex.parallel.DistributedDataParallel`; the DDP script calls `amp.initialize` before `optimizer` exists and never imports `amp` | Apex is not needed: autocast and `GradScaler` (O1), PyTorch's own DDP and `nn.SyncBatchNorm` (notebook 08); create the model and optimizer first, then the scaler | §1.1 · Pure 16-bit training stalls (the opt levels); §3 · `torch.amp.GradScaler`, step by step |
# | O3, pure float16, is "very unstable" | Besides float16's overflows, it stalls: it learns, then its updates fall below half an ulp of the weights and are lost | §1.1 · Pure 16-bit training stalls |
# | Mixed precision "stores weights and gradients in FP16" | Weights, gradients and optimizer state stay float32; autocast makes 16-bit copies for the operations that use them | §2 · `torch.amp.autocast`: low precision where it is safe; §5 · Measured |
# | Memory halves, so batches can double | Only the saved activations halve, and a 16-bit copy of each weight is added: anywhere from about half the memory to *more* memory, depending on batch and model size | §5 · Measured: float32 versus autocast |
# | Communication between GPUs drops sharply | The gradients stay float32, so DDP's all-reduce moves as many bytes; a compression hook halves it | §5 · Measured: float32 versus autocast |
# | 16-bit arithmetic is 2–8× faster, with no loss of accuracy | The loss curve matches; the speed depends on the hardware: 15× for a large matrix product on an H100, none for a small model, slower where bfloat16 is emulated | §5 · Measured: float32 versus autocast |
# | Be careful with "unsafe operations like mean and sum" | Reductions accumulate in float32 and round only their result; a total *stored* in 16 bits after every step is what stalls | §1 · Why 16 bits, and what breaks |
# | `opt.step()` on the scaled gradients "amounts to a larger learning rate" | True for SGD; Adam's steps are unchanged, but overflowing steps are no longer skipped | §3 · `torch.amp.GradScaler`, step by step |
# | The scale printed after `unscale_` is 65535; `unscale_` calls `torch._amp_non_finite_check_and_unscale_` | It is 65536 (a power of two); today one fused call, `torch._amp_foreach_non_finite_check_and_unscale_`, handles all gradients | §3 · `torch.amp.GradScaler`, step by step |
# | TF32 for matrix products and for cuDNN "defaults to True", set with `allow_tf32` | Matrix products: off since PyTorch 1.12; cuDNN convolutions: on. Today's settings: `torch.backends.cuda.matmul.fp32_precision` and friends | §4 · Recipes |

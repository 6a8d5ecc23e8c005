# %% [markdown]
# # 02 · Autograd and custom Functions (自动微分)
#
# **What you learn.** How PyTorch computes derivatives for you, and how to write your own
# differentiable operations:
#
# 1. `backward()` on a scalar and on a non-scalar (the `gradient` argument), and why that argument
#    is a *vector-Jacobian product*;
# 2. `torch.autograd.grad`: second derivatives with `create_graph=True`, several inputs, several outputs;
# 3. where the chain rule's sum over paths happens (the engine's input buffer, proved with hooks), the
#    graph is freed after a backward pass, **gradients** (梯度) *accumulate* across passes, and how to zero
#    them (and use accumulation on purpose);
# 4. minimising the notes' $f(x)=ax^2+bx+c$ with an optimizer, with a picture of the path;
# 5. custom `torch.autograd.Function`s from the notes — `MyReLU`, `Exp`, `GradCoeff`,
#    `LinearFunction`, `Square`, `Conv2D` — checked with `gradcheck` / `gradgradcheck`; `torch.func`
#    (`jacrev`, `vmap`) on custom Functions; what `@once_differentiable` does and does not protect;
# 6. the gradient-penalty recipe, `backward` versus `autograd.grad`, and freezing parameters (and the
#    BatchNorm statistics that freezing does not freeze).
#
# **Before this notebook.** Notebook 01 (creating tensors, shapes, dtypes, `requires_grad` as an
# attribute). Calculus at the level of the chain rule and partial derivatives.
#
# **Study time:** about 80 min (20 of them for the exercises). The slowest cells are the numerical gradient
# check of the convolution and the three short training runs with a gradient penalty (1–2 s each).
#
# **On a GPU.** Nothing changes in what you learn: the optimizer, the convolution check, the
# gradient-penalty model and the frozen ResNet run on `device`, which is CUDA when one is present.
# Everything here is tiny, so the GPU is not faster; the stored outputs were made on the CPU.

# %% [markdown]
# ## Setup
#
# `seed_everything(0)` makes the random tensors repeatable; `get_device()` picks CUDA, then Apple
# MPS, then the CPU (the stored outputs use the CPU).

# %%
import inspect
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from utils import fmt, get_device, plot_curves, seed_everything

seed_everything(0)
device = get_device()
print("device:", device.type)

# %% [markdown]
# ## 1. `backward()` on a scalar
#
# PyTorch's **autograd** (自动微分) records every operation done on a tensor that has `requires_grad=True`
# and builds a **computational graph (计算图)** of them. A tensor you create yourself with
# `requires_grad=True` is a **leaf tensor (叶子节点)**; a tensor computed from it has a `grad_fn`
# (the graph node that knows its backward formula) and is not a leaf.
#
# Calling `backward()` on a **scalar** walks the graph backwards with the **chain rule** (链式法则) and stores
# $\partial y/\partial x$ in the `.grad` attribute of every leaf that requires a gradient.
# The notes' running example is $f(x) = ax^2 + bx + c$ with $a=1, b=-2, c=1$, whose derivative is
# $2ax + b$, so at $x=0$ we expect $-2$.

# %%
a, b, c = torch.tensor(1.0), torch.tensor(-2.0), torch.tensor(1.0)


def f(x: torch.Tensor) -> torch.Tensor:
    """The notes' quadratic a*x**2 + b*x + c (element-wise)."""
    return a * torch.pow(x, 2) + b * x + c


x = torch.tensor(0.0, requires_grad=True)  # a leaf: we want dy/dx
y = f(x)
print("y =", y.item(), "| y.grad_fn:", type(y.grad_fn).__name__)
print("x.is_leaf:", x.is_leaf, "| y.is_leaf:", y.is_leaf, "| x.grad before backward:", x.grad)
y.backward()
print("dy/dx at x=0:", x.grad)
assert x.grad == 2 * a * x.detach() + b

# %% [markdown]
# The notes' second scalar example has two leaves, $c = p^2 + q$ with $p = 1$, $q = 2$ (the notes call them
# `a` and `b`): $\partial c/\partial p = 2p = 2$ and $\partial c/\partial q = 1$. `requires_grad` spreads: `c`
# requires grad because its inputs do.

# %%
p_leaf = torch.tensor(1.0, requires_grad=True)
q_leaf = torch.tensor(2.0, requires_grad=True)
c_out = p_leaf**2 + q_leaf
c_out.backward()
print("c =", c_out.item(), "| grad_fn:", type(c_out.grad_fn).__name__)
for name, t in (("p", p_leaf), ("q", q_leaf)):
    print(
        f"{name}: value {t.item()}, requires_grad {t.requires_grad}, grad {t.grad.item()}, grad_fn {t.grad_fn}, leaf {t.is_leaf}"
    )
assert (p_leaf.grad.item(), q_leaf.grad.item()) == (2.0, 1.0)

# %% [markdown]
# **`Variable` is gone.** Parts of the notes (and many old tutorials) wrap tensors in
# `torch.autograd.Variable(...)` to make them differentiable. Since PyTorch 0.4 (2018) `Tensor` and
# `Variable` are one class: every tensor carries `requires_grad`, `grad` and `grad_fn` itself.
# The name survives only as a shim that hands back a plain tensor, so write
# `torch.tensor(..., requires_grad=True)` or `t.requires_grad_()` instead.

# %%
from torch.autograd import Variable  # still importable, for old code

v = Variable(torch.ones(2), requires_grad=True)
print("Variable(...) returns:", type(v).__name__, "| requires_grad:", v.requires_grad, "| leaf:", v.is_leaf)
assert type(v) is torch.Tensor

t = torch.ones(2).requires_grad_()  # the modern way
assert t.requires_grad and t.is_leaf

# %% [markdown]
# ## 2. `backward()` on a non-scalar: the `gradient` argument
#
# If the output $y$ is not a scalar, "the derivative of $y$" is a whole **Jacobian (雅可比矩阵)**
# $J_{ij} = \partial y_i / \partial x_j$, and `.grad` has no room for it: `x.grad` must have the
# shape of `x`. So `backward()` refuses a non-scalar unless you pass a `gradient` tensor $g$ of the
# same shape as $y$. PyTorch then computes the **vector-Jacobian product (向量-雅可比积)**
# $g^\top J$, which has the shape of $x$. With $g$ all ones this is the gradient of `y.sum()`.

# %%
x = torch.tensor([[0.0, 0.0], [1.0, 2.0]], requires_grad=True)
y = f(x)
try:
    y.backward()
except RuntimeError as err:
    print(f"{type(err).__name__}: {err}")

y.backward(gradient=torch.ones_like(y))
print("y:\n", y.detach())
print("x.grad with gradient=ones:\n", x.grad)
assert torch.equal(x.grad, 2 * a * x.detach() + b)

# %% [markdown]
# The notes' vector example: $c = p^2 + q$ with $p = [1, 3]$, $q = [2, 4]$, first with `gradient=[1, 1]`
# ($p$.grad $= 2p = [2, 6]$), then with `gradient=[1, 2]`, for which they print $[2, 12]$ and $[1, 2]$. As
# written, their second `backward` cannot run: the first one freed the graph (section 4), and had it been kept
# (`retain_graph=True`) the gradients would have *added up* to $[4, 18]$. Their printed values are those of a
# fresh graph:

# %%
p_vec = torch.tensor([1.0, 3.0], requires_grad=True)
q_vec = torch.tensor([2.0, 4.0], requires_grad=True)
c_vec = p_vec**2 + q_vec
c_vec.backward(gradient=torch.tensor([1.0, 1.0]))
print("gradient [1, 1]: p.grad", p_vec.grad.tolist(), "q.grad", q_vec.grad.tolist())
try:
    c_vec.backward(gradient=torch.tensor([1.0, 2.0]))  # the notes' second call, on the same graph
except RuntimeError as err:
    print("the notes' second backward:", type(err).__name__, "-", str(err).split(" (")[0])
p_vec.grad = q_vec.grad = None
(p_vec**2 + q_vec).backward(gradient=torch.tensor([1.0, 2.0]))  # a fresh graph
print("gradient [1, 2] on a fresh graph: p.grad", p_vec.grad.tolist(), "q.grad", q_vec.grad.tolist())
assert p_vec.grad.tolist() == [2.0, 12.0] and q_vec.grad.tolist() == [1.0, 2.0]

# %% [markdown]
# The notes add that a non-scalar backward "can be done with a scalar backward": passing
# `gradient=g` is the same as calling `backward()` on the scalar $\sum_i g_i y_i$. Take a $g$ that is
# not all ones, so that it visibly acts as one weight per output element (as when you weight
# several loss terms).

# %%
g = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # one weight per element of y

x = torch.tensor([[0.0, 0.0], [1.0, 2.0]], requires_grad=True)
f(x).backward(gradient=g)
grad_vector_form = x.grad.clone()

x.grad = None
torch.sum(f(x) * g).backward()  # the scalar form
print("backward(gradient=g):\n", grad_vector_form)
print("sum(y * g).backward():\n", x.grad)
assert torch.equal(grad_vector_form, x.grad)

# %% [markdown]
# Where is the Jacobian? Autograd never builds it (for a network with millions of inputs it would
# not fit in memory); each backward formula multiplies the incoming vector by its local Jacobian
# directly. We can still ask for the full Jacobian, with `torch.func.jacrev` (the modern,
# composable API) or `torch.autograd.functional.jacobian` (the older one; both give the same), and
# check that $g^\top J$ is exactly what `backward(gradient=g)` returned. The Jacobian of a
# `2×2 → 2×2` function has shape `(2, 2, 2, 2)`; flattened to `4×4` it is diagonal here, because
# $f$ acts element by element: that is why $g$ simply multiplies the gradients element-wise.

# %%
x0 = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
J = torch.func.jacrev(f)(x0)  # shape y.shape + x.shape
assert torch.equal(J, torch.autograd.functional.jacobian(f, x0))
print("Jacobian shape:", tuple(J.shape))

J2d = J.reshape(4, 4)
print("flattened to 4x4:\n" + fmt(J2d, 1))
vjp = (g.reshape(1, 4) @ J2d).reshape(2, 2)
print("g^T J, reshaped:\n" + fmt(vjp, 1))
assert torch.equal(J2d, torch.diag(2 * a * x0.flatten() + b))
assert torch.equal(vjp, grad_vector_form)

# %% [markdown]
# For a function that mixes elements the Jacobian is not diagonal, and the vector-Jacobian product
# really is a matrix product. Here $h(v)_i = \sum_{j\le i} v_j^2$ (a running sum of squares), whose
# Jacobian is lower-triangular with entries $2v_j$.


# %%
def h(v: torch.Tensor) -> torch.Tensor:
    """Running sum of squares: every output depends on several inputs."""
    return torch.cumsum(v**2, dim=0)


v = torch.tensor([1.0, -1.0, 2.0, 0.5], requires_grad=True)
w = torch.tensor([1.0, 0.0, 0.0, 1.0])  # the vector of the product
h(v).backward(gradient=w)
Jh = torch.func.jacrev(h)(v.detach())
print("Jacobian of h:\n" + fmt(Jh, 1))
print("v.grad = w^T J =", fmt(v.grad, 1))
assert torch.equal(Jh, torch.tril(2 * v.detach().expand(4, 4)))
assert torch.allclose(v.grad, w @ Jh)

# %% [markdown]
# ## 3. `torch.autograd.grad`: returned gradients, second derivatives
#
# `torch.autograd.grad(outputs, inputs)` computes the same derivatives but **returns** them as a
# tuple instead of writing `.grad`. With `create_graph=True` the **backward pass** (反向传播) is itself
# recorded as a graph, so the returned derivative can be differentiated again: a **second derivative
# (二阶导数)**. For our quadratic $f'(0) = -2$ and $f'' = 2a = 2$.
#
# Without `create_graph` the returned derivative is a plain constant (no `grad_fn`), and asking for
# its derivative fails.
#
# (The notes print `dy_dx.data`. Prefer `.item()` for a number or `.detach()` for a tensor:
# see the next cell for why `.data` is risky.)

# %%
x = torch.tensor(0.0, requires_grad=True)
(dy_dx,) = torch.autograd.grad(f(x), x, create_graph=True)
print("dy/dx =", dy_dx.item(), "| dy/dx has a grad_fn:", dy_dx.grad_fn is not None)
(d2y_dx2,) = torch.autograd.grad(dy_dx, x)
print("d2y/dx2 =", d2y_dx2.item())
assert dy_dx.item() == -2.0 and d2y_dx2.item() == 2.0

(dy_dx_plain,) = torch.autograd.grad(f(x), x)  # create_graph=False (the default)
print("without create_graph, dy/dx requires_grad:", dy_dx_plain.requires_grad)
try:
    torch.autograd.grad(dy_dx_plain, x)
except RuntimeError as err:
    print(f"{type(err).__name__}: {err}")
print("x.grad after autograd.grad:", x.grad)
assert x.grad is None  # returned, never accumulated into .grad

# %% [markdown]
# The same works on a whole vector when the function is element-wise: differentiate the *sum*
# (each $y_i$ depends only on $x_i$, so the gradient of the sum holds every $dy_i/dx_i$).
# For $\sin$ we get $\cos$ and then $-\sin$.

# %%
xs = torch.linspace(0.0, 3.0, 5, requires_grad=True)
(d1,) = torch.autograd.grad(torch.sin(xs).sum(), xs, create_graph=True)
(d2,) = torch.autograd.grad(d1.sum(), xs)
print("x       :", fmt(xs))
print("d sin   :", fmt(d1))
print("d2 sin  :", fmt(d2))
assert torch.allclose(d1, torch.cos(xs.detach())) and torch.allclose(d2, -torch.sin(xs.detach()))

# %% [markdown]
# **Why not `.data`?** `t.data` and `t.detach()` both give a tensor sharing memory with `t`
# outside the graph, but autograd's safety check (a version counter bumped by in-place edits) only
# sees edits made through `.detach()`. Sigmoid's backward reuses its output
# ($\sigma' = \sigma(1-\sigma)$), so zeroing that output through `.data` silently makes the
# gradient wrong, while the same edit through `.detach()` raises an error.

# %%
t = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
correct = torch.sigmoid(t.detach()) * (1 - torch.sigmoid(t.detach()))

out = t.sigmoid()
assert out.data.data_ptr() == out.detach().data_ptr() == out.data_ptr()  # all share memory
out.data.zero_()  # old style: the edit is invisible to autograd
out.sum().backward()
print("true gradient           :", fmt(correct))
print("after editing .data     :", fmt(t.grad), "<- silently wrong")
assert not torch.allclose(t.grad, correct)

t.grad = None
out = t.sigmoid()
out.detach().zero_()  # same edit through .detach(): autograd notices
try:
    out.sum().backward()
except RuntimeError as err:
    print("after editing .detach() :", type(err).__name__, "-", str(err).split(":")[0])

# %% [markdown]
# **Several inputs, several outputs.** `inputs` may be a list: you get one derivative per input.
# With a list of `outputs`, the derivatives of all outputs are **summed** — the same as
# differentiating `y1 + y2`. For $y_1 = x_1x_2$, $y_2 = x_1 + x_2$ at $(1, 2)$:
# $\nabla y_1 = (2, 1)$ and $\nabla(y_1+y_2) = (3, 2)$. `retain_graph=True` keeps the graph alive for
# the second call (next section).

# %%
x1 = torch.tensor(1.0, requires_grad=True)
x2 = torch.tensor(2.0, requires_grad=True)
y1 = x1 * x2
y2 = x1 + x2

dy1_dx1, dy1_dx2 = torch.autograd.grad(outputs=y1, inputs=[x1, x2], retain_graph=True)
print("dy1/dx1, dy1/dx2:", dy1_dx1.item(), dy1_dx2.item())
d12_dx1, d12_dx2 = torch.autograd.grad(outputs=[y1, y2], inputs=[x1, x2], retain_graph=True)
print("d(y1+y2)/dx1, d(y1+y2)/dx2:", d12_dx1.item(), d12_dx2.item())
sum_dx1, sum_dx2 = torch.autograd.grad(y1 + y2, [x1, x2])
assert (dy1_dx1.item(), dy1_dx2.item()) == (2.0, 1.0)
assert (d12_dx1, d12_dx2) == (sum_dx1, sum_dx2) == (3.0, 2.0)

# %% [markdown]
# ## 4. The graph is freed; gradients accumulate (梯度累加)
#
# PyTorch builds the graph anew at each forward pass (a *dynamic* graph) and, to save memory,
# frees the intermediate values it saved as soon as a backward pass has used them. A second
# `backward()` through the same graph therefore fails unless the first one passed
# `retain_graph=True`. (Notebook 03 studies the graph itself: `grad_fn` chains, leaves, hooks.)
#
# The notes' example: $x=3$, $y_1 = x+1$, $y_2 = 2x$, $L=(y_1-y_2)^2$. $x$ reaches $L$ along two
# paths, and the chain rule (链式法则) says the two contributions are **added**:
# $\frac{dL}{dx} = \frac{\partial L}{\partial y_1}\cdot 1 + \frac{\partial L}{\partial y_2}\cdot 2
# = (-4)(1) + (4)(2) = 4$.
#
# The notes say autograd does this sum by adding each contribution into `x.grad`. It does not. During one
# backward pass (反向传播) the engine collects everything that flows into a node in that node's *input buffer*,
# adds it there, and runs the node once, when all its inputs have arrived. For a leaf the node is
# `AccumulateGrad`, which writes `.grad`: it runs **once**, with 4, and a hook on `x` sees 4, never $-4$ and 8
# apart. Adding into `.grad` is a different mechanism, **across** backward calls: the second cell shows it.

# %%
x = torch.tensor(3.0, requires_grad=True)
y1 = x + 1
y2 = 2 * x
loss = (y1 - y2) ** 2
dL_dy1, dL_dy2 = torch.autograd.grad(loss, [y1, y2], retain_graph=True)
calls = []
x.register_hook(lambda grad: calls.append(("hook on x", grad.item())))
accumulate_x = y1.grad_fn.next_functions[0][0]  # x's AccumulateGrad node, shared by both paths
accumulate_x.register_prehook(lambda grad_outputs: calls.append(("AccumulateGrad", grad_outputs[0].item())))
loss.backward()
print("dL/dy1 =", dL_dy1.item(), "| dL/dy2 =", dL_dy2.item(), "| x.grad =", x.grad.item())
print("calls during one backward:", calls)
assert x.grad == dL_dy1 * 1 + dL_dy2 * 2 == 4.0
assert calls == [("hook on x", 4.0), ("AccumulateGrad", 4.0)]  # each once, with the sum

try:
    loss.backward()  # the graph's saved values are gone
except RuntimeError as err:
    print(f"{type(err).__name__}: {str(err).split('. ')[0]}.")

# %% [markdown]
# Adding into `.grad` happens *across* backward calls: `.grad` is never reset for you. Three backward
# passes (keeping the graph) run `AccumulateGrad` three times and give three times the gradient. This is the bug behind "my loss
# explodes" when `zero_grad()` is forgotten in a training loop.

# %%
x = torch.tensor(3.0, requires_grad=True)
loss = (x + 1 - 2 * x) ** 2
for i in range(3):
    loss.backward(retain_graph=True)
    print(f"after backward #{i + 1}: x.grad = {x.grad.item()}")
assert x.grad.item() == 3 * 4.0

# %% [markdown]
# Accumulation is also a tool: **gradient accumulation** (梯度累加) splits a batch that does not fit in memory
# into micro-batches, calls `backward()` on each (scaled by 1/number of micro-batches, because the
# loss is a mean) and steps once. The result equals the full-batch gradient.
#
# To reset gradients, `model.zero_grad()` / `optimizer.zero_grad()` now set `.grad` to `None` by
# default (`set_to_none=True` since PyTorch 2.0: no memory is written, and an optimizer skips a
# parameter whose `.grad` is `None`); `set_to_none=False` fills them with zeros as in older versions.

# %%
seed_everything(0)
model = nn.Linear(3, 1)
X = torch.randn(8, 3)
Y = torch.randn(8, 1)
loss_fn = nn.MSELoss()

loss_fn(model(X), Y).backward()
full_batch = [p.grad.clone() for p in model.parameters()]

model.zero_grad()
print("after model.zero_grad():", [p.grad for p in model.parameters()])
assert all(p.grad is None for p in model.parameters())

for Xc, Yc in zip(X.chunk(4), Y.chunk(4)):  # 4 micro-batches of 2 samples
    (loss_fn(model(Xc), Yc) / 4).backward()
same = all(torch.allclose(p.grad, q, atol=1e-6) for p, q in zip(model.parameters(), full_batch))
print("4 accumulated micro-batches == one full batch:", same)
assert same

opt = torch.optim.SGD(model.parameters(), lr=0.1)
opt.zero_grad(set_to_none=False)
print("after zero_grad(set_to_none=False):", [fmt(p.grad, 1) for p in model.parameters()])
assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())

# %% [markdown]
# ## 5. Minimising a function with an optimizer (优化器)
#
# An **optimizer** (优化器) turns gradients into updates of the **parameters** (参数) it was given, the tensors being learned. The notes minimise $f(x) = x^2 - 2x + 1 = (x-1)^2$ with
# `SGD(lr=0.01)` for 500 steps, each step doing the three-line ritual `zero_grad()` → `backward()` →
# `step()`. SGD's update is $x \leftarrow x - \eta f'(x) = x - \eta(2x - 2)$, so
# $x_k - 1 = (1 - 2\eta)^k (x_0 - 1)$: from $x_0 = 0$ we can check every step against
# $x_k = 1 - (1-2\eta)^k$.


# %%
def descend(lr: float, steps: int) -> torch.Tensor:
    """Run SGD on f from x=0 and return the path x_0..x_steps (float64, on the CPU)."""
    x = torch.tensor(0.0, device=device, requires_grad=True)
    optimizer = torch.optim.SGD(params=[x], lr=lr)
    path = [x.item()]
    for _ in range(steps):
        optimizer.zero_grad()
        y = f(x)
        y.backward()
        optimizer.step()
        path.append(x.item())
    return torch.tensor(path, dtype=torch.float64)


path = descend(lr=0.01, steps=500)
x_final = path[-1]
print(f"after 500 steps: x = {x_final.item():.4f}, f(x) = {f(x_final).item():.4f}")
k = torch.arange(501, dtype=torch.float64)
assert torch.allclose(path, 1 - (1 - 2 * 0.01) ** k, atol=1e-5)
assert abs(x_final.item() - 1.0) < 1e-4

# %% [markdown]
# The closed form also tells us how the **learning rate** (学习率) matters: the distance to the minimum is
# multiplied by $|1-2\eta|$ every step. $\eta = 0.01$ crawls, $\eta = 0.3$ is fast, $\eta = 0.95$
# overshoots and zig-zags across the minimum, and $\eta > 1$ diverges. Left: the paths on the
# parabola; right: the distance to the minimum (dots) against the prediction $|1-2\eta|^k$ (lines).

# %%
lrs = [0.01, 0.3, 0.95, 1.05]
paths = {lr: descend(lr, steps=40) for lr in lrs}
k = torch.arange(41, dtype=torch.float64)
for lr, p in paths.items():
    assert torch.allclose((p - 1).abs(), abs(1 - 2 * lr) ** k, rtol=1e-4, atol=1e-6)
    print(f"lr={lr:<5} x_40 = {p[-1].item():8.4f}   |x_40 - 1| = {abs(p[-1].item() - 1):.2e}")
assert abs(paths[1.05][-1].item() - 1) > 1.0  # diverged

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
grid = torch.linspace(-1.2, 3.2, 200)
ax1.plot(grid, f(grid), color="gray", label=r"$f(x)=x^2-2x+1$")
p001 = path[::25]
ax1.plot(p001, f(p001.float()), "o", color="tab:blue", label="lr=0.01, every 25th of 500 steps")
p095 = paths[0.95][:12]
ax1.plot(p095, f(p095.float()), "o-", color="tab:red", lw=1, ms=4, label="lr=0.95, first 11 steps")
ax1.set_xlabel("x")
ax1.set_ylabel("f(x)")
ax1.set_title("SGD paths on the parabola")
ax1.legend(fontsize=8)
for lr, p in paths.items():
    line = ax2.semilogy(k, abs(1 - 2 * lr) ** k, lw=1)[0]
    dist = (p - 1).abs()
    nonzero = dist > 0  # lr=0.3 lands exactly on 1.0 in float32 after ~19 steps
    ax2.semilogy(k[nonzero], dist[nonzero], ".", color=line.get_color(), label=f"lr={lr}")
ax2.set_xlabel("step k")
ax2.set_ylabel("|x_k - 1|")
ax2.set_title(r"distance to the minimum vs $|1-2\eta|^k$")
ax2.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 6. Custom Functions (自定义算子)
#
# Every node of the graph is a `Function`: it knows how to compute its output (`forward`) and how to
# turn the gradient of its output into gradients of its inputs (`backward`). You can write your
# own, a **custom Function** (自定义算子), by subclassing `torch.autograd.Function` with two static methods:
#
# * `forward(ctx, *inputs)` computes the result; `ctx.save_for_backward(...)` stores the **tensors**
#   that backward will need, other values can be stored as attributes of `ctx`;
# * `backward(ctx, grad_output)` receives $\partial L/\partial\,\text{output}$ and returns one
#   gradient per input of `forward` (`None` for inputs that have no gradient).
#
# You call it through `.apply(...)`, never by instantiating the class.
#
# ### `MyReLU`
#
# The notes' ReLU saves its input and zeroes the gradient where the input was negative. Their
# example uses a tiny linear model; note that `Y_hat` has shape `(2, 1)` and `Y` has shape `(1, 2)`,
# so `Y_hat - Y` silently broadcasts to `2×2` (probably not what was intended, but it is what
# produces the notes' numbers `4.5`). The check that matters: the gradients equal those of the
# built-in `torch.relu`.


# %%
class MyReLU(Function):
    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)  # backward needs to know where input < 0
        return input.clamp(min=0)

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        grad_input = grad_output.clone()
        grad_input[input < 0] = 0
        return grad_input


def relu_model_grads(relu):
    w = torch.tensor([[3.0, 1.0]], requires_grad=True)
    b = torch.tensor([[3.0]], requires_grad=True)
    X = torch.tensor([[-1.0, -1.0], [1.0, 1.0]])
    Y = torch.tensor([[2.0, 3.0]])
    Y_hat = relu(X @ w.t() + b)
    loss = torch.mean(torch.pow(Y_hat - Y, 2))
    loss.backward()
    return w.grad, b.grad, Y_hat, (Y_hat - Y).shape


w_grad, b_grad, Y_hat, diff_shape = relu_model_grads(MyReLU.apply)
print("w.grad:", w_grad, "| b.grad:", b_grad, "| Y_hat - Y has shape", tuple(diff_shape))
print("Y_hat.grad_fn:", type(Y_hat.grad_fn).__name__)
w_ref, b_ref, _, _ = relu_model_grads(torch.relu)
assert torch.equal(w_grad, w_ref) and torch.equal(b_grad, b_ref)
assert torch.equal(w_grad, torch.tensor([[4.5, 4.5]]))

# %% [markdown]
# One subtle difference: at exactly 0 ReLU has no derivative. `MyReLU` lets the gradient through
# there (it only zeroes `input < 0`), the built-in chooses 0. Both are valid *subgradients*, but
# a numerical check near 0 would flag either, so `gradcheck` below stays away from the kink.

# %%
z = torch.tensor([-1.0, 0.0, 2.0], requires_grad=True)
(g_mine,) = torch.autograd.grad(MyReLU.apply(z).sum(), z)
(g_builtin,) = torch.autograd.grad(torch.relu(z).sum(), z)
print("at z = [-1, 0, 2]:  MyReLU grad", g_mine.tolist(), "| torch.relu grad", g_builtin.tolist())
assert g_mine[1] == 1.0 and g_builtin[1] == 0.0

z64 = (torch.rand(20, dtype=torch.float64) + 0.1) * torch.tensor([-1.0, 1.0], dtype=torch.float64).repeat(10)
assert torch.autograd.gradcheck(MyReLU.apply, (z64.requires_grad_(),))
print("gradcheck(MyReLU) away from 0: passed")

# %% [markdown]
# ### `Exp`: saving the output
#
# For $e^x$ the derivative is the output itself, so `Exp` saves its **result** rather than its
# input, then multiplies: $\partial L/\partial x = \partial L/\partial y \cdot e^x$.
# At $x=1$ the gradient is $e \approx 2.7183$.


# %%
class Exp(Function):
    @staticmethod
    def forward(ctx, i):
        result = i.exp()
        ctx.save_for_backward(result)  # saved tensors come back as ctx.saved_tensors
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * result


x = torch.tensor([1.0], requires_grad=True)
ret = Exp.apply(x)
ret.backward()
print("Exp(1) =", fmt(ret), "| grad =", fmt(x.grad), "| grad_fn:", type(ret.grad_fn).__name__)
assert torch.allclose(x.grad, torch.exp(torch.tensor([1.0])))
assert torch.autograd.gradcheck(Exp.apply, (torch.randn(5, dtype=torch.float64, requires_grad=True),))

# %% [markdown]
# ### `GradCoeff`: a non-tensor argument and a `None` gradient
#
# `GradCoeff.apply(x, coeff)` is the identity going forward but multiplies the gradient by `coeff`
# going backward (with a negative `coeff` it is the *gradient reversal layer* used in domain
# adaptation). `coeff` is a Python float, so it is stored as an attribute of `ctx` (not with
# `save_for_backward`, which is for tensors). `backward` must return **one value per input of
# forward**, so it returns `None` for `coeff`. The forward returns `x.view_as(x)`, a new tensor
# object sharing `x`'s memory, so that the output gets its own `grad_fn`.
#
# With $x=2$, $L = (\text{GradCoeff}(x, -0.1))^2$: the forward value is $4$ and the gradient
# $2x \cdot (-0.1) = -0.4$. Forgetting the `None` is an error.


# %%
class GradCoeff(Function):
    @staticmethod
    def forward(ctx, x, coeff):
        ctx.coeff = coeff  # a plain float: keep it on ctx
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return ctx.coeff * grad_output, None  # no gradient for coeff


x = torch.tensor([2.0], requires_grad=True)
ret = GradCoeff.apply(x, -0.1) ** 2
ret.backward()
print("forward:", fmt(ret), "| x.grad:", fmt(x.grad))
assert torch.equal(ret.detach(), x.detach() ** 2)
assert torch.allclose(x.grad, torch.tensor([-0.4]))


class GradCoeffMissingNone(GradCoeff):
    @staticmethod
    def backward(ctx, grad_output):
        return ctx.coeff * grad_output  # one value for two inputs


try:
    GradCoeffMissingNone.apply(x, -0.1).sum().backward()
except RuntimeError as err:
    print(f"{type(err).__name__}: {err}")

# %% [markdown]
# ### `LinearFunction` and `ctx.needs_input_grad`
#
# The notes' linear layer $y = xW^\top + b$ has three inputs. `ctx.needs_input_grad` is a tuple
# of booleans, one per input of forward, telling backward which gradients are actually wanted, so
# it can skip work (here: when the data `input` does not require a gradient, the matrix product
# for `grad_input` is skipped). Returning gradients nobody asked for is not an error, only waste.
# The class records what it saw so we can print it, and we compare with the built-in `F.linear`
# and with `gradcheck`.


# %%
class LinearFunction(Function):
    seen_needs_input_grad: list = []  # for the demonstration only

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        output = input.mm(weight.t())
        if bias is not None:
            output += bias.unsqueeze(0).expand_as(output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        LinearFunction.seen_needs_input_grad.append(ctx.needs_input_grad)
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.mm(weight)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output.t().mm(input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(0)
        return grad_input, grad_weight, grad_bias


seed_everything(0)
inp = torch.randn(4, 3, dtype=torch.float64)  # data: no gradient wanted
weight = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
bias = torch.randn(2, dtype=torch.float64, requires_grad=True)

out = LinearFunction.apply(inp, weight, bias)
grads = torch.autograd.grad(out.square().sum(), [weight, bias])
print("needs_input_grad (input, weight, bias):", LinearFunction.seen_needs_input_grad[-1])
ref_out = F.linear(inp, weight, bias)
ref_grads = torch.autograd.grad(ref_out.square().sum(), [weight, bias])
assert torch.allclose(out, ref_out) and all(torch.allclose(p, q) for p, q in zip(grads, ref_grads))

out_nobias = LinearFunction.apply(inp, weight)  # bias defaults to None
assert torch.allclose(out_nobias, inp @ weight.T)
assert torch.autograd.gradcheck(LinearFunction.apply, (inp.clone().requires_grad_(), weight, bias))
print("needs_input_grad during gradcheck:      ", LinearFunction.seen_needs_input_grad[-1])
print("matches F.linear and passes gradcheck")

# %% [markdown]
# **The modern `setup_context` style.** The classic style above (`forward(ctx, ...)`) is fine for
# `backward()` and `autograd.grad`. The function transforms of `torch.func` (`jacrev`, `vmap`,
# `grad`, ...) however need `forward` *without* `ctx` and a separate `setup_context(ctx, inputs,
# output)` that saves what backward needs. Only the split differs; `backward` is unchanged.


# %%
class ExpV2(Function):
    @staticmethod
    def forward(i):  # no ctx here
        return i.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * result


x3 = torch.tensor([0.0, 1.0, 2.0])
try:
    torch.func.jacrev(Exp.apply)(x3)
except RuntimeError as err:
    print("classic Exp under jacrev:", type(err).__name__, "-", str(err).split(". ")[0])
J_exp = torch.func.jacrev(ExpV2.apply)(x3)
print("ExpV2 under jacrev:\n" + fmt(J_exp))
assert torch.allclose(J_exp, torch.diag(x3.exp()))

# %% [markdown]
# `jacrev` and `grad` only need the split. `vmap` (and `jacfwd`, which uses it) needs one more thing: a rule for
# running the Function on a batch. Either write a `vmap` static method, or set `generate_vmap_rule = True`, which
# lets PyTorch derive the rule by running `forward`/`backward` under `vmap` themselves (possible when they are
# made of PyTorch operations, as here).

# %%
batch3 = torch.stack([x3, x3 + 1])
try:
    torch.func.vmap(ExpV2.apply)(batch3)
except RuntimeError as err:
    print("ExpV2 under vmap:", type(err).__name__, "-", str(err).split(". ")[0])


class ExpV3(ExpV2):
    generate_vmap_rule = True


batched = torch.func.vmap(ExpV3.apply)(batch3)
print("ExpV3 (generate_vmap_rule = True) under vmap: shape", tuple(batched.shape))
assert torch.allclose(batched, batch3.exp())

# %% [markdown]
# ## 7. Checking a Function: `gradcheck` and `gradgradcheck` (梯度检查)
#
# A hand-written `backward` is easy to get wrong, and a wrong gradient does not crash: training just
# goes badly. A **gradient check** (梯度检查), `torch.autograd.gradcheck(fn, inputs)`, compares your analytical
# Jacobian with a numerical one from central finite differences $\frac{f(x+\epsilon)-f(x-\epsilon)}{2\epsilon}$,
# and `gradgradcheck` does the same for the second derivative (the backward of your backward).
#
# The notes' `Square` writes its backward with ordinary differentiable tensor operations
# (`grad_out * 2 * x`), so autograd can record the backward too and double backward works for free.
# Below, a buggy `Square` that forgets the factor 2 is caught by `gradcheck`.


# %%
class Square(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)  # an input is saved with save_for_backward
        return x**2

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * 2 * x  # differentiable ops: double backward works


class BuggySquare(Square):
    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * x  # forgot the 2


seed_everything(0)
x = torch.rand(3, 3, requires_grad=True, dtype=torch.double)  # float64: see the next cell
print("gradcheck(Square):    ", torch.autograd.gradcheck(Square.apply, x))
print("gradgradcheck(Square):", torch.autograd.gradgradcheck(Square.apply, x))
try:
    torch.autograd.gradcheck(BuggySquare.apply, x)
except RuntimeError as err:  # GradcheckError is a RuntimeError
    print("gradcheck(BuggySquare):", type(err).__name__, "-", str(err).splitlines()[0])
else:
    raise AssertionError("gradcheck should have caught the bug")

# %% [markdown]
# **Why float64.** Finite differences subtract two nearly equal numbers and divide by a tiny
# $\epsilon$ (gradcheck uses $10^{-6}$). In float32, whose spacing near 1 is about $10^{-7}$, that
# rounding error is amplified to the percent level, so a correct backward would look wrong.
# In float64 the error is negligible.

# %%
for dtype in (torch.float32, torch.float64):
    x_ = torch.tensor(0.7, dtype=dtype)
    eps = 1e-6
    numerical = ((x_ + eps) ** 2 - (x_ - eps) ** 2) / (2 * eps)
    error = abs(numerical.item() - 1.4)
    print(f"{str(dtype):14} d(x^2)/dx at 0.7 ~ {numerical.item():.6f}   error {error:.0e}")
    assert (error > 1e-3) if dtype == torch.float32 else (error < 1e-8)

# %% [markdown]
# ### `once_differentiable`
#
# Decorating `backward` with `@once_differentiable` runs it with autograd switched off, so its result
# cannot be differentiated again. Use it when `backward` is written with operations autograd cannot
# follow (NumPy, a C extension, in-place tricks): it then marks the result so that a *second* backward
# through it raises instead of computing nonsense. When `backward` is made of PyTorch operations, leave
# it out: double backward then works for free. The same `Square` with the decorator still passes
# `gradcheck` but fails `gradgradcheck`, whose message shows the second derivative it got: zeros.


# %%
class SquareOnce(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**2

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * 2 * x


print("gradcheck(SquareOnce):", torch.autograd.gradcheck(SquareOnce.apply, x))
try:
    torch.autograd.gradgradcheck(SquareOnce.apply, x)
except RuntimeError as err:
    print("gradgradcheck(SquareOnce):", type(err).__name__, "-", str(err).splitlines()[0])
    analytical = str(err).split("analytical:")[1].split("dtype")[0]
    assert not any(ch in "123456789" for ch in analytical)  # every entry of the analytical matrix is 0
    print("  the analytical second derivative it reports: all zeros")
else:
    raise AssertionError("gradgradcheck should fail for a once-differentiable backward")

# %% [markdown]
# **It is not a safety net.** The decorator only raises when the *plain* `.backward()` walks into it. A gradient
# penalty computed with `torch.autograd.grad(total, params)` (section 9) gets no error: the penalty's path through
# the once-differentiable backward is silently skipped, and the gradient is that of the data term alone. With
# $L = w \sum x_i^2 + \lVert \partial L_0/\partial x \rVert^2$ the true $dL/dw$ is $2.5 + 40 = 42.5$:


# %%
def penalty_gradient(square_fn):
    """dL/dw for L = L0 + ||dL0/dx||^2 with L0 = w * sum(square_fn(x)), w = 2, x = [0.5, 1.5]."""
    w = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    xs = torch.tensor([0.5, 1.5], dtype=torch.float64, requires_grad=True)
    data_term = (w * square_fn(xs)).sum()
    (dx,) = torch.autograd.grad(data_term, xs, create_graph=True)  # the penalty's inner gradient
    total = data_term + dx.square().sum()
    return total, w


for fn in (Square, SquareOnce):
    total, w = penalty_gradient(fn.apply)
    (dw,) = torch.autograd.grad(total, [w])
    print(f"{fn.__name__:10} autograd.grad -> dL/dw = {dw.item()}")
total, w = penalty_gradient(SquareOnce.apply)
try:
    total.backward()
except RuntimeError as err:
    print(f"SquareOnce .backward()     -> {type(err).__name__}: {err}")
assert torch.autograd.grad(*penalty_gradient(Square.apply))[0].item() == 42.5
assert torch.autograd.grad(*penalty_gradient(SquareOnce.apply))[0].item() == 2.5  # the penalty term is lost

# %% [markdown]
# ### A 2-D convolution as a Function
#
# The notes (following the official "fusing convolution and batch norm" tutorial) write a
# convolution whose backward uses two identities, for a convolution without bias, stride 1 and no
# padding:
#
# * gradient w.r.t. the input = a **transposed convolution** of `grad_out` with the same weight;
# * gradient w.r.t. the weight = a convolution of the input with `grad_out`, with the batch and
#   channel dimensions swapped (`transpose(0, 1)`) so that the sum over the batch becomes the
#   sum over "channels" that `conv2d` performs.
#
# (The notes call the weight gradient `grad_input`; it is renamed `grad_weight` here.) We check it
# with `gradcheck` in float64 on the notes' shapes, and against the gradients of the built-in
# `F.conv2d`.


# %%
def convolution_backward(grad_out, X, weight):
    grad_weight = F.conv2d(X.transpose(0, 1), grad_out.transpose(0, 1)).transpose(0, 1)
    grad_X = F.conv_transpose2d(grad_out, weight)
    return grad_X, grad_weight


class Conv2D(Function):
    @staticmethod
    def forward(ctx, X, weight):
        ctx.save_for_backward(X, weight)
        return F.conv2d(X, weight)

    @staticmethod
    @once_differentiable  # as in the notes; Conv2DTwice below does without it
    def backward(ctx, grad_out):
        X, weight = ctx.saved_tensors
        return convolution_backward(grad_out, X, weight)


seed_everything(0)
weight = torch.rand(5, 3, 3, 3, requires_grad=True, dtype=torch.double, device=device)
X = torch.rand(10, 3, 7, 7, requires_grad=True, dtype=torch.double, device=device)
print("gradcheck(Conv2D):", torch.autograd.gradcheck(Conv2D.apply, (X, weight)))

out = Conv2D.apply(X, weight)
print("output shape:", tuple(out.shape))
mine = torch.autograd.grad(out.sin().sum(), [X, weight])
builtin = torch.autograd.grad(F.conv2d(X, weight).sin().sum(), [X, weight])
for p, q in zip(mine, builtin):
    torch.testing.assert_close(p, q, rtol=0, atol=1e-10)
print("gradients (input, weight) shaped", [tuple(g.shape) for g in mine], "equal those of F.conv2d within 1e-10")

# %% [markdown]
# Asking for a second derivative through it with `.backward()` raises (with `autograd.grad` it could be
# silently dropped, as shown above). Here the decorator is not even needed: `convolution_backward` is
# made of `conv2d` and `conv_transpose2d`, which autograd can differentiate, so without it the Function
# is twice differentiable and passes `gradgradcheck` (on smaller shapes, to keep the numerical check
# quick).

# %%
out = Conv2D.apply(X, weight)
(gX,) = torch.autograd.grad(out.pow(2).sum(), X, create_graph=True)
try:
    gX.sum().backward()
except RuntimeError as err:
    print(f"{type(err).__name__}: {err}")
else:
    raise AssertionError("double backward through Conv2D should fail")


class Conv2DTwice(Conv2D):  # the same forward
    @staticmethod
    def backward(ctx, grad_out):  # no decorator: built from differentiable operations
        X, weight = ctx.saved_tensors
        return convolution_backward(grad_out, X, weight)


small = (
    torch.rand(2, 2, 5, 5, dtype=torch.double, device=device, requires_grad=True),
    torch.rand(3, 2, 3, 3, dtype=torch.double, device=device, requires_grad=True),
)
print("gradgradcheck(Conv2DTwice):", torch.autograd.gradgradcheck(Conv2DTwice.apply, small))

# %% [markdown]
# ## 8. `backward` versus `autograd.grad`
#
# The notes read PyTorch's source: `Tensor.backward` calls `torch.autograd.backward`, and both that
# and `torch.autograd.grad` call the same autograd engine; the one difference is a flag,
# `accumulate_grad=True` for `backward` (results are **added into `.grad`** of the leaves, nothing is
# returned) and `accumulate_grad=False` for `grad` (results are **returned**, `.grad` is untouched).
# In current PyTorch the engine call is named `_engine_run_backward` (the notes show the older
# `Variable._execution_engine.run_backward`), but the flags are the same:

# %%
src_tensor_backward = inspect.getsource(torch.Tensor.backward)
src_backward = inspect.getsource(torch.autograd.backward)
src_grad = inspect.getsource(torch.autograd.grad)
print("Tensor.backward calls torch.autograd.backward:", "torch.autograd.backward(" in src_tensor_backward)
print("autograd.backward -> engine with accumulate_grad=True: ", "accumulate_grad=True" in src_backward)
print("autograd.grad     -> engine with accumulate_grad=False:", "accumulate_grad=False" in src_grad)
assert "torch.autograd.backward(" in src_tensor_backward
assert "_engine_run_backward(" in src_backward and "_engine_run_backward(" in src_grad
assert "accumulate_grad=True" in src_backward and "accumulate_grad=True" not in src_grad

# %% [markdown]
# The behaviour that follows, on a two-parameter expression: `grad` returns and leaves `.grad`
# alone; `backward` returns `None` and accumulates; `backward(inputs=[...])` accumulates only into
# the tensors you list.

# %%
p = torch.tensor(2.0, requires_grad=True)
q = torch.tensor(3.0, requires_grad=True)
loss = p**2 * q  # d/dp = 2pq = 12, d/dq = p^2 = 4

returned = torch.autograd.grad(loss, [p, q], retain_graph=True)
print("autograd.grad returned", [r.item() for r in returned], "| p.grad, q.grad:", p.grad, q.grad)
assert p.grad is None and q.grad is None

result = loss.backward(retain_graph=True)
print("backward returned", result, "| p.grad, q.grad:", p.grad.item(), q.grad.item())
loss.backward(inputs=[p])
print("backward(inputs=[p]) again  | p.grad, q.grad:", p.grad.item(), q.grad.item())
assert (p.grad.item(), q.grad.item()) == (24.0, 4.0)

# %% [markdown]
# ## 9. Gradient penalty (梯度惩罚)
#
# A **gradient penalty** (梯度惩罚) adds the norm of the loss's gradient w.r.t. the parameters to the loss
# itself (it favours flat regions; WGAN-GP uses the gradient w.r.t. the *inputs* instead, with the
# same mechanics). The recipe from the notes, per step:
#
# 1. `grad_params = torch.autograd.grad(loss, model.parameters(), create_graph=True)` — the
#    gradients are returned (every `p.grad` is still `None`), and thanks to `create_graph=True` they
#    are themselves part of a graph;
# 2. `grad_norm = sqrt(sum of squares)`, `loss = loss + grad_norm`;
# 3. `loss.backward()` fills `p.grad` with the gradient of loss *and* penalty (a second derivative
#    flows through step 1's graph), then `optimizer.step()`.
#
# We check the claims on one step. `.grad` is untouched after step 1. Without `create_graph=True`
# the recipe breaks in one of two ways: with no flag at all, `autograd.grad` frees the graph
# (as `backward` does) and the final `backward()` fails; with only `retain_graph=True` it runs,
# but the penalty is a constant with no graph and **silently changes nothing**. With
# `create_graph=True` the gradients equal an independent computation with `torch.func` (a `grad`
# of a function that itself contains a `grad`). (The notes take this recipe from the mixed-precision examples page; with
# AMP, the scaled gradients must be unscaled before the norm, and `torch.amp` replaces the notes'
# deprecated `torch.cuda.amp`: that is the subject of the mixed-precision notebook.)

# %%
seed_everything(0)
model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
X = torch.randn(64, 2, device=device)
Y = torch.sin(3 * X[:, :1]) * X[:, 1:]
loss_fn = nn.MSELoss()


def penalised_loss(**grad_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1 and 2 of the recipe: (loss + grad_norm, grad_norm)."""
    loss = loss_fn(model(X), Y)
    grad_params = torch.autograd.grad(loss, list(model.parameters()), **grad_kwargs)
    assert all(p.grad is None for p in model.parameters())  # returned, not accumulated
    grad_norm = torch.sqrt(sum(g.pow(2).sum() for g in grad_params))
    return loss + grad_norm, grad_norm


model.zero_grad()
loss_fn(model(X), Y).backward()
plain = {n: p.grad.clone() for n, p in model.named_parameters()}

model.zero_grad()
total, grad_norm = penalised_loss()  # no create_graph: autograd.grad frees the graph
try:
    total.backward()
except RuntimeError as err:
    print("no create_graph:    ", type(err).__name__, "-", str(err).split(" (")[0])

model.zero_grad()
total, grad_norm = penalised_loss(retain_graph=True)  # graph kept, but no graph of the gradients
total.backward()
print("retain_graph only:   grad_norm requires_grad =", grad_norm.requires_grad)
ignored = all(torch.equal(p.grad, plain[n]) for n, p in model.named_parameters())
print("  -> gradients identical to the plain loss's (penalty ignored):", ignored)
assert ignored

model.zero_grad()
total, grad_norm = penalised_loss(create_graph=True)
total.backward()
penalised = {n: p.grad.clone() for n, p in model.named_parameters()}
print("create_graph=True:   grad_norm requires_grad =", grad_norm.requires_grad)
print("  -> gradients differ from the plain loss's:", any(not torch.allclose(penalised[n], plain[n]) for n in plain))

params = {n: p.detach() for n, p in model.named_parameters()}


def loss_of(params):
    return loss_fn(torch.func.functional_call(model, params, (X,)), Y)


def total_of(params):
    grads = torch.func.grad(loss_of)(params)
    return loss_of(params) + torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))


reference = torch.func.grad(total_of)(params)
agree = all(torch.allclose(reference[n], penalised[n], atol=1e-6) for n in params)
print("  -> equal to torch.func.grad of (loss + ||grad loss||):", agree)
assert agree and grad_norm.requires_grad

# %% [markdown]
# The notes' training loop adds the penalty with weight 1. In practice the penalty has a weight
# $\lambda$, a hyperparameter: the penalty pulls towards flat regions, the data loss towards a good
# fit, and a large $\lambda$ wins. Below, 200 Adam steps for $\lambda = 0$ (no penalty), $0.1$ and
# $1$ (the notes' choice): the larger $\lambda$, the worse the fit on this small regression problem.


# %%
def train_with_penalty(lam: float, steps: int = 200) -> dict[str, list[float]]:
    """The notes' loop with loss + lam * ||d loss / d params||; returns the MSE and norm per step."""
    seed_everything(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    history = {"mse": [], "grad_norm": []}
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(X), Y)
        grad_params = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        grad_norm = torch.sqrt(sum(g.pow(2).sum() for g in grad_params))
        (loss + lam * grad_norm).backward()
        optimizer.step()
        history["mse"].append(loss.item())
        history["grad_norm"].append(grad_norm.item())
    return history


runs = {lam: train_with_penalty(lam) for lam in (0.0, 0.1, 1.0)}
for lam, hist in runs.items():
    # the final MSE is stable to two decimals; the final gradient norm is not (Adam makes it jitter
    # between about 0.02 and 0.06 from one step to the next), so only its bound is printed
    print(
        f"lambda={lam:<4} MSE {hist['mse'][0]:.2f} -> {hist['mse'][-1]:.2f}"
        f"   gradient norm {hist['grad_norm'][0]:.2f} -> below 0.1"
    )
final_mse = [hist["mse"][-1] for hist in runs.values()]
assert final_mse[0] < final_mse[1] < final_mse[2]
assert all(max(hist["grad_norm"][-20:]) < 0.1 < hist["grad_norm"][0] for hist in runs.values())
plot_curves(
    {f"MSE, lambda={lam}": hist["mse"] for lam, hist in runs.items()},
    xlabel="step",
    ylabel="MSE (data loss only)",
    title="training with a gradient penalty",
    logy=True,
)
plt.show()

# %% [markdown]
# ## 10. Freezing parameters (冻结参数)
#
# A parameter with `requires_grad=False` is a **frozen parameter** (冻结参数): autograd does not compute its
# gradient, and it does not even record the operations that involve only frozen parameters and data. The
# notes fine-tune a ResNet-18: freeze everything, then replace the last layer `fc` by a fresh
# `nn.Linear(512, 10)` (new parameters require gradients by default).
#
# The notes load it with `resnet18(pretrained=True)`. `pretrained` is deprecated since torchvision
# 0.13; the modern call is `resnet18(weights=ResNet18_Weights.DEFAULT)`. We use `weights=None`
# (random weights) so that nothing is downloaded: freezing works the same.
#
# We count the graph nodes behind the output: the unfrozen model records every convolution and
# batch norm, the frozen one only the final linear layer.


# %%
def count_graph_nodes(t: torch.Tensor) -> int:
    """Number of distinct backward nodes reachable from t.grad_fn."""
    seen, stack = set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(nxt for nxt, _ in node.next_functions)
    return len(seen)


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torchvision.models.resnet18(pretrained=False)  # the notes' argument, only to see the warning
messages = [str(w.message) for w in caught]
print("resnet18(pretrained=False) warns:", messages[0])
assert any("'pretrained' is deprecated" in m for m in messages)

seed_everything(0)
model = torchvision.models.resnet18(weights=None).to(device)
images = torch.randn(2, 3, 64, 64, device=device)
nodes_full = count_graph_nodes(model(images))

for param in model.parameters():
    param.requires_grad = False  # freeze all
model.fc = nn.Linear(512, 10).to(device)  # new head: trainable

n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
n_total = sum(p.numel() for p in model.parameters())
out = model(images)
nodes_frozen = count_graph_nodes(out)
print(f"trainable parameters: {n_train} of {n_total}")
print(f"graph nodes behind the output: unfrozen {nodes_full}, frozen backbone {nodes_frozen}")
assert n_train == 512 * 10 + 10
assert nodes_frozen < 10 and nodes_full > 100

# %% [markdown]
# After `backward()`, only the head has gradients. The optimizer may receive only the head's
# parameters (the notes' first option) or all of them (second option): SGD skips parameters whose
# `.grad` is `None`, so the frozen weights stay exactly as they were either way.

# %%
loss = F.cross_entropy(out, torch.tensor([1, 7], device=device))
loss.backward()
with_grad = [n for n, p in model.named_parameters() if p.grad is not None]
print("parameters with a .grad:", with_grad)
assert with_grad == ["fc.weight", "fc.bias"]

param_choices = {"model.fc.parameters()": model.fc.parameters, "model.parameters()": model.parameters}
for params_given, get_params in param_choices.items():
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(get_params(), lr=1e-2, momentum=0.9)
    optimizer.step()
    changed = sorted({n.split(".")[0] for n, p in model.named_parameters() if not torch.equal(p, before[n])})
    print(f"SGD({params_given:22}) step changed: {changed}")
    assert changed == ["fc"]

# %% [markdown]
# **Frozen is not the same as unchanged.** The check above compares *parameters*. A ResNet also has
# BatchNorm layers, whose running mean and variance are *buffers*, not parameters: in train mode (the default)
# every forward pass updates them, frozen or not. A "frozen" backbone fine-tuned in train mode drifts away from
# its pretrained statistics. The fix is to put the frozen part in eval mode: `model.eval()` for a frozen
# backbone, or, when the head has layers that need train mode, `model.train()` followed by `backbone.eval()`
# each epoch (`model.train()` switches every sub-module back).

# %%
bn = model.bn1  # the first BatchNorm of the frozen backbone
for mode in ("train", "eval"):
    getattr(model, mode)()
    before = bn.running_mean.clone()
    with torch.no_grad():
        model(images)
    moved = (bn.running_mean - before).abs().max().item()
    print(f"model.{mode}(): running_mean of bn1 changed by a frozen forward pass: {moved > 0}")
    assert (moved > 0) == (mode == "train")
assert not bn.weight.requires_grad  # its parameters are frozen all along

# %% [markdown]
# ## 11. From NumPy to `nn` and `optim`: one network, five times
#
# The notes open their autograd chapter with PyTorch's classic "Learning PyTorch with Examples": a two-layer
# network $\hat y = \mathrm{ReLU}(x W_1) W_2$ fitted to random data with the squared error, written five times.
# Each version replaces one piece of hand-written code by PyTorch, and nothing else changes: same data, same
# initial weights, same learning rate (学习率), so the five loss curves must be the same curve.
#
# 1. **NumPy**: forward pass, the gradients written out with the chain rule (backpropagation by hand), update.
# 2. **Tensors**: the same code with `torch` instead of `np` (this is what runs on a GPU).
# 3. **Autograd**: `loss.backward()` replaces the five lines of hand-written gradients.
# 4. **`nn`**: `nn.Sequential(nn.Linear, nn.ReLU, nn.Linear)` and `nn.MSELoss(reduction="sum")` replace the
#    weights and the formulas (`nn.Linear` stores $W^\top$, shape (out, in); bias off to match).
# 5. **`optim`**: `optimizer.step()` and `zero_grad()` replace the update loop. The notes use Adam here; plain
#    SGD keeps the curve identical to the others, and Adam would be a one-line change.
#
# Float64 everywhere, so that the only differences are the summation orders of NumPy's and PyTorch's matrix
# products.

# %%
N, D_in, H, D_out, STEPS, LR = 64, 100, 32, 10, 50, 1e-3
rng = np.random.default_rng(0)
x_np, y_np = rng.standard_normal((N, D_in)), rng.standard_normal((N, D_out))
w1_init, w2_init = rng.standard_normal((D_in, H)) / 10, rng.standard_normal((H, D_out)) / 10
curves = {}

# 1. NumPy, gradients by hand
w1, w2 = w1_init.copy(), w2_init.copy()
curves["1 NumPy"] = []
for _ in range(STEPS):
    h = x_np @ w1
    h_relu = np.maximum(h, 0)
    y_pred = h_relu @ w2
    curves["1 NumPy"].append(float(np.square(y_pred - y_np).sum()))
    grad_y_pred = 2.0 * (y_pred - y_np)
    grad_w2 = h_relu.T @ grad_y_pred
    grad_h = grad_y_pred @ w2.T
    grad_h[h < 0] = 0  # ReLU passes the gradient only where its input was positive
    grad_w1 = x_np.T @ grad_h
    w1 -= LR * grad_w1
    w2 -= LR * grad_w2

# 2. Tensors, gradients by hand
xt, yt = torch.from_numpy(x_np), torch.from_numpy(y_np)
w1, w2 = torch.tensor(w1_init), torch.tensor(w2_init)
curves["2 tensors"] = []
for _ in range(STEPS):
    h = xt @ w1
    h_relu = h.clamp(min=0)
    y_pred = h_relu @ w2
    curves["2 tensors"].append((y_pred - yt).pow(2).sum().item())
    grad_y_pred = 2.0 * (y_pred - yt)
    grad_w2 = h_relu.T @ grad_y_pred
    grad_h = grad_y_pred @ w2.T
    grad_h[h < 0] = 0
    w1 -= LR * (xt.T @ grad_h)
    w2 -= LR * grad_w2

# 3. Autograd
w1 = torch.tensor(w1_init, requires_grad=True)
w2 = torch.tensor(w2_init, requires_grad=True)
curves["3 autograd"] = []
for _ in range(STEPS):
    loss = ((xt @ w1).clamp(min=0) @ w2 - yt).pow(2).sum()
    curves["3 autograd"].append(loss.item())
    loss.backward()
    with torch.no_grad():  # the update must not be recorded
        w1 -= LR * w1.grad
        w2 -= LR * w2.grad
        w1.grad = w2.grad = None


# 4. nn, update by hand; 5. nn and optim
def two_layer_net():
    net = nn.Sequential(nn.Linear(D_in, H, bias=False), nn.ReLU(), nn.Linear(H, D_out, bias=False)).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.from_numpy(w1_init.T))
        net[2].weight.copy_(torch.from_numpy(w2_init.T))
    return net


loss_fn = nn.MSELoss(reduction="sum")
net = two_layer_net()
curves["4 nn"] = []
for _ in range(STEPS):
    loss = loss_fn(net(xt), yt)
    curves["4 nn"].append(loss.item())
    net.zero_grad()
    loss.backward()
    with torch.no_grad():
        for param in net.parameters():
            param -= LR * param.grad

net = two_layer_net()
optimizer = torch.optim.SGD(net.parameters(), lr=LR)
curves["5 optim"] = []
for _ in range(STEPS):
    loss = loss_fn(net(xt), yt)
    curves["5 optim"].append(loss.item())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

for name, curve in curves.items():
    print(f"{name:10} loss at step 0: {curve[0]:8.2f}   at step {STEPS - 1}: {curve[-1]:8.2f}")
reference = np.array(curves["1 NumPy"])
for curve in curves.values():
    np.testing.assert_allclose(curve, reference, rtol=1e-9)  # the same curve, five times
assert reference[-1] < reference[0] / 2
for name, curve in curves.items():
    plt.plot(curve, label=name, lw=4 if name.startswith("1") else 1.5)
plt.yscale("log")
plt.xlabel("step")
plt.ylabel("squared error")
plt.title("Five implementations, one loss curve")
plt.legend()
plt.show()

# %% [markdown]
# ## Exercises (练习)
#
# Three exercises, easiest first: predict a gradient, write a custom `Function`, then a stretch that combines this
# notebook with notebook 01's broadcasting. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it
# and run it. The **check cell** below it then says *correct*, or *not yet* with a hint and the section to
# re-read, or *not attempted yet* while the stub is untouched. This section does not depend on the lesson's cells:
# after a kernel restart, run its first cell and go on. `make progress` lists which exercises of every notebook
# pass.

# %%
import torch
import torch.nn.functional as F

from utils.exercises import Checker

ex = Checker("02")

# %% [markdown]
# ### Exercise 1 · Predict a vector-Jacobian product, then an accumulation
#
# The notes' reading list for `backward()` asks why `backward` has a `grad_variables` argument (today's
# `gradient`). Section 2 answered: for a non-scalar `y`, `backward(gradient=g)` computes the vector-Jacobian
# product $g^\top J$. Predict, on paper, what this code prints:
#
# ```python
# x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
# y = x * x.sum()                                      # every y_i depends on every x_j
# y.backward(gradient=torch.tensor([1.0, 0.0, -2.0]))
# print(x.grad.tolist())                               # first
# (x ** 2).sum().backward()                            # a second backward pass, no zeroing
# print(x.grad.tolist())                               # second
# ```
#
# Write $J_{ij} = \partial y_i / \partial x_j$ first (it has two terms), then `x.grad[j]` $= \sum_i g_i J_{ij}$.
# Section 4 tells what the second backward does to `x.grad`.

# %%
# ✏️ Exercise 1: replace ... with [first, second], two lists of three numbers, e.g. [[1, 2, 3], [4, 5, 6]]
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · A numerically stable Softplus `Function`
#
# $\mathrm{softplus}(x) = \log(1 + e^x)$ is a smooth ReLU, and its derivative is $\sigma(x)$, the sigmoid.
# Written as it reads, it breaks in float32: $e^{x}$ overflows to `inf` above $x \approx 88.7$, so
# `torch.log(1 + torch.exp(x))` returns `inf` for $x = 100$ instead of 100. The identity
# $\log(1 + e^x) = \max(x, 0) + \log(1 + e^{-|x|})$ (`torch.log1p` for the last term) never exponentiates a
# positive number.
#
# Write `Softplus`, a `torch.autograd.Function` (section 6): `forward` computes the stable formula and saves what
# `backward` needs; `backward` returns the gradient of the input by the chain rule. Write `backward` with PyTorch
# operations, so that it can itself be differentiated: the check runs `gradcheck` *and* `gradgradcheck` (section
# 7) in float64, and compares with `F.softplus` in float32 from $x = -100$ to $100$.


# %%
# ✏️ Exercise 2: write forward and backward
class Softplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("your code here")

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError("your code here")


# %%
ex.check(2, Softplus)

# %% [markdown]
# ### Exercise 3 · The backward of a linear layer, for any batch shape (stretch)
#
# `F.linear(x, weight, bias)` computes `x @ weight.T + bias` for `x` of shape `(..., in)`: any number of leading
# dimensions (a batch, a batch of sequences, ...), `weight` of shape `(out, in)`, `bias` of shape `(out,)`.
# The matrix product applies the same `weight` at every leading position, and `bias` is broadcast to all of them
# (notebook 01, section 7).
#
# Write `linear_backward(x, weight, bias, grad_out)`: given `grad_out` $= \partial L/\partial\,$output (shape
# `(..., out)`), return `(grad_x, grad_weight, grad_bias)`, each shaped like its tensor: what autograd computes.
# Section 6's `LinearFunction` does it for a 2-D `x`; the new part is the rule behind broadcasting's backward: a
# tensor used at many positions receives the **sum** of the gradients from all of them. Write it with tensor
# operations; the check calls your function under `torch.no_grad()`, on 2-D, 3-D and 4-D inputs.


# %%
# ✏️ Exercise 3: write the body of the function
def linear_backward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, grad_out: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError("your code here")


# %%
ex.check(3, linear_backward)

# %% [markdown]
# ## Summary
#
# * `y.backward()` on a scalar fills `.grad` of the leaves (叶子节点). On a non-scalar it needs
#   `gradient=g` and computes the vector-Jacobian product $g^\top J$, equal to
#   `(y * g).sum().backward()`; `torch.func.jacrev` shows the Jacobian that is never built.
# * `torch.autograd.grad` returns gradients instead of accumulating them; with `create_graph=True`
#   they can be differentiated again (second derivatives, gradient penalties). Several outputs are
#   summed.
# * Within one backward pass the engine sums the gradients reaching a tensor along several paths (the
#   chain rule's sum) in its input buffer, then runs `AccumulateGrad` once. The graph's saved values are
#   freed after a backward pass (`retain_graph=True` keeps them), and `.grad` accumulates *across* passes:
#   zero it each step (`zero_grad()` sets `None`), or use
#   accumulation on purpose for micro-batches.
# * `Variable` is gone (every tensor has `requires_grad`); prefer `.detach()` to `.data`.
# * A custom `Function` has `forward`/`backward` static methods, saves tensors with
#   `save_for_backward` and other values on `ctx`, returns one gradient per input (`None` for
#   non-tensors), and can skip work with `ctx.needs_input_grad`. The `setup_context` style is needed
#   for `torch.func` transforms, plus `generate_vmap_rule = True` for `vmap`. Always verify with
#   `gradcheck` (and `gradgradcheck`) in float64. `@once_differentiable` is for backwards written outside
#   autograd: `.backward()` through it raises, but `autograd.grad` can silently drop a second-order term.
# * One network written five times (NumPy, tensors, autograd, `nn`, `optim`) gives one loss curve: each
#   PyTorch layer replaces hand-written code, not the mathematics.
# * Freezing (`requires_grad=False`) removes parameters from the graph: no gradient, no update. BatchNorm's
#   running statistics are buffers and still change in train mode: put a frozen backbone in `eval()`.

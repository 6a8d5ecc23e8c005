# %% [markdown]
# # 10 · Modules and optimizers (模块与优化器)
#
# **What you learn.** The notes collect many "tricks" (技巧) and an "easy to get wrong" list (易错记录) around
# models and their training. This notebook takes the model and the optimizer apart, and checks every claim:
#
# 1. **`nn.Module` from the inside**: where parameters, buffers (缓冲区) and sub-modules live; why a Python list
#    of layers loses its parameters; initialisation by walking `modules()`; custom layers; Dropout's scaling;
#    a hand-written LayerNorm, biased and unbiased variance.
# 2. **Optimizers and schedules**: the optimizer's references to parameters, parameter groups (参数组), no
#    weight decay for biases and norms, `LBFGS` with a closure, learning-rate schedulers (学习率调度器: the
#    notes' `LambdaLR` examples, warm-up, cosine, one-cycle, plateau), **stochastic weight averaging** (随机权重平均)
#    and EMA, **gradient clipping** (梯度裁剪), and the one case where gradient accumulation is not the big batch.
#
# **You should know:** tensors, autograd and a training loop (notebooks 01–04). Several basics this notebook
# builds on are taught earlier and only linked here: `clone`/`detach` ([notebook 01](01_tensors.ipynb), §9),
# freezing parameters ([notebook 02](02_autograd.ipynb), §10), `no_grad` versus `eval()`
# ([notebook 03](03_dynamic_graphs_and_hooks.ipynb), §6, and [notebook 04](04_mnist_cnn.ipynb), §13), buffers in
# a `state_dict` ([notebook 06](06_save_load_checkpoints.ipynb), §1).
#
# **Study time:** about 70 min (20 of them for the exercises). Its cells run in seconds.
#
# **On a GPU:** the optimizer demonstration of section 2.1 moves its layer to `cuda`; everything else runs on
# the CPU by design (the lessons are about bookkeeping, not speed). The stored outputs were made on the CPU.
#
# The notes were written for PyTorch 1.x. Where they use APIs that are obsolete (`scheduler.get_lr()` called from
# outside warns, torchvision's `pretrained=True` is deprecated, `Variable` is a leftover alias of `Tensor`), the
# notebook says so and shows the current way.

# %% [markdown]
# ## Setup

# %%
import copy
import math
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from utils import fmt, get_device, seed_everything, show

seed_everything(0)
device = get_device()
print("torch", torch.__version__.split("+")[0], "| device:", device.type)

# %% [markdown]
# ## 1. `nn.Module` from the inside
#
# ### 1.1 Where a module keeps its state
#
# `nn.Module.__init__` creates a few dictionaries (plain `dict`s today; `OrderedDict`s in torch 1.6, whose source
# the notes walk through), and `nn.Module.__setattr__` sorts every attribute you assign into one of them by type:
#
# | you write in `__init__` | it lands in | returned by | in `state_dict()` | converted by `.to()` |
# |---|---|---|---|---|
# | `self.fc = nn.Linear(...)` (a sub-module, 子模块) | `_modules` | `children()`, `modules()` | its own entries | yes |
# | `self.w = nn.Parameter(...)` | `_parameters` | `parameters()` | yes | yes |
# | `self.register_buffer("b", t)` | `_buffers` | `buffers()` | yes | yes |
# | `self.register_buffer("b", t, persistent=False)` | `_buffers` | `buffers()` | **no** | yes |
# | `self.t = torch.zeros(2)` (plain tensor) | the instance `__dict__` | nothing | no | **no** |
#
# A **buffer (缓冲区)** is state that is not learned by gradient descent but belongs to the model, such as
# BatchNorm's running mean. The `training` flag is plain state too: `train()` and `eval()` set it on every sub-module.


# %%
class Scaler(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)  # sub-module
        self.scale = nn.Parameter(torch.ones(2))  # learnable parameter
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))  # saved, not learned
        self.register_buffer("cache", torch.zeros(2), persistent=False)  # not saved either
        self.note = torch.zeros(2)  # a plain attribute: the module does not know it

    def forward(self, x):
        self.calls += 1
        return self.linear(x) * self.scale


m = Scaler()
print("_modules    :", list(m._modules))
print("_parameters :", list(m._parameters))
print("_buffers    :", list(m._buffers))
print("training    :", m.training)
print("named_parameters():", [name for name, _ in m.named_parameters()])
print("named_buffers()   :", [name for name, _ in m.named_buffers()])
print("state_dict()      :", list(m.state_dict()))
m(torch.ones(4, 3))
m(torch.ones(4, 3))
m.to(torch.float64)
print(
    "after two calls and .to(float64): calls =",
    m.calls.item(),
    "| dtypes:",
    m.scale.dtype,
    m.cache.dtype,
    m.calls.dtype,
    "| plain attribute:",
    m.note.dtype,
)
assert m.note.dtype == torch.float32 and m.cache.dtype == torch.float64 and m.calls.dtype == torch.long

# %% [markdown]
# `.to(dtype)` converts only floating-point parameters and buffers (the integer counter stays `int64`), and never
# plain attributes: a tensor stored as `self.note` would also stay on the CPU after `model.to("cuda")`. Use
# `register_buffer` for every tensor the model needs.
#
# ### 1.2 `ModuleList` and `Sequential` versus a Python list
#
# The notes (004) observe that layers kept in a plain Python `list` are "not really added to the network". The
# reason is the table above: `__setattr__` sees a `list`, not a `Module`, so the layers are not registered.
# The forward pass still works, which is what makes this bug silent: the optimizer, `state_dict()` and `.to()`
# never see those parameters. `nn.ModuleList` (a list that registers) and `nn.Sequential` (which also defines
# `forward` as "call each layer in order") fix it.


# %%
class Blocks(nn.Module):
    def __init__(self, container):
        super().__init__()
        self.blocks = container([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


for container in (list, nn.ModuleList):
    net = Blocks(container)
    n_params = sum(p.numel() for p in net.parameters())
    out = net(torch.ones(1, 4))
    print(
        f"{container.__name__:10} forward works: {tuple(out.shape)}  parameters: {n_params:2}  "
        f"state_dict keys: {len(net.state_dict())}"
    )
try:
    torch.optim.SGD(Blocks(list).parameters(), lr=0.1)
except ValueError as err:
    print(f"optimizer on the list version -> {type(err).__name__}: {err}")
seq = nn.Sequential(*[nn.Linear(4, 4) for _ in range(3)])
print("nn.Sequential keys:", list(seq.state_dict())[:2], "...", "| seq[1] is", seq[1])
assert sum(p.numel() for p in Blocks(list).parameters()) == 0
assert sum(p.numel() for p in Blocks(nn.ModuleList).parameters()) == 3 * (16 + 4)

# %% [markdown]
# ### 1.3 Counting and freezing parameters: see notebooks 02 and 06
#
# Counting parameters with `numel`, **freezing** (冻结) with `requires_grad_(False)` and counting only the trainable
# ones are taught in [notebook 02](02_autograd.ipynb), §10; BatchNorm's running statistics, buffers that a
# checkpoint must save although they are not parameters, in [notebook 06](06_save_load_checkpoints.ipynb), §1.
#
# ### 1.4 Initialisation by walking `modules()`
#
# `model.modules()` yields every module recursively (the model itself first), and `named_modules()` yields
# `(name, module)` pairs with dotted names. The notes' **initialisation** (初始化) loop uses **Kaiming (He) initialisation**
# for convolutions followed by ReLU: weights drawn from a normal distribution with standard deviation
# $\sqrt{2/\text{fan}}$, where `mode="fan_out"` uses fan = out_channels × kernel area. `model.apply(fn)` is the
# same walk written as a callback. We check the measured standard deviation against the formula.


# %%
def init_weights(model):
    for layer in model.modules():
        if isinstance(layer, nn.Conv2d):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.BatchNorm2d):
            nn.init.ones_(layer.weight)
            nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.zeros_(layer.bias)


seed_everything(0)
cnn = nn.Sequential(
    nn.Sequential(nn.Conv2d(16, 64, 3), nn.BatchNorm2d(64), nn.ReLU()),
    nn.Sequential(nn.Conv2d(64, 128, 3), nn.BatchNorm2d(128), nn.ReLU()),
    nn.Flatten(),
    nn.Linear(128 * 4 * 4, 10),  # for 8x8 inputs
)
init_weights(cnn)
for name, layer in cnn.named_modules():
    if isinstance(layer, nn.Conv2d):
        fan_out = layer.out_channels * layer.kernel_size[0] * layer.kernel_size[1]
        expected = math.sqrt(2 / fan_out)
        measured = layer.weight.std().item()
        print(f"{name:4} fan_out={fan_out:5}  std measured {measured:.3f}  expected {expected:.3f}")
        assert abs(measured / expected - 1) < 0.03
print("first names from named_modules():", [name for name, _ in cnn.named_modules()][:4])

# %% [markdown]
# The notes (004) also copy convolutions into another model with `conv_model.add_module(name, layer)` for each
# `(name, layer)` of `named_modules()`. That fails on any nested model: names such as `"0.0"` contain a dot, and
# `add_module` refuses dots (they would be ambiguous in `state_dict` keys). Replace the dots or keep the structure.

# %%
conv_model = nn.Sequential()
try:
    for name, layer in cnn.named_modules():
        if isinstance(layer, nn.Conv2d):
            conv_model.add_module(name, layer)
except KeyError as err:
    print(f"{type(err).__name__}: {err}")
for name, layer in cnn.named_modules():
    if isinstance(layer, nn.Conv2d):
        conv_model.add_module(name.replace(".", "_"), layer)
print(conv_model)
assert len(conv_model) == 2

# %% [markdown]
# ### 1.5 Custom layers, with and without parameters
#
# A layer without parameters only needs `forward`: the notes' `Norm` standardises its input. Note that `x.std()` is
# the **unbiased estimate** (无偏估计, divide by n − 1): for 0, 1, …, 10 the variance is 110 / 10 = 11, so the last
# value is 5/√11 = 1.5076, exactly the output printed in the notes.


# %%
class Norm(nn.Module):  # the notes' layer without parameters
    def forward(self, x):
        return (x - x.mean()) / x.std()


y = Norm()(torch.arange(11.0))
show(y, "Norm()(torch.arange(11.))")
assert list(Norm().parameters()) == []
assert math.isclose(y[-1].item(), 5 / math.sqrt(11), rel_tol=1e-6)

# %% [markdown]
# A layer with parameters declares them as `nn.Parameter` (or as sub-modules) in `__init__`. The notes'
# `TwoLayerNet` (from the official "Learning PyTorch with Examples") stores raw weight matrices; it ignores its
# `D_in, H, D_out` arguments and hard-codes 1000, 100, 10, a small bug fixed here. It is trained as in the notes:
# sum-of-squares loss, plain SGD with learning rate 1e-4, 500 steps.
#
# Its commented-out alternative uses `nn.Linear`. Mind the layout: `nn.Linear` stores `weight` as
# **(out_features, in_features)** and computes `x @ weight.T + bias`, while `TwoLayerNet` stores (in, out) and
# computes `x @ weight1`. Copying the transposed weights gives the same function.


# %%
class TwoLayerNet(nn.Module):
    def __init__(self, d_in, h, d_out):
        super().__init__()
        self.weight1 = nn.Parameter(torch.randn(d_in, h) / 25)
        self.bias1 = nn.Parameter(torch.randn(1, h) / 25)
        self.weight2 = nn.Parameter(torch.randn(h, d_out) / 25)
        self.bias2 = nn.Parameter(torch.randn(1, d_out) / 25)

    def forward(self, x):
        h_relu = (x @ self.weight1 + self.bias1).clamp(min=0)
        return h_relu @ self.weight2 + self.bias2


seed_everything(0)
N, D_in, H, D_out = 64, 1000, 100, 10
x, y = torch.randn(N, D_in), torch.randn(N, D_out)
model = TwoLayerNet(D_in, H, D_out)
for name, param in model.named_parameters():
    print(f"{name:8} {tuple(param.shape)}")
criterion = nn.MSELoss(reduction="sum")
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
losses = []
for _t in range(500):
    loss = criterion(model(x), y)
    losses.append(loss.item())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"first loss {losses[0]:.0f}; after 500 steps below a millionth of it: {losses[-1] < 1e-6 * losses[0]}")
assert losses[-1] < 1e-6 * losses[0]

as_layers = nn.Sequential(nn.Linear(D_in, H), nn.ReLU(), nn.Linear(H, D_out))
with torch.no_grad():
    as_layers[0].weight.copy_(model.weight1.T)
    as_layers[0].bias.copy_(model.bias1.squeeze(0))
    as_layers[2].weight.copy_(model.weight2.T)
    as_layers[2].bias.copy_(model.bias2.squeeze(0))
torch.testing.assert_close(as_layers(x), model(x))
print("nn.Linear weight shape:", tuple(as_layers[0].weight.shape), "-> same outputs as TwoLayerNet")

# %% [markdown]
# ### 1.6 `train()` and `eval()`: Dropout
#
# A module starts in training mode, but the notes advise switching explicitly with `model.train()` and
# `model.eval()`. **Dropout** (丢弃法) behaves differently in the two modes. In training it zeroes each element with
# probability `p` and multiplies the survivors by 1/(1 − p), so the expected value of every element is unchanged
# ("inverted dropout"); in evaluation it returns the input unchanged. With p = 0.3 the survivors of
# `[1, 2, 3, 4, 5]` become `x / 0.7`, e.g. 2.8571 for 2, the numbers in the notes (which elements are dropped is
# random).

# %%
drop = nn.Sequential(nn.Dropout(0.3))
x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
drop.train()
seed_everything(0)
out = drop(x)
show(out, "train mode")
kept = out != 0
torch.testing.assert_close(out[kept], x[kept] / 0.7)
drop.eval()
show(drop(x), "eval mode")
assert torch.equal(drop(x), x)
drop.train()
many = drop(torch.ones(200_000))
print(f"training mode over 200,000 ones: dropped {(many == 0).float().mean():.2f}, mean {many.mean():.2f}")
assert abs((many == 0).float().mean() - 0.3) < 0.01 and abs(many.mean() - 1) < 0.01
drop.eval()
assert all(not layer.training for layer in drop.modules())  # eval() reaches every sub-module

# %% [markdown]
# ### 1.7 `no_grad` is not `eval`: see notebooks 03 and 04
#
# The notes' memory tips warn that `model.eval()` is not `torch.no_grad()`: `eval()` changes what **layers** do
# (Dropout, BatchNorm), `no_grad` changes what **autograd** records, and validation needs both. That is taught
# in [notebook 03](03_dynamic_graphs_and_hooks.ipynb), §6 (`no_grad`, `inference_mode`) and
# [notebook 04](04_mnist_cnn.ipynb), §13 (the training loop with `train()`/`eval()`).
#
# ### 1.8 LayerNorm by hand, and biased versus unbiased variance
#
# `torch.var` and `torch.std` compute the unbiased estimate by default (divide by n − 1), as the notes stress.
# LayerNorm normalises with the variance's **biased estimate** (有偏估计, divide by n). The notes' hand-written LayerNorm
# therefore rescales the unbiased variance by (C − 1)/C. Today the clearer spelling is `var(correction=0)`
# (`correction` generalises the older `unbiased=` flag, which still works). NumPy's `np.var` is biased by
# default: another trap when porting code.

# %%
v = torch.arange(11.0)
print(
    f"torch var {v.var():.1f} (unbiased) | var(correction=0) {v.var(correction=0):.1f} | numpy var "
    f"{np.var(v.numpy()):.1f} | std {v.std():.4f}"
)
assert math.isclose(v.var(), 11, rel_tol=1e-6) and math.isclose(v.var(correction=0), 10, rel_tol=1e-6)
assert math.isclose(np.var(v.numpy()), 10, rel_tol=1e-6)

seed_everything(0)
B, C = 3, 4
x, weight, bias = torch.rand(B, C), torch.rand(C), torch.rand(C)
reference = F.layer_norm(x, (C,), weight, bias, eps=1e-5)
mean = x.mean(dim=1, keepdim=True)
notes_way = (x - mean) / torch.sqrt(x.var(dim=1, keepdim=True) * (C - 1) / C + 1e-5) * weight + bias
modern_way = (x - mean) / torch.sqrt(x.var(dim=1, keepdim=True, correction=0) + 1e-5) * weight + bias
unbiased_way = (x - mean) / torch.sqrt(x.var(dim=1, keepdim=True) + 1e-5) * weight + bias
torch.testing.assert_close(notes_way, reference)
torch.testing.assert_close(modern_way, reference)
print(f"with the unbiased variance the result is off by up to {(unbiased_way - reference).abs().max():.3f}")
assert (unbiased_way - reference).abs().max() > 0.05

# the notes' general case: normalise over the last two dimensions (C1, C2)
x4 = torch.rand(1, 2, 4, 3)
ln = nn.LayerNorm([4, 3])
dims = (-2, -1)
by_hand = (x4 - x4.mean(dims, keepdim=True)) / torch.sqrt(x4.var(dims, keepdim=True, correction=0) + ln.eps)
torch.testing.assert_close(ln(x4), by_hand * ln.weight + ln.bias)
print("nn.LayerNorm([4, 3]) equals the hand-written version over the last two dimensions")

# %% [markdown]
# ### 1.9 `clone` versus `detach`: see notebook 01
#
# From the notes' "easy to get wrong" list: `detach()` shares memory and leaves the graph, `clone()` copies and
# stays in it, `detach().clone()` gives an independent copy with no history. See
# [notebook 01](01_tensors.ipynb), §9.

# %% [markdown]
# ## 2. Optimizers and schedules
#
# ### 2.1 The device before the optimizer
#
# The order of a training step, which the notes quote (`optimizer.zero_grad()` → forward → `loss.backward()` →
# `optimizer.step()`), is written out in [notebook 04](04_mnist_cnn.ipynb), §13; `scheduler.step()` comes after
# the optimizer's step (section 2.5). The optimizer stores **references to the parameter tensors** it was given
# (the notes' translation still says they "should be `Variable`s": `Variable` was merged into `Tensor` in
# PyTorch 0.4, and `torch.autograd.Variable(t)` now simply returns a tensor).
#
# The notes add: move the model to the GPU *before* building the optimizer. Today `module.to()` converts parameters
# in place (same Python objects), so most code survives the wrong order; but conversions that create new parameter
# objects leave the optimizer updating orphans. The switch `torch.__future__.set_overwrite_module_params_on_conversion`
# makes `.to()` behave that way, and shows the failure: the model's gradients land on the new tensors, while the
# optimizer steps the old ones, which have no gradient. Building the optimizer last is always safe.

# %%
layer = nn.Linear(2, 1)
ids_before = [id(p) for p in layer.parameters()]
layer.to(torch.float64)
print("default .to(): same parameter objects:", [id(p) for p in layer.parameters()] == ids_before)

optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)  # built too early
torch.__future__.set_overwrite_module_params_on_conversion(True)
try:
    layer.to(device=device, dtype=torch.float32)  # creates new Parameter objects
finally:
    torch.__future__.set_overwrite_module_params_on_conversion(False)
before = layer.weight.detach().clone()
layer(torch.ones(1, 2, device=device)).sum().backward()
optimizer.step()
stale = optimizer.param_groups[0]["params"][0]
print(
    "optimizer holds the model's tensors:",
    stale is layer.weight,
    "| its tensor has a gradient:",
    stale.grad is not None,
    "| the model changed:",
    not torch.equal(before, layer.weight),
)
assert stale is not layer.weight and torch.equal(before, layer.weight)

# %% [markdown]
# ### 2.2 Parameter groups: a smaller learning rate for the backbone
#
# For **fine-tuning (微调)** the notes give the pretrained **backbone** (the convolutional layers) a small learning
# rate and the new classifier **head** a larger one. Each **parameter group (参数组)** is a dict with a `params`
# entry and any option it overrides; options not given fall back to the keyword defaults. We use torchvision's
# ResNet-18 as in the notes, but with `weights=None`: the notes' `pretrained=True` was replaced by
# `weights=ResNet18_Weights.DEFAULT` (torchvision 0.13), which would download the weights. The notes select the
# backbone by excluding the head's `id`s; a parameter listed in two groups is an error.

# %%
from torchvision.models import resnet18

seed_everything(0)
resnet = resnet18(weights=None, num_classes=10)
head_ids = {id(p) for p in resnet.fc.parameters()}
backbone = [p for p in resnet.parameters() if id(p) not in head_ids]
optimizer = torch.optim.SGD(
    [{"params": backbone, "lr": 1e-3}, {"params": resnet.fc.parameters()}],
    lr=1e-2,
    momentum=0.9,
    weight_decay=1e-4,
)
for name, group in zip(("backbone", "head"), optimizer.param_groups):
    n = sum(p.numel() for p in group["params"])
    print(
        f"{name:8} tensors={len(group['params']):2} numbers={n:>10,} lr={group['lr']} "
        f"momentum={group['momentum']} weight_decay={group['weight_decay']}"
    )
assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(resnet.parameters()))
try:
    torch.optim.SGD([{"params": resnet.parameters()}, {"params": resnet.fc.parameters()}], lr=0.1)
    refused = None
except ValueError as err:
    refused = err
    print(f"{type(err).__name__}: {err}")
assert refused is not None and "more than one parameter group" in str(refused)

# %% [markdown]
# ### 2.3 No weight decay for biases and normalisation weights
#
# A **weight decay (权重衰减)** term pulls weights toward zero. Many training recipes exempt biases and the scale and
# shift of normalisation layers: they are few numbers that cannot overfit by growing large, so decaying them only
# drags each channel's output scale and offset toward zero, a constraint on what the network can represent rather
# than a regulariser. This is common practice rather than a law: decaying them can hurt, the evidence that exempting them helps comes from
# particular models (ResNets, transformers), and some recipes decay everything with little difference. Detection
# code (the notes quote YOLOv5) builds three groups: BatchNorm weights (no decay), other weights (decay), biases
# (no decay). The notes test `isinstance(v, nn.BatchNorm2d)`, so a LayerNorm or GroupNorm weight would be decayed
# by mistake. A rule used by much code today covers those cases too: **decay tensors with two or more dimensions,
# not the 1-D ones** (biases, norm weights).


# %%
def notes_groups(model):
    g0, g1, g2 = [], [], []  # BN weights, other weights, biases
    for v in model.modules():
        if hasattr(v, "bias") and isinstance(v.bias, nn.Parameter):
            g2.append(v.bias)
        if isinstance(v, nn.BatchNorm2d):
            g0.append(v.weight)
        elif hasattr(v, "weight") and isinstance(v.weight, nn.Parameter):
            g1.append(v.weight)
    return g0, g1, g2


g0, g1, g2 = notes_groups(resnet)
print(
    f"ResNet-18: BN weights {len(g0)}, decayed weights {len(g1)}, biases {len(g2)}, "
    f"total {len(g0) + len(g1) + len(g2)} of {len(list(resnet.parameters()))} parameter tensors"
)
decay = [p for p in resnet.parameters() if p.ndim >= 2]
no_decay = [p for p in resnet.parameters() if p.ndim < 2]
assert {id(p) for p in decay} == {id(p) for p in g1}
assert {id(p) for p in no_decay} == {id(p) for p in g0 + g2}
optimizer = torch.optim.SGD(
    [{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
    lr=0.1,
    momentum=0.9,
    nesterov=True,
)

block = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
g0, g1, g2 = notes_groups(block)
print(
    "with a LayerNorm, the notes' rule decays",
    [tuple(p.shape) for p in g1],
    "- the ndim rule decays",
    [tuple(p.shape) for p in block.parameters() if p.ndim >= 2],
)
assert any(p is block[1].weight for p in g1)

# %% [markdown]
# ### 2.4 `optimizer.step(closure)`: LBFGS
#
# Most optimizers take one step from the gradient already computed. `torch.optim.LBFGS`, a quasi-Newton method,
# needs the loss and gradient at new points *during* its step: one `step()` runs up to `max_iter` inner iterations
# (20 by default), and the optional line search (`line_search_fn="strong_wolfe"`) evaluates trial points too. So
# `step` takes a **closure (闭包)** that clears the gradients, recomputes the loss, calls `backward()` and returns the
# loss. On a least-squares problem L-BFGS reaches the exact solution (`torch.linalg.lstsq`) in a few steps.

# %%
seed_everything(0)
X = torch.randn(100, 3)
y = X @ torch.tensor([2.0, -1.0, 0.5]) + 0.1 * torch.randn(100)
w = torch.zeros(3, requires_grad=True)
lbfgs = torch.optim.LBFGS([w], lr=1, max_iter=20, line_search_fn="strong_wolfe")
calls = 0


def closure():
    global calls
    calls += 1
    lbfgs.zero_grad()
    loss = ((X @ w - y) ** 2).mean()
    loss.backward()
    return loss


for _ in range(2):
    lbfgs.step(closure)
exact = torch.linalg.lstsq(X, y.unsqueeze(1)).solution.squeeze(1)
print("L-BFGS:", fmt(w, 3), "| lstsq:", fmt(exact, 3), "| closure called more than once per step:", calls > 2)
torch.testing.assert_close(w.detach(), exact, atol=1e-4, rtol=1e-4)
assert calls > 2

# %% [markdown]
# ### 2.5 Learning-rate schedulers: the notes' `LambdaLR` examples
#
# A **learning-rate scheduler** (学习率调度器; the notes say 学习率调整策略) changes `param_groups[i]["lr"]` each
# time `scheduler.step()` is called. `LambdaLR` sets `lr = base_lr * f(epoch)`, where `epoch` counts the
# scheduler's steps. The notes' first example uses f(e) = (e + 1)²: with base 0.1 the rates are 0.1, 0.4, 0.9, 1.6, and since the gradient of `sum(x)` is 1,
# `x` moves by exactly the current rate. The notes print the rate with `scheduler.get_lr()`; the public method
# is **`get_last_lr()`** (see below why).

# %%
from torch.optim.lr_scheduler import LambdaLR

x = torch.tensor([1.0, 2.0], requires_grad=True)
optimizer = torch.optim.SGD([x], lr=0.1)
scheduler = LambdaLR(optimizer, lambda epoch: (epoch + 1) ** 2)
print("lr before any step:", fmt(scheduler.get_last_lr(), 1))
for i in range(3):
    optimizer.zero_grad()
    torch.sum(x).backward()
    optimizer.step()
    scheduler.step()
    print(f"after step {i}: x = {fmt(x, 4)}, next lr = {fmt(scheduler.get_last_lr(), 1)}")
torch.testing.assert_close(x.detach(), torch.tensor([-0.4, 0.6]))

# %% [markdown]
# With one parameter group per tensor and one function per group, `get_last_lr()` returns one rate per group: the
# notes' second example prints `[1, 2]`, `[4, 4]`, `[9, 6]`.

# %%
x = torch.tensor([1.0, 2.0], requires_grad=True)
z = torch.tensor(3.0, requires_grad=True)
optimizer = torch.optim.SGD([{"params": [x], "lr": 1}, {"params": [z], "lr": 2}])
scheduler = LambdaLR(optimizer, [lambda e: (e + 1) ** 2, lambda e: e + 1])
history = [scheduler.get_last_lr()]
for _ in range(2):
    optimizer.zero_grad()
    (torch.sum(x) + z).backward()
    optimizer.step()
    scheduler.step()
    history.append(scheduler.get_last_lr())
print(history)
assert history == [[1, 2], [4, 4], [9, 6]]

# %% [markdown]
# Why not `get_lr()`? It is the internal formula a scheduler uses *inside* `step()`. For `LambdaLR` it happens to be
# a closed form, but for chainable schedulers such as `ExponentialLR` it multiplies the current rate by γ once
# more, so calling it from outside returns the *next* rate, with a warning. The other warning below comes from
# calling `scheduler.step()` before any `optimizer.step()`: since PyTorch 1.1 the order is optimizer first, or the
# first value of the schedule is skipped.

# %%
p = nn.Parameter(torch.zeros(1))
optimizer = torch.optim.SGD([p], lr=0.1)
scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    scheduler.step()  # wrong order: no optimizer.step() yet
    from_get_lr = scheduler.get_lr()
for w in caught:
    print(f"{w.category.__name__}: {str(w.message)[:75]}...")
print(f"lr in use: get_last_lr() = {scheduler.get_last_lr()[0]:.3f} | get_lr() = {from_get_lr[0]:.3f}")
assert math.isclose(scheduler.get_last_lr()[0], 0.09) and math.isclose(from_get_lr[0], 0.081)
assert [w.category for w in caught] == [UserWarning, UserWarning]
assert "before `optimizer.step()`" in str(caught[0].message) and "get_last_lr()" in str(caught[1].message)

# %% [markdown]
# ### 2.6 Chained schedulers, warm-up, cosine, one-cycle, plateau
#
# * **Chaining**: most schedulers multiply the current rate, so stepping two of them composes their effects. The
#   notes' example: `ExponentialLR(γ=0.9)` and `MultiStepLR(milestones=[30, 80], γ=0.1)` stepped together give
#   `0.1 · 0.9^e · 0.1^(milestones passed)`.
# * **Warm-up (预热)**: the notes' multi-GPU section scales the learning rate with the batch size and warns that a
#   large rate at the start can diverge, so it is raised gradually ("Training ImageNet in 1 Hour").
#   `SequentialLR` runs a `LinearLR` warm-up, then hands over to `CosineAnnealingLR`.
# * **One-cycle** (`OneCycleLR`) rises to `max_lr` then anneals far below the start; it is stepped every **batch**.
# * **Warm restarts** (`CosineAnnealingWarmRestarts`, "SGDR") anneal along a cosine for `T_0` steps, then jump
#   back to the base rate and start again.
# * **`ReduceLROnPlateau`** reads a validation metric: `scheduler.step(val_loss)` divides the rate by 10 when the
#   metric has not improved for `patience` epochs.

# %%
from torch.optim import lr_scheduler as sched


def lr_trace(make, steps=50, lr=0.1):
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)
    schedulers = make(opt)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        for s in schedulers:
            s.step()
    return rates


chained = lr_trace(lambda o: [sched.ExponentialLR(o, 0.9), sched.MultiStepLR(o, [30, 80], 0.1)], steps=100)
closed_form = [0.1 * 0.9**e * 0.1 ** sum(e >= m for m in (30, 80)) for e in range(100)]
np.testing.assert_allclose(chained, closed_form, rtol=1e-9)
print("chained Exponential x MultiStep matches 0.1 * 0.9**e * 0.1**(milestones passed) for 100 epochs")

traces = {
    "StepLR(20, 0.5)": lr_trace(lambda o: [sched.StepLR(o, 20, 0.5)]),
    "ExponentialLR(0.95)": lr_trace(lambda o: [sched.ExponentialLR(o, 0.95)]),
    "CosineAnnealingLR(50)": lr_trace(lambda o: [sched.CosineAnnealingLR(o, T_max=50, eta_min=0.001)]),
    "warm-up 5 + cosine": lr_trace(
        lambda o: [
            sched.SequentialLR(
                o,
                [sched.LinearLR(o, start_factor=0.1, total_iters=5), sched.CosineAnnealingLR(o, T_max=45)],
                milestones=[5],
            )
        ]
    ),
    "OneCycleLR(max 0.1)": lr_trace(lambda o: [sched.OneCycleLR(o, max_lr=0.1, total_steps=50, pct_start=0.3)]),
    "WarmRestarts(T_0=10)": lr_trace(lambda o: [sched.CosineAnnealingWarmRestarts(o, T_0=10)]),
}
for name, rates in traces.items():
    peak = int(np.argmax(rates))
    print(f"{name:22} first {rates[0]:.4f}  peak {rates[peak]:.4f} at step {peak:2}  last {rates[-1]:.4f}")
warm = traces["warm-up 5 + cosine"]
assert math.isclose(warm[0], 0.01) and math.isclose(warm[5], 0.1) and warm[-1] < 0.001
one = traces["OneCycleLR(max 0.1)"]
assert math.isclose(max(one), 0.1) and one[0] < 0.01 and one[-1] < 1e-5
fig, ax = plt.subplots(figsize=(8, 3.5))
for name, rates in traces.items():
    ax.plot(rates, label=name)
ax.set(xlabel="scheduler step", ylabel="learning rate", title="Learning-rate schedules (base lr 0.1)")
ax.legend(fontsize=8, ncol=2)
plt.show()

# %%
optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
plateau = sched.ReduceLROnPlateau(optimizer, mode="min", factor=0.1, patience=2)
val_losses = [1.0, 0.8, 0.7, 0.7, 0.71, 0.72, 0.69, 0.69, 0.7, 0.7]
rates = []
for val_loss in val_losses:
    optimizer.step()
    plateau.step(val_loss)
    rates.append(optimizer.param_groups[0]["lr"])
for loss, rate in zip(val_losses, rates):
    print(f"val loss {loss:.2f} -> lr {rate:.4f}")
assert rates[4] == 0.1 and math.isclose(rates[5], 0.01) and math.isclose(rates[-1], 0.001)

# %% [markdown]
# ### 2.7 Stochastic weight averaging (随机权重平均)
#
# The notes leave this heading empty. **SWA** averages the weights visited late in training, where SGD with a
# constant (or cyclic) learning rate bounces around a wide minimum; the average sits nearer its centre, which
# Izmailov et al. (2018) found to generalise better, after long training with a high constant or cyclic rate.
# `torch.optim.swa_utils` provides:
#
# * `AveragedModel(model)`: a copy whose parameters are the running mean of the snapshots passed to
#   `update_parameters(model)` (`n_averaged` counts them);
# * `SWALR`: anneals the learning rate to a constant `swa_lr` for the SWA phase;
# * `update_bn(loader, swa_model)`: the averaged weights never saw data, so their BatchNorm statistics are wrong;
#   this resets them and recomputes them with one pass over the training data (a plain average over batches).
#
# We check the average against snapshots kept by hand and the BatchNorm mean against the data.

# %%
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_multi_avg_fn, update_bn

seed_everything(0)
X = torch.randn(1024, 8)
y = (2 * X[:, :1] - X[:, 1:2]).tanh() + 0.1 * torch.randn(1024, 1)
train_loader = DataLoader(
    TensorDataset(X[:768], y[:768]), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
)
model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
swa_model = AveragedModel(model)
swa_scheduler = SWALR(optimizer, swa_lr=0.05, anneal_epochs=3)
swa_start, epochs, snapshots = 10, 20, []
for epoch in range(epochs):
    model.train()
    for xb, yb in train_loader:
        optimizer.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        optimizer.step()
    if epoch >= swa_start:
        swa_model.update_parameters(model)
        swa_scheduler.step()
        snapshots.append([p.detach().clone() for p in model.parameters()])
for averaged, *history in zip(swa_model.module.parameters(), *snapshots):
    torch.testing.assert_close(averaged, torch.stack(history).mean(0))
print(
    "n_averaged =", swa_model.n_averaged.item(), "| SWA parameters equal the mean of the", len(snapshots), "snapshots"
)

stale_mean = swa_model.module[1].running_mean.clone()
update_bn(train_loader, swa_model)
with torch.no_grad():
    bn_input_mean = swa_model.module[0](X[:768]).mean(0)
torch.testing.assert_close(swa_model.module[1].running_mean, bn_input_mean, atol=1e-5, rtol=1e-5)
print(
    "BN running mean was stale before update_bn:",
    not torch.allclose(stale_mean, bn_input_mean),
    "| after: it equals the mean of BN's inputs over the training data",
)

model.eval()
swa_model.eval()
with torch.no_grad():
    test_final = F.mse_loss(model(X[768:]), y[768:]).item()
    test_swa = F.mse_loss(swa_model(X[768:]), y[768:]).item()
print(f"test MSE: last weights {test_final:.3f} | SWA weights {test_swa:.3f}")
assert 0.95 * test_final < test_swa < 1.1 * test_final  # within -5 % / +10 % of the last weights: no clear gain

# %% [markdown]
# Here SWA is **not** better: the averaged weights score a slightly higher test error than the last ones (the
# assert allows SWA at most 5 % lower, to stay true under other rounding, and at most 10 % higher). This run
# is short (20 epochs, averaging the last 10 at a moderate rate) on an easy problem, so the last weights already
# sit near the minimum and averaging adds nothing. SWA pays off where its authors used it: long training with a
# high constant or cyclic learning rate, where the iterates keep moving around a wide minimum. Measure it on your
# own validation set before keeping it.
#
# An **exponential moving average (EMA, 指数移动平均)** of the weights is the same tool with another averaging rule:
# `AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))` keeps `ema = decay · ema + (1 − decay) · w`
# (the first update copies the weights). Pass `use_buffers=True` to average BatchNorm's buffers too instead of
# calling `update_bn`.

# %%
layer = nn.Linear(2, 1)
ema = AveragedModel(layer, multi_avg_fn=get_ema_multi_avg_fn(0.9))
w0 = layer.weight.detach().clone()
ema.update_parameters(layer)  # first update: a copy
with torch.no_grad():
    layer.weight.add_(1.0)
ema.update_parameters(layer)
torch.testing.assert_close(ema.module.weight, 0.9 * w0 + 0.1 * (w0 + 1))
print("EMA weight moved by", fmt(ema.module.weight - w0, 4), "= 0.1 of the change")

# %% [markdown]
# ### 2.8 Gradient clipping (梯度裁剪)
#
# `clip_grad_norm_(parameters, max_norm)` treats all gradients as **one** concatenated vector: it computes their
# total norm and multiplies every gradient by `min(1, max_norm / (total_norm + 1e-6))`, so only a norm above
# `max_norm` shrinks them (the multiplication always happens: an `if` would force a GPU-to-CPU synchronisation).
# The direction is kept, and the function returns the norm *before* clipping (useful to log). The notes reproduce the
# 1.9 source; today's version is vectorised but computes the same thing. We check it against the norm computed by
# hand. `clip_grad_value_` instead clamps each element to [−v, v], which changes the direction.

# %%
seed_everything(0)
net = nn.Sequential(nn.Linear(10, 10), nn.Tanh(), nn.Linear(10, 1))
(100 * net(torch.randn(32, 10)).pow(2).mean()).backward()
grads = [p.grad.clone() for p in net.parameters()]
by_hand = torch.sqrt(sum((g**2).sum() for g in grads))
returned = nn.utils.clip_grad_norm_(net.parameters(), max_norm=1.0)
after = torch.sqrt(sum((p.grad**2).sum() for p in net.parameters()))
print(f"total norm by hand {by_hand:.2f} | returned {returned:.2f} | after clipping {after:.4f}")
torch.testing.assert_close(returned, by_hand)
assert abs(after - 1.0) < 1e-5
for g, p in zip(grads, net.parameters()):  # every gradient scaled by the same factor
    torch.testing.assert_close(p.grad, g / (by_hand + 1e-6))

for p, g in zip(net.parameters(), grads):
    p.grad = g.clone()
nn.utils.clip_grad_value_(net.parameters(), clip_value=0.5)
flat_before = torch.cat([g.flatten() for g in grads])
flat_after = torch.cat([p.grad.flatten() for p in net.parameters()])
cosine = F.cosine_similarity(flat_before, flat_after, dim=0)
print(f"clip_grad_value_: max |grad| {flat_after.abs().max():.2f}, direction changed (cosine {cosine:.3f})")
assert flat_after.abs().max() <= 0.5 and cosine < 0.999

# %% [markdown]
# The notes' mixed-precision section shows the consequence of "one vector" (clipping two tensors together gives
# each a smaller share than clipping them separately); [notebook 07](07_mixed_precision.ipynb), §3 computes it,
# and §4 clips under a `GradScaler` (unscale first).

# %% [markdown]
# ### 2.9 Gradient accumulation (梯度累加), and BatchNorm
#
# Accumulating gradients over micro-batches, each loss divided by their number — **gradient accumulation** (梯度累加) —
# gives the large-batch gradient:
# [notebook 02](02_autograd.ipynb), §4 shows why `.grad` accumulates, and [notebook 07](07_mixed_precision.ipynb),
# §4 writes the recipe. The notes add a caveat that is checked here: BatchNorm normalises each micro-batch with
# its own statistics, so with BatchNorm the two gradients differ.

# %%
seed_everything(0)
X, y = torch.randn(64, 10), torch.randn(64, 1)


def grad_gap(with_bn, micro_batches=4):
    seed_everything(1)
    big = nn.Sequential(nn.Linear(10, 16), *([nn.BatchNorm1d(16)] if with_bn else []), nn.ReLU(), nn.Linear(16, 1))
    small = copy.deepcopy(big)
    F.mse_loss(big(X), y).backward()
    for xb, yb in zip(X.chunk(micro_batches), y.chunk(micro_batches)):
        (F.mse_loss(small(xb), yb) / micro_batches).backward()
    return max((a.grad - b.grad).abs().max().item() for a, b in zip(big.parameters(), small.parameters()))


print(f"without BatchNorm: max gradient difference below 1e-6: {grad_gap(False) < 1e-6}")
print(f"with BatchNorm:    max gradient difference {grad_gap(True):.2f}")
assert grad_gap(False) < 1e-6 and grad_gap(True) > 1e-2

# %% [markdown]
# ## Exercises (练习)
#
# Three exercises, easiest first: predict, write a module, then a stretch that combines sections 2.3–2.6 with
# the training loop of notebook 04. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it and run
# it. The **check cell** below it then says *correct*, or *not yet* with a hint and the section to re-read, or
# *not attempted yet* while the stub is untouched. This section does not depend on the lesson's cells: after a
# kernel restart, run its first cell and go on. `make progress` lists which exercises of every notebook pass.

# %%
import math

import torch
import torch.nn.functional as F
from torch import nn

from utils.exercises import Checker

ex = Checker("10")

# %% [markdown]
# ### Exercise 1 · Count what a module registers
#
# The notes (004) observe that layers kept in a Python list are "not really added to the network"; sections 1.1
# and 1.2 say why. Apply that to this module (BatchNorm's buffers are listed in
# [notebook 06](06_save_load_checkpoints.ipynb), §1):
#
# ```python
# class Net(nn.Module):
#     def __init__(self):
#         super().__init__()
#         self.body = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
#         self.extra = [nn.Linear(4, 4)]
#         self.norm = nn.BatchNorm1d(4)
#         self.scale = nn.Parameter(torch.ones(4))
#         self.register_buffer("mask", torch.ones(4), persistent=False)
#         self.offset = torch.zeros(4)
# ```
#
# Predict, on paper first, for `net = Net()`: (1) `sum(p.numel() for p in net.parameters())`,
# (2) `len(list(net.buffers()))`, (3) `len(net.state_dict())`, and (4), from section 1.6, the value of every
# element that survives `nn.Dropout(p=0.2)` in training mode applied to `torch.ones(10)`.

# %%
# ✏️ Exercise 1: replace ... with [parameters, buffers, state_dict keys, survivor value], e.g. [10, 2, 5, 1.5]
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · LayerNorm as a module
#
# Section 1.8 computed the notes' hand-written LayerNorm as a formula. Make it a layer: `MyLayerNorm(n, eps=1e-5)`
# normalises each vector along the **last** dimension (size `n`) with the biased variance and `eps`, then
# multiplies by a learnable `weight` (initially ones) and adds a learnable `bias` (initially zeros), both of shape
# `(n,)`, exactly as `nn.LayerNorm(n, eps=eps)`. It must work for inputs of any number of dimensions, train (its
# parameters get gradients) and follow `.to(torch.float64)` (section 1.1).


# %%
# ✏️ Exercise 2: write __init__ and forward
class MyLayerNorm(nn.Module):
    def __init__(self, normalized_shape: int, eps: float = 1e-5):
        super().__init__()
        raise NotImplementedError("your code here")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("your code here")


# %%
ex.check(2, MyLayerNorm)

# %% [markdown]
# ### Exercise 3 · AdamW, decay groups and warm-up + cosine, in notebook 04's loop (stretch)
#
# The notes advise warming up a large learning rate ("Training ImageNet in 1 Hour") and quote YOLOv5's parameter
# groups. Write `fit(model, loader, epochs, lr, weight_decay, warmup_steps)`, which trains `model` on the
# `(x, y)` batches of `loader` with:
#
# * `torch.optim.AdamW` at learning rate `lr`, with weight decay `weight_decay` on every parameter tensor of two or
#   more dimensions and `0` on the 1-D ones (section 2.3);
# * a `LambdaLR` stepped after **every batch**, whose factor warms up linearly, then follows a half cosine down to
#   zero (sections 2.5–2.6): $f(s) = (s+1)/w$ for $s < w$, else $\tfrac12\bigl(1 + \cos(\pi (s - w) / (T - w))\bigr)$,
#   where $s$ counts the scheduler's steps so far, $w$ is `warmup_steps` and $T$ = `epochs * len(loader)`;
# * the training step of [notebook 04](04_mnist_cnn.ipynb), §13, with `F.mse_loss(model(x), y)` as the loss.
#
# Return `(optimizer, lrs)`, where `lrs[i]` is the learning rate of the i-th optimizer step, read from
# `optimizer.param_groups[0]["lr"]` just before that step.


# %%
# ✏️ Exercise 3: write the body of the function
def fit(model, loader, epochs, lr, weight_decay, warmup_steps):
    raise NotImplementedError("your code here")


# %%
ex.check(3, fit)

# %% [markdown]
# ## Summary
#
# * `nn.Module.__setattr__` files sub-modules, `nn.Parameter`s and registered buffers; anything else (a Python
#   list of layers, a plain tensor) is invisible to `parameters()`, `state_dict()` and `.to()`. Use
#   `ModuleList`/`Sequential` and `register_buffer`.
# * `modules()`/`named_modules()` drive initialisation (`add_module` refuses dotted names); custom layers declare
#   `nn.Parameter`s; `nn.Linear` stores its weight as (out, in). Dropout scales survivors by 1/(1 − p) in
#   training and does nothing in `eval()`.
# * `torch.var`/`std` are unbiased by default; LayerNorm uses the biased variance (`correction=0`).
# * Build the optimizer after moving the model: it holds references to parameter tensors. Parameter groups give
#   per-group learning rates and weight decay (a common recipe exempts 1-D tensors: biases and norm weights).
#   `LBFGS` needs `step(closure)`.
# * Read rates with `get_last_lr()`, step the optimizer before the scheduler; chain, warm up, anneal, or react to
#   a plateau. SWA (`AveragedModel`, `SWALR`, `update_bn`) averages late weights; it did not help this short run,
#   and is meant for long training at a high constant or cyclic rate. EMA is the same tool with another rule.
# * `clip_grad_norm_` scales all gradients together and returns the norm before clipping; `clip_grad_value_`
#   changes the direction. Accumulation equals the big batch unless BatchNorm is involved.

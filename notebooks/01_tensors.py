# %% [markdown]
# # 01 · Tensors (张量)
#
# A tensor is PyTorch's n-dimensional array: the numbers a model reads, computes with and learns. This notebook
# teaches how to create tensors and the everyday operations on them (reductions, joining, indexing), what their
# types and shapes are, how a shape is laid over memory (storage and strides, views and copies), how they share
# memory with NumPy and images, how shapes combine in arithmetic (broadcasting, matrix products), and how to move
# them to a GPU.
#
# **You should know:** Python and a little NumPy. **Study time:** about 45 min. **Run time:** 10 s on the 2-core
# course machine (one thread, measured by `make execute`).
# **On a GPU:** the last section moves tensors to `cuda`; everything else is the same.
#
# The course follows a teacher's study notes written for PyTorch 1.x. Where the notes use APIs that are gone
# or misleading today (legacy constructors such as `torch.IntTensor`, named tensors, `torch.set_default_tensor_type`)
# this notebook says so and shows the current way.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from utils import get_device, seed_everything, show

seed_everything(0)
print("torch", torch.__version__.split("+")[0])

# %% [markdown]
# ## 1. Data types (数据类型)
#
# Every tensor has one `dtype`. They map almost one-to-one onto NumPy's dtypes (there is no string tensor).
# Neural networks compute in `float32` by default; `int64` ("long") is the type of class labels and indices;
# `bool` is the type of masks. `float16` and `bfloat16` are the half-precision types of mixed-precision training
# (notebook 07).

# %%
pairs = [
    (torch.float64, np.float64), (torch.float32, np.float32), (torch.float16, np.float16),
    (torch.int64, np.int64), (torch.int32, np.int32), (torch.int16, np.int16),
    (torch.int8, np.int8), (torch.uint8, np.uint8), (torch.bool, np.bool_),
]
for t_dtype, np_dtype in pairs:
    converted = torch.from_numpy(np.zeros(1, dtype=np_dtype)).dtype
    assert converted == t_dtype
    print(f"{str(t_dtype):15} <-> numpy.{np.dtype(np_dtype).name:8} {t_dtype.itemsize} byte(s)")
print("aliases:", torch.float is torch.float32, torch.double is torch.float64, torch.long is torch.int64)

# %% [markdown]
# PyTorch **infers** the dtype from the Python value: an integer becomes `int64`, a float becomes `float32`
# (not `float64` as in NumPy!), a boolean becomes `bool`. Pass `dtype=` to choose.

# %%
for value in (1, 2.0, True):
    t = torch.tensor(value)
    print(f"torch.tensor({value!r:5}) -> {t}  {t.dtype}")
print("numpy infers", np.array(2.0).dtype, "but torch infers", torch.tensor(2.0).dtype)
print(torch.tensor(1, dtype=torch.int32), torch.tensor(2.0, dtype=torch.double))

# %% [markdown]
# **A trap in the notes.** The notes also build tensors with the legacy constructors `torch.IntTensor(1)` and
# `torch.Tensor(...)` and print `tensor([5], dtype=torch.int32)`. That `5` is garbage: with an integer argument the
# legacy constructor allocates *uninitialised memory* of that size; it does not store the number 1. Use
# `torch.tensor(data)` to store data, and `torch.empty/zeros/ones(size)` to allocate.

# %%
legacy = torch.IntTensor(1)  # a tensor of shape (1,) with whatever was in memory
modern = torch.tensor([1], dtype=torch.int32)
print("torch.IntTensor(1).shape =", tuple(legacy.shape), "  (its value is undefined)")
print("torch.tensor([1], dtype=torch.int32) =", modern)
assert legacy.shape == modern.shape == (1,) and modern.item() == 1

# %% [markdown]
# Converting between dtypes: `.float()`, `.long()`, ... or `.to(dtype)` (the general form, which also moves
# devices), `.type(dtype)`, and `.type_as(other)` (take the dtype of another tensor). Converting a float to an
# integer type **truncates toward zero**.

# %%
i = torch.tensor(1)
x = i.float()
print(x, x.dtype, "|", i.type(torch.float16).dtype, "|", i.to(torch.float64).dtype, "|", i.type_as(x).dtype)
print(torch.tensor([-1.7, 1.7]).long())

# %% [markdown]
# The notes set a global default with `torch.set_default_tensor_type(torch.FloatTensor)`. That function has been
# deprecated since PyTorch 2.1: use `torch.set_default_dtype(torch.float32)` (and `torch.set_default_device` for
# the device). The default is already `float32`.

# %%
print("default dtype:", torch.get_default_dtype())
assert torch.get_default_dtype() == torch.float32

# %% [markdown]
# ## 2. Dimensions and shapes (维度与尺寸)
#
# The number of dimensions is the number of nested brackets: a scalar is 0-D, a vector 1-D, a matrix 2-D, a colour
# image 3-D (channels, height, width), a batch of images or a video 4-D (frames, channels, height, width).
# `t.dim()` counts dimensions; `t.shape` (an attribute) and `t.size()` (a method) give the same `torch.Size`.

# %%
examples = {
    "scalar": torch.tensor(True),
    "vector": torch.tensor([1.0, 2.0, 3.0, 4.0]),
    "matrix": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
    "RGB image (C, H, W)": torch.zeros(3, 32, 32),
    "video (T, C, H, W)": torch.zeros(16, 3, 32, 32),
}
for name, t in examples.items():
    assert t.shape == t.size()
    print(f"{name:20} dim={t.dim()} shape={tuple(t.shape)} numel={t.numel()}")

# %% [markdown]
# ### Creating tensors
#
# Besides `torch.tensor(data)`, which copies Python or NumPy data, tensors are made by shape. Every creation
# function takes `dtype=` and `device=` (create the tensor where it will be used rather than moving it later), and
# each has a `*_like` twin that copies shape, dtype and device from another tensor. `empty` only allocates: its
# values are whatever was in memory, so fill it before reading it.

# %%
made = {
    "torch.zeros(2, 3)": torch.zeros(2, 3),
    "torch.ones(2, dtype=torch.int64)": torch.ones(2, dtype=torch.int64),
    "torch.full((2,), 7.0)": torch.full((2,), 7.0),
    "torch.arange(0, 10, 3)": torch.arange(0, 10, 3),  # end excluded, like range()
    "torch.linspace(0, 1, 5)": torch.linspace(0, 1, 5),  # 5 points, both ends included
    "torch.eye(2)": torch.eye(2),
}
for name, t in made.items():
    print(f"{name:33} {t.dtype}  {t.tolist()}")
g = torch.Generator().manual_seed(0)
u, n = torch.rand(1000, generator=g), torch.randn(1000, generator=g)  # uniform [0, 1) and standard normal
like = torch.zeros_like(n, dtype=torch.int32)
print(f"rand: min {u.min():.2f} max {u.max():.2f} | randn: mean {n.mean():.1f} std {n.std():.1f} | "
      f"zeros_like: shape {tuple(like.shape)}, {like.dtype}")
assert 0 <= u.min() and u.max() < 1 and abs(n.mean()) < 0.1 and abs(n.std() - 1) < 0.1
assert torch.empty(2, 3).shape == (2, 3)  # allocated, not initialised: never read before writing

# %% [markdown]
# ### Reductions, joining and reordering dimensions
#
# A **reduction (归约)** (`sum`, `mean`, `max`, `argmax`, ...) over `dim=d` removes dimension `d`; `keepdim=True`
# keeps it with size 1, so that the result still broadcasts against the input (section 5), e.g. to subtract
# each row's mean. `cat` joins tensors along an existing dimension, `stack` along a new one. `unsqueeze(d)` adds a
# dimension of size 1, `squeeze(d)` removes one, `permute` reorders all of them.

# %%
m = torch.arange(6.0).view(2, 3)
print("m =", m.tolist())
print("m.sum() =", m.sum().item(), "| m.sum(dim=0) =", m.sum(dim=0).tolist(), "| m.sum(dim=1) =", m.sum(dim=1).tolist())
print("m.mean(dim=1, keepdim=True) has shape", tuple(m.mean(dim=1, keepdim=True).shape),
      "| m - that =", (m - m.mean(dim=1, keepdim=True)).tolist())
values, indices = m.max(dim=1)
print("m.max(dim=1): values", values.tolist(), "indices", indices.tolist())
print("cat dim 0:", tuple(torch.cat([m, m]).shape), "| cat dim 1:", tuple(torch.cat([m, m], dim=1).shape),
      "| stack:", tuple(torch.stack([m, m]).shape))
print("unsqueeze(0):", tuple(m.unsqueeze(0).shape), "| unsqueeze(0).squeeze(0):", tuple(m.unsqueeze(0).squeeze(0).shape),
      "| permute of (2, 3, 4) by (2, 0, 1):", tuple(torch.zeros(2, 3, 4).permute(2, 0, 1).shape))
assert m.sum(dim=0).tolist() == [3.0, 5.0, 7.0] and m.sum(dim=1).tolist() == [3.0, 12.0]
assert torch.stack([m, m]).shape == (2, 2, 3) and torch.cat([m, m], dim=1).shape == (2, 6)

# %% [markdown]
# ### `view` and `reshape`, and contiguity (连续性)
#
# A tensor is a flat block of memory, its **storage (存储)**, plus a shape and **strides (步长)**: how many elements
# to skip in the storage to move one step along each dimension. Element `[i, j]` of a matrix lives at
# `i * stride[0] + j * stride[1]`. A **view (视图)** is a tensor that shares another's storage with its own shape
# and strides; `view` makes one without copying. `-1` lets PyTorch infer one dimension.

# %%
vector = torch.arange(12)
m34 = vector.view(3, 4)
m43 = vector.view(4, -1)
print(m34, m34.stride())
print(m43.shape, m43.stride())
assert m34.data_ptr() == vector.data_ptr()  # same memory, no copy
assert m34[2, 1] == vector[2 * m34.stride(0) + 1 * m34.stride(1)]

fig, ax = plt.subplots(figsize=(7, 2.2))
for k in range(12):  # the storage, one row of cells, coloured by the row of m34 each element belongs to
    ax.add_patch(plt.Rectangle((k, 1.4), 1, 0.8, color=f"C{k // 4}", alpha=0.35))
    ax.text(k + 0.5, 1.8, str(k), ha="center", va="center")
    i, j = divmod(k, 4)
    ax.add_patch(plt.Rectangle((j + 3.5, -i * 0.45), 1, 0.4, color=f"C{i}", alpha=0.35))
    ax.text(j + 4, -i * 0.45 + 0.2, str(vector[k].item()), ha="center", va="center", fontsize=8)
ax.text(-0.2, 1.8, "storage", ha="right", va="center")
ax.text(3.3, -0.25, "m34 = view(3, 4)\nstrides (4, 1)", ha="right", va="center", fontsize=8)
ax.set(xlim=(-2, 12.5), ylim=(-1.2, 2.4))
ax.axis("off")
ax.set_title("One storage, seen as a 3x4 matrix: one step down a row skips 4 elements, one step right skips 1")
plt.show()

# %% [markdown]
# A transpose `t()` swaps the sizes *and* the strides: nothing moves in memory, so the result is no longer
# **contiguous** (walking it row by row jumps around the storage). `view` does not require a contiguous tensor. It
# requires that the *requested shape* can be expressed with strides over the existing layout: `m62` (strides
# `(1, 6)`) can be viewed as `(2, 3, 2)`, by splitting its first dimension, but not as `(3, 4)`, whose rows would
# have to mix elements that are 1 and 6 apart. `reshape` works everywhere: it returns a view when one exists and
# copies when it must. `.contiguous().view(...)` gives the same *values*, but `contiguous()` copies a
# non-contiguous tensor even when a view would have done.

# %%
m26 = torch.arange(12).view(2, 6)
m62 = m26.t()
print("sizes", tuple(m26.shape), "->", tuple(m62.shape), "| strides", m26.stride(), "->", m62.stride(),
      "| contiguous:", m62.is_contiguous())
v232 = m62.view(2, 3, 2)  # works on the non-contiguous tensor
print("m62.view(2, 3, 2): strides", v232.stride(), "| shares m62's storage:", v232.data_ptr() == m62.data_ptr())
try:
    m62.view(3, 4)
except RuntimeError as err:
    print("m62.view(3, 4) failed:", type(err).__name__, "-", str(err).split(".")[0])
r = m62.reshape(3, 4)
print(r)
same_storage = {
    "m62.reshape(2, 3, 2)": m62.reshape(2, 3, 2).data_ptr() == m62.data_ptr(),
    "m62.contiguous().view(2, 3, 2)": m62.contiguous().view(2, 3, 2).data_ptr() == m62.data_ptr(),
    "m62.reshape(3, 4)": r.data_ptr() == m62.data_ptr(),
}
for expr, shared in same_storage.items():
    print(f"{expr:31} {'a view of m62' if shared else 'a copy'}")
assert not m62.is_contiguous() and v232.data_ptr() == m62.data_ptr()
assert torch.equal(r, m62.contiguous().view(3, 4))  # equal values ...
assert list(same_storage.values()) == [True, False, False]  # ... but view or copy differ

# %% [markdown]
# ## 3. Tensors and NumPy: shared memory (共享内存)
#
# `torch.from_numpy(a)` and `t.numpy()` do not copy: the tensor and the array are two views of the same memory, so
# changing one changes the other. `clone()` makes an independent copy and breaks the link. (`torch.tensor(a)`
# always copies.)

# %%
arr = np.zeros(3)
t = torch.from_numpy(arr)
np.add(arr, 1, out=arr)  # change the array ...
print("array:", arr, " tensor:", t)  # ... and the tensor changed too
assert t.dtype == torch.float64  # NumPy's default float is float64, and from_numpy keeps it

t = torch.zeros(3)
linked, copied = t.numpy(), t.clone().numpy()
t.add_(1)  # the trailing underscore: an in-place method
print("tensor:", t, " .numpy():", linked, " .clone().numpy():", copied)
assert linked[0] == 1.0 and copied[0] == 0.0

# %% [markdown]
# The notes offer `t.data.numpy()` as another way to get an array. It is not a copy either: `.data` is a tensor
# on the same storage (detached from autograd), so its array is linked like `t.numpy()`. Only `clone()` (or
# `np.array(t)`, or `copy()` on the array) breaks the link. In the other direction, NumPy can make arrays with
# **negative strides** (`a[::-1]` walks the memory backwards), which PyTorch tensors cannot have:
# `torch.from_numpy` refuses them, and the notes' fix is to copy first, `a[::-1].copy()`.

# %%
t = torch.zeros(3)
via_data = t.data.numpy()
t.add_(5)
print(".data.numpy() after t.add_(5):", via_data, "| shares memory:", np.shares_memory(via_data, t.numpy()))
assert via_data[0] == 5.0

a = np.arange(4)
print("a[::-1].strides:", a[::-1].strides, "(bytes; negative)")
try:
    torch.from_numpy(a[::-1])
except ValueError as err:
    print("from_numpy(a[::-1]):", type(err).__name__, "-", str(err).split(". ")[0])
fixed = torch.from_numpy(a[::-1].copy())
print("from_numpy(a[::-1].copy()):", fixed.tolist(), "| or torch.flip:", torch.flip(torch.from_numpy(a), [0]).tolist())
assert fixed.tolist() == [3, 2, 1, 0]

# %% [markdown]
# `item()` turns a one-element tensor into a Python number, `tolist()` a tensor into nested lists.

# %%
s = torch.tensor(1.0).item()
lst = torch.tensor([[1, 2], [3, 4]]).tolist()
print(s, type(s).__name__, "|", lst, type(lst).__name__)
try:
    torch.tensor([1.0, 2.0]).item()
except RuntimeError as err:
    print("item() on 2 elements:", err)

# %% [markdown]
# ### In-place operations (原地操作)
#
# Methods ending in `_` (`add_`, `mul_`, `clamp_`, `zero_`) write into the tensor itself instead of returning a new
# one; `out=` does the same for functions. They save memory, but autograd sometimes needs the old values; notebook 03
# shows the error you then get.

# %%
a = torch.tensor([1.0, 2.0, 3.0])
ptr = a.data_ptr()
a.mul_(10).clamp_(max=25)
b = torch.empty(3)
torch.add(a, 1, out=b)
print(a, b)
assert a.data_ptr() == ptr

# %% [markdown]
# ## 4. Images: tensor ↔ PIL ↔ NumPy
#
# Image libraries store pixels as `uint8` in (height, width, channels) order; PyTorch models expect floats in
# (channels, height, width) order. `torchvision.transforms.v2.functional` converts between them; the notes' manual
# recipe (`permute(2, 0, 1)` and `/ 255`) gives the same numbers. The notes' `transforms.functional.to_tensor`
# still works but belongs to the old transforms API: `to_image` + `to_dtype(..., scale=True)` is today's version.

# %%
from PIL import Image
from torchvision.transforms.v2 import functional as TF

rng = np.random.default_rng(0)
hwc = rng.integers(0, 256, size=(4, 6, 3), dtype=np.uint8)  # a tiny 4x6 RGB picture
pil = Image.fromarray(hwc)
chw = TF.to_dtype(TF.to_image(pil), torch.float32, scale=True)  # PIL -> float tensor in [0, 1], (C, H, W)
manual = torch.from_numpy(np.array(pil)).permute(2, 0, 1).float() / 255  # np.array copies: writable memory
back = TF.to_pil_image(chw)  # tensor -> PIL
print("PIL size (W, H):", pil.size, "mode", pil.mode, "| tensor", tuple(chw.shape), chw.dtype)
assert torch.allclose(chw, manual)
assert np.array_equal(np.asarray(back), hwc)  # the round trip is lossless
print("round trip tensor -> PIL -> numpy is exact:", np.array_equal(np.asarray(back), hwc))

# %% [markdown]
# ## 5. Broadcasting and matrix products (广播与矩阵乘法)
#
# Element-wise operations (`+`, `*`, `torch.mul`) **broadcast**: shapes are aligned from the right, and a dimension
# of size 1 (or a missing one) is stretched to match. Matrix products contract the last dimension of the first
# operand with the second-to-last of the second:
#
# | function | shapes | broadcasts? |
# |---|---|---|
# | `torch.mm(a, b)` | (m, n) @ (n, p) → (m, p) | no, 2-D only |
# | `torch.bmm(a, b)` | (b, m, n) @ (b, n, p) → (b, m, p) | no, 3-D only, same batch |
# | `torch.matmul(a, b)`, `a @ b` | (..., m, n) @ (..., n, p) → (..., m, p) | yes, over the leading dims |
# | `a * b`, `torch.mul` | element-wise | yes |

# %%
col, row = torch.arange(3).view(3, 1), torch.arange(4)
print("(3,1) + (4,) ->", tuple((col + row).shape))
print(col * 10 + row)
print("broadcast_shapes((2,1,3,4), (5,1,1)) =", tuple(torch.broadcast_shapes((2, 1, 3, 4), (5, 1, 1))))
stretched = torch.broadcast_tensors(col * 10, row)  # what broadcasting does, made visible (as views: stride 0)
print("strides of the stretched operands:", [t.stride() for t in stretched])
assert torch.equal(stretched[0] + stretched[1], col * 10 + row) and stretched[0].stride() == (1, 0)

fig, axes = plt.subplots(1, 3, figsize=(8, 2.2))
panels = (("col * 10: (3, 1) -> (3, 4)", stretched[0]), ("row: (4,) -> (3, 4)", stretched[1]),
          ("sum: (3, 4)", stretched[0] + stretched[1]))
for ax, (title, grid) in zip(axes, panels):
    grid = grid.contiguous()  # matplotlib wants real memory, not a stride-0 view
    ax.imshow(grid.numpy(), cmap="Blues", vmin=-5, vmax=30)
    for (i, j), value in np.ndenumerate(grid.numpy()):
        ax.text(j, i, str(value), ha="center", va="center", fontsize=9)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
fig.suptitle("Broadcasting repeats size-1 dimensions (stride 0, no copy) until the shapes match", fontsize=10)
plt.show()

a, b = torch.ones(2, 3), torch.ones(3, 4)
print("mm :", tuple(torch.mm(a, b).shape))
print("bmm:", tuple(torch.bmm(torch.ones(8, 2, 3), torch.ones(8, 3, 4)).shape))
a, b = torch.ones(2, 1, 3, 4), torch.ones(5, 4, 2)  # the notes' example
c = torch.matmul(a, b)
print("matmul (2,1,3,4) @ (5,4,2) ->", tuple(c.shape))
assert c.shape == (2, 5, 3, 2) and torch.all(c == 4)  # every entry sums 4 products of ones
try:
    torch.mm(torch.ones(2, 1, 3, 4), torch.ones(5, 4, 2))
except RuntimeError as err:
    print("mm refuses >2-D:", err)

# %% [markdown]
# `matmul` with batch dimensions is the same as looping over the batch with `mm`: the batch dims `(2, 1)` and `(5,)`
# broadcast to `(2, 5)`.

# %%
a, b = torch.randn(2, 1, 3, 4), torch.randn(5, 4, 2)
looped = torch.stack([torch.stack([a[i, 0] @ b[j] for j in range(5)]) for i in range(2)])
assert torch.allclose(a @ b, looped)
print("a @ b equals the loop of mm:", torch.allclose(a @ b, looped))

# %% [markdown]
# ## 6. Indexing, flipping and comparing
#
# Slicing works as in NumPy, except that **negative steps are not allowed** (`t[::-1]` raises). The notes reverse a
# dimension by indexing with a reversed `arange`; `torch.flip` says the same thing directly (both copy).

# %%
img = torch.arange(2 * 3 * 4).view(1, 2, 3, 4).float()  # N, C, H, W
try:
    img[..., ::-1]
except ValueError as err:
    print("t[..., ::-1]:", type(err).__name__, "-", err)
by_index = img[:, :, :, torch.arange(img.size(3) - 1, -1, -1)]
flipped = torch.flip(img, dims=[3])  # horizontal flip
assert torch.equal(by_index, flipped)
print(flipped[0, 0])

# %% [markdown]
# **Indexing (索引): views and copies.** *Basic* indexing — integers, slices `a:b:c`, `None` and `...` — only
# changes offset, shape and strides, so it returns a **view**: writing into it writes into the original.
# *Advanced* indexing — a list or tensor of indices, or a boolean **mask** — picks arbitrary elements, which no
# strides can describe, so it returns a **copy**. (Assigning *through* advanced indexing, `x[mask] = 0`, does write
# into `x`: that is `index_put_`, not a read.) The notes' `x[[0, 2], None]` mixes both: rows 0 and 2 (a copy), then
# a new dimension of size 1, the same as `x[[0, 2]].unsqueeze(1)`.

# %%
x = torch.arange(12.0).view(3, 4)
row = x[1]  # basic: a view
picked = x[[0, 2]]  # advanced: a copy
mask = x > 6
big = x[mask]  # boolean mask: a copy, always 1-D
print("x[1] shares x's storage:", row.data_ptr() == x.data_ptr() + 4 * x.element_size(),
      "| x[[0, 2]] shares it:", picked.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
print("x[x > 6] =", big.tolist(), "| x[[0, 2], None].shape =", tuple(x[[0, 2], None].shape))
row[0] = -1.0  # writes into x
picked[0, 0] = -2.0  # does not
x[mask] = 0.0  # assignment through a mask writes into x
print("x after the writes:", x.tolist())
assert x[1, 0] == -1.0 and x[0, 0] == 0.0 and (x <= 6).all()
assert torch.equal(torch.arange(12.0).view(3, 4)[[0, 2], None], torch.arange(12.0).view(3, 4)[[0, 2]].unsqueeze(1))

# %% [markdown]
# The notes also list `torch.nn.functional.normalize(x, p=2, dim=1)`: it divides each row by its length (its
# L2 norm along `dim`, floored at `eps` so that a zero row does not divide by zero), as in their example `[[6, 8]]`
# → `[[0.6, 0.8]]`. It is a reduction with `keepdim=True` followed by a broadcast division.

# %%
v = torch.tensor([[6.0, 8.0], [0.0, 0.0]])
unit = F.normalize(v, p=2.0, dim=1)
print("F.normalize:", unit.tolist())
assert torch.equal(unit[:1], v[:1] / v[:1].norm(dim=1, keepdim=True)) and unit[1].tolist() == [0.0, 0.0]

# %% [markdown]
# `torch.equal` asks "same shape and exactly the same values" — right for integers. For floats, rounding makes exact
# equality fragile: `torch.allclose` (and `torch.testing.assert_close`, which also explains a mismatch) compare with
# a tolerance.

# %%
x = torch.tensor([0.1, 0.2], dtype=torch.float64).sum()
y = torch.tensor(0.3, dtype=torch.float64)
print(f"0.1 + 0.2 = {x.item()!r}, 0.3 = {y.item()!r}")
print("equal:", torch.equal(x, y), "| allclose:", torch.allclose(x, y))
print("integers compare exactly:", torch.equal(torch.arange(3), torch.tensor([0, 1, 2])))
assert not torch.equal(x, y) and torch.allclose(x, y)
torch.testing.assert_close(x, y)  # passes silently; on a real mismatch it names the worst element

# %% [markdown]
# ## 7. `clone` versus `detach`
#
# | | new memory? | stays in the autograd graph? |
# |---|---|---|
# | `t.clone()` | yes | yes (gradients flow back through it) |
# | `t.detach()` | no, shares memory | no |
# | `t.detach().clone()` | yes | no — an independent snapshot |
#
# The notes write `tensor.detach.clone()()`, a typo for `tensor.detach().clone()`.

# %%
w = torch.tensor([1.0, 2.0], requires_grad=True)
c, d, snap = w.clone(), w.detach(), w.detach().clone()
print("clone :", c.requires_grad, c.grad_fn.__class__.__name__, "shares memory:", c.data_ptr() == w.data_ptr())
print("detach:", d.requires_grad, d.grad_fn, "shares memory:", d.data_ptr() == w.data_ptr())
(c * 3).sum().backward()
print("gradient through clone:", w.grad)
with torch.no_grad():
    w.add_(10)
print("after changing w: detach sees", d, "| snapshot keeps", snap)
assert torch.equal(d, w.detach()) and torch.equal(snap, torch.tensor([1.0, 2.0]))

# %% [markdown]
# ## 8. Naming dimensions: einops instead of named tensors
#
# The notes show *named tensors*: `torch.randn(32, 3, 56, 56, names=('N', 'C', 'H', 'W'))`, `images.sum('C')` and
# `align_to`. That prototype feature is **gone from PyTorch 2.14**: `names=` is no longer accepted.

# %%
try:
    torch.randn(32, 3, 56, 56, names=("N", "C", "H", "W"))
except TypeError as err:
    print("names= ->", type(err).__name__, "-", str(err).splitlines()[0])
print("Tensor.align_to exists:", hasattr(torch.Tensor, "align_to"))

# %% [markdown]
# The notes also recommend [einops](https://einops.rocks) ("贼强": very strong), and it is the better tool: the names
# live in a readable pattern string, every operation checks the shapes it is given, and it works on any tensor.
# `rearrange` reorders/merges/splits axes, `reduce` sums or averages over named axes, `repeat` tiles.

# %%
from einops import rearrange, reduce, repeat

images = torch.randn(32, 3, 56, 56)
per_channel_sum = reduce(images, "n c h w -> n h w", "sum")  # the notes' images.sum('C')
assert torch.allclose(per_channel_sum, images.sum(dim=1))
nhwc = rearrange(images, "n c h w -> n h w c")  # the notes' align_to, for channels-last
patches = rearrange(images, "n c (h p1) (w p2) -> n (h w) (p1 p2 c)", p1=14, p2=14)  # ViT-style patches
pooled = reduce(images, "n c (h 2) (w 2) -> n c h w", "max")  # 2x2 max pooling
tiled = repeat(torch.arange(3), "c -> n c", n=2)
for name, t in [("sum over c", per_channel_sum), ("channels last", nhwc), ("patches", patches), ("max pool", pooled)]:
    print(f"{name:14} {tuple(t.shape)}")
print(tiled)
assert torch.equal(pooled, torch.nn.functional.max_pool2d(images, 2))
try:
    rearrange(images, "n c h w -> n (c h w) x")
except Exception as err:  # einops.EinopsError
    print(type(err).__name__, "-", str(err).splitlines()[-1])

# %% [markdown]
# ## 9. Devices (设备)
#
# A tensor lives on one device; operations need their operands on the same device. `utils.get_device()` picks CUDA,
# then Apple's MPS, then the CPU (set `TORCH_COURSE_DEVICE=cpu` to force the CPU). `.to(device)` copies a tensor
# there (and returns the tensor itself if it is already there); results come back with `.cpu()` before `.numpy()`.
# The tests of this course run on the CPU; on a GPU machine the same cells run on `cuda`.
#
# PyTorch 2.6+ also has a device-neutral API, `torch.accelerator`: `is_available()` says whether any accelerator
# (CUDA, MPS, XPU, ...) can be used, `current_accelerator()` which kind this build of PyTorch targets, and
# `device_count()` how many there are. It lets code written for one accelerator run on another.

# %%
device = get_device()
x = torch.arange(4.0)
y = x.to(device)
z = (y * 2).cpu().numpy()
print("computed on", device.type, "->", z)
assert x.to("cpu") is x  # no copy when it is already there
if device.type != "cpu":
    try:
        x + y
    except RuntimeError as err:
        print("mixing devices:", str(err).split(".")[0])
else:
    print("On a GPU, x + y would fail here: 'Expected all tensors to be on the same device'")
print("torch.accelerator.is_available():", torch.accelerator.is_available())
if torch.accelerator.is_available():
    print("accelerator:", torch.accelerator.current_accelerator().type, "| devices:", torch.accelerator.device_count())
assert torch.accelerator.is_available() == (torch.cuda.is_available() or torch.backends.mps.is_available())

# %% [markdown]
# ## Summary
#
# - A tensor has a `dtype` (inferred: ints → `int64`, floats → `float32`), a `shape`, strides and a device.
#   Build tensors with `torch.tensor(data)`, not the legacy `torch.IntTensor(n)`, which allocates garbage.
# - Create by shape with `zeros/ones/full/arange/linspace/rand/randn` (`dtype=`, `device=`, `*_like`); reduce
#   with `dim`/`keepdim`; join with `cat` (existing dim) or `stack` (new dim); reorder with `permute`.
# - A tensor is storage + shape + strides (步长). `view` works whenever the requested shape fits the existing
#   strides, contiguous or not; `reshape` always works and copies only when it must; `.contiguous().view()`
#   gives the same values but always copies a non-contiguous tensor.
# - Basic indexing (slices, integers) gives views; advanced indexing (index lists, masks) gives copies.
# - `from_numpy`/`.numpy()` share memory (so does `.data.numpy()`); `clone()` copies; `from_numpy` refuses
#   negative strides (copy first). `detach()` leaves the graph but shares memory.
# - Broadcasting aligns shapes from the right; `mm` is 2-D, `bmm` is batched 3-D, `matmul`/`@` broadcasts.
# - No negative-step slicing: use `torch.flip`. Compare floats with `allclose`/`assert_close`.
# - Named tensors are gone: name dimensions with einops patterns.
# - Move data with `.to(device)`; pick the device once with `get_device()`.
#
# Next: **02 · autograd** — how PyTorch computes gradients.

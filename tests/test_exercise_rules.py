"""utils/exercises/rules.py: how an answer was written and what it ran, as the exercises' constraints read it."""

from __future__ import annotations

import torch

from utils.exercises.rules import (
    autograd_runs,
    counting_calls,
    python_loops,
    refers_to,
    tensor_hooks,
    torch_calls,
)
from utils.exercises.section import run_sources

CELL = """
import torch
from torch import cdist as cd

def helper(a, b):
    return [[((x - y) ** 2).sum() for y in b] for x in a]

def looped(a, b):
    return torch.tensor(helper(a, b))

def aliased(a, b):
    return cd(a, b) ** 2

def hidden(a, b):
    return getattr(torch, "cd" + "ist")(a, b) ** 2

def broadcast(a, b):
    return ((a[:, None] - b[None]) ** 2).sum(-1)

def by_vjp(x, w):
    from torch.func import vjp
    return vjp(lambda w: x @ w, w)[1](torch.ones(2, 2))[0]
"""


def cell_functions() -> dict:
    namespace: dict = {}
    run_sources([CELL], namespace)  # as a notebook cell: the source is readable
    return namespace


def test_loops_are_found_also_in_the_learners_helpers():
    ns = cell_functions()
    assert python_loops(ns["looped"]) == ["a list comprehension in `helper`"] * 2
    assert python_loops(ns["broadcast"]) == []


def test_names_are_found_through_imports_and_aliases():
    ns = cell_functions()
    assert refers_to(ns["aliased"], "cdist") == "cdist"
    assert refers_to(ns["by_vjp"], "autograd.grad", "vjp") == "vjp"
    assert refers_to(ns["broadcast"], "cdist", "vjp") is None


def test_what_ran_is_counted_however_it_was_reached():
    ns = cell_functions()
    a, b = torch.randn(3, 2), torch.randn(4, 2)
    with torch_calls() as calls:
        ns["hidden"](a, b)
    assert calls["cdist"] == 1
    with autograd_runs() as runs:
        ns["by_vjp"](torch.randn(2, 2), torch.randn(2, 2))
    assert runs[0] == 1
    with autograd_runs() as runs:
        ns["broadcast"](a, b)
    assert runs[0] == 0


def test_counted_calls_are_put_back():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with counting_calls(opt, "step") as steps:
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.step()
    assert steps[0] == 2 and "step" not in vars(opt)


NAMESAKES = """
from functools import reduce
from einops import reduce as einops_reduce

def by_functools(rows):
    return reduce(lambda a, b: a + b, rows)

def by_einops(x):
    from einops import reduce
    return reduce(x, "n d -> n", "sum")

def by_einops_alias(x):
    return einops_reduce(x, "n d -> n", "sum")
"""


def test_a_bare_reduce_is_a_loop_only_when_it_is_pythons():
    ns: dict = {}
    run_sources([NAMESAKES], ns)
    assert python_loops(ns["by_functools"]) == ["`reduce(...)` in `by_functools`"]
    assert python_loops(ns["by_einops"]) == []
    assert python_loops(ns["by_einops_alias"]) == []


def test_tensor_hooks_are_counted_when_registered_and_when_run_and_put_back():
    original = torch.Tensor.register_hook
    t = torch.ones(3, requires_grad=True)
    with tensor_hooks() as hooks:
        out = t.clone()
        out.register_hook(lambda grad: grad * 2)
        t.clone().register_hook(lambda grad: grad)  # on a tensor nothing flows through
    assert torch.Tensor.register_hook is original
    assert hooks["registered"] == 2 and hooks["ran"] == 0
    (grad,) = torch.autograd.grad(out.sum(), t)
    assert hooks["ran"] == 1 and torch.equal(grad, torch.full((3,), 2.0))
    assert hooks["changed"] == 1  # the hook returned a gradient different from the one it got
    with tensor_hooks() as hooks:
        same = t.clone()
        same.register_hook(lambda grad: grad)
        none = t.clone()
        none.register_hook(lambda grad: None)
    torch.autograd.grad((same + none).sum(), t)
    assert hooks["ran"] == 2 and hooks["changed"] == 0

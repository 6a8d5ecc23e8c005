"""utils.exercises.rules.calls_to and assigned_names (added for notebooks 10-12's checks, issue 29)."""

from __future__ import annotations

import io
import pickle
import sys

import torch
from torch import nn

from utils.exercises.rules import assigned_names, calls_to
from utils.exercises.section import run_sources


def test_calls_to_sees_a_re_export_an_alias_a_library_caller_and_builtins():
    from torch.nn.utils import fuse_conv_bn_weights as fold  # the re-export, bound before the block

    conv, bn = nn.Conv2d(2, 3, 1).eval(), nn.BatchNorm2d(3).eval()
    previous = sys.getprofile()
    with calls_to(torch.nn.utils.fusion.fuse_conv_bn_weights, pickle.loads, pickle.Unpickler.load) as seen:
        fold(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
        torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn)  # calls fuse_conv_bn_weights itself
        pickle.loads(pickle.dumps(1))
        pickle.Unpickler(io.BytesIO(pickle.dumps(2))).load()
    assert seen == {"fuse_conv_bn_weights": 2, "loads": 1, "Unpickler.load": 1}
    assert sys.getprofile() is previous  # put back


def test_calls_to_counts_nothing_for_other_code():
    with calls_to(torch.optim.Optimizer.__init__) as seen:
        torch.ones(3).sum()
    assert not seen


def test_assigned_names_are_the_functions_own():
    namespace: dict = {}
    run_sources(
        [
            "def helper(rng_state_dict):\n    return rng_state_dict\n\n"
            "def answer(x):\n    layer_norm = x * 2\n    for item in x:\n        pass\n    return helper(layer_norm)\n"
        ],
        namespace,
    )
    names = assigned_names(namespace["answer"])
    assert {"layer_norm", "item", "x", "rng_state_dict"} <= names
    assert "helper" not in names and "answer" not in names

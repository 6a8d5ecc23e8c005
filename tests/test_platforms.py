"""What differs on Windows and macOS, taken care of by the course (notebook 08's "On Windows and macOS")."""

from __future__ import annotations

import sys

from utils import launch


def test_torchrun_on_windows_gets_the_store_without_libuv(monkeypatch):
    """PyTorch's Windows builds have no libuv, which torchrun's TCPStore uses unless USE_LIBUV=0."""
    monkeypatch.delenv("USE_LIBUV", raising=False)
    monkeypatch.setattr(sys, "platform", "win32")
    assert launch._launch_env(None, "x")["USE_LIBUV"] == "0"
    assert launch._launch_env({"USE_LIBUV": "1"}, "x")["USE_LIBUV"] == "1"  # a learner's own choice stays
    monkeypatch.setattr(sys, "platform", "linux")
    assert "USE_LIBUV" not in launch._launch_env(None, "x")

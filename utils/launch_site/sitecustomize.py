"""Loopback-only stores in the workers of a single-machine launch. Used by no notebook. Lives in utils/ because
:mod:`utils.launch` puts this folder first on the workers' ``PYTHONPATH``, where Python imports ``sitecustomize`` as
it starts (before the worker's script), and imports its store class from here for the agent.

``TCPStore(host, port, is_master=True)`` listens on every interface whatever ``host`` says; the one way to choose
the address is to hand it a socket that already listens (``master_listen_fd``). The agent of a launch patches its own
stores (:func:`utils.launch._listen_on_loopback_only`). With ``max_restarts`` the workers do not share the agent's
store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, see :func:`utils.launch.run_torchrun`): rank 0 starts the workers'
store itself, in ``torch.distributed.rendezvous`` (probe L10: it listened on ``*:PORT``). In a worker this module
waits until that module is imported and then replaces its ``TCPStore`` (and ``torch.distributed.TCPStore``) by
:class:`LoopbackTCPStore`; it imports nothing of torch itself, so a script that sets variables before ``import torch``
is not affected, and nothing of ``utils`` (whose import would import torch).

Active only when the launch sets ``TORCH_COURSE_LOOPBACK_STORES=1``. A ``sitecustomize`` that this one hides (a
Linux distribution's, say) is imported after it.
"""

from __future__ import annotations

import errno
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import socket
import sys

ENV_VAR = "TORCH_COURSE_LOOPBACK_STORES"
"""Set to ``1`` by :mod:`utils.launch` in the agent of a single-machine launch on Linux; the workers inherit it."""
_TARGET = "torch.distributed.rendezvous"


def tcpstore_parameters(store_class: type) -> tuple[str, ...]:
    """The names of ``TCPStore``'s constructor parameters, in order, read from this torch's own signature.

    Raises:
        RuntimeError: the signature no longer has what :class:`LoopbackTCPStore` relies on.
    """
    doc = (store_class.__init__.__doc__ or "").split("\n", 1)[0]
    names = tuple(re.findall(r", (\w+): ", doc))
    if not {"port", "is_master", "master_listen_fd"} <= set(names):
        raise RuntimeError(
            f"TCPStore's signature changed ({doc[:200]!r}); utils.launch cannot make its stores listen on "
            "loopback only: update utils/launch_site/sitecustomize.py"
        )
    return names


def loopback_listener(port: int, in_use: type[Exception] = OSError) -> tuple[int, int]:
    """A TCP socket listening on 127.0.0.1:``port`` (0: any free port): (its port, its file descriptor).

    A busy port raises ``in_use`` (torch's ``DistNetworkError`` where torch is imported), naming EADDRINUSE.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore does: TIME_WAIT does not block it
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise in_use(f"port {port} on 127.0.0.1 is already in use (EADDRINUSE)") from err
        raise
    return sock.getsockname()[1], sock.detach()


def loopback_store_class(base: type, in_use: type[Exception] = OSError) -> type:
    """A subclass of ``base`` (torch's ``TCPStore``) whose servers listen on 127.0.0.1 only."""
    params = tcpstore_parameters(base)

    class LoopbackTCPStore(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            kwargs.update(zip(params, args))
            if kwargs.get("is_master") and kwargs.get("master_listen_fd") is None:
                kwargs["port"], kwargs["master_listen_fd"] = loopback_listener(kwargs["port"], in_use)
            super().__init__(**kwargs)

    return LoopbackTCPStore


def _patch(rendezvous) -> None:
    dist = sys.modules["torch.distributed"]
    if getattr(dist, "TCPStore", None) is not rendezvous.TCPStore:
        raise RuntimeError(f"{_TARGET} no longer uses torch.distributed.TCPStore: update utils.launch")
    store = loopback_store_class(rendezvous.TCPStore, getattr(dist, "DistNetworkError", OSError))
    rendezvous.TCPStore = dist.TCPStore = store


class _PatchWhenImported(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``torch.distributed.rendezvous`` is about to load, wraps its loader so that
    :func:`_patch` runs right after the module has run (torch.distributed's own import is then still going on)."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _import_hidden_sitecustomize() -> None:
    """Import the ``sitecustomize`` that this one hides on ``sys.path``, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.pop("sitecustomize", None)
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules["sitecustomize"] = module
            spec.loader.exec_module(module)
            return
    except Exception as err:  # as site.py does: report, and go on
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(err).__name__}: {err}", file=sys.stderr)
    if me is not None:
        sys.modules["sitecustomize"] = me


if __name__ == "sitecustomize":
    if os.environ.get(ENV_VAR) == "1" and _TARGET not in sys.modules:
        sys.meta_path.insert(0, _PatchWhenImported())
    _import_hidden_sitecustomize()

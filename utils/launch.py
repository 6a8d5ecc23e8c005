"""Launching the course's distributed scripts with ``torchrun`` from a notebook or a test.

A notebook cannot start DDP workers from functions defined in its own cells (``mp.spawn``
pickles them by name from ``__main__``, which a kernel does not have). What works every time is
what a user types in a shell: ``torchrun`` running a script, either a module of the repository or
a ``.py`` file that the notebook wrote with ``%%writefile`` (notebook 08 does both). This module
wraps that command so a cell can run it and show what the workers reported::

    from utils.launch import run_torchrun

    result = run_torchrun(RUNS / "hello.py", nproc=2)   # python -m torch.distributed.run --standalone ...
    result = run_torchrun(RUNS / "ddp_train.py", nproc=2, args=["--out", out])  # a file the notebook wrote
    print("\\n".join(result.rank_lines()))              # "[rank 0] ...", then "[rank 1] ..."

What it takes care of:

* ``OMP_NUM_THREADS=1`` (torchrun otherwise prints a timestamped warning and each worker would
  start one thread per core), ``PYTHONUNBUFFERED=1`` (a worker's last lines are not lost when
  it is killed) and the repository root on ``PYTHONPATH`` (``-m utils.ddp.<script>`` imports).
* stdout and stderr are captured; the caller prints only what it chooses. Worker lines that start
  with ``[rank N]`` (see :func:`utils.ddp.common.report`) are returned sorted by rank, so that
  outputs do not depend on which process printed first.
* a non-zero exit status raises :class:`TorchrunError` whose message ends with the workers'
  stderr (tracebacks included), and a launch that runs past ``timeout`` is stopped: the agent
  and every worker it started are killed, found by a marker variable in their environment
  (workers run in sessions of their own, so killing the agent's process group is not enough).
* :func:`leftover_processes` lists processes of earlier launches that are still alive (none
  should be), and :func:`port_is_free` tells whether a rendezvous port has been released.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from utils.paths import REPO_ROOT

MARKER_VAR = "TORCH_COURSE_LAUNCH_ID"
"""Environment variable set to a fresh id in every launch: how its processes are found again."""

DEFAULT_TIMEOUT_S = 120.0
_RANK_LINE = re.compile(r"^\[rank (\d+)\] ?(.*)$")
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_LAUNCH_IDS: list[str] = []  # every id this process launched, for leftover_processes()


class TorchrunError(RuntimeError):
    """A torchrun launch failed (non-zero exit status) or ran past its timeout.

    ``result`` holds what was captured; the message ends with the workers' stderr.
    """

    def __init__(self, message: str, result: LaunchResult):
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class LaunchResult:
    """What one launch (one or more ``torchrun`` agents) left behind."""

    commands: tuple[tuple[str, ...], ...]
    """The command line of each agent (one per simulated node)."""
    returncode: int
    """0 when every agent succeeded, else the first non-zero status (-9 after a timeout kill)."""
    stdout: str
    stderr: str
    wall_s: float
    launch_id: str
    timed_out: bool = False
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables this launch set on purpose (shown by :meth:`shell_lines`)."""

    def by_rank(self) -> dict[int, list[str]]:
        """The ``[rank N] message`` lines of stdout, grouped by rank, in the order each rank printed them."""
        lines: dict[int, list[str]] = {}
        for line in self.stdout.splitlines():
            m = _RANK_LINE.match(line)
            if m:
                lines.setdefault(int(m.group(1)), []).append(m.group(2))
        return dict(sorted(lines.items()))

    def rank_lines(self) -> list[str]:
        """Every ``[rank N] ...`` line, sorted by rank (stable: each rank keeps its own order)."""
        return [f"[rank {r}] {msg}" for r, msgs in self.by_rank().items() for msg in msgs]

    def print_ranks(self) -> None:
        """Print :meth:`rank_lines`, one per line."""
        print("\n".join(self.rank_lines()))

    def shell_lines(self) -> list[str]:
        """Each agent's command as a user would type it (see :func:`format_command`)."""
        return [format_command(c, dict(self.env)) for c in self.commands]


def _script_args(module: str | os.PathLike[str]) -> list[str]:
    """``["-m", module]`` for a dotted module name, ``[path]`` for a ``.py`` file (e.g. one a
    notebook wrote with ``%%writefile``)."""
    if isinstance(module, os.PathLike) or (isinstance(module, str) and module.endswith(".py")):
        path = Path(module).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"no script {path}: write it first (e.g. run the notebook's %%writefile cell)")
        return [str(path)]
    if not isinstance(module, str):
        raise TypeError(f"module must be a dotted module name (str) or a .py path, got {type(module).__name__}")
    if not _MODULE_NAME.match(module):
        raise ValueError(f"module must be a dotted module name such as 'package.script' or a .py path, got {module!r}")
    return ["-m", module]


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _check_args(args: Sequence[str]) -> tuple[str, ...]:
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError("args must be a list of strings (the script's command-line arguments), not a single string")
    out = []
    for a in args:
        if not isinstance(a, (str, int, float, os.PathLike)) or isinstance(a, bool):
            raise TypeError(f"every script argument must be a str, number or path, got {type(a).__name__}")
        out.append(os.fspath(a) if isinstance(a, os.PathLike) else str(a))
    return tuple(out)


def torchrun_command(
    module: str | os.PathLike[str],
    nproc: int = 2,
    args: Sequence[str] = (),
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    max_restarts: int = 0,
) -> list[str]:
    """The command line of one ``torchrun`` agent (``python -m torch.distributed.run``).

    With ``nnodes=1`` the agent is ``--standalone`` (it picks a free port itself). With
    ``nnodes>1`` it is one node of a multi-node job with the static rendezvous a user would type
    on each machine: ``--nnodes --node_rank --master_addr --master_port`` (``master_port`` is
    required then).
    """
    script = _script_args(module)
    _check_positive_int("nproc", nproc)
    _check_positive_int("nnodes", nnodes)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nnodes:
            raise ValueError(f"node_rank must be an int in [0, {nnodes}), got {node_rank!r}")
        if master_port is None:
            raise ValueError("a multi-node launch needs master_port (use free_port())")
        if isinstance(master_port, bool) or not isinstance(master_port, int) or not 0 < master_port < 65536:
            raise ValueError(f"master_port must be an int in (0, 65536), got {master_port!r}")
        cmd += [f"--nnodes={nnodes}", f"--node_rank={node_rank}", f"--master_addr={master_addr}",
                f"--master_port={master_port}"]
    cmd.append(f"--nproc_per_node={nproc}")
    if max_restarts:
        cmd.append(f"--max_restarts={max_restarts}")
    cmd += [*script, *_check_args(args)]
    return cmd


def format_command(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """A command as a user would type it: ``torchrun ...``, with the port shown as ``$PORT``.

    The Python executable is an absolute path and the port is random: neither belongs in a
    notebook's stored output. ``env`` variables are written in front (``NAME=value torchrun ...``).
    """
    parts = list(cmd)
    if parts[:3] == [sys.executable, "-m", "torch.distributed.run"]:
        parts = ["torchrun", *parts[3:]]
    parts = [re.sub(r"^(--master_port=)\d+$", r"\g<1>$PORT", p) for p in parts]
    prefix = "".join(f"{k}={shlex.quote(str(v))} " for k, v in (env or {}).items())
    return prefix + " ".join(p if p.startswith("--master_port=") else shlex.quote(p) for p in parts)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it): for ``--master_port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``host:port`` any more (a finished job released its store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _launch_env(env: Mapping[str, str] | None, launch_id: str) -> dict[str, str]:
    full = dict(os.environ)
    if env is not None:
        if not isinstance(env, Mapping):
            raise TypeError(f"env must be a mapping of extra environment variables, got {type(env).__name__}")
        full.update({str(k): str(v) for k, v in env.items()})
    full.setdefault("OMP_NUM_THREADS", "1")
    full["PYTHONUNBUFFERED"] = "1"
    path = full.get("PYTHONPATH", "")
    full["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    full[MARKER_VAR] = launch_id
    return full


def _processes_with_marker(launch_ids: set[str]) -> list[int]:
    """PIDs of live processes (not zombies) whose environment holds one of ``launch_ids``."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours
            continue
        if state == "Z":
            continue
        for var in environ.split(b"\0"):
            if var.startswith(MARKER_VAR.encode() + b"=") and var.split(b"=", 1)[1].decode() in launch_ids:
                found.append(int(entry.name))
                break
    return sorted(found)


def leftover_processes(launch_ids: Sequence[str] | None = None) -> list[int]:
    """PIDs of processes started by earlier launches of this Python process that are still alive.

    Every launch marks its agent and workers with a unique id in their environment; an empty list
    means every agent and worker has exited. Only works where ``/proc`` exists (Linux); elsewhere
    it returns ``[]``.
    """
    ids = set(_LAUNCH_IDS if launch_ids is None else launch_ids)
    if not ids or not Path("/proc").is_dir():
        return []
    return _processes_with_marker(ids)


def _kill_launch(procs: Sequence[subprocess.Popen], launch_id: str) -> None:
    """Stop a launch: SIGTERM to the agents (they stop their workers), then SIGKILL to anything left."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    # SIGKILL to every process still marked with this launch, until none is left: a signal is delivered
    # asynchronously, so a process can still look alive for a moment after it was sent (seen under load).
    deadline = time.monotonic() + 10
    while Path("/proc").is_dir() and (left := _processes_with_marker({launch_id})) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _tail(text: str, n: int) -> str:
    lines = text.rstrip().splitlines()
    return "\n".join(lines[-n:]) if lines else "(empty)"


def run_commands(
    commands: Sequence[Sequence[str]],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    cwd: str | os.PathLike[str] | None = None,
) -> LaunchResult:
    """Run several commands side by side (e.g. one ``torchrun`` agent per simulated node) and wait for all.

    Output is captured (stdout of all commands concatenated in order, same for stderr). After
    ``timeout`` seconds every process of the launch is killed and :class:`TorchrunError` is raised.
    With ``check=True`` a non-zero exit status raises :class:`TorchrunError` too.
    """
    if isinstance(commands, (str, bytes)) or not commands:
        raise ValueError("commands must be a non-empty list of command lines (lists of strings)")
    cmds = []
    for c in commands:
        if isinstance(c, (str, bytes)) or not all(isinstance(x, str) for x in c) or not c:
            raise TypeError("each command must be a non-empty list of strings, e.g. torchrun_command(...)")
        cmds.append(tuple(c))
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    launch_id = uuid.uuid4().hex
    _LAUNCH_IDS.append(launch_id)
    full_env = _launch_env(env, launch_id)
    outs = [(tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+")) for _ in cmds]
    procs: list[subprocess.Popen] = []
    start = time.monotonic()
    timed_out = False
    try:
        for cmd, (out, err) in zip(cmds, outs):
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=full_env, cwd=cwd or REPO_ROOT,
                                          start_new_session=True))
        deadline = start + timeout
        for p in procs:
            try:
                p.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        if timed_out or any(p.poll() is None for p in procs):
            _kill_launch(procs, launch_id)
    wall = time.monotonic() - start
    texts = []
    for out, err in outs:
        out.seek(0)
        err.seek(0)
        texts.append((out.read(), err.read()))
        out.close()
        err.close()
    codes = [p.returncode for p in procs]
    returncode = next((c for c in codes if c != 0), 0)
    result = LaunchResult(
        commands=tuple(cmds),
        returncode=returncode,
        stdout="".join(t[0] for t in texts),
        stderr="".join(t[1] for t in texts),
        wall_s=wall,
        launch_id=launch_id,
        timed_out=timed_out,
        env=tuple(sorted((str(k), str(v)) for k, v in (env or {}).items())),
    )
    if timed_out:
        raise TorchrunError(
            f"launch timed out after {timeout:g} s and was killed: {' | '.join(format_command(c) for c in cmds)}\n"
            f"--- stdout (last 20 lines) ---\n{_tail(result.stdout, 20)}\n"
            f"--- workers' stderr (last 40 lines) ---\n{_tail(result.stderr, 40)}",
            result,
        )
    if check and returncode != 0:
        raise TorchrunError(
            f"launch failed with exit status {returncode}: {' | '.join(format_command(c) for c in cmds)}\n"
            f"--- stdout (last 20 lines) ---\n{_tail(result.stdout, 20)}\n"
            f"--- workers' stderr (last 40 lines) ---\n{_tail(result.stderr, 40)}",
            result,
        )
    return result


def run_torchrun(
    module: str | os.PathLike[str],
    nproc: int = 2,
    args: Sequence[str] = (),
    *,
    max_restarts: int = 0,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> LaunchResult:
    """Run ``torchrun --standalone --nproc_per_node=nproc -m module *args`` and wait for it.

    Args:
        module: the script, as a module of this repository (``"package.script"``) or the path of a
            ``.py`` file (str ending in ``.py``, or a ``Path``), such as one a notebook wrote.
        nproc: worker processes (ranks) on this machine.
        args: the script's own command-line arguments.
        max_restarts: how often torchrun restarts the whole worker group after a failure
            (TorchElastic fault tolerance); 0 means a failure ends the job. With restarts,
            ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` is set unless ``env`` says otherwise: when the
            workers share the agent's rendezvous store (the default), a restarted worker can read
            the address of a peer of the previous attempt and fail with "Connection refused"
            (pytorch/pytorch#135712; seen here in about half of the restarts).
        timeout: seconds before the agent and its workers are killed.
        env: extra environment variables for the agent and the workers.
        check: raise :class:`TorchrunError` on a non-zero exit status (the default).

    Returns:
        A :class:`LaunchResult`; ``result.rank_lines()`` are the workers' reports sorted by rank.
    """
    cmd = torchrun_command(module, nproc, args, max_restarts=max_restarts)
    if env is not None and not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping of extra environment variables, got {type(env).__name__}")
    if max_restarts:
        env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **(env or {})}
    return run_commands([cmd], timeout=timeout, env=env, check=check)


def run_torchrun_nodes(
    module: str | os.PathLike[str],
    nnodes: int = 2,
    nproc_per_node: int = 1,
    args: Sequence[str] = (),
    *,
    master_port: int | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> LaunchResult:
    """Simulate a multi-node job on this machine: ``nnodes`` torchrun agents on 127.0.0.1, one per "node".

    Each agent gets ``--nnodes --node_rank --master_addr=127.0.0.1 --master_port``, exactly what
    a user runs on each of ``nnodes`` machines (with the first machine's address instead of
    127.0.0.1). Node 0 hosts the rendezvous store on ``master_port`` (a free port by default).
    """
    _check_positive_int("nnodes", nnodes)
    port = free_port() if master_port is None else master_port
    cmds = [
        torchrun_command(module, nproc_per_node, args, nnodes=nnodes, node_rank=i, master_port=port)
        for i in range(nnodes)
    ]
    return run_commands(cmds, timeout=timeout, env=env, check=check)


def load_rank_results(out_dir: str | os.PathLike[str]) -> dict[int, dict]:
    """Read the ``rank<N>.pt`` files that the workers wrote with :func:`utils.ddp.common.save_result`.

    Returns ``{rank: dict}`` sorted by rank; loading uses ``weights_only=True``.
    """
    import torch  # local import: launching needs no torch in the parent

    out = Path(out_dir)
    if not out.is_dir():
        raise ValueError(f"{out} is not a folder of rank results")
    files = sorted(out.glob("rank*.pt"), key=lambda p: int(p.stem[4:]))
    if not files:
        raise ValueError(f"no rank*.pt result files in {out}: did the workers run with --out {out}?")
    return {int(p.stem[4:]): torch.load(p, weights_only=True) for p in files}

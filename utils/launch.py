"""Launching the course's distributed scripts with ``torchrun`` from a notebook or a test. Used by notebooks 08 and 09.

A notebook cannot start DDP workers from functions defined in its own cells (``mp.spawn``
pickles them by name from ``__main__``, which a kernel does not have). What works every time is
what a user types in a shell: ``torchrun`` running a script, either a module of the repository or
a ``.py`` file that the notebook wrote with ``%%writefile`` (notebooks 08 and 09 do both). This module
wraps that command so a cell can run it and show what the workers reported::

    from utils.launch import run_torchrun

    result = run_torchrun(RUNS / "hello.py", nproc=2)   # torchrun --standalone --nproc_per_node=2 ...
    result = run_torchrun(RUNS / "ddp_train.py", nproc=2, args=["--out", out])  # a file the notebook wrote
    print("\\n".join(result.rank_lines()))              # "[rank 0] ...", then "[rank 1] ..."

What it takes care of:

* ``OMP_NUM_THREADS=1`` (torchrun otherwise prints a timestamped warning and each worker would
  start one thread per core), ``PYTHONUNBUFFERED=1`` (a worker's last lines are not lost when
  it is killed) and the repository root on ``PYTHONPATH`` (``-m utils.ddp.<script>`` imports).
* stdout and stderr are captured; the caller prints only what it chooses. Worker lines that start
  with ``[rank N]`` (see :func:`utils.ddp.common.report`) are returned sorted by rank, so that
  outputs do not depend on which process printed first.
* a failure raises :class:`TorchrunError`. When workers failed, its message names the rank that
  failed first and shows that rank's stderr (its traceback). torchrun's own summary cannot tell:
  its "Root Cause" is the failure it noticed first to the second, the lowest rank among those it
  noticed in the same second, so usually rank 0, which often only failed because a peer had died.
  The first is a rank that ended by itself (not by the SIGTERM with which the agent stops the
  others) whose stderr file was last written earliest: a rank that fails because a peer has gone
  writes its traceback after that peer has exited. When one
  agent fails (node 0 of a multi-node job cannot open ``master_port``, say), the others are stopped
  at once instead of waiting for ``timeout``, and a busy ``master_port`` is named in the message.
* a launch that runs past ``timeout`` is stopped: the agent and every worker it started are
  killed, found by a marker variable in their environment (workers run in sessions of their own,
  so killing the agent's process group is not enough).

What a launch leaves: nothing, also when its launcher dies. Each ``torchrun`` command is run as
``python -m utils.launch ARGS``: the same ``torchrun`` (its ``main``, with the same arguments), plus

* it exits when its launcher does (a kernel killed by SIGTERM or SIGKILL: JupyterLab sends both,
  to the kernel's process group only, when it restarts a kernel that does not answer; the agent
  runs in a session of its own): a thread in the agent watches its parent process and sends the
  agent SIGTERM, and torchrun then stops its workers. An agent killed with SIGKILL itself cannot
  stop its workers: its launcher, which waits for the agent, stops every process still marked with
  the launch's id once the agent has exited. Only when launcher and agent die together are workers
  left running; those are found later, by any process of the same user with the same
  temporary directory: every launch has a folder in
  ``<temp dir>/torch-course-launches-<uid>/<launch id>`` naming its launcher,
  :func:`leftover_processes` lists the processes of launches whose launcher has died, and the next
  launch (:func:`run_commands`) stops them and removes their folders.
* torchrun's logs go to that folder, which is removed after the launch, instead of a
  ``torchelastic_*`` folder left in the temporary directory by every launch. Each worker's stderr is
  also written to its own file there (``--tee=2``, shown in the agent's stderr as ``[rankN]: ...``).
* a single-machine job (``--standalone``, or a static rendezvous on a loopback ``--master_addr``)
  listens on 127.0.0.1 only: torchrun's stores listen on every interface whatever address they are
  given (``TCPStore`` takes no address to listen on, only ``master_listen_fd``), so the agent hands
  each store a socket already listening on 127.0.0.1; ``--local-addr=127.0.0.1`` makes the workers
  connect there, and ``GLOO_SOCKET_IFNAME`` (the loopback interface) keeps gloo's sockets on it
  too. With ``max_restarts`` the workers' store is started by rank 0 itself (see :func:`run_torchrun`):
  the workers import ``utils/launch_site/sitecustomize.py`` as they start (first on their
  ``PYTHONPATH``), which gives that store the same loopback socket. Not covered: NCCL chooses its own
  interface.

Where: the agent's watch of its launcher works on Linux and macOS. Finding processes by their
marker reads ``/proc``, so on macOS :func:`leftover_processes` returns ``[]`` and the workers of an
agent killed by SIGKILL are not stopped by the next launch (their folders are still removed).
Loopback-only stores are set up on Linux only, where they are tested; elsewhere torchrun's stores
listen on every interface, as plain ``torchrun`` does. The commands shown (:func:`format_command`,
:meth:`LaunchResult.shell_lines`) are the ``torchrun`` commands a user would type.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from utils.launch_site import sitecustomize as launch_site
from utils.paths import REPO_ROOT

MARKER_VAR = "TORCH_COURSE_LAUNCH_ID"
"""Environment variable set to a fresh id in every launch: how its processes are found again."""

_AGENT_DIR_VAR = "TORCH_COURSE_AGENT_DIR"
"""Set for each agent: the folder, inside its launch's folder, for torchrun's logs."""
_LAUNCHER_VAR = "TORCH_COURSE_LAUNCHER_PID"
"""Set for each agent: the process it exits with."""
_TORCHRUN = ("-m", "torch.distributed.run")
_AGENT = ("-m", "utils.launch")
_LAUNCH_SITE = Path(__file__).resolve().parent / "launch_site"
"""Put first on the workers' PYTHONPATH: its ``sitecustomize`` makes their stores listen on loopback only."""

DEFAULT_TIMEOUT_S = 120.0
_RANK_LINE = re.compile(r"^\[rank (\d+)\] ?(.*)$")
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# torch prefixes the lines of a worker's uncaught traceback with "[rankN]: " (once it has joined a
# process group), and the agent's --tee prefixes every stderr line the same way: one is kept.
_TWICE_PREFIXED = re.compile(r"^(\[rank\d+\]: )\1", re.MULTILINE)
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
        cmd += [
            f"--nnodes={nnodes}",
            f"--node_rank={node_rank}",
            f"--master_addr={master_addr}",
            f"--master_port={master_port}",
        ]
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
    if sys.platform == "win32":  # Windows builds of PyTorch have no libuv, which torchrun's store uses by default
        full.setdefault("USE_LIBUV", "0")
    path = full.get("PYTHONPATH", "")
    full["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    full[MARKER_VAR] = launch_id
    return full


# --- finding the processes and folders of launches --------------------------------------------------------


def _has_proc() -> bool:
    return Path("/proc/self/stat").is_file()


def _identity(pid: int) -> str | None:
    """``"PID START"`` while process ``pid`` runs, None once it has exited (a zombie has exited).

    START, its start time from ``/proc``, tells it from a later process that reuses the id; without
    ``/proc`` (macOS) the identity is the id alone. On Windows every process counts as running
    (``os.kill(pid, 0)`` would send it CTRL_C_EVENT there).
    """
    if os.name != "posix":
        return str(pid)
    if not _has_proc():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:  # alive, another user's
            pass
        return str(pid)
    try:
        state, *fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if state == "Z" else f"{pid} {fields[18]}"  # field 22 of stat: starttime


def _launches_root() -> Path:
    """The folder of this user's running launches, one subfolder per launch, named by its id."""
    user = os.getuid() if hasattr(os, "getuid") else os.getlogin()
    return Path(tempfile.gettempdir()) / f"torch-course-launches-{user}"


def _open_launch_folder(launch_id: str) -> Path:
    """Create the launch's folder; the file ``launcher`` in it says which process launched it."""
    root = _launches_root()
    root.mkdir(mode=0o700, exist_ok=True)
    folder = root / launch_id
    folder.mkdir()
    tmp = folder / "launcher.part"
    tmp.write_text(_identity(os.getpid()) or str(os.getpid()))
    tmp.rename(folder / "launcher")  # whole or absent, for a reader in another process
    return folder


def _orphaned_launches() -> list[Path]:
    """Folders of launches whose launcher has exited without removing them (a killed kernel)."""
    root = _launches_root()
    orphans = []
    for folder in root.iterdir() if root.is_dir() else ():
        try:
            launcher = (folder / "launcher").read_text()
            pid = int(launcher.split()[0])
        except (OSError, ValueError, IndexError):  # being created or removed right now
            continue
        if _identity(pid) != launcher:
            orphans.append(folder)
    return orphans


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
    """PIDs of processes of earlier launches that are still alive: an empty list means none is left.

    Without ``launch_ids``: the launches of this Python process, and those of any launcher that has
    died (a kernel that was killed or restarted: the next launch stops what it left). Every launch
    marks its agent and workers with a unique id in their environment. Only works where ``/proc``
    exists (Linux); elsewhere it returns ``[]``.
    """
    if not _has_proc():
        return []
    if launch_ids is None:
        ids = set(_LAUNCH_IDS) | {folder.name for folder in _orphaned_launches()}
    else:
        ids = set(launch_ids)
    return _processes_with_marker(ids) if ids else []


def _kill_marked(launch_id: str) -> None:
    """SIGKILL every process still marked with ``launch_id``, until none is left (at most 10 s).

    A signal is delivered asynchronously, so a process can still look alive for a moment after it
    was sent (seen under load).
    """
    deadline = time.monotonic() + 10
    while _has_proc() and (left := _processes_with_marker({launch_id})) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _stop_orphans() -> None:
    """Stop what launches of dead launchers left running, and remove their folders."""
    for folder in _orphaned_launches():
        _kill_marked(folder.name)
        shutil.rmtree(folder, ignore_errors=True)


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
    _kill_marked(launch_id)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


# --- what failed --------------------------------------------------------------------------------------------


def _tail(text: str, n: int) -> str:
    lines = text.rstrip().splitlines()
    return "\n".join(lines[-n:]) if lines else "(empty)"


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


@dataclass(frozen=True)
class _RankFailure:
    rank: int
    exitcode: int
    stderr: Path
    written_ns: float
    """When its stderr file was last written (inf when there is none)."""


def _rank_failures(agent_dir: Path) -> list[_RankFailure]:
    """The workers that an agent reported failed (``failures.json``, written by :func:`_agent_main`)."""
    try:
        failures = json.loads((agent_dir / "failures.json").read_text())
    except (OSError, ValueError):
        return []
    # torchrun's layout: <log dir>/<run id>_<random>/attempt_<restart>/<local rank>/stderr.log
    attempts = sorted(agent_dir.glob("*/attempt_*"), key=lambda a: int(a.name.split("_")[1]))
    out = []
    for rank, (local_rank, exitcode) in failures.items():
        stderr = attempts[-1] / str(local_rank) / "stderr.log" if attempts else agent_dir / "none"
        try:
            written = stderr.stat().st_mtime_ns
        except OSError:
            written = float("inf")
        out.append(_RankFailure(int(rank), exitcode, stderr, written))
    return out


def _explain_failures(failures: list[_RankFailure]) -> str:
    """Which rank failed first, with its stderr; the others that failed with their last stderr line."""

    def when(f: _RankFailure) -> tuple[bool, float]:
        # the agent stops the other workers with SIGTERM once one has failed: those are victims, whatever
        # their stderr's time (a worker stopped before it wrote anything has an old file)
        return f.exitcode == -signal.SIGTERM, f.written_ns

    failures = sorted(failures, key=lambda f: (when(f), f.rank))
    first, rest = failures[0], failures[1:]
    try:
        stderr = first.stderr.read_text(errors="replace")
    except OSError:
        stderr = ""
    together = [f.rank for f in rest if when(f) == when(first)]
    if together:  # the file times cannot order them
        head = f"ranks {', '.join(map(str, [first.rank, *together]))} failed at the same moment; rank {first.rank}"
    else:
        head = f"rank {first.rank} failed{' first' if rest else ''}"
    lines = [f"{head} ({_exit_text(first.exitcode)}); its stderr (last 40 lines):", _tail(stderr, 40)]
    for f in rest:
        try:
            last = _tail(f.stderr.read_text(errors="replace"), 1)
        except OSError:
            last = "(no stderr file)"
        lines.append(f"then rank {f.rank} ({_exit_text(f.exitcode)}): {last}")
    return "\n".join(lines)


def _master_port(cmd: Sequence[str]) -> int | None:
    for part in cmd:
        if part.startswith(("--master_port=", "--master-port=")):
            return int(part.split("=", 1)[1])
    return None


def _failure_message(
    cmds: Sequence[Sequence[str]], stderrs: Sequence[str], agent_dirs: Sequence[Path], stdout: str, status: str
) -> str:
    """The message of a :class:`TorchrunError`: what ran, what failed and why, and the end of the output."""
    what = f"{status}: {' | '.join(format_command(c) for c in cmds)}"
    for cmd, err in zip(cmds, stderrs):
        port = _master_port(cmd)
        if port is not None and "EADDRINUSE" in err:
            what += (
                f"\nmaster_port {port} is already in use (EADDRINUSE): another program or job listens on it; "
                f"pick a free port (utils.launch.free_port()) or stop what holds it (`ss -ltnp` on Linux, "
                f"`lsof -i :{port}` on macOS)"
            )
    failures = [f for d in agent_dirs for f in _rank_failures(d)]
    if failures:
        why = _explain_failures(failures)
    else:
        why = f"--- stderr (last 40 lines) ---\n{_tail(''.join(stderrs), 40)}"
    return f"{what}\n{why}\n--- stdout (last 20 lines) ---\n{_tail(stdout, 20)}"


# --- running ------------------------------------------------------------------------------------------------


def _agent_command(cmd: tuple[str, ...]) -> tuple[str, ...]:
    """A torchrun command as this module runs it: ``python -m utils.launch ARGS`` (see the module docstring)."""
    if cmd[1:3] == _TORCHRUN:
        return (cmd[0], *_AGENT, *cmd[3:])
    return cmd


def _wait(procs: Sequence[subprocess.Popen], deadline: float) -> bool:
    """Wait until every process has exited or one has failed (True), or the deadline has passed (False).

    After one agent fails, the others would only wait for it (node 1 for a node 0 that could not
    open its port, up to the timeout): the caller stops them at once.
    """
    while True:
        codes = [p.poll() for p in procs]
        if None not in codes or any(codes):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


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
    With ``check=True`` a non-zero exit status raises :class:`TorchrunError` too; when one command
    fails, the others are stopped at once. A ``torchrun`` command (:func:`torchrun_command`) is run
    as ``python -m utils.launch ARGS`` (see the module docstring). First, whatever launches of dead
    launchers left running is stopped.
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
    _stop_orphans()
    launch_id = uuid.uuid4().hex
    _LAUNCH_IDS.append(launch_id)
    full_env = _launch_env(env, launch_id)
    folder = _open_launch_folder(launch_id)
    try:
        return _run(
            cmds,
            full_env,
            folder,
            timeout=timeout,
            check=check,
            cwd=cwd or REPO_ROOT,
            shown_env=tuple(sorted((str(k), str(v)) for k, v in (env or {}).items())),
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(
    cmds: Sequence[tuple[str, ...]],
    env: dict[str, str],
    folder: Path,
    *,
    timeout: float,
    check: bool,
    cwd: str | os.PathLike[str],
    shown_env: tuple[tuple[str, str], ...],
) -> LaunchResult:
    """Run one launch whose folder exists (the body of :func:`run_commands`)."""
    launch_id = env[MARKER_VAR]
    agent_dirs = [folder / f"agent{i}" for i in range(len(cmds))]
    outs = [(tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+")) for _ in cmds]
    procs: list[subprocess.Popen] = []
    start = time.monotonic()
    finished = False
    try:
        for cmd, agent_dir, (out, err) in zip(cmds, agent_dirs, outs):
            agent_env = {**env, _AGENT_DIR_VAR: str(agent_dir), _LAUNCHER_VAR: str(os.getpid())}
            procs.append(
                subprocess.Popen(
                    _agent_command(cmd), stdout=out, stderr=err, env=agent_env, cwd=cwd, start_new_session=True
                )
            )
        finished = _wait(procs, start + timeout)
        codes = [p.poll() for p in procs]  # before the others are stopped: who failed by itself
    finally:
        if any(p.poll() is None for p in procs):
            _kill_launch(procs, launch_id)
        else:  # an agent killed by SIGKILL (the OOM killer, a user's kill -9) left its workers running
            _kill_marked(launch_id)
    wall = time.monotonic() - start
    texts = []
    for out, err in outs:
        out.seek(0)
        err.seek(0)
        texts.append((out.read(), _TWICE_PREFIXED.sub(r"\1", err.read())))
        out.close()
        err.close()
    result = LaunchResult(
        commands=tuple(cmds),
        returncode=next((c for c in codes if c), 0) or next((p.returncode for p in procs if p.returncode), 0),
        stdout="".join(t[0] for t in texts),
        stderr="".join(t[1] for t in texts),
        wall_s=wall,
        launch_id=launch_id,
        timed_out=not finished,
        env=shown_env,
    )
    if not finished:
        status = f"launch timed out after {timeout:g} s and was killed"
    elif check and result.returncode != 0:
        status = f"launch failed with exit status {result.returncode}"
    else:
        return result
    raise TorchrunError(_failure_message(cmds, [t[1] for t in texts], agent_dirs, result.stdout, status), result)


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
    results = {}
    for p in files:
        try:
            results[int(p.stem[4:])] = torch.load(p, weights_only=True)
        except Exception as err:  # torch's UnpicklingError is long, coloured, and does not name the file
            first = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip().splitlines()
            raise ValueError(
                f"{p} cannot be loaded as a rank result ({type(err).__name__}: {first[0] if first else 'no message'}): "
                "was it written by utils.ddp.common.save_result? Delete it and run the launch again"
            ) from err
    return results


# --- the agent: torchrun as run_commands runs it ------------------------------------------------------------


def _exit_with_launcher(launcher_pid: int, poll_s: float = 0.2) -> None:
    """Send this process SIGTERM as soon as its parent is no longer ``launcher_pid`` (it has exited).

    A watching thread rather than Linux's ``prctl(PR_SET_PDEATHSIG)``: it works on macOS too, it
    follows the launching process rather than the thread that started this one (a launch may be
    started from a thread), and it also fires when the launcher died before the watch began (the
    parent is then already another process). torchrun answers SIGTERM by stopping its workers.
    """

    def watch() -> None:
        while os.getppid() == launcher_pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-launcher", daemon=True).start()


def _single_machine(args) -> bool:
    """Whether parsed torchrun arguments describe a job that runs on this machine only."""
    if args.standalone:
        return True
    try:
        return args.rdzv_backend == "static" and ipaddress.ip_address(args.master_addr).is_loopback
    except ValueError:  # a host name: another machine, or this one by name
        return False


def tcpstore_parameters() -> tuple[str, ...]:
    """The names of ``TCPStore``'s constructor parameters, in order, read from this torch's own signature.

    Raises:
        RuntimeError: the signature no longer has what :func:`_listen_on_loopback_only` relies on.
    """
    import torch.distributed as dist

    return launch_site.tcpstore_parameters(dist.TCPStore)


def _listen_on_loopback_only() -> None:
    """Make every TCPStore server that this process starts listen on 127.0.0.1 only.

    ``TCPStore(host, port, is_master=True)`` listens on every interface whatever ``host`` says; no public
    setting chooses the address, except giving it a socket that already listens (``master_listen_fd``).
    torchrun's agent creates its stores through the names patched here (``tests/test_launch.py`` fails
    loudly if a torch release moves them or changes the constructor). The workers get the same class through
    ``utils/launch_site/sitecustomize.py`` (their store, with ``max_restarts``).
    """
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, static_tcp_rendezvous

    for module in (dist, c10d_rendezvous_backend, static_tcp_rendezvous):
        if getattr(module, "TCPStore", None) is not dist.TCPStore:
            raise RuntimeError(f"{module.__name__} no longer uses torch.distributed.TCPStore: update utils.launch")
    store = launch_site.loopback_store_class(dist.TCPStore, dist.DistNetworkError)
    dist.TCPStore = c10d_rendezvous_backend.TCPStore = static_tcp_rendezvous.TCPStore = store


def _workers_listen_on_loopback_only() -> None:
    """Make the stores that this agent's workers start listen on 127.0.0.1 too (see ``utils/launch_site/``)."""
    os.environ[launch_site.ENV_VAR] = "1"
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = str(_LAUNCH_SITE) + (os.pathsep + path if path else "")


def _loopback_interface() -> str | None:
    names = {name for _, name in socket.if_nameindex()}
    return next((n for n in ("lo", "lo0") if n in names), None)  # Linux, macOS


def _agent_main(argv: list[str]) -> None:
    """``python -m utils.launch TORCHRUN_ARGS``: torchrun's ``main`` with what a course launch adds.

    Options go in front of the user's, so that an option the user gives wins.
    """
    _exit_with_launcher(int(os.environ[_LAUNCHER_VAR]))
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    agent_dir = Path(os.environ[_AGENT_DIR_VAR])
    extra = [f"--log-dir={agent_dir}", "--tee=2", "--log-line-prefix-template=[rank${rank}]: "]
    if _single_machine(torchrun.parse_args(argv)):
        if sys.platform == "linux":  # master_listen_fd: tested on Linux only (Windows sockets are no fds)
            _listen_on_loopback_only()
            _workers_listen_on_loopback_only()
        extra.append("--local-addr=127.0.0.1")
        if (lo := _loopback_interface()) is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)  # the workers inherit it
    try:
        torchrun.main(extra + argv)
    except ChildFailedError as err:  # for the launcher's message: which ranks failed, how
        failures = {rank: [f.local_rank, f.exitcode] for rank, f in err.failures.items()}
        (agent_dir / "failures.json").write_text(json.dumps(failures))
        raise


if __name__ == "__main__":
    _agent_main(sys.argv[1:])

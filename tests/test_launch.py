"""utils.launch: commands, output sorting, errors, timeouts and leftovers; then what a torchrun launch leaves.

The torchrun launches here run tiny jobs whose workers import no torch (except the one that needs a
collective): a job that waits until told, a job where one rank fails. test_ddp_scripts runs real programs.
"""

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from utils import REPO_ROOT
from utils.launch import (
    LaunchResult,
    TorchrunError,
    format_command,
    free_port,
    leftover_processes,
    load_rank_results,
    port_is_free,
    run_commands,
    run_torchrun,
    run_torchrun_nodes,
    torchrun_command,
)

PY = sys.executable


def test_standalone_command():
    cmd = torchrun_command("package.script", 2, ["--out", "x"])
    assert cmd[:3] == [PY, "-m", "torch.distributed.run"]
    assert cmd[3:] == ["--standalone", "--nproc_per_node=2", "-m", "package.script", "--out", "x"]
    assert "--max_restarts=1" in torchrun_command("package.script", 2, max_restarts=1)


def test_script_path_command(tmp_path):
    script = tmp_path / "written_by_a_notebook.py"
    script.write_text("print('hi')\n")
    for given in (script, str(script)):
        cmd = torchrun_command(given, 2)
        assert cmd[-1] == str(script.resolve()) and "-m" not in cmd[3:]


def test_multinode_command_and_format():
    cmd = torchrun_command("package.script", 1, nnodes=2, node_rank=1, master_port=29555)
    assert "--nnodes=2" in cmd and "--node_rank=1" in cmd and "--master_addr=127.0.0.1" in cmd
    text = format_command(cmd, {"A": "1"})
    assert text.startswith("A=1 torchrun --nnodes=2 --node_rank=1")
    assert "--master_port=$PORT" in text and "29555" not in text and PY not in text


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"module": "utils/ddp/no_such_script.py"}, FileNotFoundError),
        ({"module": "package/script"}, ValueError),
        ({"module": 3}, TypeError),
        ({"nproc": 0}, ValueError),
        ({"nproc": 2.0}, TypeError),
        ({"nnodes": 2}, ValueError),  # no master_port
        ({"nnodes": 2, "master_port": 1234, "node_rank": 2}, ValueError),
        ({"max_restarts": -1}, ValueError),
        ({"args": "--out x"}, TypeError),
    ],
)
def test_bad_arguments_are_clear(kwargs, error):
    kwargs = {"module": "package.script", **kwargs}
    with pytest.raises(error):
        torchrun_command(**kwargs)


def test_rank_lines_are_sorted_by_rank_and_stable():
    out = "noise\n[rank 1] b1\n[rank 0] a1\n[rank 10] z\n[rank 1] b2\n[rank 0] a2\n"
    result = LaunchResult(commands=(("x",),), returncode=0, stdout=out, stderr="", wall_s=0.0, launch_id="id")
    assert result.rank_lines() == ["[rank 0] a1", "[rank 0] a2", "[rank 1] b1", "[rank 1] b2", "[rank 10] z"]
    assert result.by_rank()[1] == ["b1", "b2"]


def test_run_commands_captures_output_and_environment():
    code = "import os, sys; print('[rank 0]', os.environ['OMP_NUM_THREADS'], os.getcwd()); print('e', file=sys.stderr)"
    result = run_commands([[PY, "-c", code]], env={"EXTRA": "1"})
    assert result.returncode == 0 and result.rank_lines() == [f"[rank 0] 1 {REPO_ROOT}"]
    assert result.stderr == "e\n" and result.env == (("EXTRA", "1"),)
    assert leftover_processes([result.launch_id]) == []


def test_failure_shows_the_workers_stderr():
    code = "import sys; print('[rank 0] started'); sys.exit('worker exploded: bad batch')"
    with pytest.raises(TorchrunError, match=r"(?s)exit status 1.*worker exploded: bad batch") as info:
        run_commands([[PY, "-c", code]])
    assert info.value.result.rank_lines() == ["[rank 0] started"]
    result = run_commands([[PY, "-c", code]], check=False)  # or inspect it yourself
    assert result.returncode == 1


def test_timeout_kills_the_whole_tree():
    # the "agent" starts a "worker" in a session of its own, as torchrun does, then both hang
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
        "print('[rank 0] hanging', flush=True); time.sleep(60)"
    )
    with pytest.raises(TorchrunError, match="timed out") as info:
        run_commands([[PY, "-c", code]], timeout=3)
    result = info.value.result
    assert result.timed_out and result.rank_lines() == ["[rank 0] hanging"]
    assert leftover_processes([result.launch_id]) == []


def test_run_commands_validates():
    with pytest.raises(ValueError):
        run_commands([])
    with pytest.raises(TypeError):
        run_commands(["python -c 1"])
    with pytest.raises(ValueError):
        run_commands([[PY, "-c", "1"]], timeout=0)
    with pytest.raises(TypeError):
        run_torchrun("package.script", env=["A=1"])


def test_port_is_free():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not port_is_free(port)
    assert port_is_free(port)


def test_load_rank_results(tmp_path):
    import torch

    with pytest.raises(ValueError, match="no rank"):
        load_rank_results(tmp_path)
    with pytest.raises(ValueError, match="not a folder"):
        load_rank_results(tmp_path / "missing")
    for r in (10, 2):
        torch.save({"r": r}, tmp_path / f"rank{r}.pt")
    assert load_rank_results(tmp_path) == {2: {"r": 2}, 10: {"r": 10}}


def test_k12_a_rank_result_that_is_a_pickle_is_refused_naming_the_file(tmp_path):
    """Probe K12's aside: load_rank_results raised torch's raw UnpicklingError, with ANSI codes and no file name."""
    import torch

    torch.save({"f": os.getcwd}, tmp_path / "rank0.pt")  # a function: weights_only refuses it
    with pytest.raises(ValueError, match=r"rank0\.pt cannot be loaded as a rank result \(UnpicklingError: ") as info:
        load_rank_results(tmp_path)
    assert "\x1b[" not in str(info.value)


# --- what a torchrun launch leaves behind (Linux: the checks read /proc) ---------------------------------

linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the checks read /proc")

WAITING_WORKER = """
import json, os, pathlib, socket, sys, time
out = pathlib.Path(sys.argv[1])
held = socket.socket()  # a port the worker holds, as gloo does
held.bind(("127.0.0.1", 0))
held.listen()
info = {"pid": os.getpid(), "agent": os.getppid(), "ports": [int(os.environ["MASTER_PORT"]), held.getsockname()[1]]}
tmp = out / f"rank{os.environ['RANK']}.part"
tmp.write_text(json.dumps(info))
tmp.rename(out / f"rank{os.environ['RANK']}.txt")
deadline = time.monotonic() + 60  # never hangs a test run for long, even when the launch cannot stop it
while not (out / "stop").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def _wait_for(condition, within: float, what: str):
    deadline = time.monotonic() + within
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} not within {within:g} s"
        time.sleep(0.05)
    return value


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _listening(pids) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket that one of ``pids`` holds."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addr, port = fields[1].split(":")
                raw = bytes.fromhex(addr)  # each 32-bit word in host (little-endian) order
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.append((str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


@dataclass
class Job:
    """A launch of WAITING_WORKER on 2 ranks, up and running."""

    agent: int
    workers: list[int]
    listening: list[tuple[str, int]]
    out: Path

    @property
    def pids(self) -> list[int]:
        return [self.agent, *self.workers]


def _job_is_up(out: Path) -> Job:
    """Wait until both workers of WAITING_WORKER have reported; what the job runs and listens on."""

    def reports():
        files = sorted(out.glob("rank*.txt"))
        return len(files) == 2 and [json.loads(f.read_text()) for f in files]

    infos = _wait_for(reports, 60, "both workers up")
    job = Job(agent=infos[0]["agent"], workers=[i["pid"] for i in infos], listening=[], out=out)
    job.listening = _listening(job.pids)
    assert {p for i in infos for p in i["ports"]} <= {port for _, port in job.listening}
    return job


def _assert_stopped(job: Job, within: float = 30):
    """Every process of the job exits and every port it listened on is free again, within a bounded wait."""
    try:
        _wait_for(lambda: not any(_alive(p) for p in job.pids), within, "the agent and workers exited")
        _wait_for(lambda: all(port_is_free(port) for _, port in job.listening), 5, "the job's ports released")
    finally:  # a failing test leaves nothing running either
        for pid in job.pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _kernel_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a stand-in kernel: a temporary directory of its own, so that its launches' folders
    (and the orphans they name) are seen only by the kernels of this test, not by launches running beside it."""
    temp = tmp_path / "kernel_temp"
    temp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(temp)}


@pytest.fixture
def waiting_job(tmp_path):
    """Start a launcher process (a stand-in for a notebook kernel) that runs WAITING_WORKER with run_torchrun."""
    script = tmp_path / "waiting.py"
    script.write_text(WAITING_WORKER)
    code = f"from utils.launch import run_torchrun; run_torchrun({str(script)!r}, nproc=2, args=[{str(tmp_path)!r}])"
    launcher = subprocess.Popen([PY, "-c", code], cwd=REPO_ROOT, env=_kernel_env(tmp_path))
    try:
        yield launcher, _job_is_up(tmp_path)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()


@linux_only
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_killed_launcher_takes_its_job_with_it(waiting_job, sig):
    """The kernel dies (SIGTERM, or SIGKILL as JupyterLab's restart does): its agent and workers follow."""
    launcher, job = waiting_job
    launcher.send_signal(sig)
    launcher.wait()
    _assert_stopped(job)


@linux_only
def test_ln2_an_agent_killed_by_sigkill_leaves_no_worker(waiting_job, tmp_path):
    """Probe LN2: the torchrun agent is killed with SIGKILL (the OOM killer, a user's kill -9) while its launcher
    lives. The launch fails, and no worker or port outlives it (the agent could not stop its workers itself)."""
    launcher, job = waiting_job
    os.kill(job.agent, signal.SIGKILL)
    assert launcher.wait(timeout=60) != 0  # run_torchrun raised TorchrunError (exit status -9)
    _assert_stopped(job, within=15)
    code = "import json; from utils.launch import leftover_processes; print(json.dumps(leftover_processes()))"
    fresh = subprocess.run(
        [PY, "-c", code], cwd=REPO_ROOT, env=_kernel_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert json.loads(fresh.stdout.splitlines()[-1]) == [], fresh.stderr


@linux_only
def test_the_next_kernel_finds_and_stops_what_a_killed_one_left(waiting_job, tmp_path):
    """Kernel and agent killed at once, so nothing stopped the workers: a new process finds them and stops them."""
    launcher, job = waiting_job
    os.kill(job.agent, signal.SIGSTOP)  # the agent cannot react, and the launcher sees it still running
    launcher.kill()
    launcher.wait()
    os.kill(job.agent, signal.SIGKILL)
    assert all(_alive(p) for p in job.workers)  # orphans, still listening on their ports
    code = (
        "import json, sys; from utils.launch import leftover_processes, run_commands; "
        "before = leftover_processes(); run_commands([[sys.executable, '-c', 'pass']]); "
        "print(json.dumps([before, leftover_processes()]))"
    )
    new_kernel = subprocess.run(
        [PY, "-c", code], cwd=REPO_ROOT, env=_kernel_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert new_kernel.returncode == 0, new_kernel.stderr
    before, after = json.loads(new_kernel.stdout.splitlines()[-1])
    assert set(job.workers) <= set(before), "leftover_processes() in a new process must list the orphans"
    assert not set(job.workers) & set(after), "the next launch stops them"
    _assert_stopped(job, within=10)
    assert not list((tmp_path / "kernel_temp").glob("torch-course-launches-*/*")), "and removes their folders"


@linux_only
def test_a_single_machine_launch_listens_on_loopback_only_and_leaves_no_temp_folder(tmp_path):
    script = tmp_path / "waiting.py"
    script.write_text(WAITING_WORKER)
    temp = tmp_path / "temp"
    temp.mkdir()
    results = []
    launch = threading.Thread(
        target=lambda: results.append(
            run_torchrun(script, nproc=2, args=[tmp_path], env={"TMPDIR": str(temp)}, timeout=120)
        )
    )
    launch.start()
    try:
        job = _job_is_up(tmp_path)
    finally:
        (tmp_path / "stop").touch()
        launch.join()
    assert job.listening and all(_is_loopback(addr) for addr, _ in job.listening), job.listening
    [result] = results
    assert result.returncode == 0
    assert not list(temp.iterdir()), "torchrun's log folder (torchelastic_*) must be removed after the launch"
    assert not leftover_processes([result.launch_id])


GROUP_WORKER = WAITING_WORKER.replace(
    "held = socket.socket()",
    "import torch.distributed as dist\ndist.init_process_group('gloo')  # rank 0 hosts the workers' store here\n"
    "held = socket.socket()",
)


@linux_only
def test_l10_with_max_restarts_the_workers_store_listens_on_loopback_only(tmp_path):
    """Probe L10: with max_restarts (notebook 08 section 6) the workers do not share the agent's store; rank 0
    starts one in init_process_group, which listened on every interface (*:PORT)."""
    script = tmp_path / "group.py"
    script.write_text(GROUP_WORKER)
    temp = tmp_path / "temp"
    temp.mkdir()
    results = []
    launch = threading.Thread(
        target=lambda: results.append(
            run_torchrun(script, nproc=2, args=[tmp_path], max_restarts=1, env={"TMPDIR": str(temp)}, timeout=120)
        )
    )
    launch.start()
    try:
        job = _job_is_up(tmp_path)
    finally:
        (tmp_path / "stop").touch()
        launch.join()
    [result] = results
    assert result.returncode == 0, result.stderr
    worker_ports = {p for i in tmp_path.glob("rank*.txt") for p in json.loads(i.read_text())["ports"][:1]}
    assert worker_ports <= {port for _, port in job.listening}, "rank 0 hosts the workers' store on MASTER_PORT"
    assert job.listening and all(_is_loopback(addr) for addr, _ in job.listening), job.listening


def test_a_busy_master_port_fails_fast_and_names_the_port(tmp_path):
    script = tmp_path / "hi.py"
    script.write_text("print('hi')\n")
    timeout = 120  # starting two agents (each imports torch) takes seconds; a busy machine can make it 30
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(TorchrunError, match=rf"master_port {port} is already in use") as info:
            run_torchrun_nodes(script, nnodes=2, master_port=port, timeout=timeout)
        elapsed = time.monotonic() - start
    assert elapsed < timeout / 2, f"waited {elapsed:.0f} s for a launch that failed at once"
    assert leftover_processes([info.value.result.launch_id]) == []


FAILING_RANK = """
import atexit, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    # rank 1 stays alive (its sockets open) for 0.3 s after writing its traceback: rank 0's traceback comes
    # later than that, beyond the granularity of file times (a few ms) however idle or busy the machine is
    atexit.register(time.sleep, 0.3)
    raise ValueError("boom")
dist.all_reduce(torch.ones(1))  # rank 0 waits for rank 1, which has died: rank 0 fails too
"""


def test_the_error_shows_the_first_failing_rank_and_its_traceback(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(FAILING_RANK)
    with pytest.raises(TorchrunError) as info:
        run_torchrun(script, nproc=2, timeout=120)
    message = str(info.value)
    assert "rank 1 failed first" in message, message
    assert 'raise ValueError("boom")' in message and "ValueError: boom" in message, message
    assert leftover_processes([info.value.result.launch_id]) == []


def test_the_loopback_patch_fits_this_torch():
    """utils.launch hands torchrun's stores a loopback socket by wrapping TCPStore where torchrun looks it up: if a
    torch release moves those names or changes the constructor, this fails here rather than silently elsewhere."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, static_tcp_rendezvous

    from utils.launch import tcpstore_parameters

    params = tcpstore_parameters()
    assert params[:4] == ("host_name", "port", "world_size", "is_master") and "master_listen_fd" in params
    assert c10d_rendezvous_backend.TCPStore is static_tcp_rendezvous.TCPStore is dist.TCPStore

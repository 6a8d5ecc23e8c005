"""utils.launch: commands, output sorting, errors, timeouts and leftovers (no torchrun here: see test_ddp_scripts)."""

import socket
import sys

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
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
            "print('[rank 0] hanging', flush=True); time.sleep(60)")
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

"""benchmarks/gpu_check.py: its CPU smoke run goes through every code path of the GPU check (the
speed table, the grad-norm throughput, every command), and a failing command fails the check loudly."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
COMMANDS = ("train", "ood", "calibrate", "eval", "robust", "sample")


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_check

    return gpu_check


@pytest.mark.slow
def test_smoke_run_on_cpu_goes_through_every_step():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--smoke", "--device", "cpu"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for name in COMMANDS:
        assert any(line.startswith(f"ok      {name} (") for line in lines), (name, done.stdout)
    assert any(line.startswith("ok      report (") for line in lines) or "skipped: no report command" in lines
    table = [line for line in lines if line.startswith("| ") and "x |" in line]
    names = [line.split(" | ")[0][2:] for line in table]
    assert names[:3] == ["release (buffer on host, 3 forwards)", "TrainStep fp32", "TrainStep + channels_last"]
    assert any(n.startswith("Trainer loop") for n in names) and any(n.startswith("`jemeval train`") for n in names)
    assert "TrainStep + channels_last, 2 calls back to back" in names  # the loop-like comparator (bf16: CUDA only)
    assert table[0].split(" | ")[2] == "1.00x"
    # every iteration row: the step's counted FLOPs over its time, beside a large matmul's rate
    assert "| model TFLOP/s |" in done.stdout and "float32 matmul on this device: " in done.stdout
    iteration = [line for line in table if not line.startswith("| jemeval gradnorm") and "release-style" not in line]
    assert all(float(line.rstrip(" |").rsplit("| ", 1)[1]) > 0 for line in iteration), iteration
    assert any(n.startswith("jemeval gradnorm, fp32") for n in names)


def test_a_failing_command_is_recorded_with_its_stderr(gpu_check, tmp_path, capsys):
    failures: list = []
    argv = gpu_check.jemeval_command("ood", "--model", tmp_path / "missing.pt", "--ood", "uniform")
    assert gpu_check.run_command("ood", argv, failures) is None
    assert capsys.readouterr().out.startswith("FAILED  ood (exit 1")  # a missing file: exit 1
    (command, stderr), = failures
    assert command.endswith("--ood uniform") and "missing.pt" in stderr
    assert gpu_check.run_command("list", gpu_check.jemeval_command("list"), failures) is not None
    assert len(failures) == 1

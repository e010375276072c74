"""scripts/gpu-check: passes on a CPU-only machine by saying what it skipped, and its checks' code runs.

The GPU checks compare a device against the CPU; run with the CPU as the "device" they exercise the same
code (the real ExpertBackend, its pools and Adam step), so a broken check is found here and not in the
few minutes a GPU machine is lent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lah import gpu_check

REPO = Path(__file__).resolve().parents[3]


def test_backend_check_code_runs_against_the_cpu() -> None:
    figures = gpu_check.check_backend("cpu")
    assert set(figures) == {
        f"{a}_{d}" for a in ("ffn", "transformer") for d in ("float32", "float16", "bfloat16")
    }
    for errors in figures.values():
        assert errors["forward"] == 0.0 and errors["backward"] == 0.0 and errors["param_grads"] == 0.0
        assert 0.5 < errors["step_max_move_over_lr"] <= 1.5  # Adam's first step: about lr per weight


def test_fused_check_code_runs_against_the_cpu() -> None:
    figures = gpu_check.check_fused("cpu", experts=4, rounds=3)
    assert figures["experts"] == 4 and figures["weights_max_relative_diff"] <= 2e-3
    assert figures["together_ms_per_round"] > 0 and figures["alone_ms_per_round"] > 0


def test_compute_check_counts_samples() -> None:
    figures = gpu_check.check_compute(0.5, device="cpu", warmup_s=0.2)
    assert figures["backend_sps"] > 0 and figures["batch"] == 256


def test_stage_check_code_runs_small_on_the_cpu() -> None:
    figures = gpu_check.check_stage("cpu", smoke=True, calls=1)
    assert figures["spec"]["arch"] == "stage" and figures["spec"]["depth"] == 2
    assert figures["gflop_per_call"] > 0 and figures["tflops"] > 0 and figures["recomputed_samples"] == 0
    # the same formula as benchmarks/compute_per_byte.py: 8-bit carries about twice float16's FLOPs a byte
    assert 1.8 < figures["flops_per_upload_byte_int8"] / figures["flops_per_upload_byte_float16"] < 2.0
    assert 0 < figures["busy_share_formula_float16"] < figures["busy_share_formula_int8"] < 1


def test_script_cpu_smoke_runs_the_stage_check_alone(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = subprocess.run(
        ["bash", "scripts/gpu-check", "--cpu-smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert set(report) == {"environment", "stage", "passed"} and report["passed"] is True
    assert report["stage"]["status"] == "ok" and report["stage"]["device"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the checks run instead")
def test_script_passes_without_a_gpu_and_says_what_it_skipped(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = subprocess.run(
        ["bash", "scripts/gpu-check", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert json.loads(proc.stdout.splitlines()[-1]) == report
    assert report["passed"] is True and report["environment"]["status"] == "ok"
    for name in (
        "nvml",
        "backend",
        "fused",
        "memory_cap",
        "release",
        "compute",
        "stage",
        "expert_throughput",
    ):
        assert report[name]["status"] == "skipped" and "no CUDA device" in report[name]["reason"]

"""What only a GPU can tell: the CUDA paths of the node, checked on a real device in one short run.

``scripts/gpu-check`` runs this. On a machine without CUDA every GPU check says that it was skipped and
why, and the run passes: the script must be ready for the day a GPU machine is lent, and CI keeps it from
rotting. On a GPU it checks, in order of what a volunteer would notice first:

1. ``nvml``: the readings the governor decides on (utilisation, temperature, memory, power) through the
   node's own :class:`~engine.resources.sensors.NvmlGpu`, not a separate probe.
2. ``backend``: each expert architecture's forward and backward on CUDA through the real
   :class:`~engine.moe.backend.ExpertBackend` (batching pools, worker thread, Adam step), against the same
   expert on the CPU from the same weights; float16 and bfloat16 inputs as they come off the wire.
   ``fused``: 32 experts' backward batches as a host runs them when they are ready together (one
   autograd call, one foreach clipping and Adam pass) against each expert alone: the same weights, and
   how much faster (:mod:`lah.gpu_backend` holds both).
3. ``memory_cap``: the volunteer's GPU memory budget (``apply_torch_limits``) refuses an allocation above it.
4. ``release``: a node's pause (``Hosting.release_memory``) gives the experts' memory back to the driver,
   measured by the driver (``cudaMemGetInfo``) and NVML before and after, and ``restore_memory`` brings the
   same weights back (the outputs before and after agree).
5. ``compute``: samples/s of one d=1024 FFN expert through the real backend on the GPU: the host's ceiling.
6. ``stage``: the stage expert of issue 33 at the size a 24 GB GPU holds (:mod:`lah.gpu_stage`): FLOP/s,
   peak memory against the plan, FLOPs per uploaded byte and the busy share behind a home uplink.
   ``--cpu-smoke`` runs only this check, on the CPU at a small size: the code path without a GPU.
7. ``expert_throughput`` (unless ``--no-bench``): ``benchmarks/expert_throughput.py`` on this device and
   ``benchmarks/transport.py --quick``; their ratio is the wire bound, the samples/s the link allows at the
   bytes per sample it measured, which shows whether the GPU or the link limits a volunteer.

The last line printed is one JSON object; ``--out`` also writes it to a file. Exit status 1 when a check
that ran failed, 0 otherwise (skips included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .gpu_backend import CheckFailed, Skip, check_backend, check_fused, cuda
from .gpu_stage import check_stage

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def _driver_used_bytes() -> int:
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def _nvml_process_bytes() -> int | None:
    """This process's GPU memory as NVML sees it; None where the driver hides pids (containers, VMs)."""
    try:
        import pynvml  # type: ignore[import-untyped]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except Exception:
        return None
    return None


# -- checks ------------------------------------------------------------------------------------------


def check_environment() -> dict[str, Any]:
    figures: dict[str, Any] = {"torch": torch.__version__, "cuda_build": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        figures |= {
            "device": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
        }
    else:
        figures["device"] = "cpu"
    # What float32 matmuls may round to: TF32 would explain CPU/CUDA differences near 1e-3.
    figures["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    figures["cublas_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
    figures["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
    return figures


def check_nvml() -> dict[str, Any]:
    cuda()
    from engine.resources.sensors import NvmlGpu

    gpu = NvmlGpu(0)
    try:
        torch.ones(1 << 20, device="cuda").sum().item()  # some work, so utilisation and power are live
        reading = gpu.read()
    finally:
        gpu.close()
    if not reading.present:
        raise CheckFailed(f"NVML read nothing: {reading.reason}")
    missing = [
        name
        for name in (
            "utilization_percent",
            "temperature_c",
            "memory_used_bytes",
            "memory_total_bytes",
            "power_w",
        )
        if getattr(reading, name) is None
    ]
    if missing:
        raise CheckFailed(f"NVML gave no {', '.join(missing)} for {reading.name}")
    return {
        "name": reading.name,
        "utilization_percent": reading.utilization_percent,
        "other_utilization_percent": reading.other_utilization_percent,
        "temperature_c": reading.temperature_c,
        "memory_used_mib": round((reading.memory_used_bytes or 0) / MIB),
        "memory_total_mib": round((reading.memory_total_bytes or 0) / MIB),
        "power_w": reading.power_w,
    }


def check_memory_cap() -> dict[str, Any]:
    cuda()
    from engine.resources.limits import apply_torch_limits
    from engine.resources.settings import Settings

    total = torch.cuda.get_device_properties(0).total_memory
    budget_mib = 2048
    apply_torch_limits(Settings(gpu_memory_budget_mib=budget_mib))
    try:
        small = torch.empty(budget_mib // 2 * MIB, dtype=torch.uint8, device="cuda")
        del small
        try:
            big = torch.empty(budget_mib * 2 * MIB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            refused = True
        else:
            del big
            refused = False
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
    if not refused:
        raise CheckFailed(f"a {budget_mib} MiB budget let {2 * budget_mib} MiB be allocated")
    return {
        "budget_mib": budget_mib,
        "fraction": round(budget_mib * MIB / total, 4),
        "over_budget_refused": True,
    }


async def _release_cycle(experts: int, batch: int) -> dict[str, Any]:
    from engine.moe import ExpertSpec
    from engine.node.gate import WorkGate
    from engine.node.hosting import Hosting
    from engine.p2p import Handlers

    specs = {f"ffn.{i}": ExpertSpec("ffn", dim=1024) for i in range(experts)}
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"lah-gpu-check-{os.getpid()}"
    hosting = Hosting(Handlers(), WorkGate(), tmp, torch.device("cuda", 0), checkpoint_interval_s=3600)
    torch.cuda.synchronize()
    base, base_nvml = _driver_used_bytes(), _nvml_process_bytes()
    await hosting.apply(specs)
    server = hosting.server
    assert server is not None
    probe = torch.randn(batch, 1024, generator=torch.Generator().manual_seed(2))
    for uid, backend in server.experts.items():
        await backend.forward("t", uid, probe)
        await backend.backward("t", uid, torch.randn_like(probe))
    before = {uid: await b.forward("t", "check", probe) for uid, b in server.experts.items()}
    torch.cuda.synchronize()
    loaded, loaded_nvml = _driver_used_bytes(), _nvml_process_bytes()
    t0 = time.perf_counter()
    await hosting.release_memory()
    release_s = time.perf_counter() - t0
    released, released_nvml = _driver_used_bytes(), _nvml_process_bytes()
    t0 = time.perf_counter()
    await hosting.restore_memory()
    restore_s = time.perf_counter() - t0
    after = {uid: await b.forward("t", "check2", probe) for uid, b in server.experts.items()}
    await hosting.close()
    drift = max(float((after[u] - before[u]).abs().max()) for u in before)
    held = loaded - base
    kept = released - base
    figures = {
        "experts": experts,
        "loaded_mib": round(held / MIB),
        "after_release_mib": round(kept / MIB),
        "released_fraction": round(1 - kept / held, 3) if held > 0 else None,
        "release_s": round(release_s, 3),
        "restore_s": round(restore_s, 3),
        "nvml_process_mib": [
            None if v is None else round(v / MIB) for v in (base_nvml, loaded_nvml, released_nvml)
        ],
        "outputs_drift_after_restore": drift,
    }
    if held <= 0 or kept > 0.1 * held + 64 * MIB:
        raise CheckFailed(f"pause kept {kept / MIB:.0f} of {held / MIB:.0f} MiB on the GPU: {figures}")
    if drift > 1e-5:
        raise CheckFailed(f"outputs changed across release/restore by {drift:.2e}")
    return figures


def check_release() -> dict[str, Any]:
    cuda()
    return asyncio.run(_release_cycle(experts=8, batch=256))


async def _compute_sps(
    seconds: float, batch: int, in_flight: int, device: str, warmup_s: float
) -> dict[str, Any]:
    from engine.moe import ExpertSpec
    from engine.moe.backend import ExpertBackend

    backend = ExpertBackend("ffn.0", ExpertSpec("ffn", dim=1024), device=device, seed=0)
    x = torch.randn(batch, 1024)
    done = 0

    async def worker(w: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < deadline:
            aid = f"w{w}.{i}"
            out = await backend.forward("t", aid, x)
            await backend.backward("t", aid, out)
            done += batch
            i += 1

    try:
        deadline = time.perf_counter() + warmup_s  # warm-up: kernels, cuBLAS handles, the allocator
        await asyncio.gather(*(worker(w) for w in range(in_flight)))
        done = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        await asyncio.gather(*(worker(w) for w in range(in_flight)))
        return {
            "backend_sps": round(done / (time.perf_counter() - t0)),
            "batch": batch,
            "in_flight": in_flight,
        }
    finally:
        await backend.close()


def check_compute(seconds: float, device: str | None = None, warmup_s: float = 2.0) -> dict[str, Any]:
    device = device or str(cuda())
    return asyncio.run(_compute_sps(seconds, 256, 4, device, warmup_s))


def _bench(args: list[str], timeout: float) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise CheckFailed(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def check_expert_throughput(quick: bool) -> dict[str, Any]:
    device = cuda()
    help_text = subprocess.run(
        [sys.executable, "benchmarks/expert_throughput.py", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout
    args = ["benchmarks/expert_throughput.py", "--quick"] if quick else ["benchmarks/expert_throughput.py"]
    if "--device" in help_text:
        args += ["--device", str(device)]
    experts = _bench(args, timeout=400)
    transport = _bench(["benchmarks/transport.py", "--quick"], timeout=300)
    figures: dict[str, Any] = {"expert_throughput": experts, "transport": transport}
    link = next((transport[k] for k in ("project_MBps", "ours_MBps", "MBps") if k in transport), None)
    per_sample = experts.get("wire_bytes_per_sample")
    if isinstance(link, int | float) and isinstance(per_sample, int | float) and per_sample > 0:
        bound = link * 1e6 / per_sample
        figures["wire_bound_sps"] = round(bound)
        figures["remote_over_wire_bound"] = round(float(experts.get("remote_sps", 0)) / bound, 3)
    return figures


# -- the run -------------------------------------------------------------------------------------------


def run(quick: bool, bench: bool, cpu_smoke: bool = False) -> tuple[dict[str, Any], bool]:
    checks: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("environment", check_environment),
        ("nvml", check_nvml),
        ("backend", check_backend),
        ("fused", check_fused),
        ("memory_cap", check_memory_cap),
        ("release", check_release),
        ("compute", lambda: check_compute(3.0 if quick else 10.0)),
        ("stage", lambda: check_stage(cuda())),
    ]
    if cpu_smoke:
        checks = [("environment", check_environment), ("stage", lambda: check_stage("cpu", smoke=True))]
    elif bench:
        checks.append(("expert_throughput", lambda: check_expert_throughput(quick)))
    report: dict[str, Any] = {}
    ok = True
    for name, check in checks:
        t0 = time.perf_counter()
        try:
            figures = check()
        except Skip as e:
            report[name] = {"status": "skipped", "reason": str(e)}
        except Exception as e:
            ok = False
            detail = str(e) if isinstance(e, CheckFailed) else traceback.format_exc(limit=6)
            report[name] = {"status": "failed", "reason": detail}
        else:
            report[name] = {"status": "ok", **figures}
        report[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{name}: {report[name]['status']} ({report[name]['seconds']} s)", flush=True)
        if report[name]["status"] != "ok":
            print(f"  {report[name]['reason']}", flush=True)
    return report, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter timings and the benchmarks' --quick")
    parser.add_argument("--no-bench", action="store_true", help="skip the throughput benchmarks")
    parser.add_argument("--out", type=Path, help="also write the JSON report to this file")
    parser.add_argument("--cpu-smoke", action="store_true", help="only the stage check, small, on the CPU")
    args = parser.parse_args(argv)
    report, ok = run(args.quick, not args.no_bench, args.cpu_smoke)
    report["passed"] = ok
    line = json.dumps(report)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

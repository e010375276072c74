"""FLOPs per uploaded byte: stage experts against today's FFN experts, on real calls (issue 33, item 1).

Why: a volunteer's GPU behind a home uplink of U bytes/s doing F FLOP/s is busy a share s of the time only
if each byte it uploads carries ``s * F / U`` FLOPs: 1.6e7 for s = 0.5, F = 80 TFLOP/s (a 24 GB consumer
GPU at about half its bf16 peak) and U = 2.5 MB/s (20 Mb/s).

Method. Every case is a real call through the real stack: the trainer's ``RemoteExpert.call_forward`` and
``call_backward`` (float16 or 8-bit on the wire) -> Peer -> WebRTC data channel on loopback (the project's
aiortc patches) -> ``ExpertServer`` -> ``ExpertBackend`` (batching, kept graphs, Adam step), the host in a
process of its own as a volunteer's node is. The host's worker thread runs under torch's FLOP counter
(``torch.utils.flop_counter.FlopCounterMode`` via :func:`engine.moe.stage.flop_counter`, which also counts
the CPU's fused attention with torch's own formula for the CUDA kernels), so what is counted is what the
host computed: forward and backward (the Adam step is not a matmul and counts nothing). The bytes are the
host's upload as the transport counts them: DTLS bytes sent (UDP payloads: records of SCTP packets, the
acknowledgements of what it downloads included) and, beside them, data-channel frame bytes. Each figure
is one window of ``--calls`` forward+backward calls after a warm-up call, ``--repeat`` windows a case
(cases interleaved), median and spread printed.

Cases: today's FFN expert (d=1024, hidden 4096), the language model's default expert (``LmConfig``'s:
d=128, hidden 128) and stages (:mod:`engine.moe.stage`) at three sizes a CPU runs in seconds. Each is
compared with a formula: FLOPs from :func:`~engine.moe.stage.stage_flops_per_token` (``12 d h`` a row for
an FFN), bytes as the two tensors the host sends per token (output, input gradient) in the wire format
(float16: 2 bytes a value; 8-bit: 1 byte plus a float32 scale per row block), times the transport's
overhead per payload byte (SCTP, DTLS and UDP headers per packet, acknowledgements, message headers:
:data:`TRANSPORT_OVERHEAD`, measured on the FFN baseline in the same run, not fitted to the stages).
The formula must match every measured stage within 10%; then it gives the figure at the size a 24 GB
GPU holds (:func:`engine.moe.stage_fit.largest_stage` for a budget of ``--budget-gib``) without running
it. ``gpu_busy_share_formula`` is ``min(1, flops_per_upload_byte * 2.5e6 / 8e13)``: a formula, not the
emulated home link of the issue's item 4.

    .venv/bin/python benchmarks/compute_per_byte.py            # about two minutes on two cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from expert_figures import stats  # benchmarks/ is first on sys.path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

UPLINK_BPS = 2.5e6  # 20 Mb/s, near the US median upload
GPU_FLOPS = 8e13  # a 24 GB consumer GPU at about half its bf16 peak
TARGET = 1.6e7  # FLOPs per uploaded byte for a share of 0.5
UID = "bench.0"

#: name -> (ExpertSpec fields, samples a call); stages at three sizes, then the two FFN baselines.
CASES: dict[str, tuple[dict[str, Any], int]] = {
    "stage_s1": ({"arch": "stage", "dim": 64, "hidden": 256, "heads": 4, "seq_len": 32, "depth": 2}, 4),
    "stage_s2": ({"arch": "stage", "dim": 128, "hidden": 512, "heads": 4, "seq_len": 64, "depth": 4}, 4),
    "stage_s3": ({"arch": "stage", "dim": 256, "hidden": 1024, "heads": 8, "seq_len": 128, "depth": 6}, 4),
    "ffn_1024": ({"arch": "ffn", "dim": 1024, "hidden": 4096, "heads": 1, "seq_len": 0}, 256),
    "ffn_lm": ({"arch": "ffn", "dim": 128, "hidden": 128, "heads": 1, "seq_len": 0}, 1024),
}


def _stack() -> None:
    from engine.p2p import patches

    patches.pin_host_addresses(["127.0.0.1"])
    patches.install(strict=True)


# -- the host process --------------------------------------------------------------------------------


def _host_main(ctl: Connection, url: str, fields: dict[str, Any]) -> None:
    import torch

    from engine.p2p import eventloop

    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    _stack()
    eventloop.run(_host(ctl, url, fields))


async def _host(ctl: Connection, url: str, fields: dict[str, Any]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from engine.moe import ActivationCache, ExpertBackend, ExpertServer, ExpertSpec
    from engine.moe.stage import flop_counter
    from engine.p2p import Handlers, Identity, LinkConfig, Peer

    counter = flop_counter()
    # The counter is a dispatch mode, which is per thread: entered on the one worker thread that runs
    # every forward and backward of this host (CPU autograd runs there too), and never left.
    executor = ThreadPoolExecutor(1, thread_name_prefix="experts-cpu", initializer=counter.__enter__)
    backend = ExpertBackend(
        UID,
        ExpertSpec.from_fields(fields),
        device="cpu",
        executor=executor,
        graphs=ActivationCache(4 << 30),  # every graph kept: no recomputed forward in the counts
        seed=0,
        max_request_samples=4096,
    )
    server = ExpertServer({UID: backend})
    handlers = Handlers()
    server.register(handlers)
    host = Peer(Identity.generate(), url, handlers=handlers, config=LinkConfig())
    await host.start()
    ctl.send({"peer_id": host.peer_id})
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, ctl.recv) == "mark":
        links = list(host.links.values())
        ctl.send(
            {
                "flops": int(counter.get_total_flops()),
                "dtls_tx": sum(link.pc.sctp.transport._RTCDtlsTransport__tx_bytes for link in links),
                "channel_tx": sum(link.rpc.channel.bytes_sent for link in links),
                "recomputed": backend.stats.recomputed_samples,
                "errors": backend.stats.errors,
            }
        )
    await host.stop()
    await server.close()
    executor.shutdown()


# -- the trainer (this process) ----------------------------------------------------------------------


class Trainer:
    """One trainer Peer on a LoopThread, calling whichever host a case runs on."""

    def __init__(self, url: str) -> None:
        from engine.moe import LoopThread
        from engine.p2p import Identity, LinkConfig, Peer

        self.loop = LoopThread("trainer-loop")
        self.peer = Peer(Identity.generate(), url, config=LinkConfig())
        self.loop.run(self.peer.start(), 60)

    def calls(self, host_id: str, spec: Any, batch: int, wire: str, n: int) -> None:
        import torch

        from engine.moe import RemoteExpert, new_activation_id

        expert = RemoteExpert(self.peer, host_id, UID, loop=self.loop, timeout=300, wire=wire)
        shape = (batch, spec.seq_len, spec.dim) if spec.arch == "stage" else (batch, spec.dim)
        gen = torch.Generator().manual_seed(0)
        x = expert.to_wire(torch.randn(shape, generator=gen))
        g = expert.to_wire(torch.randn(shape, generator=gen) * 1e-2)

        async def run() -> None:
            for _ in range(n):
                aid = new_activation_id()
                await expert.call_forward(aid, x)
                await expert.call_backward(aid, g, x)

        self.loop.run(run(), 300 + 60 * n)

    def close(self) -> None:
        self.loop.run(self.peer.stop(), 30)
        self.loop.close()


def _mark(ctl: Connection) -> dict[str, int]:
    ctl.send("mark")
    assert ctl.poll(60), "host did not answer a mark"
    got: dict[str, int] = ctl.recv()
    return got


def window(trainer: Trainer, ctl: Connection, host_id: str, spec: Any, batch: int, wire: str, n: int) -> Any:
    trainer.calls(host_id, spec, batch, wire, 1)  # warm-up: the link, the wire format, the allocator
    m0 = _mark(ctl)
    t0 = time.perf_counter()
    trainer.calls(host_id, spec, batch, wire, n)
    seconds = time.perf_counter() - t0
    m1 = _mark(ctl)
    d = {k: m1[k] - m0[k] for k in m0}
    assert d["recomputed"] == 0 and d["errors"] == 0, f"host recomputed or failed: {d}"
    tokens = n * batch * (spec.seq_len if spec.arch == "stage" else 1)
    return {
        "flops": d["flops"],
        "tokens": tokens,
        "dtls_tx": d["dtls_tx"],
        "channel_tx": d["channel_tx"],
        "seconds": seconds,
    }


# -- formulas ----------------------------------------------------------------------------------------


def flops_per_token(spec: Any) -> int:
    from engine.moe.stage import stage_flops_per_token

    if spec.arch == "stage":
        return stage_flops_per_token(spec.dim, spec.hidden_size, spec.depth, spec.seq_len)
    return 12 * spec.dim * spec.hidden_size


def payload_per_token(spec: Any, wire: str) -> float:
    """Tensor bytes the host uploads per token: its output and the input gradient, in ``wire``."""
    from engine.wire.compression import int8_payload_nbytes, row_block_size

    if wire == "float16":
        return 2 * 2 * spec.dim
    rows = 1024  # per-row blocks: the scale's share does not depend on how many rows a call has
    return 2 * int8_payload_nbytes(rows * spec.dim, row_block_size((rows, spec.dim))) / rows


def formula(spec: Any, wire: str, overhead: float) -> float:
    return flops_per_token(spec) / (payload_per_token(spec, wire) * (1 + overhead))


def busy(fpb: float) -> float:
    return round(min(1.0, fpb * UPLINK_BPS / GPU_FLOPS), 5)


def _design(d: int, heads: int, seq: int, budget: int, wire: str, overhead: float) -> dict[str, Any]:
    from engine.moe.stage_fit import largest_stage

    spec = largest_stage(d, heads, budget, seq_len=seq, batch_tokens=seq)
    fpb = formula(spec, wire, overhead)
    return {
        "dim": d,
        "seq_len": seq,
        "depth": spec.depth,
        "flops_per_upload_byte": round(fpb),
        "busy": busy(fpb),
    }


# -- the run -----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--calls", type=int, default=3, help="forward+backward calls a window (3)")
    parser.add_argument("--repeat", type=int, default=3, help="windows a case, cases interleaved (3)")
    parser.add_argument("--wire", default="float16,int8", help="wire formats, comma-separated")
    parser.add_argument("--budget-gib", type=float, default=20.0, help="a 24 GB GPU's budget for its stage")
    parser.add_argument("--quick", action="store_true", help="one window of two calls a case")
    opts = parser.parse_args()
    if opts.quick:
        opts.calls, opts.repeat = 2, 1
    wires = opts.wire.split(",")

    from hub import signaling_hub_thread

    from engine.moe import ExpertSpec
    from engine.moe.stage_fit import largest_stage, stage_memory

    _stack()
    url, stop_hub = signaling_hub_thread()
    ctx = mp.get_context("spawn")
    hosts: dict[str, tuple[Any, Connection, str]] = {}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {(c, w): [] for c in CASES for w in wires}
    trainer = Trainer(url)
    try:
        for name, (fields, _) in CASES.items():
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_host_main, args=(child, url, fields))
            proc.start()
            assert parent.poll(120), f"host of {name} did not start"
            hosts[name] = (proc, parent, parent.recv()["peer_id"])
        for r in range(opts.repeat):
            order = list(CASES)
            for name in order[r % len(order) :] + order[: r % len(order)]:
                fields, batch = CASES[name]
                spec = ExpertSpec.from_fields(fields)
                for wire in wires:
                    _, ctl, host_id = hosts[name]
                    got = window(trainer, ctl, host_id, spec, batch, wire, opts.calls)
                    runs[(name, wire)].append(got)
                    print(
                        f"  round {r + 1}/{opts.repeat} {name} {wire}: {got['flops'] / got['dtls_tx']:.4g} "
                        f"FLOPs per uploaded byte ({got['flops'] / 1e9:.2f} GFLOP, {got['dtls_tx']} B up, "
                        f"{got['seconds']:.1f} s)",
                        flush=True,
                    )
    finally:
        trainer.close()
        for proc, ctl, _ in hosts.values():
            ctl.send("stop")
            proc.join(60)
            if proc.is_alive():
                proc.kill()
        stop_hub.set()

    result: dict[str, Any] = {"calls": opts.calls, "repeat": opts.repeat, "cpus": os.cpu_count()}
    cases: dict[str, Any] = {}
    for (name, wire), windows in runs.items():
        spec = ExpertSpec.from_fields(CASES[name][0])
        fpb = [w["flops"] / w["dtls_tx"] for w in windows]
        payload = [w["tokens"] * payload_per_token(spec, wire) for w in windows]
        overhead = [w["dtls_tx"] / p - 1 for w, p in zip(windows, payload, strict=True)]
        counted = [w["flops"] / (w["tokens"] * flops_per_token(spec)) for w in windows]
        cases[f"{name}_{wire}"] = {
            "spec": CASES[name][0],
            "flops_per_upload_byte": stats(fpb),
            "flops_per_token": flops_per_token(spec),
            "counted_over_formula_flops": round(statistics.median(counted), 6),
            "upload_bytes_per_token": round(statistics.median(w["dtls_tx"] / w["tokens"] for w in windows)),
            "channel_bytes_per_token": round(
                statistics.median(w["channel_tx"] / w["tokens"] for w in windows)
            ),
            "transport_overhead": round(statistics.median(overhead), 4),
            "gpu_busy_share_formula": busy(statistics.median(fpb)),
        }
    result["cases"] = cases
    checks: dict[str, Any] = {}
    for wire in wires:
        # The transport's overhead per payload byte, from the big FFN's windows (the stages' own bytes
        # are what the formula is checked against, so they do not set it).
        over = cases[f"ffn_1024_{wire}"]["transport_overhead"]
        worst = 0.0
        for name in ("stage_s1", "stage_s2", "stage_s3"):
            spec = ExpertSpec.from_fields(CASES[name][0])
            measured = cases[f"{name}_{wire}"]["flops_per_upload_byte"]["median"]
            predicted = formula(spec, wire, over)
            cases[f"{name}_{wire}"]["formula"] = round(predicted, 1)
            worst = max(worst, abs(measured / predicted - 1))
        budget = int(opts.budget_gib * (1 << 30))
        big = largest_stage(1024, 16, budget, seq_len=1024, batch_tokens=1024)
        at_24gb = formula(big, wire, over)
        checks[wire] = {
            "transport_overhead": over,
            "formula_worst_error": round(worst, 4),
            "formula_within_10pct": worst <= 0.10,
            "stage_24gb": {
                **big.to_fields(),
                "batch_tokens": 1024,
                "memory": stage_memory(big, batch_tokens=1024).describe(),
            },
            "flops_per_upload_byte_24gb": round(at_24gb),
            "gpu_busy_share_formula_24gb": busy(at_24gb),
            "meets_1.6e7": at_24gb >= TARGET,
        }
    result["by_wire"] = checks
    best = max(wires, key=lambda w: checks[w]["flops_per_upload_byte_24gb"])
    ffn, lm = cases[f"ffn_1024_{best}"], cases[f"ffn_lm_{best}"]
    # Other widths in the same budget (the formula, with this run's overhead): thinner and deeper carries
    # more FLOPs a byte, since memory grows with depth * d^2 and FLOPs a byte with depth * d.
    result["designs_24gb"] = [
        _design(d, heads, seq, budget, best, checks[best]["transport_overhead"])
        for d, heads in ((256, 4), (512, 8), (1024, 16), (2048, 16))
        for seq in (1024, 4096)
    ]
    result.update(
        {
            "wire": best,
            "flops_per_upload_byte": checks[best]["flops_per_upload_byte_24gb"],
            "gpu_busy_share_formula": checks[best]["gpu_busy_share_formula_24gb"],
            "baseline_ffn_1024_flops_per_upload_byte": ffn["flops_per_upload_byte"]["median"],
            "baseline_ffn_1024_gpu_busy_share_formula": ffn["gpu_busy_share_formula"],
            "baseline_ffn_lm_flops_per_upload_byte": lm["flops_per_upload_byte"]["median"],
            "baseline_ffn_lm_gpu_busy_share_formula": lm["gpu_busy_share_formula"],
            "target": TARGET,
            "meets_target": checks[best]["meets_1.6e7"],
            "busy_share_note": "formula min(1, fpb * 2.5e6 / 8e13), not the emulated home link (item 4)",
            "device": "cpu (measured at three small sizes; the 24 GB figure is the checked formula's)",
        }
    )
    for wire in wires:
        c = checks[wire]
        print(
            f"{wire}: formula within {c['formula_worst_error']:.1%} of the three stages; at the 24 GB stage "
            f"(depth {c['stage_24gb']['depth']}, d=1024, seq 1024) {c['flops_per_upload_byte_24gb']:.3g} "
            f"FLOPs per uploaded byte, busy share {c['gpu_busy_share_formula_24gb']}; today's FFN "
            f"{cases[f'ffn_1024_{wire}']['flops_per_upload_byte']['median']:.3g}",
            flush=True,
        )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

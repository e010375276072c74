"""Connect time under packet loss, phase by phase: the project's transport against stock aiortc (root).

One network namespace with only its loopback; both peers of every connect live in one process there
(``benchmarks/connect_loss_peer.py``: the engine's own dial and accept, signed descriptions handed over
in memory, host candidates on 127.0.0.1). iptables' ``statistic`` match drops each UDP datagram with the
loss rate (every datagram crosses OUTPUT once, so both directions lose that much, as through the NAT
testbed's lossy router); ``--rtt-ms`` adds half the round trip to every datagram through the testbed's
NFQUEUE delayer (this kernel has no netem). Signaling is not measured: the phases after it are.

Arms (see the peer module): ``stock`` (aiortc as released), ``before`` (the project's patches without
the ``handshake`` group: the timers as they were) and ``project`` (every patch). For every loss rate the
arms run interleaved, ``--rounds`` times, each time ``--connects / --rounds`` connects per arm,
``--concurrency`` at a time; a connect that has not opened its channel within ``--timeout`` counts as
failed. Per loss and arm: p50, p90, p99 and max of the time to an open channel over all connects, the
spread (p25-p75 and the p50 of each round), how many connects took longer than 15 s (the engine's
connect timeout), each phase's p50 and p99 (ICE, DTLS, SCTP association, channel OPEN), and what the
phases resent per connect. The last line printed is one JSON object.

Usage: ``sudo .venv/bin/python -m benchmarks.connect_loss [--quick] [--connects 200] [--losses
0.01,0.05,0.1] [--arms stock,before,project] [--rounds 2] [--concurrency 6] [--rtt-ms 0]``. ``--quick``:
50 connects per arm and loss in one round (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.connect_loss_peer import ARMS, PHASES
from tests.nat.topology import PYTHON, Proc, sh

ENGINE_CONNECT_TIMEOUT_S = 15.0  # LinkConfig.connect_timeout's default: a connect past it fails in a node
COUNTS = ("stun_rtx", "dtls_timeouts", "dtls_copies", "t1", "t3")


class LossyLoopback:
    """A namespace whose loopback drops (and optionally delays) UDP datagrams; removed on close."""

    def __init__(self, rtt_ms: float) -> None:
        self.ns = f"lahnat{os.getpid()}-connect"  # the testbed's prefix: a crashed run's namespace is reaped
        self.log_dir = Path(tempfile.mkdtemp(prefix="lah-connect-loss-"))
        self.delay: Proc | None = None
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "set", "lo", "up", ns=self.ns)
        if rtt_ms > 0:
            args = [PYTHON, "-m", "tests.nat.delay", "--queue", "5", "--ms", str(rtt_ms / 2)]
            self.delay = Proc("delay", self.ns, args, self.log_dir)
            self.delay.event(timeout=20)
            sh("iptables", "-w", "-t", "mangle", "-A", "OUTPUT", "-o", "lo", "-p", "udp",
               "-j", "NFQUEUE", "--queue-num", "5", ns=self.ns)  # fmt: skip

    def set_loss(self, p: float) -> None:
        sh("iptables", "-w", "-F", "OUTPUT", ns=self.ns)
        if p > 0:
            sh("iptables", "-w", "-A", "OUTPUT", "-o", "lo", "-p", "udp", "-m", "statistic",
               "--mode", "random", "--probability", str(p), "-j", "DROP", ns=self.ns)  # fmt: skip

    def connects(self, arm: str, n: int, concurrency: int, timeout: float) -> dict[str, Any]:
        args = [PYTHON, "-m", "benchmarks.connect_loss_peer", "--arm", arm, "--connects", str(n)]
        args += ["--concurrency", str(concurrency), "--timeout", str(timeout)]
        proc = Proc(f"{arm}-{time.monotonic_ns()}", self.ns, ["nice", "-n", "10", *args], self.log_dir)
        try:
            return proc.event(timeout=120 + n * timeout / concurrency)
        finally:
            proc.stop()

    def close(self) -> None:
        if self.delay is not None:
            with contextlib.suppress(Exception):
                self.delay.stop()
        for pid in sh("ip", "netns", "pids", self.ns, check=False).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        sh("ip", "netns", "del", self.ns, check=False)
        shutil.rmtree(self.log_dir, ignore_errors=True)


@contextlib.contextmanager
def lossy_loopback(rtt_ms: float) -> Iterator[LossyLoopback]:
    path = LossyLoopback(rtt_ms)
    try:
        yield path
    finally:
        path.close()


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (q in 0..1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def phase_durations(rec: dict[str, Any]) -> dict[str, float]:
    """How long each phase took in a connect that opened: from the end of the previous one."""
    ends = [rec["ice_ms"], rec["dtls_ms"], rec["sctp_ms"], rec["open_ms"]]
    starts = [0.0, *ends[:-1]]
    return {phase: end - start for phase, start, end in zip(PHASES, starts, ends, strict=True)}


def figures(records: list[dict[str, Any]], rounds: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """One arm at one loss rate: the time to an open channel, its spread, and each phase."""
    opened = [r for r in records if r["ok"]]
    times = [r["open_ms"] for r in opened]
    out: dict[str, Any] = {
        "connects": len(records),
        "failed": len(records) - len(opened),
        "over_15s": sum(1 for r in records if not r["ok"] or r["open_ms"] > ENGINE_CONNECT_TIMEOUT_S * 1000),
        "p50_ms": _ms(quantile(times, 0.5)),
        "p90_ms": _ms(quantile(times, 0.9)),
        "p99_ms": _ms(quantile(times, 0.99)),
        "max_ms": _ms(max(times, default=None)),
        "p25_ms": _ms(quantile(times, 0.25)),
        "p75_ms": _ms(quantile(times, 0.75)),
        "round_p50_ms": [_ms(quantile([r["open_ms"] for r in rr if r["ok"]], 0.5)) for rr in rounds],
        "over_1s": sum(1 for t in times if t > 1000),
    }
    durations = [phase_durations(r) for r in opened]
    out["phases"] = {
        phase: {
            "p50_ms": _ms(quantile([d[phase] for d in durations], 0.5)),
            "p99_ms": _ms(quantile([d[phase] for d in durations], 0.99)),
        }
        for phase in PHASES
    }
    out["resent_per_connect"] = {
        key: round(sum(r[key] for r in records) / max(1, len(records)), 3) for key in COUNTS
    }
    return out


def _row(loss: float, arm: str, f: dict[str, Any]) -> str:
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"

    phases = " ".join(f"{p} {fmt(f['phases'][p]['p50_ms'])}/{fmt(f['phases'][p]['p99_ms'])}" for p in PHASES)
    resent = " ".join(f"{k} {v:g}" for k, v in f["resent_per_connect"].items())
    return (
        f"{loss:>5.0%} {arm:8} n={f['connects']:<4} p50 {fmt(f['p50_ms']):>6} p90 {fmt(f['p90_ms']):>6} "
        f"p99 {fmt(f['p99_ms']):>6} max {fmt(f['max_ms']):>6} ms (p25-p75 {fmt(f['p25_ms'])}-"
        f"{fmt(f['p75_ms'])}; rounds' p50 {f['round_p50_ms']}) >1s {f['over_1s']} >15s {f['over_15s']} "
        f"failed {f['failed']}\n      phases p50/p99 ms: {phases}\n      resent per connect: {resent}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 connects per arm and loss, one round")
    parser.add_argument("--connects", type=int, default=200, help="per arm and loss rate")
    parser.add_argument("--losses", default="0.01,0.05,0.1")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=30.0, help="a connect's limit in the benchmark")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="added round trip (NFQUEUE delayer)")
    args = parser.parse_args()
    if args.quick:
        args.connects, args.rounds = 50, 1
    try:
        losses = [float(x) for x in args.losses.split(",") if x]
    except ValueError:
        print(f"--losses takes fractions such as 0.01,0.05, not {args.losses!r}", file=sys.stderr)
        return 2
    arms = [a for a in args.arms.split(",") if a]
    if not losses or any(not 0 <= p < 1 for p in losses) or not arms or set(arms) - set(ARMS):
        print(f"--losses must lie in [0, 1) and --arms be among {', '.join(ARMS)}", file=sys.stderr)
        return 2
    if args.connects < 1 or args.rounds < 1 or args.concurrency < 1:
        print("--connects, --rounds and --concurrency must be at least 1", file=sys.stderr)
        return 2
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        print("benchmarks/connect_loss.py needs root and iptables (a network namespace)", file=sys.stderr)
        return 2
    per_round = max(1, args.connects // args.rounds)
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores; "
          f"{per_round} x {args.rounds} connects per arm and loss, {args.concurrency} at a time, "
          f"added RTT {args.rtt_ms:g} ms", flush=True)  # fmt: skip
    results: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    with lossy_loopback(args.rtt_ms) as path:
        for loss in losses:
            path.set_loss(loss)
            rounds: dict[str, list[list[dict[str, Any]]]] = {arm: [] for arm in arms}
            for _ in range(args.rounds):
                for arm in arms:
                    out = path.connects(arm, per_round, args.concurrency, args.timeout)
                    rounds[arm].append(out["records"])
            results[f"{loss:g}"] = {}
            for arm in arms:
                records = [r for rr in rounds[arm] for r in rr]
                f = figures(records, rounds[arm])
                results[f"{loss:g}"][arm] = f
                print(_row(loss, arm, f), flush=True)
    summary = {
        "benchmark": "connect_loss",
        "rtt_ms": args.rtt_ms,
        "connects_per_arm": per_round * args.rounds,
        "concurrency": args.concurrency,
        "seconds": round(time.monotonic() - started, 1),
        "load_average": [round(x, 2) for x in load],
        "loss": results,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

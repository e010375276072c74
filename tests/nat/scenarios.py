"""Scenarios on a running :class:`tests.nat.topology.Testbed`, shared by the tests and the benchmark."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from .topology import KINDS, Testbed, needs_relay, node_for, peer_pairs, standard_nodes


@dataclass
class PairResult:
    kinds: tuple[str, str]
    caller: str
    callee: str
    ok: bool
    connect_ms: float | None
    types: tuple[str, str] | None
    error: str | None
    expect_relay: bool

    @property
    def relayed(self) -> bool:
        return self.types is not None and "relay" in self.types


@contextlib.contextmanager
def standard_testbed(connect_timeout: float = 10.0, **kwargs: Any) -> Iterator[Testbed]:
    """Two peers per NAT kind and two public ones, coturn and the coordinator; removed on exit."""
    tb = Testbed(**kwargs)
    try:
        home, public = standard_nodes()
        tb.build_network(home, public)
        tb.start_coturn()
        tb.start_stun()
        tb.start_coordinator()
        tb.start_peers(connect_timeout=connect_timeout)
        yield tb
    finally:
        tb.close()


def pair_nodes(a: str, b: str) -> tuple[str, str]:
    """The caller (kind a, first of its kind) and callee (kind b; the second one when a == b)."""
    return node_for(a, 1), node_for(b, 2 if a == b else 1)


def call(tb: Testbed, caller: str, callee: str, nbytes: int = 0, timeout: float = 20.0) -> dict[str, Any]:
    proc = tb.nodes[caller].proc
    assert proc is not None
    cmd = {"cmd": "call", "peer": tb.nodes[callee].peer_id, "bytes": nbytes, "timeout": timeout}
    return proc.request(cmd, timeout=timeout + 10)


def drop_all_links(tb: Testbed) -> None:
    for node in tb.nodes.values():
        if node.proc is not None:
            node.proc.request({"cmd": "drop_links"}, timeout=15)


def run_matrix(tb: Testbed, kinds: tuple[str, ...] = KINDS, timeout: float = 20.0) -> list[PairResult]:
    """Connect every pair of kinds, one pair at a time (fresh links), through the coordinator."""
    results = []
    for a, b in peer_pairs(kinds):
        caller, callee = pair_nodes(a, b)
        out = call(tb, caller, callee, nbytes=64 << 10, timeout=timeout)
        types = tuple(out["types"]) if out.get("types") else None
        results.append(
            PairResult(
                kinds=(a, b),
                caller=caller,
                callee=callee,
                ok=bool(out["ok"]),
                connect_ms=out.get("connect_ms"),
                types=types,  # type: ignore[arg-type]
                error=out.get("error"),
                expect_relay=needs_relay(a, b),
            )
        )
    return results


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summarize(results: list[PairResult]) -> dict[str, Any]:
    times = [r.connect_ms for r in results if r.ok and r.connect_ms is not None]
    return {
        "pairs": len(results),
        "connected": sum(r.ok for r in results),
        "relayed": sum(r.relayed for r in results),
        "relayed_unexpected": sum(r.relayed and not r.expect_relay for r in results),
        "connect_ms_p50": percentile(times, 50),
        "connect_ms_p99": percentile(times, 99),
    }


def table(results: list[PairResult]) -> str:
    lines = [f"{'pair':36} {'ok':3} {'connect ms':>10}  {'local/remote':22} expected"]
    for r in results:
        pair = f"{r.kinds[0]}-{r.kinds[1]} ({r.caller}->{r.callee})"
        ms = f"{r.connect_ms:.0f}" if r.connect_ms is not None else "-"
        types = "/".join(r.types) if r.types else (r.error or "-")
        expected = "relay" if r.expect_relay else "direct"
        lines.append(f"{pair:36} {'yes' if r.ok else 'NO':3} {ms:>10}  {types:22} {expected}")
    return "\n".join(lines)


def as_dicts(results: list[PairResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]

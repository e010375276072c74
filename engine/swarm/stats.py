"""SwarmStats: what the swarm did for a researcher's script, read on the trainer's loop.

The counters live where they are kept: the mixture layers' observer (``TrainerNode.observe``: every
expert request, answered, failed or late, and which host answered it), the Peer's links (bytes each
way), the receipt book (submitted, credited, rejected) and the spot checker. :func:`collect` reads them
on the loop that writes them, so a snapshot is consistent; nothing here blocks a call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SwarmStats", "collect"]


@dataclass(frozen=True)
class SwarmStats:
    calls_ok: int = 0  # expert requests answered in time
    calls_failed: int = 0  # failed: the host's error, a timeout, a lost connection
    calls_late: int = 0  # answered after the layer had moved on (its grace period)
    failures: dict[str, int] = field(default_factory=dict)  # failure code -> requests
    bytes_sent: int = 0  # over the links open now (a closed link's bytes leave the sum)
    bytes_received: int = 0
    hosts: dict[str, int] = field(default_factory=dict)  # host peer id -> requests it answered
    short_rows: int = 0  # tokens passed through unchanged for want of answers
    receipts_submitted: int = 0  # receipts the coordinator received (signed: host, expert, samples)
    receipts_credited: int = 0
    receipts_rejected: int = 0
    receipts_dropped: int = 0  # never delivered (the coordinator away too long, a full queue)
    spot_checks: int = 0  # answers recomputed from their host's own state and compared
    spot_mismatches: int = 0
    spot_reports: int = 0  # mismatches reported to the coordinator
    collab_steps: int = 0  # collaborative steps this trainer took part in
    epoch: int = 0  # the collaboration's optimizer steps (0: none, or not collaborative)

    def line(self) -> str:
        """One line for a log: calls, bytes, hosts, receipts, spot checks."""
        collab = f"; {self.collab_steps} collaborative steps (epoch {self.epoch})" if self.epoch else ""
        return (
            f"calls {self.calls_ok} answered, {self.calls_failed} failed, {self.calls_late} late; "
            f"{self.bytes_sent / 1e6:.1f} MB sent, {self.bytes_received / 1e6:.1f} MB received; "
            f"{len(self.hosts)} hosts served; receipts {self.receipts_submitted} submitted, "
            f"{self.receipts_credited} credited, {self.receipts_rejected} rejected; "
            f"spot checks {self.spot_checks} ({self.spot_mismatches} mismatched){collab}"
        )


async def collect(node: Any, short_rows: int, optimizer: Any = None) -> SwarmStats:
    """A snapshot of ``node``'s counters (a started ``TrainerNode``; call on its loop)."""
    req = node.stats.requests
    links = list(node.peer.links.values()) if node.peer is not None else []
    receipts, spot = node.receipts.stats, node.spot.stats if node.spot is not None else None
    return SwarmStats(
        calls_ok=req["ok"],
        calls_failed=sum(n for code, n in req.items() if code not in ("ok", "late")),
        calls_late=req["late"],
        failures={code: n for code, n in req.items() if code != "ok"},
        bytes_sent=sum(lk.rpc.channel.bytes_sent for lk in links),
        bytes_received=sum(lk.rpc.channel.bytes_received for lk in links),
        hosts=dict(node.stats.served),
        short_rows=short_rows,
        receipts_submitted=receipts.submitted,
        receipts_credited=receipts.accepted,
        receipts_rejected=receipts.rejected,
        receipts_dropped=receipts.dropped,
        spot_checks=spot.checked if spot is not None else 0,
        spot_mismatches=spot.mismatches if spot is not None else 0,
        spot_reports=spot.reported if spot is not None else 0,
        collab_steps=len(optimizer.steps) if optimizer is not None else 0,
        epoch=optimizer.epoch if optimizer is not None else 0,
    )

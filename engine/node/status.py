"""The node's status as one JSON-ready dict: what the tray, ``lah status`` and the control API show.

Keys (stable; new ones may be added)::

    state, reason_code, reason   the governor's state and its human reason ("running" without a governor)
    peer_id, account_id, coordinator, device
    experts                      hosted uids;  accepting: whether new work is taken now
    lm_experiments               the language models whose layers' experts it hosts (the site has a page
                                 for each: ``<coordinator>/experiments/<name>``)
    requests_served, requests_refused, in_flight
    trainers_refused             the hosted experts' guards (engine.moe.guard), summed: backwards refused
                                 for their size (grad_too_large) or their sender's share (over_share),
                                 those clipped for their size (clipped), and rollbacks after a jump on
                                 an expert's probe
    bytes_up, bytes_down         over the open links
    transport                    the links' SCTP senders summed: retransmissions, recoveries, RTO expiries,
                                 srtt median and worst, cwnd, controllers (see engine.p2p.ice_stats)
    credit, rank                 None until the coordinator reports them (rank: 1 = first)
    credit_at, credit_error      when the credit was last read (unix time), why the last read failed
    participation                assigned / reachable / chosen and a summary in plain words, for a
                                 node that serves nothing (see engine.node.participation)
    energy_kwh                   the governor's estimate (None without one)
    dht_peers, signaling_joins, assignment_expires_in
    errors                       the most recent errors, newest last: [{time, message}]
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from engine.p2p.ice_stats import summarize_transport, transport_stats

from .participation import Participation

if TYPE_CHECKING:
    import torch

    from engine.account.coordinator_api import Assignment
    from engine.account.tokens import Credentials
    from engine.dht import DHTNode
    from engine.p2p import Peer
    from engine.resources import Governor

    from .gate import WorkGate
    from .hosting import Hosting

STATUS_KEYS = (
    "state",
    "reason_code",
    "reason",
    "peer_id",
    "account_id",
    "coordinator",
    "device",
    "experts",
    "lm_experiments",
    "accepting",
    "requests_served",
    "requests_refused",
    "trainers_refused",
    "in_flight",
    "bytes_up",
    "bytes_down",
    "transport",
    "credit",
    "rank",
    "credit_at",
    "credit_error",
    "participation",
    "energy_kwh",
    "dht_peers",
    "signaling_joins",
    "assignment_expires_in",
    "errors",
)


class StatusSource(Protocol):
    """What the status reads of a node: :class:`~.volunteer.Volunteer` is one. Named here, not
    imported, because the volunteer asks this module for its status."""

    @property
    def governor(self) -> Governor | None: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def started(self) -> bool: ...
    @property
    def gate(self) -> WorkGate: ...
    @property
    def peer(self) -> Peer: ...
    @property
    def assignment(self) -> Assignment | None: ...
    @property
    def assignment_at(self) -> float: ...
    @property
    def peer_id(self) -> str: ...
    @property
    def credentials(self) -> Credentials | None: ...
    @property
    def coordinator_url(self) -> str: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def hosted_uids(self) -> list[str]: ...
    @property
    def hosting(self) -> Hosting: ...
    @property
    def credit(self) -> float | None: ...
    @property
    def rank(self) -> int | None: ...
    @property
    def credit_at(self) -> float | None: ...
    @property
    def credit_error(self) -> str | None: ...
    @property
    def dht(self) -> DHTNode | None: ...
    @property
    def errors(self) -> deque[dict[str, Any]]: ...


def lm_experiments(v: StatusSource) -> list[str]:
    """The models (``part_of`` of the assignment) of the experts this node hosts now, sorted."""
    hosted = set(v.hosted_uids)
    experts = v.assignment.experts if v.assignment is not None else ()
    return sorted({e.part_of for e in experts if e.part_of and e.uid in hosted})


#: An expert's stats (engine.moe.BackendStats) -> the status's name for each guard counter.
GUARD_COUNTERS = {
    "grad_refused": "grad_too_large",
    "share_refused": "over_share",
    "grad_clipped": "clipped",
    "rollbacks": "rollbacks",
}


def guard_counts(experts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """The guards' counters of every hosted expert, summed (a node that hosts nothing: zeros)."""
    totals = dict.fromkeys(GUARD_COUNTERS.values(), 0)
    for stats in experts:
        for key, name in GUARD_COUNTERS.items():
            totals[name] += int(stats.get(key, 0))
    return totals


def build_status(v: StatusSource) -> dict[str, Any]:
    decision = v.governor.decision if v.governor is not None else None
    if v.stopping:
        state, code, reason = "stopped", "stopping", "the node is shutting down"
    elif not v.started:
        state, code, reason = "starting", "starting", "joining the swarm"
    elif decision is not None:
        state, code, reason = str(decision.state), str(decision.reason_code), decision.human_reason
    elif v.gate.open:
        state, code, reason = "running", "running", "hosting experts"
    else:
        state, code, reason = "waiting", "waiting", v.gate.reason
    links = list(v.peer.links.values())
    expires = None
    if v.assignment is not None:
        expires = max(0.0, v.assignment_at + v.assignment.ttl_s - time.time())
    meter = v.governor.energy if v.governor is not None else None
    seen = Participation(
        started=v.started,
        assignment_known=v.assignment is not None,
        experts=len(v.hosted_uids),
        links_in=v.peer.links_in,
        links_out=v.peer.links_out,
        served=v.gate.served,
        refused=v.gate.refused,
    )
    return {
        "state": state,
        "reason_code": code,
        "reason": reason,
        "peer_id": v.peer_id,
        "account_id": v.credentials.account_id if v.credentials else None,
        "coordinator": v.coordinator_url,
        "device": str(v.device),
        "experts": v.hosted_uids,
        "lm_experiments": lm_experiments(v),
        "accepting": v.gate.open,
        "requests_served": v.hosting.requests_served(),
        "requests_refused": v.gate.refused,
        "trainers_refused": guard_counts(v.hosting.stats().values()),
        "in_flight": v.gate.in_flight,
        "bytes_up": sum(lk.rpc.channel.bytes_sent for lk in links),
        "bytes_down": sum(lk.rpc.channel.bytes_received for lk in links),
        "transport": summarize_transport([transport_stats(lk.pc) for lk in links]),
        "credit": v.credit,
        "rank": v.rank,
        "credit_at": v.credit_at,
        "credit_error": v.credit_error,
        "participation": seen.to_json(),
        "energy_kwh": meter.totals.kwh if meter is not None else None,
        "dht_peers": len(v.dht.table) if v.dht is not None else 0,
        "signaling_joins": v.peer.signaling.joins,
        "assignment_expires_in": expires,
        "errors": list(v.errors),
    }

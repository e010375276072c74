"""The node's status as one JSON-ready dict: what the tray, ``lah status`` and the control API show.

Keys (stable; new ones may be added)::

    state, reason_code, reason   the governor's state and its human reason ("running" without a governor)
    peer_id, account_id, coordinator, device
    experts                      hosted uids;  accepting: whether new work is taken now
    requests_served, requests_refused, in_flight
    bytes_up, bytes_down         over the open links
    transport                    the links' SCTP senders summed: retransmissions, recoveries, RTO expiries,
                                 srtt median and worst, cwnd, controllers (see engine.p2p.ice_stats)
    credit, rank                 None until the coordinator reports them
    energy_kwh                   the governor's estimate (None without one)
    dht_peers, signaling_joins, assignment_expires_in
    errors                       the most recent errors, newest last: [{time, message}]
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from engine.p2p.ice_stats import summarize_transport, transport_stats

if TYPE_CHECKING:
    from .volunteer import Volunteer

STATUS_KEYS = (
    "state",
    "reason_code",
    "reason",
    "peer_id",
    "account_id",
    "coordinator",
    "device",
    "experts",
    "accepting",
    "requests_served",
    "requests_refused",
    "in_flight",
    "bytes_up",
    "bytes_down",
    "transport",
    "credit",
    "rank",
    "energy_kwh",
    "dht_peers",
    "signaling_joins",
    "assignment_expires_in",
    "errors",
)


def build_status(v: Volunteer) -> dict[str, Any]:
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
    return {
        "state": state,
        "reason_code": code,
        "reason": reason,
        "peer_id": v.peer_id,
        "account_id": v.credentials.account_id if v.credentials else None,
        "coordinator": v.coordinator_url,
        "device": str(v.device),
        "experts": v.hosted_uids,
        "accepting": v.gate.open,
        "requests_served": v.hosting.requests_served(),
        "requests_refused": v.gate.refused,
        "in_flight": v.gate.in_flight,
        "bytes_up": sum(lk.rpc.channel.bytes_sent for lk in links),
        "bytes_down": sum(lk.rpc.channel.bytes_received for lk in links),
        "transport": summarize_transport([transport_stats(lk.pc) for lk in links]),
        "credit": v.credit,
        "rank": v.rank,
        "energy_kwh": meter.totals.kwh if meter is not None else None,
        "dht_peers": len(v.dht.table) if v.dht is not None else 0,
        "signaling_joins": v.peer.signaling.joins,
        "assignment_expires_in": expires,
        "errors": list(v.errors),
    }

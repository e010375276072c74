"""What ICE chose for a connection (the nominated pair's types) and how its SCTP sender is doing.

aiortc exposes no selected-pair statistics for data channels, so this reads aioice's internals, pinned
like everything else to aiortc 1.16.0 / aioice 0.13.0 (see :mod:`engine.p2p.patches`):
``RTCPeerConnection.sctp.transport`` (RTCDtlsTransport) ``.transport`` (RTCIceTransport)
``._connection`` (aioice Connection) ``._nominated[1]`` (CandidatePair of component 1).
"""

from __future__ import annotations

from typing import Any


def nominated_pair(pc: Any) -> Any | None:
    """aioice's nominated CandidatePair for component 1, or None before ICE completes / after close."""
    sctp = getattr(pc, "sctp", None)
    dtls = getattr(sctp, "transport", None)
    ice = getattr(dtls, "transport", None)
    connection = getattr(ice, "_connection", None)
    nominated = getattr(connection, "_nominated", None)
    if not nominated:
        return None
    return nominated.get(1)


def selected_candidate_types(pc: Any) -> tuple[str, str] | None:
    """(local type, remote type) of the nominated pair, e.g. ("srflx", "prflx") or ("relay", "host")."""
    pair = nominated_pair(pc)
    if pair is None:
        return None
    return str(pair.local_candidate.type), str(pair.remote_candidate.type)


def selected_addresses(pc: Any) -> tuple[tuple[str, int], tuple[str, int]] | None:
    """(local address, remote address) of the nominated pair, for logs and diagnostics."""
    pair = nominated_pair(pc)
    if pair is None:
        return None
    local, remote = pair.local_candidate, pair.remote_candidate
    return (str(local.host), int(local.port)), (str(remote.host), int(remote.port))


def transport_stats(pc: Any) -> dict[str, Any]:
    """The SCTP sender's counters and congestion state for a connection: retransmissions, recoveries,
    RTO expiries, srtt, cwnd, the controller... ({} before the association exists or on stock aiortc).
    For ``lah status``, link stats and the benchmarks."""
    from .patches import transport_stats as sctp_stats

    sctp = getattr(pc, "sctp", None)
    return sctp_stats(sctp) if sctp is not None else {}


__all__ = ["nominated_pair", "selected_addresses", "selected_candidate_types", "transport_stats"]

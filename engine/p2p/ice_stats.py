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


_SUMMED = ("retransmissions", "fast_retransmits", "rack_losses", "tlp_probes", "recoveries", "rto_expiries")


def summarize_transport(per_link: list[dict[str, Any]]) -> dict[str, Any]:
    """One line's worth of the links' sender state for ``lah status``: counters summed over links, srtt
    as median and worst (a node's links differ: one peer next door, one across an ocean), cwnd summed,
    and which controllers run. Links on stock aiortc (empty stats) count as links but add nothing.
    Pure, so it tests without sockets."""
    known = [s for s in per_link if s]
    srtts = sorted(float(s["srtt_ms"]) for s in known if s.get("srtt_ms") is not None)
    summary: dict[str, Any] = {"links": len(per_link)}
    for key in _SUMMED:
        summary[key] = sum(int(s.get(key, 0)) for s in known)
    summary["in_recovery"] = sum(1 for s in known if s.get("in_recovery"))
    summary["cwnd_bytes"] = sum(int(s.get("cwnd", 0)) for s in known)
    summary["srtt_ms_median"] = srtts[len(srtts) // 2] if srtts else None
    summary["srtt_ms_max"] = srtts[-1] if srtts else None
    summary["controllers"] = sorted({str(s["cc"]) for s in known if s.get("cc")})
    return summary


def format_transport(summary: dict[str, Any]) -> str:
    """E.g. ``3 links (bbr), srtt 52 ms median / 140 ms worst, 12 retransmissions, 2 recoveries,
    0 RTO expiries``: what a researcher asks first when a volunteer's throughput drops."""
    links = int(summary.get("links") or 0)
    text = f"{links} link{'' if links == 1 else 's'}"
    if summary.get("controllers"):
        text += f" ({', '.join(summary['controllers'])})"
    if summary.get("srtt_ms_median") is not None:
        text += f", srtt {summary['srtt_ms_median']:.0f} ms median / {summary['srtt_ms_max']:.0f} ms worst"
    text += (
        f", {summary.get('retransmissions', 0)} retransmissions, {summary.get('recoveries', 0)} recoveries,"
        f" {summary.get('rto_expiries', 0)} RTO expiries"
    )
    return text


__all__ = [
    "format_transport",
    "nominated_pair",
    "selected_addresses",
    "selected_candidate_types",
    "summarize_transport",
    "transport_stats",
]

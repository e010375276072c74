"""One side of benchmarks/connect_loss.py: connects made in one process, inside the benchmark's namespace.

``python -m benchmarks.connect_loss_peer --arm ARM --connects N`` makes N connections between two fresh
identities with the engine's own :func:`engine.p2p.connection.dial` and :func:`accept` (signed offer
and answer, handed over in memory: signaling is not what is measured), host candidates on 127.0.0.1,
``--concurrency`` at a time, and prints one JSON object: a record per connect.

Arms: ``stock`` (aiortc and aioice as released; only the host candidates pinned, which changes no
timer), ``before`` (the project's patches without the ``handshake`` group: the timers as they were
before it; the two fixes in the ``dtls`` group's reader, which ended hangs, are in this arm too) and
``project`` (every patch group).

Each record has the moments, from the dial's start, at which the last of the two sides finished ICE,
the DTLS handshake, the SCTP association and the channel (the offerer's data channel open, the
answerer's accepted), and what each phase retransmitted on both sides: STUN requests sent again
(ICE checks), DTLS flights resent by OpenSSL's timer and copies resent by the ``handshake`` group,
T1 (INIT, COOKIE ECHO) and T3 (DATA: the channel's OPEN and ACK) expiries. The hooks that count are
set here, on the classes, after the arm's patches: measuring changes nothing that is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import os
import time
from typing import Any

ARMS = ("stock", "before", "project")
PHASES = ("ice", "dtls", "sctp", "open")
_pcs: contextvars.ContextVar[list[Any]] = contextvars.ContextVar("pcs")


def setup(arm: str) -> None:
    """Install the arm's patches, then the counting hooks on top of whatever runs."""
    from engine.p2p.patches import install, pin_host_addresses, registry

    pin_host_addresses(["127.0.0.1"])
    if arm != "stock":
        install(strict=True)
    if arm == "before":
        registry.uninstall_group("handshake")
    _hooks()


def _hooks() -> None:
    import aioice.ice as ice
    import aioice.stun as stun
    from aiortc import rtcdtlstransport, rtcsctptransport
    from OpenSSL import SSL

    import engine.p2p.connection as connection

    sctp_cls: Any = rtcsctptransport.RTCSctpTransport
    dtls_cls: Any = rtcdtlstransport.RTCDtlsTransport
    connected, established = rtcdtlstransport.State.CONNECTED, sctp_cls.State.ESTABLISHED

    def stamp(cls: Any, name: str, mark: Any) -> None:
        original = getattr(cls, name)

        def hooked(self: Any, *args: Any) -> Any:
            mark(self, *args)
            return original(self, *args)

        setattr(cls, name, hooked)

    def mark_once(obj: Any, attr: str) -> None:
        obj.__dict__.setdefault(attr, time.monotonic())

    def count(obj: Any, attr: str) -> None:
        obj.__dict__[attr] = obj.__dict__.get(attr, 0) + 1

    stamp(dtls_cls, "_set_state", lambda t, s: s == connected and mark_once(t, "_bench_done"))
    stamp(sctp_cls, "_set_state", lambda t, s: s == established and mark_once(t, "_bench_done"))
    stamp(sctp_cls, "_t1_expired", lambda t: count(t, "_bench_t1"))
    stamp(sctp_cls, "_t3_expired", lambda t: count(t, "_bench_t3"))

    ice_connect = ice.Connection.connect

    async def connect(self: Any) -> None:
        await ice_connect(self)
        mark_once(self, "_bench_done")

    ice.Connection.connect = connect  # type: ignore[method-assign]

    send_stun = ice.StunProtocol.send_stun

    def sent_stun(self: Any, message: Any, addr: Any) -> None:
        if message.message_class == stun.Class.REQUEST:
            seen = self.receiver.__dict__.setdefault("_bench_tids", set())
            if message.transaction_id in seen:
                count(self.receiver, "_bench_stun_rtx")
            seen.add(message.transaction_id)
        send_stun(self, message, addr)

    ice.StunProtocol.send_stun = sent_stun  # type: ignore[method-assign]

    handle_timeout = SSL.Connection.DTLSv1_handle_timeout

    def timed_out(self: Any) -> bool:
        resent = handle_timeout(self)
        if resent:
            count(self, "_bench_dtls_timeouts")
        return resent

    SSL.Connection.DTLSv1_handle_timeout = timed_out  # type: ignore[method-assign]

    class CountedPeerConnection(connection.RTCPeerConnection):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            with contextlib.suppress(LookupError):
                _pcs.get().append(self)

    connection.RTCPeerConnection = CountedPeerConnection  # type: ignore[misc]


def _side(pc: Any) -> dict[str, Any]:
    """One side's moments (monotonic) and retransmission counts."""
    sctp = pc.sctp
    dtls = sctp.transport if sctp is not None else None
    conn = dtls.transport._connection if dtls is not None else None
    ssl = dtls._ssl if dtls is not None else None
    return {
        "ice": conn.__dict__.get("_bench_done") if conn is not None else None,
        "dtls": dtls.__dict__.get("_bench_done") if dtls is not None else None,
        "sctp": sctp.__dict__.get("_bench_done") if sctp is not None else None,
        "stun_rtx": conn.__dict__.get("_bench_stun_rtx", 0) if conn is not None else 0,
        "dtls_timeouts": ssl.__dict__.get("_bench_dtls_timeouts", 0) if ssl is not None else 0,
        "dtls_copies": dtls.__dict__.get("_lah_flight_copies", 0) if dtls is not None else 0,
        "t1": sctp.__dict__.get("_bench_t1", 0) if sctp is not None else 0,
        "t3": sctp.__dict__.get("_bench_t3", 0) if sctp is not None else 0,
    }


def summarize(t0: float, sides: list[dict[str, Any]], opened: float | None) -> dict[str, Any]:
    """A record: the moment the last side finished each phase (ms from t0), and the counts summed."""
    rec: dict[str, Any] = {}
    for phase in ("ice", "dtls", "sctp"):
        moments = [s[phase] for s in sides]
        done = len(sides) == 2 and all(m is not None for m in moments)
        rec[f"{phase}_ms"] = round((max(moments) - t0) * 1000, 1) if done else None
    rec["open_ms"] = round((opened - t0) * 1000, 1) if opened is not None else None
    for key in ("stun_rtx", "dtls_timeouts", "dtls_copies", "t1", "t3"):
        rec[key] = sum(s[key] for s in sides)
    return rec


async def one_connect(index: int, timeout: float, closers: set[asyncio.Task[None]]) -> dict[str, Any]:
    from engine.p2p import Handlers, Identity, LinkConfig
    from engine.p2p.connection import Link, accept, close_quietly, dial
    from engine.p2p.descriptions import SignedDescription

    offerer, answerer = Identity.generate(), Identity.generate()
    config = LinkConfig(connect_timeout=timeout)
    handlers = Handlers()
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[SignedDescription] = loop.create_future()
    accepted: asyncio.Future[Link] = loop.create_future()
    pcs: list[Any] = []
    _pcs.set(pcs)

    async def to_answerer(_: str, offer: SignedDescription) -> None:
        async def run() -> None:
            try:
                accepted.set_result(await accept(answerer, offer, config, handlers, to_offerer, _closed))
            except Exception as e:  # the dial's own timeout reports it
                if not accepted.done():
                    accepted.set_exception(e)

        task = loop.create_task(run())
        closers.add(task)
        task.add_done_callback(closers.discard)

    async def to_offerer(_: str, desc: SignedDescription) -> None:
        if not answer.done():
            answer.set_result(desc)

    t0 = time.monotonic()
    links: list[Link] = []
    error = None
    opened = None
    try:
        links.append(
            await dial(offerer, answerer.peer_id, config, handlers, to_answerer, answer, f"b{index}", _closed)
        )
        async with asyncio.timeout(max(0.001, timeout - (time.monotonic() - t0))):
            links.append(await asyncio.shield(accepted))
        opened = time.monotonic()
    except Exception as e:  # recorded: a connect that failed is a figure too
        error = f"{type(e).__name__}: {e}"
    rec = summarize(t0, [_side(pc) for pc in pcs], opened)
    rec["ok"] = error is None
    if error:
        rec["error"] = error
    for link in links:
        task = loop.create_task(close_quietly(link))
        closers.add(task)
        task.add_done_callback(closers.discard)
    if error:
        for pc in pcs:
            task = loop.create_task(pc.close())
            closers.add(task)
            task.add_done_callback(closers.discard)
    return rec


def _closed(_: Any) -> None:
    pass


async def run(connects: int, concurrency: int, timeout: float) -> list[dict[str, Any]]:
    slots = asyncio.Semaphore(concurrency)
    closers: set[asyncio.Task[None]] = set()

    async def slot(i: int) -> dict[str, Any]:
        async with slots:
            return await one_connect(i, timeout, closers)

    records = await asyncio.gather(*(slot(i) for i in range(connects)))
    if closers:
        await asyncio.wait(list(closers), timeout=15)
    return list(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", choices=ARMS, required=True)
    parser.add_argument("--connects", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    setup(args.arm)
    from engine.p2p.eventloop import loop_name
    from engine.p2p.eventloop import run as run_loop

    async def measure() -> None:
        started = time.monotonic()
        records = await run(args.connects, args.concurrency, args.timeout)
        out = {"event": "result", "arm": args.arm, "loop": loop_name(), "records": records,
               "seconds": round(time.monotonic() - started, 2)}  # fmt: skip
        print(json.dumps(out), flush=True)
        # Out at once: closing the event loop would cancel and wait for every link still closing, and
        # an association left half open by the loss can hold that up; the figures are out already.
        os._exit(0)

    run_loop(measure())


if __name__ == "__main__":
    main()

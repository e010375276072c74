"""One engine Peer inside a network namespace, driven by JSON lines: ``python -m tests.nat.peer_proc``.

Starts a :class:`engine.p2p.Peer` with host candidates pinned to ``--host`` (the namespace's address),
joins the coordinator at ``--signal`` (its ICE servers, TURN credentials included, come from there),
serves ``echo`` (tensors back) and ``sink`` (byte count back), prints ``{"event":"ready","id":...}`` and
answers commands read from stdin, one JSON object a line, each answered with its ``req`` echoed back.
Commands run concurrently (a call may be in flight while another command runs):

- ``{"cmd":"call","peer":ID,"bytes":N,"timeout":T,"method":"echo"}`` -> ``ok``, ``ms`` (whole call),
  ``connect_ms`` (dial time, null when a link was reused), ``types`` ([local, remote] candidate types of
  the link's nominated pair) or ``error`` ("ClassName: message")
- ``{"cmd":"bench","peer":ID,"bytes":TOTAL,"chunk":N,"timeout":T}`` -> ``MBps`` over ``sink`` calls
- ``{"cmd":"tcp_listen","port":P}`` / ``{"cmd":"tcp_send","host":H,"port":P,"bytes":N,"timeout":T,"cc":C}``
  (``cc``: the TCP congestion controller pinned on the socket, e.g. cubic or bbr; the reply names it)
  -> a plain TCP stream between the same namespaces, for comparison (``MBps``)
- ``{"cmd":"links"}`` -> every link: remote, usable, state, types; ``{"cmd":"ice"}`` -> ICE servers in use
- ``{"cmd":"drop_links"}`` closes every link (the next call dials again, probing ICE servers afresh)
- ``{"cmd":"host","uids":[...],"dim":D,"hidden":H}`` hosts ffn experts (an ExpertServer on this Peer)
- ``{"cmd":"train","hosts":{uid: peer},"steps":N,"dim":D,"hidden":H,"timeout":T}`` trains the digits
  DMoE through those hosts -> ``accuracy``, ``steps``, ``skipped``, ``max_step_s``, ``requests``
- ``{"cmd":"collab_role","peers":[ID...],"timeout":T}`` connects to those peers -> ``client`` (whether
  this trainer would act as an all-reduce client: a link through TURN), ``relayed`` (those peers)
- ``{"cmd":"allreduce","round":R,"members":[ID...],"parts":[N...],"value":V,"weight":W,"timeout":T}``
  averages a vector filled with ``V`` (plus its index / N) with those members -> ``head`` (its first
  values after the round), ``complete``, ``reduced`` (whether this peer reduced a part), bytes moved

Ends when stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
import time
from typing import Any

import torch

from engine.p2p import CallContext, Handlers, Identity, LinkConfig, Peer
from engine.p2p.connection import close_quietly
from engine.p2p.eventloop import run
from engine.p2p.ice_servers import DEFAULT_PROBE
from engine.p2p.ice_stats import selected_addresses, selected_candidate_types, transport_stats
from engine.p2p.patches import install, pin_host_addresses
from engine.wire import Kind, Message


def handlers() -> Handlers:
    h = Handlers()

    async def echo(msg: Message, ctx: CallContext) -> Message:
        return Message(Kind.RESPONSE, 0, fields=dict(msg.fields), tensors=msg.tensors)

    async def sink(msg: Message, ctx: CallContext) -> Message:
        return Message(
            Kind.RESPONSE, 0, fields={"nbytes": sum(t.numel() * t.element_size() for t in msg.tensors)}
        )

    h.add_unary("echo", echo)
    h.add_unary("sink", sink)
    return h


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class Node:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.tcp_received = 0
        self._servers: list[asyncio.Server] = []
        self.expert_servers: list[Any] = []
        self.collab: Any = None  # an AllReduceService, made on the first allreduce command

    def link_info(self, remote: str) -> dict[str, Any]:
        link = self.peer.links.get(remote)
        if link is None:
            return {"remote": remote, "usable": False}
        return {
            "remote": remote,
            "usable": link.usable,
            "state": link.pc.connectionState,
            "types": selected_candidate_types(link.pc),
            "addrs": selected_addresses(link.pc),
            "sctp": transport_stats(link.pc),  # retransmissions, recoveries, RTOs, srtt, cwnd, controller
        }

    async def call(self, cmd: dict[str, Any]) -> dict[str, Any]:
        remote, timeout = cmd["peer"], float(cmd.get("timeout", 20))
        nbytes = int(cmd.get("bytes", 0))
        tensors = [torch.randint(0, 255, (nbytes,), dtype=torch.uint8)] if nbytes else []
        started = time.monotonic()
        connect_ms = None
        try:
            existing = self.peer.links.get(remote)
            if existing is None or not existing.usable:
                async with asyncio.timeout(timeout):
                    await self.peer.connect(remote)
                connect_ms = (time.monotonic() - started) * 1000
            left = max(0.001, timeout - (time.monotonic() - started))
            reply = await self.peer.call(
                remote, cmd.get("method", "echo"), {"n": nbytes}, tensors, timeout=left
            )
            if (
                cmd.get("method", "echo") == "echo"
                and tensors
                and not torch.equal(reply.tensors[0], tensors[0])
            ):
                raise AssertionError("echo returned different bytes")
        except Exception as e:
            return {
                "ok": False,
                "error": _error(e),
                "ms": (time.monotonic() - started) * 1000,
                **self.link_info(remote),
            }
        return {
            "ok": True,
            "ms": (time.monotonic() - started) * 1000,
            "connect_ms": connect_ms,
            **self.link_info(remote),
        }

    async def bench(self, cmd: dict[str, Any]) -> dict[str, Any]:
        remote, total, chunk = cmd["peer"], int(cmd["bytes"]), int(cmd.get("chunk", 4 << 20))
        timeout = float(cmd.get("timeout", 60))
        x = torch.randint(0, 255, (chunk,), dtype=torch.uint8)
        await self.peer.call(remote, "sink", {}, [], timeout=timeout)  # connected before the clock starts
        sent, started = 0, time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                while sent < total:
                    await self.peer.call(remote, "sink", {}, [x], timeout=timeout)
                    sent += chunk
        except Exception as e:
            return {"ok": False, "error": _error(e), "sent": sent}
        seconds = time.monotonic() - started
        return {
            "ok": True,
            "bytes": sent,
            "s": seconds,
            "MBps": sent / seconds / 1e6,
            **self.link_info(remote),
        }

    async def tcp_listen(self, cmd: dict[str, Any]) -> dict[str, Any]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            n = 0
            while chunk := await reader.read(1 << 20):
                n += len(chunk)
            writer.write(n.to_bytes(8, "little"))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, self.peer_host, int(cmd["port"]))
        self._servers.append(server)
        return {"ok": True}

    async def tcp_send(self, cmd: dict[str, Any]) -> dict[str, Any]:
        total, timeout = int(cmd["bytes"]), float(cmd.get("timeout", 60))
        block = bytes(1 << 20)
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                want = str(cmd.get("cc", "cubic")).encode()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, want)
                cc = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
                sock.setblocking(False)
                await asyncio.get_running_loop().sock_connect(sock, (cmd["host"], int(cmd["port"])))
                reader, writer = await asyncio.open_connection(sock=sock)
                started = time.monotonic()
                for _ in range(total // len(block)):
                    writer.write(block)
                    await writer.drain()
                writer.write_eof()
                got = int.from_bytes(await reader.readexactly(8), "little")
                writer.close()
        except Exception as e:
            return {"ok": False, "error": _error(e)}
        seconds = time.monotonic() - started
        return {"ok": got == total, "bytes": got, "s": seconds, "MBps": got / seconds / 1e6, "cc": cc}

    async def turn_probe(self) -> dict[str, Any]:
        """Allocate on each TURN server in use with the current credentials and say how it went.

        aioice drops a failed TURN allocation silently (the connection just has no relay candidate);
        this surfaces the reason (401 for wrong or expired credentials, a timeout when coturn is down).
        """
        import aioice.turn

        results = []
        for server in self.peer.config.ice_servers:
            for url in server.urls:
                if not url.startswith("turn:"):
                    continue
                host, _, port = url[5:].split("?")[0].rpartition(":")
                try:
                    async with asyncio.timeout(10):
                        transport, _ = await aioice.turn.create_turn_endpoint(
                            asyncio.DatagramProtocol, (host, int(port)), server.username, server.credential
                        )
                    transport.close()
                    results.append({"url": url, "ok": True})
                except Exception as e:
                    results.append({"url": url, "ok": False, "error": _error(e) or type(e).__name__})
        return {"ok": all(r["ok"] for r in results), "servers": results}

    async def host(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from engine.moe import ExpertServer, ExpertSpec

        spec = ExpertSpec("ffn", int(cmd["dim"]), int(cmd["hidden"]))
        server = ExpertServer.create({uid: spec for uid in cmd["uids"]}, device="cpu")
        await server.start()
        server.register(self.peer.handlers)
        self.expert_servers.append(server)
        return {"ok": True, "hosted": list(cmd["uids"])}

    async def train(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Training runs on a worker thread: autograd calls back into this loop for every expert request."""
        from engine.moe import LoopThread, StaticExpertFinder
        from engine.trainer import Trainer, TrainerConfig, load_digits_split, remote_model

        hosts: dict[str, str] = cmd["hosts"]
        grid = tuple(int(n) for n in cmd.get("grid", [2, 2]))
        config = TrainerConfig(
            grid=grid,
            dim=int(cmd["dim"]),
            hidden=int(cmd["hidden"]),
            k_best=len(hosts),
            timeout=float(cmd.get("timeout", 5.0)),
            spot_check_fraction=0.0,
        )
        loop = LoopThread.attach(asyncio.get_running_loop())
        model = remote_model(self.peer, StaticExpertFinder(hosts), loop, config)
        trainer = Trainer(model, load_digits_split(), config)

        def run_training() -> dict[str, Any]:
            torch.set_num_threads(1)
            stats = trainer.train(int(cmd["steps"]), progress=False)
            return {
                "ok": True,
                "accuracy": trainer.evaluate(),
                "steps": stats.steps,
                "skipped": stats.skipped_steps,
                "max_step_s": stats.max_step_s,
                "requests": dict(stats.requests),
            }

        return await asyncio.to_thread(run_training)

    async def collab_role(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from engine.collab.optimizer import relayed_links

        async with asyncio.timeout(float(cmd.get("timeout", 30))):
            await asyncio.gather(*(self.peer.connect(p) for p in cmd["peers"]))
        relayed = relayed_links(self.peer)
        return {"ok": True, "client": bool(relayed), "relayed": relayed}

    async def allreduce(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from engine.collab import AllReduceConfig, AllReduceService, Group

        if self.collab is None:
            # the plain weighted mean (robust=None), which the testbed's check computes exactly
            self.collab = AllReduceService(
                self.peer, AllReduceConfig(chunk=1 << 14, stall_timeout=10, round_timeout=60, robust=None)
            )
        parts = tuple(int(p) for p in cmd["parts"])
        group = Group(str(cmd["round"]), tuple(cmd["members"]), parts)
        n = group.vector_size
        vector = torch.arange(n, dtype=torch.float32).div_(n).add_(float(cmd["value"]))
        report = await self.collab.all_reduce(group, vector, float(cmd["weight"]))
        return {
            "ok": True,
            "head": vector[:8].tolist(),
            "tail": vector[-8:].tolist(),
            "complete": report.complete,
            "reduced": parts[group.index(self.peer.peer_id)] > 0,
            "bytes_sent": report.bytes_sent,
            "bytes_received": report.bytes_received,
            "seconds": report.seconds,
        }

    async def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        name = cmd.get("cmd")
        if name == "call":
            return await self.call(cmd)
        if name == "bench":
            return await self.bench(cmd)
        if name == "tcp_listen":
            return await self.tcp_listen(cmd)
        if name == "tcp_send":
            return await self.tcp_send(cmd)
        if name == "links":
            return {"ok": True, "links": [self.link_info(r) for r in list(self.peer.links)]}
        if name == "ice":
            servers = [{"urls": s.urls, "username": s.username} for s in self.peer.config.ice_servers]
            return {"ok": True, "ice": servers, "signaling": self.peer.signaling.connected.is_set()}
        if name == "turn_probe":
            return await self.turn_probe()
        if name == "host":
            return await self.host(cmd)
        if name == "train":
            return await self.train(cmd)
        if name == "collab_role":
            return await self.collab_role(cmd)
        if name == "allreduce":
            return await self.allreduce(cmd)
        if name == "drop_links":
            links = list(self.peer.links.values())
            self.peer.links.clear()
            await asyncio.gather(*(close_quietly(link) for link in links))
            DEFAULT_PROBE.forget()  # fresh links, and ICE servers probed afresh (a test may stop one)
            return {"ok": True, "dropped": len(links)}
        return {"ok": False, "error": f"unknown command {name!r}"}

    peer_host = ""


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--signal", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--connect-timeout", type=float, default=10.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aioice").setLevel(logging.WARNING)
    pin_host_addresses([args.host])
    install()
    peer = Peer(
        Identity.generate(),
        args.signal,
        handlers=handlers(),
        config=LinkConfig(connect_timeout=args.connect_timeout),
    )
    await peer.start()
    node = Node(peer)
    node.peer_host = args.host
    print(json.dumps({"event": "ready", "id": peer.peer_id}), flush=True)

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: set[asyncio.Task[None]] = set()

    async def answer(cmd: dict[str, Any]) -> None:
        try:
            out = await node.handle(cmd)
        except Exception as e:
            out = {"ok": False, "error": _error(e)}
        print(json.dumps({**out, "req": cmd.get("req")}), flush=True)

    while line := await reader.readline():
        try:
            cmd = json.loads(line)
        except ValueError:
            continue
        task = asyncio.create_task(answer(cmd))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for task in tasks:
        task.cancel()
    await asyncio.wait_for(peer.stop(), timeout=10)


if __name__ == "__main__":
    run(main())

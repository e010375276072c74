"""Spot checks over real aiortc on loopback: two honest replicas of every expert, training apart while
one trainer calls both, are never flagged; a host that perturbs 1% of its answer rows is.

Each check fetches the answering host's own state (``moe.state``) and recomputes the answer when the
host's update steps still equal the version its reply stated (engine/trainer/spot_check.py)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from engine.moe import ExpertServer, ExpertSpec, LoopThread, RemoteMixtureOfExperts, StaticExpertFinder
from engine.moe.gather import fetch_state
from engine.moe.weights import ExpertState
from engine.p2p import CallContext, Handlers, Peer
from engine.trainer.spot_check import SpotChecker
from engine.wire import Message
from tests.integration.conftest import MakePeer

SPEC = ExpertSpec("ffn", 16, hidden=32)
UIDS = [f"ffn.0.{i}" for i in range(4)]


class Replicas(StaticExpertFinder):
    """Every expert on several hosts; each lookup picks one of them at random (replication)."""

    def __init__(self, hosts: Sequence[str], seed: int = 0) -> None:
        super().__init__(dict.fromkeys(UIDS, hosts[0]))
        self.replicas, self.rng = list(hosts), random.Random(seed)

    async def find(self, prefix: str, dim_scores: Sequence[Sequence[float]], k: int) -> list[tuple[str, str]]:
        found = await super().find(prefix, dim_scores, k)
        return [(uid, self.rng.choice(self.replicas)) for uid, _ in found]


def perturbing(handlers: Handlers, fraction: float, seed: int) -> list[int]:
    """Make the host behind ``handlers`` add noise of a row's own size to ``fraction`` of the rows it
    answers; returns the running count of perturbed rows."""
    rng = random.Random(seed)
    count = [0]
    for method in ("moe.forward", "moe.forward_many"):
        honest = handlers.unary[method]

        async def cheat(msg: Message, ctx: CallContext, honest: Any = honest) -> Message:
            reply: Message = await honest(msg, ctx)
            for t in reply.tensors:
                for row in range(len(t)):
                    if rng.random() < fraction:
                        t[row] += torch.randn_like(t[row]) * t[row].norm() / t[row].numel() ** 0.5
                        count[0] += 1
            return reply

        handlers.add_unary(method, cheat)
    return count


async def hosts(make_peer: MakePeer, n: int) -> tuple[list[ExpertServer], list[Peer], list[Handlers]]:
    servers, peers, all_handlers = [], [], []
    for i in range(n):
        server = ExpertServer.create(dict.fromkeys(UIDS, SPEC), device="cpu", backend_options={"seed": i})
        handlers = Handlers()
        server.register(handlers)
        servers.append(server)
        all_handlers.append(handlers)
        peers.append(await make_peer(handlers))
    return servers, peers, all_handlers


async def train_and_check(
    trainer: Peer, host_ids: list[str], steps: int, fraction: float, until_flagged: bool = False
) -> tuple[SpotChecker, list[tuple[str, str]]]:
    loop = LoopThread.attach(asyncio.get_running_loop())
    reports: list[tuple[str, str]] = []

    async def state(host: str, uid: str) -> ExpertState:
        return await fetch_state(trainer, host, uid, SPEC, timeout=20)

    async def report(host: str, uid: str, start: float, end: float, reason: str) -> None:
        reports.append((host, reason))

    checker = SpotChecker(state, lambda uid: SPEC, report, fraction=fraction, max_in_flight=8)
    torch.manual_seed(0)
    moe = RemoteMixtureOfExperts(
        trainer, Replicas(host_ids), loop=loop, in_features=16, grid_size=(1, 4), uid_prefix="ffn",
        k_best=2, k_min=1, grace_s=0.5, timeout=20, observer=checker.consider,
    )  # fmt: skip
    dense = nn.Linear(16, 16)
    opt = torch.optim.Adam([*dense.parameters(), *moe.parameters()], lr=1e-3)

    def train() -> None:
        for _ in range(steps):
            x = torch.randn(32, 16)
            loss = (moe(dense(x)) - x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if until_flagged and reports:
                return

    await asyncio.to_thread(train)
    async with asyncio.timeout(30):
        while checker._tasks:
            await asyncio.sleep(0.05)
    return checker, reports


async def test_honest_replicas_are_never_flagged(make_peer: MakePeer) -> None:
    servers, peers, _ = await hosts(make_peer, 2)
    trainer = await make_peer()
    checker, reports = await train_and_check(trainer, [p.peer_id for p in peers], 40, fraction=0.5)
    s = checker.stats
    assert reports == [] and s.mismatches == 0, (reports, s)
    assert s.checked >= 10, s  # most checks were conclusive: the state was read before the next step
    # the replicas did train apart: comparing one with the other would have flagged them
    a, b = (srv.experts[UIDS[0]].module.state_dict() for srv in servers)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    for server in servers:
        await server.close()


async def test_a_host_perturbing_one_percent_of_its_rows_is_flagged(make_peer: MakePeer) -> None:
    servers, peers, handlers = await hosts(make_peer, 2)
    perturbed = perturbing(handlers[1], 0.01, seed=1)
    trainer = await make_peer()
    checker, reports = await train_and_check(
        trainer, [p.peer_id for p in peers], 400, fraction=0.5, until_flagged=True
    )
    assert reports, checker.stats
    assert {host for host, _ in reports} == {peers[1].peer_id}  # the cheat alone, never the honest one
    assert perturbed[0] > 0 and "its own state at version" in reports[0][1]
    for server in servers:
        await server.close()

"""``moe.state`` (engine/moe/server.py) and gathering experts' weights (engine/moe/gather.py), no sockets.

The host hands out its module's exact float32 state in the registry's order with its update steps and a
digest; it copies on the expert's worker thread (so never mid-update) and leaves the event loop free
meanwhile. The trainer refuses a reply whose digest, names, dtypes or shapes are wrong (a
``BadExpertState`` that says which), maps transport failures to codes, and among replicas takes the one
with the most update steps.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from engine.moe import ExpertCallFailed, ExpertServer, ExpertSpec
from engine.moe import server as server_module
from engine.moe.errors import BadExpertState
from engine.moe.gather import choose_replica, expert_hosts, fetch_state, gather_experts
from engine.moe.weights import ExpertState, state_layout, weights_digest
from engine.p2p import Handlers, RemoteError
from engine.wire import Compression, Message
from tests.unit.moe.test_server_client import FakePeer

SPEC = ExpertSpec("ffn", 8, hidden=16)


def host(specs: dict[str, ExpertSpec] | None = None, **backend: Any) -> tuple[ExpertServer, FakePeer]:
    server = ExpertServer.create(
        specs or {"ffn.0.1": SPEC}, device="cpu", backend_options={"seed": 0, "lr": 0.05, **backend}
    )
    handlers = Handlers()
    server.register(handlers)
    return server, FakePeer(handlers)


async def train_once(peer: FakePeer, uid: str = "ffn.0.1") -> None:
    x = torch.randn(4, 8)
    await peer.call("h", "moe.forward", {"uid": uid, "aid": "a"}, [x])
    await peer.call("h", "moe.backward", {"uid": uid, "aid": "a"}, [torch.randn(4, 8)])


class Altered:
    """A peer whose ``moe.state`` replies are changed by ``alter`` after the wire (a host that lies)."""

    def __init__(self, inner: FakePeer, alter: Any) -> None:
        self.inner, self.alter = inner, alter

    async def call(
        self,
        peer_id: str,
        method: str,
        fields: Any = None,
        tensors: Sequence[torch.Tensor] = (),
        *,
        timeout: float = 30.0,
        compression: Compression = Compression.NONE,
    ) -> Message:
        reply = await self.inner.call(peer_id, method, fields, tensors, timeout=timeout)
        self.alter(reply)
        return reply


class Silent:
    """A host that never answers."""

    async def call(self, *args: Any, timeout: float = 30.0, **kw: Any) -> Message:
        async with asyncio.timeout(timeout):
            await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_state_is_the_exact_module_state_in_registry_order_with_steps_and_digest() -> None:
    server, peer = host()
    await train_once(peer)
    await train_once(peer)
    reply = await peer.call("h", "moe.state", {"uid": "ffn.0.1"})
    module_state = server.experts["ffn.0.1"].module.state_dict()
    assert reply.fields["names"] == [n for n, _, _ in state_layout(SPEC)] == list(module_state)
    assert reply.fields["steps"] == 2
    for name, t in zip(reply.fields["names"], reply.tensors, strict=True):
        assert t.dtype == torch.float32 and torch.equal(t, module_state[name])  # raw, not float16
    assert reply.fields["sha256"] == weights_digest(list(module_state), list(module_state.values()))
    state = await fetch_state(peer, "h", "ffn.0.1", SPEC, timeout=5)
    assert state.steps == 2 and state.digest == reply.fields["sha256"] and state.host == "h"
    await server.close()


async def test_the_copy_waits_for_the_worker_thread_and_leaves_the_loop_free() -> None:
    """While the expert's worker thread is busy (a batch, an optimizer step) the state is not read; the
    event loop still answers other calls meanwhile."""
    server, peer = host()
    backend = server.experts["ffn.0.1"]
    release, entered = threading.Event(), threading.Event()

    def busy() -> None:
        entered.set()
        release.wait(10)
        with torch.no_grad():  # an "update" that must be seen whole or not at all
            for p in backend.module.parameters():
                p.add_(1.0)
        backend.stats.steps += 1

    before = {k: v.clone() for k, v in backend.module.state_dict().items()}
    loop = asyncio.get_running_loop()
    blocker = loop.run_in_executor(backend.executor, busy)
    await asyncio.to_thread(entered.wait, 5)
    pending = asyncio.ensure_future(peer.call("h", "moe.state", {"uid": "ffn.0.1"}))
    await asyncio.sleep(0.2)
    assert not pending.done()  # queued behind the update
    info = await asyncio.wait_for(peer.call("h", "moe.info", {"uid": "ffn.0.1"}), 1)  # the loop is free
    assert info.fields["dim"] == 8
    release.set()
    await blocker
    reply = await asyncio.wait_for(pending, 5)
    assert reply.fields["steps"] == 1
    for name, t in zip(reply.fields["names"], reply.tensors, strict=True):
        assert torch.equal(t, before[name] + 1.0)  # the whole update, never part of it
    await server.close()


@pytest.mark.parametrize(
    ("alter", "reason"),
    [
        (lambda r: r.tensors[2].view(-1).__setitem__(0, 0.123), "digest"),  # bytes changed after hashing
        (lambda r: r.fields.__setitem__("sha256", "0" * 64), "digest"),
        (
            lambda r: r.fields.__setitem__(
                "names", ["norm.weight", "norm.bias", "down.weight", "up.bias", "up.weight", "down.bias"]
            ),
            "names",
        ),
        (lambda r: r.tensors.__setitem__(0, r.tensors[0][:4].clone()), "shapes"),
        (lambda r: r.tensors.__setitem__(0, r.tensors[0].double()), "shapes"),
        (lambda r: r.tensors[3].view(-1).__setitem__(0, float("nan")), "non_finite"),
        (lambda r: r.tensors.pop(), "malformed"),
        (lambda r: r.fields.__setitem__("steps", -1), "malformed"),
        (lambda r: r.fields.__setitem__("sha256", "not hex"), "malformed"),
        (lambda r: r.fields.__setitem__("names", "up.weight"), "malformed"),
    ],
)
async def test_a_reply_that_does_not_check_out_is_refused_with_its_reason(alter: Any, reason: str) -> None:
    server, peer = host()
    with pytest.raises(BadExpertState) as err:
        await fetch_state(Altered(peer, alter), "h", "ffn.0.1", SPEC, timeout=5)
    assert err.value.reason == reason and err.value.code == "bad_state" and "ffn.0.1" in str(err.value)
    await server.close()


async def test_another_architecture_or_size_is_refused_against_the_local_spec() -> None:
    """The host's module is built from its own spec; the trainer checks it against the experiment's."""
    server, peer = host({"ffn.0.1": ExpertSpec("ffn", 8, hidden=32), "ffn.0.2": ExpertSpec("transformer", 8)})
    with pytest.raises(BadExpertState) as err:
        await fetch_state(peer, "h", "ffn.0.1", SPEC, timeout=5)
    assert err.value.reason == "shapes" and "up.weight" in str(err.value)
    with pytest.raises(BadExpertState) as err:
        await fetch_state(peer, "h", "ffn.0.2", SPEC, timeout=5)
    assert err.value.reason == "names"
    await server.close()


async def test_unknown_uid_closing_host_silent_host_and_oversized_state_have_codes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, peer = host()
    with pytest.raises(ExpertCallFailed) as err:
        await fetch_state(peer, "h", "ffn.9.9", SPEC, timeout=5)
    assert err.value.code == "unknown_expert"
    with pytest.raises(ExpertCallFailed) as err:
        await asyncio.wait_for(fetch_state(Silent(), "h", "ffn.0.1", SPEC, timeout=0.2), 2)
    assert err.value.code == "timeout"
    monkeypatch.setattr(server_module, "STATE_MAX_BYTES", 100)
    with pytest.raises(RemoteError) as remote:
        await peer.call("h", "moe.state", {"uid": "ffn.0.1"})
    assert remote.value.code == "too_large"
    monkeypatch.undo()
    await server.close()
    with pytest.raises(ExpertCallFailed) as err:
        await fetch_state(peer, "h", "ffn.0.1", SPEC, timeout=5)
    assert err.value.code == "unavailable"


def state(host_id: str, steps: int, digest: str) -> ExpertState:
    return ExpertState("ffn.0.1", host_id, (), (), steps, digest)


def test_the_replica_with_most_steps_wins_then_the_majority_then_the_smallest_host() -> None:
    assert choose_replica([state("a", 3, "x"), state("b", 5, "y"), state("c", 4, "z")]).host == "b"
    assert choose_replica([state("a", 5, "x"), state("b", 5, "y"), state("c", 5, "y")]).host == "b"
    assert choose_replica([state("c", 5, "x"), state("b", 5, "y")]).host == "b"
    assert choose_replica([state("c", 9, "x"), state("b", 5, "x"), state("a", 5, "x")]).host == "c"
    with pytest.raises(ValueError):
        choose_replica([])


class Swarm:
    """FakePeers by host id (``Silent`` ones too)."""

    def __init__(self, peers: dict[str, Any]) -> None:
        self.peers = peers
        self.calls: list[str] = []

    async def call(self, peer_id: str, method: str, *args: Any, **kw: Any) -> Message:
        self.calls.append(peer_id)
        reply: Message = await self.peers[peer_id].call(peer_id, method, *args, **kw)
        return reply


async def test_gathering_takes_the_most_trained_replica_and_reports_every_other() -> None:
    s1, p1 = host({"ffn.0.1": SPEC, "ffn.0.2": SPEC})
    s2, p2 = host({"ffn.0.1": SPEC})
    s3, p3 = host({"ffn.0.1": SPEC})
    await train_once(p2)  # host2's replica has learned one step more than host1's
    liar = Altered(p3, lambda r: r.fields.__setitem__("sha256", "f" * 64))
    swarm = Swarm({"host1": p1, "host2": p2, "host3": liar, "host4": Silent()})
    hosts = {"ffn.0.1": ["host1", "host2", "host3", "host4"], "ffn.0.2": ["host1"], "ffn.1.1": []}
    got = await asyncio.wait_for(gather_experts(swarm, hosts, SPEC, timeout=0.5), 5)
    one = got["ffn.0.1"]
    assert one.taken is not None and one.taken.host == "host2" and one.taken.steps == 1
    assert [s.host for s in one.answered] == ["host1", "host2"] and not one.agree
    assert set(one.failed) == {"host3", "host4"}
    assert one.failed["host3"].startswith("bad_state") and one.failed["host4"].startswith("timeout")
    want = s2.experts["ffn.0.1"].module.state_dict()
    assert all(torch.equal(t, want[n]) for n, t in one.taken.as_dict().items())
    assert got["ffn.0.2"].taken is not None and got["ffn.0.2"].taken.host == "host1"
    assert got["ffn.1.1"].taken is None and got["ffn.1.1"].hosts == ()
    for s in (s1, s2, s3):
        await s.close()


async def test_expert_hosts_reads_every_cell_of_the_grid_from_the_lookups() -> None:
    table = {
        "g.0.": {0: ("g.0.0", ("h1", "h2")), 2: ("g.0.2", ("h2",))},
        "g.1.": {1: ("g.1.1", ("h1",)), 5: ("g.1.5", ("h9",)), 0: ("g.9.9", ("h7",))},
    }
    asked: list[str] = []

    async def children(prefix: str) -> Any:
        asked.append(prefix)
        return table.get(prefix, {})

    hosts = await expert_hosts(children, "g", (2, 3))
    assert sorted(asked) == ["g.0.", "g.1."]
    assert hosts == {  # a foreign uid under a prefix, and a cell off the grid, are ignored
        "g.0.0": ("h1", "h2"), "g.0.1": (), "g.0.2": ("h2",),
        "g.1.0": (), "g.1.1": ("h1",), "g.1.2": (),
    }  # fmt: skip
    assert set(await expert_hosts(children, "g", (3,))) == {"g.0", "g.1", "g.2"}

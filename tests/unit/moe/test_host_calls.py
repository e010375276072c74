"""One request per host and layer (``moe.forward_many`` / ``moe.backward_many``, engine/moe/host_call.py).

A mixture layer over hosts that each hold several experts: the answers equal the local computation, each
host gets one request per direction whatever the number of its experts touched, an expert fails alone
(unknown on its host, evicted inputs re-sent by the single call), a host whose reply does not fit fails
all of its experts, the observer still hears of every expert, and the server refuses malformed batches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from engine.moe import (
    ExpertServer,
    ExpertSpec,
    LoopThread,
    NotEnoughExperts,
    RemoteMixtureOfExperts,
    StaticExpertFinder,
    build,
)
from engine.moe.layer_calls import CallRecord
from engine.p2p import CallContext, Handlers, RemoteError
from engine.wire import Compression, Kind, Message
from tests.unit.moe.test_server_client import FakePeer

SPEC = ExpertSpec("ffn", 8, hidden=16)
GRID = (3, 3)
UIDS = [f"ffn.{i}.{j}" for i in range(3) for j in range(3)]
HOSTS = {uid: f"host{n % 2}" for n, uid in enumerate(UIDS)}  # host0: 5 experts, host1: 4


class CountingSwarm:
    """FakePeers by host id, counting methods; ``garbage`` hosts answer a batched call wrongly."""

    peer_id = "7e" * 20  # the trainer's: receipt ids derive from it

    def __init__(self, servers: dict[str, ExpertServer]) -> None:
        self.peers = {}
        for host, server in servers.items():
            handlers = Handlers()
            server.register(handlers)
            self.peers[host] = FakePeer(handlers)
        self.methods: Counter[tuple[str, str]] = Counter()
        self.garbage: set[str] = set()

    async def call(
        self,
        peer_id: str,
        method: str,
        fields: dict[str, Any] | None = None,
        tensors: Sequence[torch.Tensor] = (),
        *,
        timeout: float = 30.0,
        compression: Compression = Compression.NONE,
    ) -> Message:
        self.methods[(peer_id, method)] += 1
        reply = await self.peers[peer_id].call(peer_id, method, fields, tensors, timeout=timeout)
        if peer_id in self.garbage and method.endswith("_many") and reply.tensors:
            reply.tensors = [reply.tensors[0][:-1]]  # one row short
        return reply


@pytest.fixture
def swarm() -> Iterator[tuple[LoopThread, CountingSwarm, dict[str, ExpertServer]]]:
    servers = {
        host: ExpertServer.create(
            {u: SPEC for u, h in HOSTS.items() if h == host}, device="cpu", backend_options={"lr": 0.0}
        )
        for host in ("host0", "host1")
    }
    with LoopThread() as lt:
        yield lt, CountingSwarm(servers), servers


def mixture(
    lt: LoopThread, swarm: CountingSwarm, hosts: dict[str, str] | None = None, **kw: Any
) -> RemoteMixtureOfExperts:
    torch.manual_seed(0)
    return RemoteMixtureOfExperts(
        swarm,  # type: ignore[arg-type]
        StaticExpertFinder(hosts or HOSTS),
        loop=lt,
        in_features=8,
        grid_size=GRID,
        uid_prefix="ffn",
        **{"k_best": 4, "k_min": 1, "grace_s": 0.2, "timeout": 3.0, **kw},
    )


def reference(moe: RemoteMixtureOfExperts, servers: dict[str, ExpertServer], x: torch.Tensor) -> torch.Tensor:
    """The layer computed here with the hosts' weights (top-4 of the grid, as the static finder picks)."""
    scores = torch.stack(
        [moe.gates[0](x)[:, int(u.split(".")[1])] + moe.gates[1](x)[:, int(u.split(".")[2])] for u in UIDS], 1
    )
    top, index = scores.topk(4, dim=1)
    modules = []
    for uid in UIDS:
        m = build(SPEC)
        m.load_state_dict(servers[HOSTS[uid]].experts[uid].module.state_dict())
        modules.append(m)
    xh = x.half().float()
    outs = torch.stack(
        [torch.stack([modules[int(e)](xh[r : r + 1])[0] for e in index[r]]) for r in range(len(x))]
    )
    return (torch.softmax(top, 1).unsqueeze(-1) * outs).sum(1)


def test_one_request_per_host_and_direction_with_the_local_answer(
    swarm: tuple[LoopThread, CountingSwarm, dict[str, ExpertServer]],
) -> None:
    lt, counting, servers = swarm
    moe = mixture(lt, counting)
    x = torch.randn(12, 8, requires_grad=True)
    y = moe(x)
    assert torch.allclose(y, reference(moe, servers, x.detach()), atol=2e-2, rtol=1e-2)
    y.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    touched = {m[1] for m in counting.methods}
    assert touched == {"moe.forward_many", "moe.backward_many"}
    assert all(n == 1 for n in counting.methods.values())  # each host once per direction
    assert sum(s["backward_requests"] for srv in servers.values() for s in srv.stats().values()) > 2


def test_an_expert_unknown_on_its_host_fails_alone(
    swarm: tuple[LoopThread, CountingSwarm, dict[str, ExpertServer]],
) -> None:
    lt, counting, _ = swarm
    records: list[CallRecord] = []
    lying = {**HOSTS, "ffn.0.0": "host1"}  # host1 does not hold ffn.0.0
    moe = mixture(lt, counting, hosts=lying, observer=records.append)
    x = torch.randn(16, 8, requires_grad=True)
    moe(x).sum().backward()
    forward = {r.uid: r for r in records if not r.backward}
    assert forward["ffn.0.0"].code == "unknown_expert" and not forward["ffn.0.0"].ok
    assert all(r.ok for u, r in forward.items() if u != "ffn.0.0")
    assert {r.uid for r in records if r.backward} == {u for u, r in forward.items() if r.ok}


def test_a_host_whose_reply_does_not_fit_fails_all_its_experts(
    swarm: tuple[LoopThread, CountingSwarm, dict[str, ExpertServer]],
) -> None:
    lt, counting, _ = swarm
    counting.garbage.add("host1")
    records: list[CallRecord] = []
    moe = mixture(lt, counting, observer=records.append)
    moe(torch.randn(16, 8))
    bad = [r for r in records if r.host == "host1"]
    assert bad and all(r.code == "bad_reply" for r in bad)
    assert all(r.ok for r in records if r.host == "host0")


def test_evicted_inputs_are_re_sent_by_the_single_call(
    swarm: tuple[LoopThread, CountingSwarm, dict[str, ExpertServer]],
) -> None:
    lt, counting, servers = swarm
    moe = mixture(lt, counting)
    x = torch.randn(12, 8, requires_grad=True)
    y = moe(x)
    for server in servers.values():  # as if the hosts' caches ran out
        backend = next(iter(server.experts.values()))
        backend.cache.clear()
        if backend.graphs is not None:
            backend.graphs.clear()
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert sum(n for (_, m), n in counting.methods.items() if m == "moe.backward") >= 2


async def _many(server: ExpertServer, fields: dict[str, Any], tensors: list[torch.Tensor]) -> Message:
    handlers = Handlers()
    server.register(handlers)
    msg = Message(Kind.REQUEST, 1, "moe.forward_many", fields, tensors)
    return await handlers.unary["moe.forward_many"](msg, CallContext("trainer", 1))


@pytest.mark.parametrize(
    "fields, rows, why",
    [
        ({"uids": ["ffn.0.0"], "aids": ["a"]}, [3], "one length"),
        ({"uids": [], "aids": [], "rows": []}, [3], "at least one"),
        ({"uids": ["ffn.0.0"], "aids": ["a"], "rows": [0]}, [3], "positive ints"),
        ({"uids": ["ffn.0.0"], "aids": ["a"], "rows": [True]}, [3], "positive ints"),
        ({"uids": ["ffn.0.0"], "aids": ["a"], "rows": [2]}, [3], "sum of rows"),
        ({"uids": ["ffn.0.0"] * 1025, "aids": ["a"] * 1025, "rows": [1] * 1025}, [1025], "at most 1024"),
        ({"uids": ["ffn.0.0"], "aids": ["a"], "rows": [3], "wire": "int3"}, [3], "unknown wire"),
    ],
)
async def test_the_server_refuses_malformed_batches(
    fields: dict[str, Any], rows: list[int], why: str
) -> None:
    server = ExpertServer.create({"ffn.0.0": SPEC}, device="cpu")
    with pytest.raises(RemoteError, match=why):
        await _many(server, fields, [torch.randn(rows[0], 8)])
    await server.close()


async def test_a_bad_aid_fails_its_expert_alone() -> None:
    server = ExpertServer.create({"ffn.0.0": SPEC, "ffn.0.1": SPEC}, device="cpu")
    reply = await _many(
        server,
        {"uids": ["ffn.0.0", "ffn.0.1"], "aids": ["x" * 65, "ok"], "rows": [2, 3]},
        [torch.randn(5, 8)],
    )
    assert reply.fields["codes"] == ["bad_input", ""] and reply.tensors[0].shape == (3, 8)
    await server.close()


def test_a_sample_no_expert_answered_passes_through_when_asked(
    swarm: tuple[LoopThread, CountingSwarm, dict[str, ExpertServer]],
) -> None:
    """Residual experts (a language model's): an unanswered token keeps its input, and only it."""
    lt, counting, servers = swarm
    only_host0 = {u: "host0" for u in UIDS}  # host0 claims every expert but holds five
    x = torch.randn(32, 8, requires_grad=True)
    with pytest.raises(NotEnoughExperts):
        mixture(lt, counting, hosts=only_host0, k_best=1)(x)
    moe = mixture(lt, counting, hosts=only_host0, k_best=1, pass_short=True)
    y = moe(x)
    held = set(servers["host0"].experts)
    scores = moe.gates[0](x)[:, :, None] + moe.gates[1](x)[:, None, :]
    best = scores.flatten(1).argmax(1).tolist()
    unserved = torch.tensor([UIDS[b] not in held for b in best])
    assert 0 < moe.short_rows == int(unserved.sum()) < len(x)
    assert torch.equal(y[unserved], x[unserved])
    assert not torch.allclose(y[~unserved], x[~unserved])
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()

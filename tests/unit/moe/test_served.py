"""What a host says of its answers: one countersignature per reply over every expert it answered (the
trainer's receipts carry it and the coordinator verifies it), and each forward's expert version."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from coordinator.credit.receipts import Verifier
from engine.moe import ExpertServer, LoopThread
from engine.moe.host_call import reply_proofs, reply_versions
from engine.moe.layer_calls import CallRecord
from engine.p2p import Identity
from engine.wire.statements import sign_receipt
from tests.unit.moe.test_host_calls import SPEC, UIDS, CountingSwarm, mixture

HOST_KEYS = [Identity.generate(), Identity.generate()]
HOSTS = {uid: HOST_KEYS[n % 2].peer_id for n, uid in enumerate(UIDS)}
TRAINER = Identity.generate()


@pytest.fixture
def swarm() -> Iterator[tuple[LoopThread, CountingSwarm]]:
    servers = {
        key.peer_id: ExpertServer.create(
            {u: SPEC for u, h in HOSTS.items() if h == key.peer_id},
            device="cpu",
            backend_options={"lr": 0.0},
            signer=key,
        )
        for key in HOST_KEYS
    }
    with LoopThread() as lt:
        counting = CountingSwarm(servers)
        _as_trainer(counting)
        yield lt, counting


def _as_trainer(swarm: CountingSwarm) -> None:
    """The hosts see the trainer's peer id as the caller's, as a real link authenticates it."""
    swarm.peer_id = TRAINER.peer_id  # type: ignore[misc]
    for peer in swarm.peers.values():
        peer.peer_id = TRAINER.peer_id


def _receipts(records: list[CallRecord]) -> list:  # type: ignore[type-arg]
    return [
        sign_receipt(TRAINER, r.host, r.uid, r.samples, r.backward, r.served_at, r.receipt_id, r.proof)
        for r in records
        if r.ok
    ]


async def test_every_answer_is_countersigned_and_the_coordinator_verifies_it(
    swarm: tuple[LoopThread, CountingSwarm],
) -> None:
    lt, counting = swarm
    records: list[CallRecord] = []
    lying = {**HOSTS, "ffn.0.0": HOST_KEYS[1].peer_id}  # that host does not hold ffn.0.0: fails alone
    moe = mixture(lt, counting, hosts=lying, observer=records.append)
    for _ in range(2):
        moe(torch.randn(16, 8, requires_grad=True)).sum().backward()
    ok = [r for r in records if r.ok]
    assert len(ok) > 8 and all(r.proof is not None for r in ok)
    assert len({r.receipt_id for r in ok}) == len(ok)  # one receipt id per request and direction
    assert any(r.proof is not None and r.proof.leaves > 1 for r in ok)  # one signature, many experts
    assert await Verifier().reasons(_receipts(records)) == [None] * len(ok)
    # Stated versions: the first forward of each expert saw no update, the second one each.
    forwards = [r for r in ok if not r.backward]
    first = {r.uid: r.version for r in reversed(forwards)}
    assert set(first.values()) == {0}
    assert all(r.version >= 0 for r in forwards) and any(r.version == 1 for r in forwards)
    assert all(r.version == -1 for r in ok if r.backward)


async def test_a_host_without_a_signer_gives_no_proof_and_its_receipts_are_refused() -> None:
    server = ExpertServer.create({u: SPEC for u in UIDS}, device="cpu")
    host = Identity.generate().peer_id
    with LoopThread() as lt:
        counting = CountingSwarm({host: server})
        _as_trainer(counting)
        records: list[CallRecord] = []
        moe = mixture(lt, counting, hosts=dict.fromkeys(UIDS, host), observer=records.append)
        moe(torch.randn(4, 8))
    ok = [r for r in records if r.ok]
    assert ok and all(r.proof is None for r in ok)
    assert set(await Verifier().reasons(_receipts(records))) == {"no_countersignature"}


def test_malformed_reply_fields_are_no_proof_and_no_version() -> None:
    key = Identity.generate()
    good = {"served_at": 1.0, "host_key": key.public_key, "host_sig": b"s" * 64}
    served = [("aid", "ffn.0.0", 4)]
    assert reply_proofs(good, TRAINER.peer_id, False, served) is not None
    for bad in (
        {},
        {**good, "served_at": "1"},
        {**good, "host_key": b"k" * 31},
        {**good, "host_sig": "s" * 64},
        {**good, "host_sig": b"s" * 65},
    ):
        assert reply_proofs(bad, TRAINER.peer_id, False, served) is None
    assert reply_proofs(good, TRAINER.peer_id, False, []) is None
    assert reply_versions({"versions": [3, -1, True, "x", -5]}, 5) == [3, -1, -1, -1, -1]
    assert reply_versions({"versions": [3]}, 2) == [-1, -1]
    assert reply_versions({"version": 7}, 1) == [7]
    assert reply_versions({"version": 7}, 2) == [-1, -1]




async def test_another_trainer_cannot_claim_what_a_host_served_this_one(
    swarm: tuple[LoopThread, CountingSwarm],
) -> None:
    lt, counting = swarm
    records: list[CallRecord] = []
    mixture(lt, counting, hosts=HOSTS, observer=records.append)(torch.randn(4, 8))
    r = next(r for r in records if r.ok)
    thief = Identity.generate()
    stolen = sign_receipt(thief, r.host, r.uid, r.samples, r.backward, r.served_at, r.receipt_id, r.proof)
    assert await Verifier().reasons([stolen]) == ["bad_countersignature"]

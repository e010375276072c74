"""Error feedback and state snapshots: pure tensor work, no network."""

import hashlib

import pytest
import torch
from torch import nn

from engine.collab.codec import ErrorFeedback, roundtrip
from engine.collab.errors import NoStateMajority, StateDownloadFailed
from engine.collab.snapshot import StateRecord, choose_state, load_snapshot, take_snapshot
from engine.wire import Compression


@pytest.mark.parametrize("comp", [Compression.FLOAT16, Compression.INT8])
def test_roundtrip_is_idempotent(comp: Compression) -> None:
    x = torch.randn(10_000)
    once = roundtrip(x, comp)
    assert torch.equal(roundtrip(once, comp), once)


def test_error_feedback_keeps_the_sum_of_what_was_sent_close() -> None:
    torch.manual_seed(0)
    fb = ErrorFeedback(4096, Compression.INT8)
    xs = [torch.randn(4096) * 0.01 for _ in range(50)]
    sent_total = torch.zeros(4096)
    for x in xs:
        sent, comp = fb.apply(0, x)
        assert comp == Compression.INT8
        sent_total += sent
    true_total = torch.stack(xs).sum(0)
    assert fb.residual is not None
    # the residual costs half a float32 vector: bfloat16, as wide in range as float32
    assert fb.residual.dtype == torch.bfloat16 and fb.residual.element_size() == 2
    # what is still owed is the residual (up to its bfloat16 rounding): nothing is lost across rounds
    assert torch.allclose(sent_total + fb.residual.float(), true_total, atol=1e-5)
    no_fb = sum(roundtrip(x, Compression.INT8) for x in xs)
    assert (sent_total - true_total).abs().max() < (no_fb - true_total).abs().max()


def test_float16_overflow_goes_uncompressed() -> None:
    fb = ErrorFeedback(4, Compression.FLOAT16)
    sent, comp = fb.apply(0, torch.tensor([1e6, 0.0, 1.0, 2.0]))
    assert comp == Compression.NONE and sent[0] == 1e6


def make() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return model, opt


def test_snapshot_loads_into_a_fresh_model_bit_for_bit() -> None:
    model, opt = make()
    snap = take_snapshot("run", 7, model, opt, part_bytes=256)
    assert len(snap.manifest.part_hashes) == -(-len(snap.blob) // 256)
    assert snap.manifest_hash == hashlib.sha256(snap.manifest_bytes).digest()
    fresh = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    load_snapshot(fresh, fresh_opt, snap.manifest, bytearray(snap.blob))
    again = take_snapshot("run", 7, fresh, fresh_opt, part_bytes=256)
    assert again.blob == snap.blob and again.manifest_hash == snap.manifest_hash


def test_snapshot_that_does_not_fit_is_refused() -> None:
    model, opt = make()
    snap = take_snapshot("run", 1, model, opt)
    other = nn.Sequential(nn.Linear(8, 17), nn.ReLU(), nn.Linear(17, 3))
    with pytest.raises(StateDownloadFailed, match="does not fit"):
        load_snapshot(other, torch.optim.Adam(other.parameters()), snap.manifest, bytearray(snap.blob))
    with pytest.raises(StateDownloadFailed):
        load_snapshot(model, opt, snap.manifest, bytearray(snap.blob[:-4]))


def test_choose_state_takes_the_newest_state_a_majority_vouches_for() -> None:
    records = {
        "a": StateRecord(5, b"h1", 4, b"h0"),
        "b": StateRecord(5, b"h1", 4, b"h0"),
        "c": StateRecord(5, b"h2", 4, b"h0"),  # a donor whose epoch-5 state differs
        "d": StateRecord(4, b"h0", 3, b"hx"),  # not yet stepped
    }
    # 2 of 4 for (5, h1) is no majority; all four still vouch for (4, h0): that is taken
    assert choose_state(records) == (4, b"h0", ["a", "b", "c", "d"])
    records["c"] = StateRecord(5, b"h1", 4, b"h0")
    assert choose_state(records) == (5, b"h1", ["a", "b", "c"])
    with pytest.raises(StateDownloadFailed):
        choose_state({})
    # records without a previous snapshot (the first epoch, or an older donor's wire form) vote once
    assert choose_state({"a": StateRecord(1, b"h"), "b": StateRecord(1, b"h")}) == (1, b"h", ["a", "b"])
    with pytest.raises(NoStateMajority):
        choose_state({"a": StateRecord(1, b"h"), "b": StateRecord(2, b"g")})

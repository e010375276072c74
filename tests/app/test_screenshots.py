"""Every window a volunteer sees, in light and dark, with real content: the wizard's pages, the
settings, and the status window whose chart shows a trainer's real calls to the node. Saved under
docs/screenshots/ (shown in README.md) and checked here for what a reader must find on them."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from PySide6.QtWidgets import QApplication, QWidget

from app.qt.controller import AppController
from app.qt.theme import apply_color_scheme
from engine.account import CoordinatorApi
from engine.moe.host_call import reply_proofs
from engine.p2p import Identity
from engine.p2p.patches import pin_host_addresses
from engine.trainer import sign_receipt
from engine.wire.statements import receipt_id_of
from tests.integration.test_node_swarm import trainer_peer

from .conftest import Coordinator
from .helpers import consented

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def save(widget: QWidget, name: str) -> Path:
    QApplication.processEvents()
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    assert widget.grab().save(str(path)), path
    return path


@pytest.fixture(params=["light", "dark"])
def scheme(request: pytest.FixtureRequest, qapp: QApplication) -> Any:
    apply_color_scheme(qapp, request.param)
    yield request.param
    apply_color_scheme(qapp, "light")


def test_wizard_pages(scheme: str, app_env: Path, make_controller: Callable[..., AppController]) -> None:
    c = make_controller(coordinator="http://127.0.0.1:8470", use_tray=False)
    c.start()
    wiz = c.wizard
    assert wiz is not None
    for name in ("welcome", "limits", "account", "confirm"):
        if name == "account":
            wiz.account.name.setText("Ada")
            wiz.account.team.setText("Lovelace Lab")
        if name == "limits":
            wiz.limits.form.widget("sat").setText("09:00-17:00, 25:00-26:00")  # shows the live check
        save(wiz, f"wizard-{name}-{scheme}")
        if name == "limits":
            assert not wiz.limits.isComplete()
            wiz.limits.form.widget("sat").setText("09:00-17:00")
        if name != "confirm":
            wiz.next()
    assert "Start contributing" in wiz.confirm.summary.text()


async def credit_work(
    coordinator: Coordinator, identity: Identity, host: str, uid: str, served: list[tuple[str, Any]]
) -> None:
    """Receipts for the calls ``served`` ((activation id, reply fields) of 32 samples each), signed by
    the caller's key (its account "Trainer" given the trainer role) and countersigned by the host's
    replies, as the trainer's ReceiptBook posts them."""
    services = coordinator.running.services
    api = CoordinatorApi(coordinator.url)
    try:
        account = await services.accounts.set_role("Trainer", "trainer", by=None)
        token = services.tokens.issue(account.id, "trainer")
        receipts = []
        for aid, fields in served[:100]:
            (proof,) = reply_proofs(fields, identity.peer_id, False, [(aid, uid, 32)]) or [None]
            assert proof is not None, fields
            rid = receipt_id_of(identity.peer_id, aid, False)
            receipts.append(sign_receipt(identity, host, uid, 32, False, proof.served_at, rid, proof))
        answer = await api.post_receipts(token, receipts)
        assert answer["accepted"] == len(receipts), answer
    finally:
        await api.close()


def test_settings_and_status_with_real_activity(
    scheme: str,
    app_env: Path,
    coordinator: Coordinator,
    make_controller: Callable[..., AppController],
    wait_until: Callable[..., None],
) -> None:
    consented(coordinator.url, name="Ada")
    c = make_controller(use_tray=False)
    c.start()
    wait_until(lambda: (c.status or {}).get("state") == "running", 90, "the node to run")
    assert c.status is not None
    node_id, uid = c.status["peer_id"], c.status["experts"][0]
    pin_host_addresses(["127.0.0.1"])
    peer, dht = coordinator.loop.run(trainer_peer(coordinator.running, [node_id]), 60)
    c.show_status()
    served: list[tuple[str, Any]] = []
    try:
        end = time.monotonic() + 14
        while time.monotonic() < end:  # a trainer's calls, as the chart should show them
            batch = torch.randn(32, 16)
            aid = f"a{time.monotonic_ns()}"
            reply = coordinator.loop.run(
                peer.call(node_id, "moe.forward", {"uid": uid, "aid": aid}, [batch], timeout=20), 30
            )
            served.append((aid, reply.fields))
            QApplication.processEvents()
    finally:
        coordinator.loop.run(dht.stop(), 15)
        coordinator.loop.run(peer.stop(), 15)
    wait_until(lambda: len(c.activity.points) >= 3, 20, "points on the chart")
    wait_until(lambda: (c.status or {}).get("requests_served", 0) > 0, 10, "requests counted")
    # a trainer's receipts for that work credit the account; the window shows the coordinator's credit
    # as soon as it is opened again (it said "0.0 (rank #1)", read before any receipt arrived)
    coordinator.loop.run(credit_work(coordinator, peer.identity, node_id, uid, served), 30)
    c.show_status()
    credit = c.status_window.fields["credit"]
    wait_until(
        lambda: re.fullmatch(r"[\d,]+\.\d \(rank #1\), read at \d\d:\d\d:\d\d", credit.text()), 20, "credit"
    )
    work = c.status_window.fields["work"].text()
    assert work.startswith("Chosen: trainers called its"), work
    c.status_window.redraw()
    assert c.status_window.fields["served"].text().split(" ")[0] != "0"
    axis = c.status_window.chart.getAxis("bottom")  # clock times at round steps, not "minutes ago"
    (low, high), width = c.status_window.chart.viewRange()[0], axis.width() or 500
    [(spacing, ticks)] = axis.tickValues(low, high, width)
    labels = axis.tickStrings(ticks, 1.0, spacing)
    assert len(labels) >= 2 and spacing in (10, 15, 30, 60, 120), (spacing, labels)
    assert all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", label) for label in labels), labels
    save(c.status_window, f"status-{scheme}")
    c.show_settings()
    save(c.settings_window, f"settings-{scheme}")
    assert c.window is not None
    save(c.window, f"window-no-tray-{scheme}")

"""Real collaborative trainers report to a real coordinator: two Trainers train the dense part together
through a volunteer's experts; their status appears on the swarm page and their training samples on
the Trainers tab, bounded by their receipts; with the coordinator gone, a report only logs a warning."""

from __future__ import annotations

import json
import logging
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from coordinator.config import CoordinatorConfig
from coordinator.server.app import start_full
from engine.moe import LoopThread
from engine.node.join import join_local
from engine.p2p.patches import install
from engine.resources import Settings
from engine.trainer import Trainer, TrainerConfig, TrainerNode, load_digits_split
from lah.demo import experiment_of

pytestmark = pytest.mark.integration


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=15) as r:
        return str(r.read().decode())


@pytest.mark.timeout(300)
def test_trainers_status_reaches_the_swarm_page_and_the_trainers_tab(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = TrainerConfig(
        grid=(2, 2),
        k_best=2,
        batch_size=16,
        target_batch_size=64,
        gather_s=1.0,
        status_interval_s=0.5,
        lr=1e-2,
    )
    install()  # the transport's patches, as the demo and the CLI install them
    torch.set_num_threads(1)  # tiny matrices: threads only contend with the peers' own
    loop = LoopThread("collab-status-test")
    with tempfile.TemporaryDirectory(prefix="lah-collab-status-") as tmp_name:
        tmp = Path(tmp_name)
        experiment = experiment_of(cfg, replication=1)
        config = CoordinatorConfig(
            port=0,
            database_url=f"sqlite+aiosqlite:///{tmp / 'c.sqlite3'}",
            token_key_path=str(tmp / "token.key"),
            experiments=[experiment],
            verify_workers=0,
        )
        running = loop.run(start_full(config), 60)
        nodes: list[TrainerNode] = []
        volunteer: Any = None
        try:
            volunteer = loop.run(
                join_local(running.url, "vol", tmp / "v", Settings(ram_budget_mib=64), device="cpu"), 90
            )
            for i in range(2):
                node = TrainerNode(running.url, f"trainer-{i}", loop=loop, config=cfg)
                nodes.append(node)
                loop.run(node.start(), 60)
                loop.run(running.services.accounts.set_role(f"trainer-{i}", "trainer", by=None), 15)
            uids = [f"{cfg.uid_prefix}.{i}.{j}" for i in range(2) for j in range(2)]
            assert loop.run(nodes[0].finder.wait_for_hosts(uids, 30), 40) == 4
            data = load_digits_split(seed=0)
            team = []
            for i, node in enumerate(nodes):
                model = node.model()
                collab = loop.run(node.collaborate(model), 60)
                team.append(Trainer(model, data, cfg, collab=collab, loop=loop, data_seed=i))
            with ThreadPoolExecutor(2) as pool:
                done = [pool.submit(t.train_epochs, 3, progress=False, max_batches=200) for t in team]
                for f in done:
                    f.result(timeout=200)
            for node in nodes:
                loop.run(node.receipts.flush(), 30)
                assert node.status is not None
                assert loop.run(node.status.report(), 15)  # the last word, after the receipts
                assert node.status.failed == 0

            (c,) = json.loads(fetch(running.url + "/api/collab"))["collaborations"]
            assert c["experiment"] == cfg.uid_prefix and c["target"] == 64
            assert {t["peer_id"] for t in c["trainers"]} == {n.identity.peer_id for n in nodes}
            assert c["epoch"] >= 3 and c["last_round_epoch"] >= 1
            assert c["last_round_outcome"] in ("ok", "partial", "timed_out", "local")
            assert all(t["peers"] >= 1 for t in c["trainers"])

            swarm = fetch(running.url + "/swarm")
            assert "Collaborative training" in swarm and "trainers online" in swarm
            for node in nodes:
                assert node.identity.peer_id[:12] in swarm and node.name in swarm

            board = json.loads(fetch(running.url + "/api/collab/trainers"))["trainers"]
            by_name = {row["account_name"]: row for row in board}
            for node, trainer in zip(nodes, team, strict=True):
                row = by_name[node.name]
                assert trainer.collab is not None
                assert row["claimed"] == trainer.collab.samples_processed == trainer.stats.samples > 0
                assert row["receipt_samples"] > 0  # every batch went forward through the volunteer's experts
                assert row["samples"] == min(row["claimed"], row["receipt_samples"])
            page = fetch(running.url + "/leaderboard?kind=trainers")
            assert all(node.name in page for node in nodes)
        finally:
            loop.run(running.stop(), 15)
        # The coordinator is gone: a report fails, the trainer logs a warning and goes on.
        caplog.set_level(logging.WARNING, logger="engine.trainer.collab_status")
        status = nodes[0].status
        assert status is not None
        status.warn_every_s = 0.0
        assert loop.run(status.report(), 30) is False
        assert status.failed >= 1
        assert any("collaboration status not reported" in r.getMessage() for r in caplog.records)
        for node in nodes:
            try:
                loop.run(node.stop(), 30)
            except Exception:  # the final report of a stopping trainer may time out: not the test's subject
                logging.getLogger(__name__).exception("stopping a trainer")
        if volunteer is not None:
            loop.run(volunteer.stop(), 30)
        loop.close()

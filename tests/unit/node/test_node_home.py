"""A node's home (--data-dir), the words a volunteer reads about it (where the token is, why the node
waits, why it got no work, its credit), and the limit flags of ``lah node``. No sockets."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import keyring
import pytest
from keyrings.alt.file import PlaintextKeyring

from engine.account import FileTokenStore, keyring_place
from engine.control.credit import describe_credit
from engine.control.headless import add_limit_flags, flag, hint_for, limit_overrides
from engine.node import NodeHome
from engine.node.participation import Participation
from engine.resources import Decision, Reason, SettingsError, State


def test_data_dir_is_the_whole_home_and_two_homes_share_no_path(tmp_path: Path) -> None:
    a, b = NodeHome.at(tmp_path / "a"), NodeHome.at(tmp_path / "b")
    paths = {"lock", "control", "identity", "traffic", "settings", "token_file", "log_file"}
    for home, root in ((a, tmp_path / "a"), (b, tmp_path / "b")):
        for name in paths:
            assert getattr(home, name).is_relative_to(root), name
    assert not {getattr(a, n) for n in paths} & {getattr(b, n) for n in paths}
    a.prepare()
    if os.name == "posix":
        assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700  # it holds the key and the token
    assert isinstance(a.token_store(), FileTokenStore)  # never the user's one keyring entry
    # --settings replaces one file only (nodes may share a settings file on purpose)
    shared = NodeHome.choose(tmp_path / "a", settings=tmp_path / "shared.toml")
    assert shared.settings == tmp_path / "shared.toml" and shared.lock == a.lock


def test_the_default_home_is_where_nodes_always_lived(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    home = NodeHome.default()
    if sys.platform.startswith("linux"):
        assert home.lock == tmp_path / "run" / "learning-at-home" / "node.lock"
    assert home.settings == tmp_path / "config" / "learning-at-home" / "settings.toml"
    assert home.token_file is None and home.log_file is None and not home.explicit


def test_a_home_made_before_it_held_the_token_adopts_the_keyring_entry_once(tmp_path: Path) -> None:
    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring.cfg")  # type: ignore[misc]
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    try:
        backend.set_password("learning-at-home", "http://c:8470", '{"account_id": 7}')
        home = NodeHome.at(tmp_path / "old")
        assert not home.adopt_keyring_token("http://c:8470")  # no identity: a new home, nothing to adopt
        home.prepare()
        home.identity.write_bytes(b"key")
        assert home.adopt_keyring_token("http://c:8470")
        assert FileTokenStore(home.data / "token.json").get("http://c:8470") == '{"account_id": 7}'
        backend.set_password("learning-at-home", "http://c:8470", '{"account_id": 8}')
        assert not home.adopt_keyring_token("http://c:8470")  # once: the file is the node's from now on
        assert "keyring.cfg" in keyring_place()
    finally:
        keyring.set_keyring(previous)


def _decision(reason: Reason) -> Decision:
    return Decision(State.WAITING, reason, "waiting")


def test_each_wait_names_its_setting_and_flag(tmp_path: Path) -> None:
    file = tmp_path / "settings.toml"
    no_display = hint_for(_decision(Reason.IDLE_UNKNOWN), gpu=False, settings_file=file)
    assert no_display is not None and "no display" in no_display
    assert f"only_when_idle = false in {file}" in no_display and "--no-only-when-idle" in no_display
    gpu = hint_for(_decision(Reason.IDLE_UNKNOWN), gpu=True, settings_file=file)
    assert gpu is not None and "--no-gpu-only-when-idle" in gpu
    busy = hint_for(_decision(Reason.CPU_BUSY), gpu=False, settings_file=file)
    assert busy is not None and "pause_when_other_cpu_percent = 0" in busy
    assert "--pause-when-other-cpu-percent 0" in busy
    # a flag sets it: editing the file would change nothing, so only the flag is named
    forced = hint_for(
        _decision(Reason.USER_ACTIVE), gpu=False, settings_file=file, overrides={"only_when_idle": True}
    )
    assert forced is not None and "started with --only-when-idle" in forced and str(file) not in forced
    assert hint_for(Decision(State.RUNNING, Reason.RUNNING, "ok"), gpu=False, settings_file=file) is None
    assert hint_for(Decision(State.PAUSED, Reason.PAUSED, "you"), gpu=False, settings_file=file) is None
    assert hint_for(None, gpu=False, settings_file=file) is None


def test_limit_flags_are_the_settings_and_bad_values_are_named() -> None:
    parser = argparse.ArgumentParser()
    add_limit_flags(parser)
    args = parser.parse_args(["--no-only-when-idle", "--pause-when-other-cpu-percent", "0"])
    assert limit_overrides(args) == {"only_when_idle": False, "pause_when_other_cpu_percent": 0}
    assert limit_overrides(parser.parse_args([])) == {}
    with pytest.raises(SettingsError) as bad:
        limit_overrides(parser.parse_args(["--cpu-max-percent", "0", "--idle-after-s", "5"]))
    assert "--cpu-max-percent 0" in str(bad.value) and "--idle-after-s 5" in str(bad.value)
    assert flag("use_gpu", False) == "--no-use-gpu" and flag("cpu_threads", 2) == "--cpu-threads 2"


def test_why_a_node_got_no_work_in_plain_words() -> None:
    base = {"started": True, "assignment_known": True, "links_out": 0, "served": 0, "refused": 0}
    unassigned = Participation(**{**base, "experts": 0, "links_in": 0})
    assert not unassigned.assigned and "no experts" in unassigned.summary()
    unreached = Participation(**{**base, "experts": 4, "links_in": 0})
    assert unreached.assigned and not unreached.reachable
    assert (
        "no other computer has connected" in unreached.summary() and "firewall or NAT" in unreached.summary()
    )
    unchosen = Participation(**{**base, "experts": 4, "links_in": 3})
    assert unchosen.reachable and not unchosen.chosen and "no trainer has called" in unchosen.summary()
    chosen = Participation(**{**base, "experts": 4, "links_in": 3, "served": 1200, "refused": 12})
    assert chosen.chosen and "1,212 times" in chosen.summary() and "12 turned away" in chosen.summary()
    as_json = chosen.to_json()
    assert (as_json["assigned"], as_json["reachable"], as_json["chosen"]) == (True, True, True)
    assert Participation(False, False, 0, 0, 0, 0, 0).summary().startswith("Not in the swarm yet")


def test_credit_is_a_reading_with_its_time() -> None:
    at = time.mktime((2026, 5, 2, 14, 2, 10, 0, 0, -1))
    assert describe_credit({"credit": 31403.0, "rank": 4, "credit_at": at}, now=at + 5) == (
        "31,403.0 (rank #4), read at 14:02:10"
    )
    none_yet = describe_credit({"credit": 0.0, "rank": 1, "credit_at": at}, now=at + 5)
    assert none_yet.startswith("none yet, read at 14:02:10") and "rank" not in none_yet  # "#1" of nobody
    assert describe_credit({"credit": None}) == "not read yet"
    failed = describe_credit({"credit": 5.0, "credit_at": at, "credit_error": "unreachable"}, now=at + 5)
    assert failed.endswith("; the last reading failed: unreachable")
    assert "02 May" in describe_credit({"credit": 5.0, "credit_at": at}, now=at + 2 * 86400)

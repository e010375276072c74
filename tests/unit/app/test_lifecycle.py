"""The tray app's states and transitions (``app.core.lifecycle``) without Qt: a recording host stands in
for the windows, the node's process and the loop thread, and answers when the test says so. The same
paths against the real widgets, node and coordinator are in tests/app."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from app.core import notices
from app.core.config import AppConfig, load_config, save_config
from app.core.consent import Consent, FirstRun
from app.core.errors import RegistrationError
from app.core.host import Done
from app.core.lifecycle import Lifecycle, Phase
from app.core.notices import seconds_until_tomorrow
from app.core.paths import AppPaths
from app.core.presentation import View
from app.core.registration import TokenPlace
from engine.account.tokens import Credentials
from engine.control import ControlError
from engine.resources import Settings, load_settings, save_settings

URL = "http://127.0.0.1:8470"


@dataclass
class Sent:
    cmd: str
    done: Done | None
    args: dict[str, Any]


class FakeHost:
    """Records what the lifecycle asks; the node's process and link are two plain fields."""

    def __init__(self, *, window: bool = False) -> None:
        self.window = window  # a no-tray window stands in for the tray
        self.node: tuple[str, str] | None = None
        self.connected = False
        self.notices: list[tuple[str, str]] = []
        self.views: list[View] = []
        self.events: list[str] = []
        self.first_run: FirstRun | None = None
        self.work: list[tuple[Coroutine[Any, Any, Any], Done]] = []
        self.sent: list[Sent] = []
        self.shown: list[tuple[dict[str, Any], bool]] = []
        self.on_stopped: Callable[[], None] | None = None

    def notify(self, title: str, text: str) -> None:
        self.notices.append((title, text))

    def show_tray(self) -> None:
        self.events.append("show_tray")

    def render(self, view: View) -> None:
        self.views.append(view)

    def show_wizard(self, first_run: FirstRun) -> None:
        self.events.append("show_wizard")
        self.first_run = first_run

    def show_window(self) -> bool:
        self.events.append("show_window")
        return self.window

    def start_node(self) -> None:
        self.events.append("start_node")
        self.node = self.node or ("stopped", "Not started yet.")

    def restart_node(self) -> None:
        self.events.append("restart_node")

    def start_updates(self, coordinator_url: str) -> None:
        self.events.append(f"start_updates {coordinator_url}")

    def run(self, work: Coroutine[Any, Any, Any], done: Done) -> None:
        self.work.append((work, done))

    def send(self, cmd: str, done: Done | None, **args: Any) -> None:
        self.sent.append(Sent(cmd, done, args))

    def show_node_status(self, status: dict[str, Any], new_point: bool) -> None:
        self.shown.append((status, new_point))

    def node_state(self) -> tuple[str, str] | None:
        return self.node

    def node_connected(self) -> bool:
        return self.connected

    def wind_down(self, on_stopped: Callable[[], None]) -> None:
        self.events.append("wind_down")
        self.on_stopped = on_stopped

    def finish(self) -> None:
        self.events.append("finish")

    # the test's hand on the other side

    def complete_work(self) -> None:
        """Run the oldest submitted coroutine to its end and deliver its result, as the loop thread would."""
        work, done = self.work.pop(0)
        try:
            result = asyncio.run(work)
        except Exception as e:
            done(None, e)
        else:
            done(result, None)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Made:
    life: Lifecycle
    host: FakeHost
    paths: AppPaths
    clock: Clock
    autostart: list[bool]
    registered: list[tuple[str, str, str, str]]


def paths_in(tmp_path: Path) -> AppPaths:
    config = tmp_path / "config"
    return AppPaths(config / "app.toml", config / "settings.toml", tmp_path / "data", tmp_path / "logs")


@pytest.fixture
def make(tmp_path: Path) -> Callable[..., Made]:
    def build(
        *, consented: bool = False, window: bool = False, fail_with: Exception | None = None, **options: Any
    ) -> Made:
        paths = paths_in(tmp_path)
        if consented:
            joined = AppConfig(consented=True, coordinator_url=URL, display_name="Bo", autostart=False)
            save_config(joined, paths.config)
            save_settings(Settings(use_gpu=False), paths.settings)
        host, clock = FakeHost(window=window), Clock()
        autostart: list[bool] = []
        registered: list[tuple[str, str, str, str]] = []

        async def register(
            url: str, name: str, team: str, data: Path, *, invite: str = ""
        ) -> tuple[Credentials, TokenPlace]:
            registered.append((url, name, team, invite))
            if fail_with is not None:
                raise fail_with
            return Credentials(42, "token", 2e9), TokenPlace("a private file", data / "token.json")

        life = Lifecycle(
            host,
            paths,
            register=register,
            place=lambda data: TokenPlace("a private file", data / "token.json"),
            set_autostart=autostart.append,
            clock=clock,
            **options,
        )
        return Made(life, host, paths, clock, autostart, registered)

    return build


def consent(**fields: Any) -> Consent:
    base: dict[str, Any] = {
        "settings": Settings(cpu_max_percent=35),
        "display_name": "Ada",
        "team": "lab",
        "coordinator_url": URL,
        "autostart": True,
        "invite": "code",
    }
    return Consent(**{**base, **fields})


def running(m: Made, **status: Any) -> None:
    m.host.node, m.host.connected = ("running", "The contribution engine is running."), True
    m.life.status_received({"state": "running", "experts": ["ffn.0.0"], **status})


# -- the first run ---------------------------------------------------------------------------------------


def test_a_first_run_opens_the_wizard_and_starts_nothing(make: Callable[..., Made]) -> None:
    m = make(coordinator=URL + "/")
    assert m.life.phase is Phase.NEW
    m.life.start()
    assert m.life.phase is Phase.FIRST_RUN
    assert m.host.events == ["show_tray", "show_wizard"]
    assert m.host.first_run == FirstRun(
        m.life.settings, URL, "a private file", name="", team="", autostart=True
    )
    assert m.host.views == [View("starting", "Starting…", "Waiting for you to join.", False)]
    assert not m.paths.config.exists() and not m.paths.settings.exists() and m.registered == []


def test_registration_keeps_the_choices_and_closing_the_wizard_starts_the_node(
    make: Callable[..., Made],
) -> None:
    m = make(coordinator=URL)
    m.life.start()
    replies: list[str | None] = []
    m.life.register(consent(), replies.append)
    assert m.life.phase is Phase.REGISTERING and replies == [] and not m.paths.config.exists()
    m.host.complete_work()
    assert replies == [None] and m.life.phase is Phase.JOINED
    assert m.registered == [(URL, "Ada", "lab", "code")]
    saved, _ = load_config(m.paths.config)
    assert saved.consented and saved.account_id == 42 and saved.display_name == "Ada" and saved.team == "lab"
    assert saved.token_file == str(m.paths.data / "token.json") and saved.autostart
    datetime.fromisoformat(saved.consented_at)
    assert load_settings(m.paths.settings)[0].cpu_max_percent == 35 == m.life.settings.cpu_max_percent
    assert "start_node" not in m.host.events  # ... until the wizard has closed
    m.life.wizard_closed()
    assert m.autostart == [True]
    assert m.host.events[-3:] == ["show_window", "start_node", f"start_updates {URL}"]
    assert m.life.phase is Phase.STARTING
    token = ["--token-file", str(m.paths.data / "token.json")]
    assert m.life.node_args() == ["--coordinator", URL, "--name", "Ada", "--team", "lab", *token]


def test_a_failed_registration_says_why_and_lets_the_volunteer_try_again(make: Callable[..., Made]) -> None:
    m = make(fail_with=RegistrationError("The name 'Ada' is already taken.", unreachable=False))
    m.life.start()
    replies: list[str | None] = []
    m.life.register(consent(), replies.append)
    m.host.complete_work()
    assert replies == ["The name 'Ada' is already taken."] and m.life.phase is Phase.FIRST_RUN
    assert not m.life.config.consented and not m.paths.config.exists() and not m.paths.settings.exists()
    m.life.register(consent(), replies.append)
    assert m.life.phase is Phase.REGISTERING
    m.host.complete_work()
    assert len(replies) == 2 and m.life.phase is Phase.FIRST_RUN


def test_an_unexpected_registration_error_is_named_as_such(make: Callable[..., Made]) -> None:
    m = make(fail_with=ValueError("boom"))
    m.life.start()
    replies: list[str | None] = []
    m.life.register(consent(), replies.append)
    m.host.complete_work()
    assert replies == ["Registration failed: boom"]


def test_closing_the_wizard_without_consent_quits_and_leaves_nothing(make: Callable[..., Made]) -> None:
    m = make()
    m.life.start()
    m.life.wizard_closed()
    assert m.life.phase is Phase.QUITTING and m.host.events[-1] == "wind_down"
    assert "start_node" not in m.host.events and m.autostart == [] and not m.paths.config.exists()
    assert m.host.on_stopped is not None
    m.host.on_stopped()
    assert m.life.phase is Phase.DONE and m.host.events[-1] == "finish"


def test_a_demo_never_checks_for_updates_nor_ticks_start_at_login(
    make: Callable[..., Made], tmp_path: Path
) -> None:
    m = make(demo=True)
    assert not m.life.settings.only_when_idle and m.life.settings.pause_when_other_cpu_percent == 0
    m.life.start()
    assert m.host.first_run is not None and m.host.first_run.name == "you" and not m.host.first_run.autostart
    m.life.register(consent(autostart=False), lambda _: None)
    m.host.complete_work()
    m.life.wizard_closed()
    assert "start_node" in m.host.events and not any(e.startswith("start_updates") for e in m.host.events)


# -- a volunteer who joined: the node and what it says --------------------------------------------------


def test_one_who_joined_goes_straight_to_work(make: Callable[..., Made]) -> None:
    m = make(consented=True, coordinator="http://ignored")  # --coordinator counts only before consent
    m.life.start()
    assert m.host.events == ["show_tray", "show_window", "start_node", f"start_updates {URL}"]
    assert m.host.first_run is None and m.life.phase is Phase.STARTING and m.autostart == []
    assert m.host.views[-1] == View("starting", "Starting…", "Not started yet.", False)


def test_the_phase_follows_the_node_running_paused_restarting_and_failed(make: Callable[..., Made]) -> None:
    m = make(consented=True)
    m.life.start()
    m.host.node = ("starting", "Starting the contribution engine…")
    m.life.node_changed(*m.host.node)
    assert m.life.phase is Phase.STARTING and m.life.view.reason == "Starting the contribution engine…"
    running(m)
    assert m.life.phase is Phase.RUNNING and m.life.view.icon == "contributing"
    assert m.host.shown[-1][0]["state"] == "running"
    m.life.status_received({"state": "paused"})
    assert m.life.phase is Phase.PAUSED and m.life.view.paused
    m.host.connected = False
    m.life.link_changed()
    assert m.life.phase is Phase.STARTING and m.life.view.icon == "starting"
    m.host.node = ("restarting", "The contribution engine crashed; restarting in 1 s.")
    m.life.node_changed(*m.host.node)
    assert m.life.phase is Phase.RESTARTING and m.life.view.icon == "error"
    assert m.host.notices == []
    m.host.node = ("gave_up", "The contribution engine crashed 5 times in a row.")
    m.life.node_changed(*m.host.node)
    assert m.life.phase is Phase.FAILED and m.life.view.paused  # the menu offers Resume
    title, text = m.host.notices[-1]
    assert title == "Learning@home stopped" and str(m.paths.logs / "node.log") in text
    m.life.resume()  # after giving up, Resume starts the process again rather than asking it
    assert m.host.events[-1] == "restart_node" and m.host.sent == []


def test_the_tray_is_redrawn_only_when_what_it_shows_changes(make: Callable[..., Made]) -> None:
    m = make(consented=True)
    m.life.start()
    running(m, requests_served=1)
    drawn = len(m.host.views)
    m.life.status_received({"state": "running", "experts": ["ffn.0.0"], "requests_served": 2})
    assert len(m.host.views) == drawn and len(m.host.shown) == 2  # the status window still gets each


def test_an_unreachable_project_is_told_once_after_a_minute_and_forgotten_once_back(
    make: Callable[..., Made],
) -> None:
    m = make(consented=True)
    m.life.start()
    m.host.node, m.host.connected = ("running", ""), True
    down = {"state": "starting", "errors": [{"message": "coordinator unreachable"}]}
    m.life.status_received(down)
    assert m.life.view.headline == "Cannot reach the project" and m.host.notices == []
    m.clock.t += notices.UNREACHABLE_NOTIFY_S
    m.life.status_received(down)
    m.clock.t += 5
    m.life.status_received(down)
    assert [t for t, _ in m.host.notices] == ["Cannot reach the project"]
    m.life.status_received({"state": "running", "experts": []})
    m.life.status_received(down)
    m.clock.t += notices.UNREACHABLE_NOTIFY_S
    m.life.status_received(down)
    assert [t for t, _ in m.host.notices] == ["Cannot reach the project"] * 2


def test_a_credit_milestone_is_thanked_once(make: Callable[..., Made]) -> None:
    m = make(consented=True)
    m.life.start()
    running(m, credit=120.0)
    running(m, credit=150.0)
    assert m.host.notices == [("Thank you!", "Your computer has earned 100 credit for the project.")]
    assert load_config(m.paths.config)[0].credit_milestone == 100


def test_a_window_instead_of_a_tray_is_explained_once(make: Callable[..., Made], tmp_path: Path) -> None:
    m = make(consented=True, window=True)
    m.life.start()
    assert m.host.notices[0][0] == "No tray icon here" and load_config(m.paths.config)[0].no_tray_noted
    again = make(window=True)
    again.life.start()
    assert again.host.notices == []


def test_repaired_settings_are_told_before_anything_else(make: Callable[..., Made], tmp_path: Path) -> None:
    settings = paths_in(tmp_path).settings
    settings.parent.mkdir(parents=True)
    settings.write_text("cpu_max_percent = 400\n")
    m = make()
    m.life.start()
    assert m.host.notices and all(title == "Settings repaired" for title, _ in m.host.notices)
    assert any("cpu_max_percent" in text for _, text in m.host.notices)
    assert m.host.events[0] == "show_tray" and m.life.settings.cpu_max_percent == Settings().cpu_max_percent


# -- the volunteer's commands -----------------------------------------------------------------------------


def test_a_command_shows_the_new_state_or_says_why_not(make: Callable[..., Made]) -> None:
    m = make(consented=True)
    m.life.start()
    running(m)
    m.life.command("snooze", seconds=3600)
    sent = m.host.sent[-1]
    assert sent.cmd == "snooze" and sent.args == {"seconds": 3600} and sent.done is not None
    snoozed = {"state": "snoozed", "reason": "snoozed for an hour"}
    sent.done(snoozed, None)
    assert m.life.phase is Phase.PAUSED and m.life.status == snoozed
    m.life.resume()
    assert m.host.sent[-1].cmd == "resume"
    done = m.host.sent[-1].done
    assert done is not None
    done(None, ControlError("not_running", "the node does not answer"))
    assert m.host.notices[-1] == ("Learning@home", "Could not resume: the node does not answer")


def test_settings_apply_live_or_wait_in_the_file_for_the_next_start(make: Callable[..., Made]) -> None:
    m = make(consented=True)
    m.life.start()
    running(m, limits=msgspec.to_builtins(Settings(cpu_max_percent=20)))
    assert m.life.current_settings().cpu_max_percent == 20  # what the node has in force
    replies: list[str | None] = []
    m.life.apply_settings({"cpu_max_percent": 30}, True, replies.append)
    assert m.autostart == [True] and load_config(m.paths.config)[0].autostart
    sent = m.host.sent[-1]
    assert sent.cmd == "set_limits" and sent.args == {"limits": {"cpu_max_percent": 30}} and sent.done
    sent.done(msgspec.to_builtins(Settings(cpu_max_percent=30)), None)
    assert replies == [None] and m.life.settings.cpu_max_percent == 30
    m.life.apply_settings({"cpu_max_percent": 40}, True, replies.append)
    done = m.host.sent[-1].done
    assert done is not None
    done(None, ControlError("not_running", "no node"))
    assert replies[-1] == "Saved. The engine is not running; it will use them when it starts."
    assert load_settings(m.paths.settings)[0].cpu_max_percent == 40 == m.life.settings.cpu_max_percent


def test_a_login_entry_that_cannot_be_written_is_said(make: Callable[..., Made]) -> None:
    m = make(consented=True)

    def refuse(_enabled: bool) -> None:
        raise OSError("read-only")

    m.life._set_autostart = refuse
    m.life.start()
    replies: list[str | None] = []
    m.life.apply_settings({}, True, replies.append)
    done = m.host.sent[-1].done
    assert done is not None
    done(msgspec.to_builtins(m.life.settings), None)
    assert replies == ["The login entry could not be changed."]
    assert m.host.notices[-1] == ("Start at login", "Could not change the login entry: read-only")
    assert not load_config(m.paths.config)[0].autostart


def test_the_site_link_is_the_volunteers_page_once_known(make: Callable[..., Made]) -> None:
    m = make()
    assert m.life.site_url().endswith("/leaderboard")
    m.life.config = msgspec.structs.replace(m.life.config, account_id=7)
    assert m.life.site_url() == f"{m.life.config.coordinator_url}/contributors/7"


def test_quit_winds_down_once_and_finishes(make: Callable[..., Made]) -> None:
    m = make(consented=True)
    m.life.start()
    m.life.quit()
    m.life.quit()
    assert m.host.events.count("wind_down") == 1 and m.life.phase is Phase.QUITTING
    assert m.host.on_stopped is not None
    m.host.on_stopped()
    assert m.life.phase is Phase.DONE and m.host.events[-1] == "finish"


def test_snooze_until_tomorrow_means_seven_in_the_morning() -> None:
    assert seconds_until_tomorrow(datetime(2026, 3, 1, 22, 30)) == 8.5 * 3600

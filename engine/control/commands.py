"""What ``lah node``, ``lah status``, ``lah pause``, ``lah resume`` and ``lah snooze`` do.

``lah node`` lives in a :class:`~engine.node.NodeHome` (``--data-dir``: one folder for everything the
node owns, so several nodes on one machine and account share nothing). It takes the home's instance
lock (a second node on the same home is refused with the first one's PID), loads the settings with the
command line's limits on top, follows the settings file while it runs (``SettingsWatcher``: every node
sharing a file picks up an edit), loads the identity and token, starts the Volunteer with the real
machine's sensors and governor, and serves the control socket until Ctrl+C / SIGTERM. Why a node waits
(and what changes that) and, at the end, why it served nothing, go to its console and its home's log.
The others reach a node by its home: the default one, or ``--data-dir DIR``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

import psutil  # type: ignore[import-untyped]

from engine.account import AccountError, CoordinatorUnreachable
from engine.node import (
    AlreadyRunning,
    InstanceLock,
    NodeError,
    NodeHome,
    Volunteer,
    VolunteerConfig,
)
from engine.p2p import Identity, LinkConfig
from engine.p2p.ice_stats import format_transport
from engine.resources import (
    DataCapCounter,
    Settings,
    SettingsError,
    SettingsWatcher,
    SystemSensors,
    TokenBucket,
    apply_overrides,
    apply_torch_limits,
    format_overrides,
    load_settings,
)

from .client import ControlClient
from .credit import describe_credit
from .headless import NodeLog
from .node_control import NodeControl
from .protocol import ControlError
from .server import ControlServer

RETRY_UNREACHABLE_S = 30.0
SETTINGS_CHECK_S = 2.0  # how often a running node looks at its settings file
HINT_CHECK_S = 1.0
HINT_REPEAT_S = 600.0


async def run_node(
    coordinator_url: str,
    *,
    name: str | None = None,
    team: str | None = None,
    home: NodeHome | None = None,
    invite: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    settings_check_s: float = SETTINGS_CHECK_S,
) -> int:
    """``overrides``: the command line's limits (``engine.control.headless.limit_overrides``), on top of
    the settings file for the whole run and never written to it."""
    home = home or NodeHome.default()
    overrides = dict(overrides or {})
    try:
        home.prepare()
    except OSError as e:
        print(f"lah node: cannot make {home.data} this node's home: {e}", file=sys.stderr)
        return 2
    lock = InstanceLock(home.lock)
    try:
        lock.acquire()
    except AlreadyRunning as e:
        reach = f"`lah status --data-dir {home.data}`" if home.explicit else "`lah status`"
        print(
            f"lah node: a volunteer node is already running in this home (pid {e.pid}, lock {e.path}); "
            f"{reach} shows it. Another node on this machine needs a --data-dir of its own.",
            file=sys.stderr,
        )
        return 2
    except (NodeError, OSError) as e:
        print(f"lah node: {e}", file=sys.stderr)
        return 2
    try:
        out = NodeLog(home.log_file)
    except OSError as e:
        lock.release()
        print(f"lah node: cannot write this node's log {home.log_file}: {e}", file=sys.stderr)
        return 2
    try:
        return await _run_locked(coordinator_url, name, team, home, invite, overrides, out, settings_check_s)
    finally:
        out.close()
        lock.release()


async def _run_locked(
    coordinator_url: str,
    name: str | None,
    team: str | None,
    home: NodeHome,
    invite: str | None,
    overrides: dict[str, Any],
    out: NodeLog,
    settings_check_s: float,
) -> int:
    node_control: NodeControl | None = None

    def on_settings_change(file_settings: Settings, warnings: list[str]) -> None:
        for warning in warnings:
            out.warn(f"settings: {warning}")
        if node_control is None:
            return
        try:
            changed = node_control.reload(file_settings)
        except SettingsError as e:
            out.warn(f"settings: {home.settings} changed, but {e}; the limits in force stay")
            return
        if changed:
            kept = sorted(set(changed) & set(overrides))
            still = f"; the command line still sets {', '.join(kept)}" if kept else ""
            out.say(f"settings: {home.settings} changed ({', '.join(changed)}): applied{still}")

    watcher = SettingsWatcher(home.settings, on_settings_change, interval=settings_check_s)  # before loading
    file_settings, warnings = load_settings(home.settings)
    for warning in warnings:
        out.warn(f"settings: {warning}")
    try:
        settings = apply_overrides(file_settings, overrides)
    except SettingsError as e:
        out.warn(f"lah node: {e}")
        return 2
    out.say(f"lah node: {home.describe()}")
    if overrides:
        out.say(
            f"lah node: limits from the command line, over the settings file: {format_overrides(overrides)}"
        )
    apply_torch_limits(settings)
    store = home.token_store()
    if home.adopt_keyring_token(coordinator_url.rstrip("/")):
        out.say(
            f"lah node: this home's token was in the keyring; it is kept in {home.token_file} from now on"
        )
    # The volunteer's bandwidth caps and monthly data cap, enforced in the transport: every link
    # paces its frames through these buckets and counts its bytes into the counter, which the
    # governor reads to wait once the month's cap is spent.
    traffic = DataCapCounter(home.traffic, settings.data_cap_reset_day)
    upload = TokenBucket(settings.max_upload_kib_s * 1024)  # rate 0: unlimited, until the user sets one
    download = TokenBucket(settings.max_download_kib_s * 1024)
    link_config = LinkConfig(
        connect_timeout=15,
        upload=upload,
        download=download,
        on_traffic=lambda sent, received: traffic.add(sent=sent, received=received),
    )
    sensors = SystemSensors(use_gpu=settings.use_gpu, gpu_index=settings.gpu_index, data_counter=traffic)

    def make_volunteer(settings: Settings) -> Volunteer:
        return Volunteer(
            Identity.load_or_create(home.identity),
            coordinator_url,
            store,
            settings,
            home.data,
            account_name=name,
            team=team,
            invite=invite,
            sensors=sensors,
            config=VolunteerConfig(link=link_config),
        )

    volunteer = make_volunteer(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # Windows: Ctrl+C only
            loop.add_signal_handler(sig, stop.set)
    # The control socket is up from the start, so the tray app can show "starting" and the
    # coordinator's errors while the node waits for it, and can stop the node at any moment.
    node_control = NodeControl(
        volunteer,
        home.settings,
        upload,
        download,
        traffic=traffic,
        on_shutdown=stop.set,
        overrides=overrides,
        file_settings=file_settings,
    )
    control = ControlServer(node_control, home.control)
    await control.start()
    watcher.start()
    tasks: list[asyncio.Task[None]] = []
    try:
        while True:  # a volunteer's node waits out a coordinator that is down, however long
            try:
                await volunteer.start()
                break
            except CoordinatorUnreachable as e:
                out.warn(f"lah node: {e}; trying again in {RETRY_UNREACHABLE_S:.0f} s")
                await volunteer.stop()
                try:
                    await asyncio.wait_for(stop.wait(), RETRY_UNREACHABLE_S)
                    return 0  # asked to stop while waiting: a clean stop
                except TimeoutError:
                    errors = volunteer.errors
                    volunteer = make_volunteer(node_control.volunteer.settings)  # as reloaded meanwhile
                    volunteer.errors.extend(errors)  # the tray keeps showing why it waits
                    node_control.volunteer = volunteer
            except (AccountError, NodeError) as e:
                out.warn(f"lah node: {e}")
                await volunteer.stop()
                return 1
        if (watch := _watch_parent(stop)) is not None:
            tasks.append(watch)
        tasks.append(asyncio.create_task(_tell_waits(node_control, out), name="wait-hints"))
        hosted = ", ".join(volunteer.hosted_uids) or "nothing yet"
        reach = f"lah status --data-dir {home.data}" if home.explicit else "lah status"
        out.say(
            f"node {volunteer.peer_id[:12]}… hosting {hosted}; `{reach}` shows it; control at "
            f"{control.path}; Ctrl+C stops"
        )
        await stop.wait()
        out.say(_run_summary(volunteer.status()))
        return 0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await watcher.stop()
        await control.stop()
        await volunteer.stop()
        sensors.close()
        traffic.flush()


async def _tell_waits(node_control: NodeControl, out: NodeLog) -> None:
    """Say in the log why the node waits and what would change that, when it starts waiting: on a server
    nobody looks at a tray, and a node that waits for good must say so where its operator looks. The same
    hint at most every ``HINT_REPEAT_S`` (a busy machine goes in and out of waiting all day)."""
    said: dict[str, float] = {}
    last: str | None = None
    while True:
        hint = node_control.hint()
        now = time.monotonic()
        if hint is not None and hint != last and now - said.get(hint, -HINT_REPEAT_S) >= HINT_REPEAT_S:
            out.warn(f"lah node: waiting. {hint}")
            said[hint] = now
        last = hint
        await asyncio.sleep(HINT_CHECK_S)


def _run_summary(status: dict[str, Any]) -> str:
    """The run's last line: what it served, and when that is nothing, why (assigned, reachable, chosen)."""
    served = int(status.get("requests_served") or 0)
    seen = status.get("participation") or {}
    if served or not seen:
        return f"lah node: stopping; this run served {served:,} requests"
    return f"lah node: stopping; this run served no requests. {seen.get('summary', '')}".rstrip()


PARENT_CHECK_S = 2.0


def _watch_parent(stop: asyncio.Event) -> asyncio.Task[None] | None:
    """A node started by the tray app (``LAH_PARENT_PID``) stops cleanly once the app is gone (it
    crashed or was killed), instead of running on where nobody can pause it."""
    try:
        parent = int(os.environ.get("LAH_PARENT_PID", ""))
    except ValueError:
        return None

    async def watch() -> None:
        # no event tells another process's exit: poll, slowly
        while psutil.pid_exists(parent):  # noqa: ASYNC110
            await asyncio.sleep(PARENT_CHECK_S)
        print(f"lah node: the app that started this node (pid {parent}) is gone; stopping", flush=True)
        stop.set()

    return asyncio.create_task(watch(), name="parent-watch")


def format_status(status: dict[str, Any]) -> str:
    lines = [f"state:     {status.get('state')} ({status.get('reason')})"]
    if status.get("hint"):
        lines.append(f"hint:      {status['hint']}")
    seen = status.get("participation") or {}
    if seen.get("summary"):
        lines.append(f"work:      {seen['summary']}")
    lines += [
        f"experts:   {', '.join(status.get('experts') or []) or '-'}",
        f"served:    {status.get('requests_served')} requests, refused {status.get('requests_refused')}",
        f"traffic:   {status.get('bytes_up', 0) / 2**20:.1f} MiB up, "
        f"{status.get('bytes_down', 0) / 2**20:.1f} MiB down",
        f"links:     {format_transport(status.get('transport') or {})}",
        f"credit:    {describe_credit(status)}",
    ]
    if status.get("overrides"):
        lines.append(f"flags:     {format_overrides(status['overrides'])} (over the settings file)")
    if status.get("energy_kwh") is not None:
        lines.append(f"energy:    {status['energy_kwh']:.4f} kWh (estimate)")
    for err in (status.get("errors") or [])[-3:]:
        lines.append(f"error:     {err.get('message')}")
    return "\n".join(lines)


async def run_client(
    command: str, *, minutes: float = 0.0, follow: bool = False, home: NodeHome | None = None
) -> int:
    """``home``: the node's (``--data-dir``), default: the user's own node."""
    path = (home or NodeHome.default()).control
    try:
        async with ControlClient(path) as client:
            if command == "status" and follow:
                async for status in client.follow_status():
                    print(format_status(status) + "\n", flush=True)
                return 0
            if command == "status":
                status = await client.status()
            elif command == "pause":
                status = await client.pause()
            elif command == "resume":
                status = await client.resume()
            elif command == "snooze":
                status = await client.snooze(minutes * 60)
            else:
                raise ControlError("unknown_command", command)
    except ControlError as e:
        print(f"lah {command}: {e.message}", file=sys.stderr)
        return 1
    print(format_status(status))
    return 0

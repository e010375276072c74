"""What ``lah node``, ``lah status``, ``lah pause``, ``lah resume`` and ``lah snooze`` do.

``lah node`` takes the single-instance lock (a second node is refused with the first one's PID), loads
the settings, identity and token (OS keyring, or ``--token-file``), starts the Volunteer with the real
machine's sensors and governor, and serves the control socket until Ctrl+C / SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from engine.node import (
    CoordinatorUnreachable,
    FileTokenStore,
    InstanceLock,
    NodeError,
    TokenStore,
    Volunteer,
)
from engine.node.tokens import default_token_store
from engine.p2p import Identity, LinkConfig
from engine.p2p.ice_stats import format_transport
from engine.resources import (
    DataCapCounter,
    SystemSensors,
    TokenBucket,
    apply_torch_limits,
    load_settings,
    settings_path,
)

from .client import ControlClient
from .node_control import NodeControl
from .protocol import ControlError, data_dir, default_connection_path, default_dir
from .server import ControlServer

RETRY_UNREACHABLE_S = 30.0


async def run_node(
    coordinator_url: str,
    *,
    name: str | None = None,
    team: str | None = None,
    data: Path | None = None,
    settings_file: Path | None = None,
    token_file: Path | None = None,
    invite: str | None = None,
) -> int:
    data = data or data_dir()
    lock = InstanceLock(default_dir() / "node.lock")
    try:
        lock.acquire()
    except NodeError as e:
        print(f"lah node: {e}", file=sys.stderr)
        return 2
    try:
        settings_file = settings_file or settings_path()  # where `set_limits` saves, as load reads
        settings, warnings = load_settings(settings_file)
        for warning in warnings:
            print(f"settings: {warning}", file=sys.stderr)
        apply_torch_limits(settings)
        store: TokenStore = FileTokenStore(token_file) if token_file else default_token_store(data)
        # The volunteer's bandwidth caps and monthly data cap, enforced in the transport: every link
        # paces its frames through these buckets and counts its bytes into the counter, which the
        # governor reads to wait once the month's cap is spent.
        traffic = DataCapCounter(data / "traffic.json", settings.data_cap_reset_day)
        upload = TokenBucket(settings.max_upload_kib_s * 1024)  # rate 0: unlimited, until the user sets one
        download = TokenBucket(settings.max_download_kib_s * 1024)
        link_config = LinkConfig(
            connect_timeout=15,
            upload=upload,
            download=download,
            on_traffic=lambda sent, received: traffic.add(sent=sent, received=received),
        )
        sensors = SystemSensors(use_gpu=settings.use_gpu, gpu_index=settings.gpu_index, data_counter=traffic)

        def make_volunteer() -> Volunteer:
            return Volunteer(
                Identity.load_or_create(data / "identity.key"),
                coordinator_url,
                store,
                settings,
                data,
                account_name=name,
                team=team,
                invite=invite,
                sensors=sensors,
                link_config=link_config,
            )

        volunteer = make_volunteer()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # Windows: Ctrl+C only
                loop.add_signal_handler(sig, stop.set)
        # The control socket is up from the start, so the tray app can show "starting" and the
        # coordinator's errors while the node waits for it, and can stop the node at any moment.
        node_control = NodeControl(
            volunteer, settings_file, upload, download, traffic=traffic, on_shutdown=stop.set
        )
        control = ControlServer(node_control)
        await control.start()
        try:
            while True:  # a volunteer's node waits out a coordinator that is down, however long
                try:
                    await volunteer.start()
                    break
                except CoordinatorUnreachable as e:
                    print(
                        f"lah node: {e}; trying again in {RETRY_UNREACHABLE_S:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
                    await volunteer.stop()
                    try:
                        await asyncio.wait_for(stop.wait(), RETRY_UNREACHABLE_S)
                        return 0  # asked to stop while waiting: a clean stop
                    except TimeoutError:
                        errors = volunteer.errors
                        volunteer = make_volunteer()
                        volunteer.errors.extend(errors)  # the tray keeps showing why it waits
                        node_control.volunteer = volunteer
                except NodeError as e:
                    print(f"lah node: {e}", file=sys.stderr)
                    await volunteer.stop()
                    return 1
            watch = _watch_parent(stop)
            hosted = ", ".join(volunteer.hosted_uids) or "nothing yet"
            print(
                f"node {volunteer.peer_id[:12]}… hosting {hosted}; control at {control.path}; Ctrl+C stops",
                flush=True,
            )
            await stop.wait()
            if watch is not None:
                watch.cancel()
            return 0
        finally:
            await control.stop()
            await volunteer.stop()
            sensors.close()
            traffic.flush()
    finally:
        lock.release()


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
    lines = [
        f"state:     {status.get('state')} ({status.get('reason')})",
        f"experts:   {', '.join(status.get('experts') or []) or '-'}",
        f"served:    {status.get('requests_served')} requests, refused {status.get('requests_refused')}",
        f"traffic:   {status.get('bytes_up', 0) / 2**20:.1f} MiB up, "
        f"{status.get('bytes_down', 0) / 2**20:.1f} MiB down",
        f"links:     {format_transport(status.get('transport') or {})}",
        f"credit:    {status.get('credit') if status.get('credit') is not None else 'unknown'}",
    ]
    if status.get("energy_kwh") is not None:
        lines.append(f"energy:    {status['energy_kwh']:.4f} kWh (estimate)")
    for err in (status.get("errors") or [])[-3:]:
        lines.append(f"error:     {err.get('message')}")
    return "\n".join(lines)


async def run_client(
    command: str, *, minutes: float = 0.0, follow: bool = False, path: Path | None = None
) -> int:
    try:
        async with ControlClient(path or default_connection_path()) as client:
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

"""The tray app's Qt-free part: what it knows and decides, tested without a screen or an event loop.

No module here imports PySide6 (nor anything of ``app.qt``); tests/unit/app/test_core_is_qt_free.py
checks both. The Qt side (``app.qt``) owns the widgets, the processes and the threads and calls in.

Modules::

    lifecycle        Lifecycle: the app's states (first run, registering, node starting, running, paused,
                     failed, quitting) and transitions, driven by calls, reporting to its Host
    host             Host: what the lifecycle asks of the Qt side (windows, the node, threads), and the
                     callbacks it hands that side
    notices          when an outage is told (once), and how long "Snooze until tomorrow" lasts
    consent          FirstRun (what the wizard opens with) and Consent (what the volunteer agreed to)
    paths            AppPaths: where the app keeps its settings, the node's limits, data and logs
    config           the app's own settings (``app.toml``), apart from the node's limits
    registration     first run: the volunteer's account registered, its token kept where the node looks
    presentation     what the tray shows for a given moment: icon, status line, tooltip
    activity         request and byte rates from successive status snapshots; the chart's clock ticks
    autostart        start at login: a Windows Run value, a macOS LaunchAgent, an XDG autostart entry
    manifest         a release manifest signed with Ed25519: its format, checked against the key built in
    update_policy    which signed release manifests the update check believes and offers
    updates          the update check: the manifest fetched, believed, compared; the offered file fetched
    errors           the app's own exceptions (the engine's stay the engine's)

Of the engine: engine.control (the node's data dir), engine.resources (the settings, their checks),
engine.files (atomic writes), and engine.account: the token stores and the coordinator's errors (in
``registration``, ``lifecycle``), and its coordinator client, imported for the first run only
(aiohttp). engine.account and engine.control load their heavy modules lazily, so none of this loads
torch; nothing here imports the volunteer's engine.node (engine.control does, lightly).

May import: engine.account, engine.control, engine.files, engine.resources
"""

"""The tray app (PySide6): a volunteer's node started, watched and steered from the desktop.

The node runs as a child process and the app speaks to it only through its local control API, so the
app never loads torch or aiortc (tests/app/test_pure.py checks that) and never blocks the GUI thread:
network and file waits run on the app's one asyncio loop on a worker thread. Nothing in the engine
imports the app.

Modules, grouped by role::

    main             ``lah app``: the entry point (one copy per user, Fusion style, rotated logs)
    controller       AppController: the composition; first run or straight to work; commands; Quit
    bridge           the app's one asyncio loop on a worker thread; results back to Qt as signals
    node_link        NodeLink: the node's control API (status stream + command connection), idle feeding
    supervisor       NodeSupervisor: the node as a QProcess child, restarted with back-off, clean stop
    registration     first run: the volunteer's account registered, its token kept where the node looks
    wizard           ConsentWizard: the first run in plain words; nothing runs before "Start contributing"
    limits_form      LimitsForm: every limit of engine.resources' Settings as a checked control
    settings_window  the Settings window: the limits applied live through ``set_limits``, start at login
    status_window    the Status window: now, today, this month, and a chart of the last ten minutes
    control_window   the window that stands in for the tray where the desktop has none
    about            the About box: version, licence, links, what the engine computes on
    actions          the commands as QActions, shared by the tray menu and the no-tray window
    presentation     what the tray shows for a given moment: icon, status line, tooltip (pure)
    activity         request and byte rates from successive status snapshots; the chart's clock ticks
    clock_axis       the status chart's time axis on this computer's clock (activity's ticks)
    config           the app's own settings (``app.toml``), apart from the node's limits
    autostart        start at login: a Windows Run value, a macOS LaunchAgent, an XDG autostart entry
    idle             the user's idle time as this desktop session sees it, fed to the node
    single_instance  one app per user: a second copy asks the first to come forward and exits
    theme            light and dark: Fusion everywhere, a dark palette when the desktop asks for it
    assets           where the icons are, in a source tree and in a bundle
    stall_probe      how long the GUI thread went without running its events (footprint benchmark only)
    update_check     UpdateChecker: once a day ``lah update`` as a child process; the file on a click
    update_policy    which signed release manifests the update check believes and offers (pure)
    updates          a release manifest signed with Ed25519, checked against the key built in
    errors           the app's own exceptions (the engine's stay the engine's)

Of the engine, the app uses engine.control (the control API's client, the node's data dir, the credit
reading), engine.resources (the settings, their checks and schedules, idle sources), engine.files
(atomic writes), and in ``registration`` engine.node: its token stores and errors, and its coordinator
client, imported for the first run only (aiohttp). engine.node and engine.control load their heavy
modules lazily, so none of this loads torch.

May import: engine.control, engine.files, engine.node, engine.resources
"""

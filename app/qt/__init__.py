"""The tray app's desktop side (PySide6): widgets, the tray, the node's process, the loop thread.

The controller owns the QObjects and forwards their events to ``app.core``'s Lifecycle, which decides;
the windows show what it decided. Nothing here is imported by ``app.core``.

Modules, grouped by role::

    main             ``lah app``: the entry point (one copy per user, Fusion style, rotated logs)
    controller       AppController: the QObjects wired to the Lifecycle (its Host); the volunteer's commands
    bridge           the app's one asyncio loop on a worker thread; results back to Qt as signals
    node_link        NodeLink: the node's control API (status stream + command connection), idle feeding
    supervisor       NodeSupervisor: the node as a QProcess child, restarted with back-off, clean stop
    wizard           ConsentWizard: the first run in plain words; nothing runs before "Start contributing"
    limits_form      LimitsForm: every limit of engine.resources' Settings as a checked control
    settings_window  the Settings window: the limits applied live through ``set_limits``, start at login
    status_window    the Status window: now, today, this month, and a chart of the last ten minutes
    control_window   the window that stands in for the tray where the desktop has none
    about            the About box: version, licence, links, what the engine computes on
    actions          the commands as QActions, shared by the tray menu and the no-tray window
    clock_axis       the status chart's time axis on this computer's clock (``app.core.activity``'s ticks)
    idle             the user's idle time as this desktop session sees it (QtDBus on Wayland), for the node
    single_instance  one app per user: a second copy asks the first to come forward and exits
    theme            light and dark: Fusion everywhere, a dark palette when the desktop asks for it
    assets           where the icons are, in a source tree and in a bundle
    stall_probe      how long the GUI thread went without running its events (footprint benchmark only)
    update_check     UpdateChecker: once a day ``lah update`` as a child process; the file on a click

Of the engine: engine.control (the control API's client, the credit reading) and engine.resources (the
settings, their checks and schedules, idle sources).

May import: app.core, engine.control, engine.resources
"""

"""The tray app (PySide6): a volunteer's node started, watched and steered from the desktop.

The node runs as a child process and the app speaks to it only through its local control API, so the
app never loads torch or aiortc (tests/app/test_pure.py checks that) and never blocks the GUI thread:
network and file waits run on the app's one asyncio loop on a worker thread. Nothing in the engine
imports the app.

Two subpackages, the lower one free of Qt::

    core/  what the app knows and decides, with no PySide6 import (tests/unit/app/test_core_is_qt_free.py):
           its settings, the first run's registration, what the tray shows, the chart's rates, start at
           login, signed updates, and the Lifecycle: the app's states and transitions as a plain class
    qt/    the desktop: the controller that wires the Lifecycle to the tray, the windows, the node's
           QProcess, the control link and the loop thread; ``lah app`` starts it (``app.qt.main``)

``qt`` imports ``core``, never the other way. Each subpackage's own ``May import:`` line says what it
uses of the engine; this package's own modules (this file alone) import nothing.

May import: nothing
"""

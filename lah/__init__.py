"""The ``lah`` command line and the local demo: the one package that composes the others.

``engine`` is the headless runtime; ``coordinator`` (web service) and ``app`` (tray UI) each import the
engine's public API and nothing of each other. What wires them into one program lives here, above all
three::

    cli      ``lah``: subcommands for the app, the node and its controls, the coordinator, the demos
    demo     ``lah demo``: coordinator, volunteers and a trainer on loopback (optionally the tray app too)
"""

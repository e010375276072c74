"""The ``lah`` command line and the local demo: the one package that composes the others.

``engine`` is the headless runtime; ``coordinator`` (web service) and ``app`` (tray UI) each import the
engine's public API and nothing of each other. What wires them into one program lives here, above all
three::

    cli        ``lah``: subcommands for the app, the node and its controls, the coordinator, the demos
    demo       ``lah demo``: coordinator, volunteers and a trainer on loopback (optionally the tray app too)
    train_credentials  where ``lah train`` keeps its token (its own keyring service, or a 0600 file)
    train      ``lah train``: a researcher's trainer for a coordinator's experiment (collaborative)
    lm_progress  a language model's evaluations (and generated samples) posted for the experiment's page
    export     ``lah export``: a language model's experts gathered from their hosts + its dense part, one file
    generate   ``lah generate``: text from that file, on this machine alone
    selftest   ``lah self-test`` / ``learning-at-home --self-test``: does this installation work?
    resources  where read-only files (``assets/``) are, in a checkout and in a bundle
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("learning-at-home")  # the bundle carries this metadata (installers/*.spec)
except PackageNotFoundError:  # a checkout that was never installed
    __version__ = "0+unknown"

"""The ``lah`` command line and the local demo: the one package that composes the others.

``engine`` is the headless runtime; ``coordinator`` (web service) and ``app`` (tray UI) each import
parts of the engine (their docstrings say which) and nothing of each other. What wires them into one
program lives here, above all three::

    cli        ``lah``: subcommands for the app, the node and its controls, the coordinator, the demos
    __main__   ``python -m lah``: the same as ``lah``
    demo       ``lah demo``: coordinator, volunteers and a trainer on loopback (optionally the tray app too)
    demo_app   the tray app as one more volunteer of ``lah demo --app``, in folders of its own
    demo_transport  ``lah demo-transport``: a coordinator and two peers on loopback; a call, a stream, tensors
    lm_demo    ``lah demo --experiment lm``: a language model trained through a local swarm
    local_swarm  a whole swarm on this machine: the coordinator in process, each volunteer a process
    local_volunteer  one volunteer of a local swarm, in its own process (``python -m lah.local_volunteer``)
    train_credentials  where ``lah train`` keeps its token (its own keyring service, or a 0600 file)
    trainer_session  what ``lah train`` and ``lah export`` share: the login, account, experiment and node
    train      ``lah train``: a researcher's trainer for a coordinator's experiment (collaborative)
    train_data  a classifier experiment's config and ``--data`` (an ``.npz``), checked against each other
    train_lm   ``lah train`` for a language model: its text, checkpoints, metrics
    lm_progress  a language model's evaluations (and generated samples) posted for the experiment's page
    lm_text    text sampled from a language model while it trains (the demo's, ``lah train``'s, the page's)
    export     ``lah export``: a language model's experts gathered from their hosts + its dense part, one file
    generate   ``lah generate``: text from that file, on this machine alone
    update     ``lah update``: is there a newer, correctly signed release (and its verified file)?
    selftest   ``lah self-test`` / ``learning-at-home --self-test``: does this installation work?
    selftest_parts  the self-test's checks after the bundle's, each one line or an exception
    bundle     the bundle's manifest: every file's size and SHA-256, written at build time
    resources  where read-only files (``assets/``) are, in a checkout and in a bundle
    gpu_check  ``scripts/gpu-check``: the node's CUDA paths on a real device (skipped, and said so, without)
    gpu_backend  its expert compute checks: one expert, and many experts' backward as one, GPU against CPU
    gpu_stage  its stage check: the 24 GB stage expert's FLOP/s, memory against its plan, busy share

The demos and the trainers share no module of each other's: what both need is in ``lm_text``,
``lm_progress``, ``local_swarm`` or in the engine (the finder's ``wait_for_hosts``, the trainer's
``call_counters``).
``update`` is the child process the tray app's update check starts: it uses ``app.core.updates`` and
``app.core.update_policy``, and ``app.qt.about`` for the version.

May import: app, coordinator, engine
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("learning-at-home")  # the bundle carries this metadata (installers/*.spec)
except PackageNotFoundError:  # a checkout that was never installed
    __version__ = "0+unknown"

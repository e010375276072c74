"""The ``lah`` command: ``lah app`` (the tray app), ``lah node`` and its controls (``lah status``,
``lah pause``, ``lah resume``, ``lah snooze MINUTES``), ``lah coordinator``, ``lah demo``,
``lah train`` (a researcher's trainer: lah/train.py), ``lah demo-transport`` and ``lah self-test``.

Everything runs on :func:`engine.p2p.eventloop.run` (uvloop where the platform has it). Each
subcommand imports what it needs when it runs: ``lah app`` must not load torch or aiortc, which only
its node child uses.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lah", description="Learning@home volunteer client and tools")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    app = sub.add_parser("app", help="the tray app: opt in, host experts while the computer is idle")
    app.add_argument("--coordinator", help="coordinator URL offered on first run (default: the project's)")
    app.add_argument("--demo", action="store_true", help=argparse.SUPPRESS)  # set by `lah demo --app`
    demo = sub.add_parser("demo-transport", help="two peers on loopback exchange tensors over WebRTC")
    demo.add_argument("--mib", type=int, default=64, help="MiB of float32 tensors to send each way")
    coord = sub.add_parser("coordinator", help="run the coordinator: accounts, signaling, ledger, site")
    coord.add_argument("--config", type=Path, help="TOML config (see README); LAH_* variables override it")
    coord.add_argument("--host", help="listen address (default 127.0.0.1)")
    coord.add_argument("--port", type=int, help="listen port (default 8470)")
    coord.add_argument("--make-admin", metavar="NAME", help="give this existing account the admin role")
    actions = coord.add_subparsers(dest="action", metavar="{invite,disable,enable,grant-trainer}")
    coord_invite = actions.add_parser("invite", help="create a single-use invitation code for NAME")
    coord_invite.add_argument("name")
    coord_invite.add_argument("--ttl-days", type=float, help="how long the code is valid (default 14)")
    for action, text in (("disable", "refuse every token of an account at once"), ("enable", "re-enable it")):
        actions.add_parser(action, help=text).add_argument("name")
    grant = actions.add_parser("grant-trainer", help="make NAME a trainer; prints its `lah train login` code")
    grant.add_argument("name")
    grant.add_argument("--ttl-days", type=float, help="how long the login code is valid (default 14)")
    node = sub.add_parser("node", help="run the volunteer node (host experts while the computer is idle)")
    node.add_argument("--coordinator", default="http://127.0.0.1:8470", help="coordinator URL")
    node.add_argument("--name", help="account name on first run")
    node.add_argument("--team")
    node.add_argument("--data-dir", type=Path, help="identity, checkpoints (default: user data dir)")
    node.add_argument("--settings", type=Path, help="settings TOML (default: user config dir)")
    node.add_argument("--token-file", type=Path, help="keep the token in this 0600 file, not the keyring")
    node.add_argument("--invite", help="the invitation code, where the project admits only invited names")
    status = sub.add_parser("status", help="show the running node's status")
    status.add_argument("-f", "--follow", action="store_true", help="keep printing updates")
    sub.add_parser("pause", help="pause the running node")
    sub.add_parser("resume", help="resume the running node")
    snooze = sub.add_parser("snooze", help="pause the running node for MINUTES")
    snooze.add_argument("minutes", type=float)
    dmoe = sub.add_parser(
        "demo", help="a whole swarm on loopback trains a DMoE model (digits; --experiment lm: text)"
    )
    dmoe.add_argument(
        "--experiment",
        choices=["digits", "lm"],
        default="digits",
        help="digits: a classifier, in one process; lm: a language model on text, volunteers in processes",
    )
    dmoe.add_argument("--volunteers", type=int, default=4, help="volunteer nodes hosting experts")
    dmoe.add_argument(
        "--steps", type=int, help="training steps (digits: 150 of 64 samples; lm: 300 of 12 x 64 tokens)"
    )
    dmoe.add_argument("--data", type=Path, help="lm: a text file or folder (default: shipped Shakespeare)")
    dmoe.add_argument("--csv", type=Path, help="lm: append each evaluation's metrics to this CSV file")
    dmoe.add_argument(
        "--trainers",
        type=int,
        default=1,
        help="trainers training the dense part together (collaborative steps; default 1: alone)",
    )
    dmoe.add_argument(
        "--target-batch-size",
        type=int,
        default=0,
        help="samples per collaborative step (default with --trainers N>1: 2 batches per trainer)",
    )
    dmoe.add_argument(
        "--linger",
        type=float,
        help="seconds to keep the coordinator up after training (default: until Ctrl+C)",
    )
    dmoe.add_argument("--app", action="store_true", help="the tray app joins too (needs a display)")
    dmoe.add_argument(
        "--wire",
        choices=["float16", "int8"],
        default="float16",
        help="how expert calls travel (int8: half the bytes)",
    )
    train = sub.add_parser("train", help="train an experiment's model with the volunteers' experts")
    train_login = train.add_subparsers(dest="train_action", metavar="{login}").add_parser(
        "login", help="exchange the operator's login code for a trainer token (kept in the keyring)"
    )
    for p in (train, train_login):
        p.add_argument("--coordinator", default="http://127.0.0.1:8470", help="coordinator URL")
        p.add_argument("--data-dir", type=Path, help="the trainer's identity (default: user data dir)")
        p.add_argument("--token-file", type=Path, help="keep the token in this 0600 file, not the keyring")
    train_login.add_argument("--name", required=True, help="the trainer account's name")
    train_login.add_argument("--code", help="the login code, as --code=CODE (default: asked for, not echoed)")
    train.add_argument("--experiment", help="the experiment to train (the coordinator defines it)")
    until = train.add_mutually_exclusive_group()
    until.add_argument("--steps", type=int, help="stop at this collaborative step (default: Ctrl+C)")
    until.add_argument("--samples", type=int, help="stop after this many samples of this trainer's")
    train.add_argument(
        "--wait-peers", type=int, default=1, help="wait (up to 2 min) until this many trainers are in"
    )
    train.add_argument("--data", type=Path, help=".npz with arrays x and y; lm: a text file or folder")
    train.add_argument(
        "--tokenizer", type=Path, help="lm: the experiment's tokenizer file (default: characters)"
    )
    train.add_argument("--resume", action="store_true", help="lm: continue from the newest checkpoint")
    from . import selftest  # light: each part imports what it tests

    selftest.add_arguments(sub.add_parser("self-test", help="check this installation (headless)"))
    update = sub.add_parser("update", help="is there a newer signed release? (--download fetches it)")
    update.add_argument("--download", type=Path, metavar="DIR", help="fetch this platform's file into DIR")
    update.add_argument(
        "--coordinator",
        metavar="URL",
        help="ask this project server where its releases are (default: the Learning@home project's)",
    )
    update.add_argument("--state", type=Path, metavar="FILE", help=argparse.SUPPRESS)  # the newest seen
    update.add_argument("--manifest-url", help=argparse.SUPPRESS)  # a mirror; the key stays built in
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if args.command == "update":
        from . import update as update_command

        return update_command.run(args)
    if args.command == "app":  # before the transport: the app process loads neither torch nor aiortc
        from app.main import main as app_main  # Qt is imported only by the app

        return app_main(coordinator=args.coordinator, demo=args.demo)
    from engine.p2p.patches import install as install_transport_patches

    install_transport_patches()  # every engine command runs the patched transport (stock if they differ)
    if args.command == "self-test":
        return selftest.run(args)
    from engine.p2p import eventloop  # every other command runs the engine's event loop
    from engine.p2p.patches import pin_host_addresses

    if args.command == "demo-transport":
        from .demo_transport import demo_transport

        eventloop.run(demo_transport(args.mib))
    elif args.command == "demo" and args.experiment == "lm":
        from .lm_demo import demo_main

        return demo_main(args)
    elif args.command == "demo":
        from engine.trainer import TrainerConfig

        from .demo import run_demo  # starts its own loop thread (the trainer's autograd is synchronous)

        if args.trainers < 1 or args.target_batch_size < 0:
            parser.error("--trainers must be at least 1 and --target-batch-size not negative")
        config = TrainerConfig(wire=args.wire, target_batch_size=args.target_batch_size)
        run_demo(
            volunteers=args.volunteers,
            steps=args.steps or 150,
            linger=args.linger,
            app=args.app,
            config=config,
            trainers=args.trainers,
        )
    elif args.command == "train":
        from .train import train_main  # its own module: the command's body and its credentials

        return train_main(parser, args)
    elif args.command == "coordinator":
        from coordinator import cli as coordinator_cli  # the engine runs without the coordinator

        if args.action == "invite":
            ttl = None if args.ttl_days is None else args.ttl_days * 86400
            eventloop.run(coordinator_cli.invite(args.config, args.name, ttl))
        elif args.action == "grant-trainer":
            ttl = None if args.ttl_days is None else args.ttl_days * 86400
            eventloop.run(coordinator_cli.grant_trainer(args.config, args.name, ttl))
        elif args.action in ("disable", "enable"):
            eventloop.run(coordinator_cli.set_disabled(args.config, args.name, args.action == "disable"))
        else:
            eventloop.run(coordinator_cli.run(args.config, args.host, args.port, args.make_admin))
    elif args.command == "node":
        from engine.control.commands import run_node

        pinned = os.environ.get("LAH_HOST_ADDRESSES")  # e.g. 127.0.0.1 for local swarms and tests
        if pinned:
            pin_host_addresses([a.strip() for a in pinned.split(",") if a.strip()])

        return eventloop.run(
            run_node(
                args.coordinator,
                name=args.name,
                team=args.team,
                data=args.data_dir,
                settings_file=args.settings,
                token_file=args.token_file,
                invite=args.invite,
            )
        )
    elif args.command in ("status", "pause", "resume", "snooze"):
        from engine.control.commands import run_client

        minutes = getattr(args, "minutes", 0.0)
        return eventloop.run(run_client(args.command, minutes=minutes, follow=getattr(args, "follow", False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

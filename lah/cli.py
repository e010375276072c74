"""The ``lah`` command: ``lah app`` (the tray app), ``lah node`` and its controls (``lah status``,
``lah pause``, ``lah resume``, ``lah snooze MINUTES``), ``lah coordinator``, ``lah demo``,
``lah train`` (a researcher's trainer: lah/train.py), ``lah export`` and ``lah generate`` (a language
model as one file, and text from it: lah/export.py, lah/generate.py), ``lah demo-transport`` and
``lah self-test``.

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
from urllib.parse import urlsplit


def coordinator_url(text: str) -> str:
    """A coordinator's URL as a person typed it: ``http(s)://host[:port]``. Refused with a sentence (exit
    status 2) rather than accepted and found unreachable later, as "127.0.0.1:8470" would be."""
    given = text.strip()
    try:
        parts = urlsplit(given)
        port = parts.port  # a port that is not a number raises here
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{given!r} is not a URL ({e})") from None
    if parts.scheme not in ("http", "https"):
        guess = given.split("://", 1)[-1]
        raise argparse.ArgumentTypeError(
            f"{given!r} is not a web address: a coordinator's URL starts with http:// or https:// "
            f"(did you mean http://{guess}?)"
        )
    if not parts.hostname:
        raise argparse.ArgumentTypeError(f"{given!r} names no host: give it as http://HOST:PORT")
    del port
    return given.rstrip("/")


def ttl_days(text: str) -> float:
    """How long a code stays valid: more than nothing, at most a year (what the coordinator accepts)."""
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if not 0 < days <= 366:
        raise argparse.ArgumentTypeError(f"a code is valid for more than 0 and at most 366 days, not {text}")
    return days


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lah", description="Learning@home volunteer client and tools")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    app = sub.add_parser("app", help="the tray app: opt in, host experts while the computer is idle")
    app.add_argument(
        "--coordinator",
        type=coordinator_url,
        help="coordinator URL offered on first run (default: the project's)",
    )
    app.add_argument("--demo", action="store_true", help=argparse.SUPPRESS)  # set by `lah demo --app`
    demo = sub.add_parser("demo-transport", help="two peers on loopback exchange tensors over WebRTC")
    demo.add_argument("--mib", type=int, default=64, help="MiB of float32 tensors to send each way")
    coord = sub.add_parser("coordinator", help="run the coordinator: accounts, signaling, ledger, site")
    coord.add_argument("--config", type=Path, help="TOML config (see README); LAH_* variables override it")
    coord.add_argument("--host", help="listen address (default 127.0.0.1)")
    coord.add_argument("--port", type=int, help="listen port (default 8470)")
    coord.add_argument("--make-admin", metavar="NAME", help="give this existing account the admin role")
    actions = coord.add_subparsers(
        dest="action", metavar="{invite,disable,enable,grant-trainer,flags,undo-flag,refusals}"
    )
    coord_invite = actions.add_parser("invite", help="create a single-use invitation code for NAME")
    coord_invite.add_argument("name")
    coord_invite.add_argument("--ttl-days", type=ttl_days, help="how long the code is valid (default 14)")
    for action, text in (("disable", "refuse every token of an account at once"), ("enable", "re-enable it")):
        actions.add_parser(action, help=text).add_argument("name")
    grant = actions.add_parser("grant-trainer", help="make NAME a trainer; prints its `lah train login` code")
    grant.add_argument("name")
    grant.add_argument("--ttl-days", type=ttl_days, help="how long the login code is valid (default 14)")
    flagged = actions.add_parser("flags", help="list spot-check flags, newest first")
    flagged.add_argument("--host", help="only this host's (its peer id)")
    undo = actions.add_parser("undo-flag", help="undo a spot-check flag and give back the credit it took")
    undo.add_argument("flag_id", type=int)
    refused = actions.add_parser("refusals", help="receipts and reports refused, by reason")
    refused.add_argument("--days", type=int, default=7, help="over the last N days (default 7)")
    node = sub.add_parser("node", help="run the volunteer node (host experts while the computer is idle)")
    node.add_argument(
        "--coordinator", type=coordinator_url, default="http://127.0.0.1:8470", help="coordinator URL"
    )
    node.add_argument("--name", help="account name on first run")
    node.add_argument("--team")
    node.add_argument(
        "--data-dir",
        type=Path,
        help="this node's home: lock, settings, identity, token, logs, control file (default: the user's "
        "folders); give each node on one machine its own",
    )
    node.add_argument("--settings", type=Path, help="settings TOML (default: user config dir, or --data-dir)")
    node.add_argument("--token-file", type=Path, help="keep the token in this 0600 file, not the keyring")
    node.add_argument("--invite", help="the invitation code, where the project admits only invited names")
    from engine.control.headless import add_limit_flags  # light: argparse and the settings model

    add_limit_flags(node)
    status = sub.add_parser("status", help="show the running node's status")
    status.add_argument("-f", "--follow", action="store_true", help="keep printing updates")
    snooze = sub.add_parser("snooze", help="pause the running node for MINUTES")
    snooze.add_argument("minutes", type=float)
    controls = [status, sub.add_parser("pause", help="pause the running node")]
    controls += [sub.add_parser("resume", help="resume the running node"), snooze]
    for p in controls:
        p.add_argument("--data-dir", type=Path, help="the node started with this --data-dir (default: yours)")
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
        p.add_argument(
            "--coordinator", type=coordinator_url, default="http://127.0.0.1:8470", help="coordinator URL"
        )
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
    export = sub.add_parser("export", help="lm: the experts' weights + the dense part as one model file")
    export.add_argument("--coordinator", default="http://127.0.0.1:8470", help="coordinator URL")
    export.add_argument("--experiment", required=True, help="the language-model experiment to export")
    export.add_argument("--out", type=Path, required=True, help="the .safetensors file to write")
    export.add_argument(
        "--checkpoint", type=Path, help="the dense part: a checkpoint file or folder (default: lah train's)"
    )
    export.add_argument("--data-dir", type=Path, help="the trainer's data dir (as lah train's)")
    export.add_argument("--token-file", type=Path, help="the trainer token's 0600 file (as lah train's)")
    export.add_argument("--tokenizer", type=Path, help="the experiment's tokenizer file (default: chars)")
    export.add_argument("--data", type=Path, help="the text the character tokenizer was built from")
    export.add_argument("--allow-missing", action="store_true", help="keep unanswered experts untrained")
    export.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each host")
    generate = sub.add_parser("generate", help="print text from a model file lah export wrote (no swarm)")
    generate.add_argument("--model", type=Path, required=True, help="the file lah export wrote")
    generate.add_argument("--prompt", required=True, help="the text to continue")
    generate.add_argument("--tokens", type=int, default=200, help="how many tokens to add (default 200)")
    generate.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (> 0)")
    generate.add_argument("--top-k", type=int, default=40, help="sample among the k likeliest (0: all)")
    generate.add_argument("--seed", type=int, default=0, help="the sampler's seed (same seed, same text)")
    generate.add_argument("--tokenizer", type=Path, help="for a file that holds no tokenizer")
    from . import selftest  # light: each part imports what it tests

    selftest.add_arguments(sub.add_parser("self-test", help="check this installation (headless)"))
    update = sub.add_parser("update", help="is there a newer signed release? (--download fetches it)")
    update.add_argument("--download", type=Path, metavar="DIR", help="fetch this platform's file into DIR")
    update.add_argument(
        "--coordinator",
        type=coordinator_url,
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
    if args.command == "generate":  # this machine alone: no transport, no swarm
        from .generate import run_generate

        if not 1 <= args.tokens <= 100_000 or not args.temperature > 0 or args.top_k < 0:
            parser.error("--tokens must be 1 to 100000, --temperature above 0 and --top-k at least 0")
        return run_generate(
            args.model, args.prompt, tokens=args.tokens, temperature=args.temperature, top_k=args.top_k,
            seed=args.seed, tokenizer=args.tokenizer,
        )  # fmt: skip
    if args.command == "app":  # before the transport: the app process loads neither torch nor aiortc
        from app.qt.main import main as app_main  # Qt is imported only by the app

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
    elif args.command == "export":
        from .export import run_export

        if not args.timeout > 0:
            parser.error("--timeout must be above 0 seconds")
        return run_export(
            args.coordinator, args.experiment, args.out, checkpoint=args.checkpoint, data_dir=args.data_dir,
            token_file=args.token_file, data=args.data, tokenizer=args.tokenizer,
            allow_missing=args.allow_missing, timeout=args.timeout, say=lambda line: print(line, flush=True),
        )  # fmt: skip
    elif args.command == "coordinator":
        from coordinator.accounts.accounts import AccountError
        from coordinator.credit.review import ReviewError
        from coordinator.server import cli as coordinator_cli  # the engine runs without the coordinator

        try:
            if args.action == "invite":
                ttl = None if args.ttl_days is None else args.ttl_days * 86400
                eventloop.run(coordinator_cli.invite(args.config, args.name, ttl))
            elif args.action == "grant-trainer":
                ttl = None if args.ttl_days is None else args.ttl_days * 86400
                eventloop.run(coordinator_cli.grant_trainer(args.config, args.name, ttl))
            elif args.action in ("disable", "enable"):
                eventloop.run(coordinator_cli.set_disabled(args.config, args.name, args.action == "disable"))
            elif args.action == "flags":
                eventloop.run(coordinator_cli.flags(args.config, args.host))
            elif args.action == "undo-flag":
                eventloop.run(coordinator_cli.undo_flag(args.config, args.flag_id))
            elif args.action == "refusals":
                eventloop.run(coordinator_cli.refusals(args.config, args.days))
        except (AccountError, ReviewError) as e:  # a name refused, no such account or flag: nothing changed
            print(f"lah coordinator {args.action}: {e}", file=sys.stderr)
            return 2
        if args.action is None:
            eventloop.run(coordinator_cli.run(args.config, args.host, args.port, args.make_admin))
    elif args.command == "node":
        from engine.control.commands import run_node
        from engine.control.headless import limit_overrides
        from engine.node import NodeHome
        from engine.resources import SettingsError

        try:
            overrides = limit_overrides(args)
        except SettingsError as e:
            parser.error(str(e))
        home = NodeHome.choose(args.data_dir, settings=args.settings, token_file=args.token_file)
        pinned = os.environ.get("LAH_HOST_ADDRESSES")  # e.g. 127.0.0.1 for local swarms and tests
        if pinned:
            pin_host_addresses([a.strip() for a in pinned.split(",") if a.strip()])

        return eventloop.run(
            run_node(
                args.coordinator,
                name=args.name,
                team=args.team,
                home=home,
                invite=args.invite,
                overrides=overrides,
            )
        )
    elif args.command in ("status", "pause", "resume", "snooze"):
        from engine.control.commands import run_client
        from engine.node import NodeHome

        minutes = getattr(args, "minutes", 0.0)
        home = NodeHome.choose(args.data_dir)
        follow = getattr(args, "follow", False)
        return eventloop.run(run_client(args.command, minutes=minutes, follow=follow, home=home))
    return 0


if __name__ == "__main__":
    sys.exit(main())

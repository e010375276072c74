"""The first run's two values: what the wizard opens with (``FirstRun``) and what the volunteer agreed
to when pressing "Start contributing" (``Consent``). Plain data, so the lifecycle that decides on them
is tested without a screen and the wizard that shows them holds no decision."""

from __future__ import annotations

from dataclasses import dataclass

from engine.resources import Settings


@dataclass(frozen=True)
class FirstRun:
    settings: Settings  # the limits the wizard starts from (a demo's are relaxed)
    coordinator_url: str
    token_place: str  # where the account's token will be kept, in words (``registration.token_place``)
    name: str  # the name field's start ("you" in a demo)
    team: str
    autostart: bool  # whether "start at login" starts ticked: a demo never writes a login entry


@dataclass(frozen=True)
class Consent:
    settings: Settings
    display_name: str
    team: str
    coordinator_url: str
    autostart: bool
    invite: str = ""  # the invitation code, where the project admits only invited names

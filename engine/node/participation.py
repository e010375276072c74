"""Why a volunteer got no work: is it assigned, reachable, chosen? In plain words.

A node can run for hours and serve nothing, and "0 requests" says nothing about why. Three things must
hold before a trainer's request reaches it, and each can be seen from inside the node:

    assigned   the coordinator gave it experts to host
    reachable  another computer opened a link to it (``Peer.links_in``): signaling and NAT let others in.
               Links it opened itself (``links_out``) show only that it can reach out.
    chosen     a trainer called one of its experts (served, or turned away while the node waited)

``Participation.summary`` names the first that does not hold and what that means, for ``lah status``, the
tray's status window, and the line ``lah node`` prints when a run ends.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Participation"]


@dataclass(frozen=True)
class Participation:
    started: bool  # joined: account, signaling and a first assignment
    assignment_known: bool  # the coordinator has answered with an assignment (maybe an empty one)
    experts: int
    links_in: int
    links_out: int
    served: int
    refused: int

    @property
    def assigned(self) -> bool:
        return self.experts > 0

    @property
    def reachable(self) -> bool:
        return self.links_in > 0

    @property
    def chosen(self) -> bool:
        return self.served + self.refused > 0

    def summary(self) -> str:
        experts = f"{self.experts} expert{'s' if self.experts != 1 else ''}"
        if not self.started:
            return "Not in the swarm yet: still joining through the coordinator."
        if not self.assignment_known:
            return "Not assigned yet: the coordinator has not given this node any experts to host."
        if not self.assigned:
            return (
                "Not assigned: the coordinator gave this node no experts to host (every expert may have "
                "enough hosts, or this node's memory budget holds none). It asks again as its assignment "
                "lapses."
            )
        if not self.reachable and not self.chosen:
            if self.links_out:
                return (
                    f"Assigned {experts}, but no other computer has connected to this node yet (it "
                    f"connected to {self.links_out} itself). Trainers connect to the hosts they call: "
                    "a firewall or NAT may be keeping them out, or no trainer has looked for these "
                    "experts yet."
                )
            return (
                f"Assigned {experts}, but no other computer has connected to this node yet, so no "
                "trainer has reached it: nobody may be training now, or a firewall or NAT keeps them out."
            )
        if not self.chosen:
            return (
                f"Assigned {experts} and reachable ({self.links_in} connection"
                f"{'s' if self.links_in != 1 else ''} from other computers), but no trainer has called "
                "its experts yet: nobody may be training now, or trainers chose other hosts of the same "
                "experts."
            )
        turned = f" ({self.refused:,} turned away while it waited)" if self.refused else ""
        return f"Chosen: trainers called its {experts} {self.served + self.refused:,} times{turned}."

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self)
        out |= {"assigned": self.assigned, "reachable": self.reachable, "chosen": self.chosen}
        out["summary"] = self.summary()
        return out

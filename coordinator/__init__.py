"""The coordinator: the one central service of a collaboration. Tensor traffic never passes through it.

Modules, bottom up:

- :mod:`coordinator.signaling`: the signaling hub (authenticated peers, presence, offer/answer relay).
- :mod:`coordinator.app`: the aiohttp application that mounts the hub, and how to run it.

It imports ``engine`` (shared wire schemas and identities) and never ``app``.
"""

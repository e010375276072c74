"""What volunteers earn: signed receipts checked in batches, the credit ledger, spot checks, trainers'
training samples, leaderboards, and the credit's JSON API.

Modules, bottom up (each imports only those above it in this list):

- ``pool_guard``: the initializer that ends a pool's worker once the coordinator is gone (killed too).
- ``receipts``: receipts and spot-check reports on the coordinator's side: batch limits, signature
  checks with a key cache, a pool of spawned processes for big batches (on ``pool_guard``).
- ``training``: trainers' own training samples, a credit kind of its own (never added to credit),
  bounded by the forward samples of their accepted receipts.
- ``credit_plan``: the arithmetic of credit (decayed recent credit, days), and a plan of credit added
  to hosts, their accounts, teams and day rows under the hosts' row locks.
- ``rules``: what a receipt must pass beyond its signature: the host held the expert when it served,
  hourly caps per host and per (trainer account, host) by its declared device, spot-check flags that
  withhold only their reporter's receipts unless two accounts agree; refusals counted per reason.
- ``ledger``: receipts in, credit on hosts, accounts, teams and days out, in one transaction per batch;
  ``TRAINER_ROLES``, who posts receipts (and never hosts).
- ``spot_checks``: failed spot checks: the reporter's own receipts' credit in the period withheld and
  taken back (everyone's where two trainer accounts agree), reports capped per reporter and host per
  day, replays and impossible periods refused; on ``ledger``'s locking and credit plan.
- ``review``: the operator's side: flags listed, a reversal undone (the credit given back), refusals
  by reason (``lah coordinator flags``, ``undo-flag``, ``refusals``).
- ``leaderboard``: top users, teams and hosts by total or recent credit, contributors' histories,
  the swarm's totals.
- ``api_ledger``: the JSON API: receipts and spot-check reports in (from trainer accounts, rate
  limited per account), leaderboards and histories out.

All but ``api_ledger`` sit below :mod:`coordinator.services` and need no HTTP; ``api_ledger`` sits
above it and above :mod:`coordinator.http`, like every JSON API of the coordinator. The site's pages
(:mod:`coordinator.site`) read ``ledger`` and ``leaderboard`` too.

May import: coordinator.accounts.accounts, coordinator.config, coordinator.db, coordinator.http,
    coordinator.services, engine.p2p.identity, engine.wire.statements
"""

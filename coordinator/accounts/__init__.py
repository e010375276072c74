"""Who takes part: accounts, teams, hosts, bearer tokens, invitations and trainer accounts, and their
JSON APIs.

Modules, bottom up (each imports only those above it in this list):

- ``confusables``: skeletons of display names, so names that look alike are refused as duplicates.
- ``tokens``: bearer tokens signed by the coordinator's Ed25519 key, short-lived, refreshable,
  revocable (the revocations in the database).
- ``accounts``: accounts, teams, hosts (peer keys bound by a signature) and the allowlist
  (invitations); on ``confusables``, and on :mod:`coordinator.credit.ledger` for its one-parameter
  ``IN`` list.
- ``trainers``: trainer accounts (an admin grants the role, the researcher logs in with a single-use
  code); who may train is who may post receipts (``coordinator.credit.ledger.TRAINER_ROLES``).
- ``api_accounts``: the JSON API for accounts, hosts and tokens; ``api_trainers``: for trainers
  (experiments' configs, which ``lah train`` reads, trainer login, the admin's grant).

The first four sit below :mod:`coordinator.services`, which opens the token authority and the accounts
once; the two ``api_`` modules sit above it and above :mod:`coordinator.http` (authentication, error
shapes, body limits), like every JSON API of the coordinator. Errors: ``tokens.TokenError`` (401) and
``accounts.AccountError`` with its kinds (400, 403, 404, 409), as :mod:`coordinator.http` answers them.

May import: coordinator.config, coordinator.credit.ledger, coordinator.db, coordinator.http,
    coordinator.hub.signaling, coordinator.services, engine.p2p.errors, engine.p2p.identity,
    engine.wire.statements
"""

"""Tables. Credit totals are kept on the account, team and host rows (updated at ingestion) so the
leaderboard reads one indexed table instead of summing a million receipts per page view; daily
rollups in ``credit_days`` feed the contributor chart.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAME_MAX = 64
SKELETON_MAX = 4 * NAME_MAX  # a character's prototype may be several characters ("m" -> "rn")
PEER_ID_LEN = 40
ROLES = ("volunteer", "trainer", "admin")


class Base(DeclarativeBase):
    pass


class CreditMixin:
    """Total credit, and recent average credit (RAC): exponentially decayed with a 7-day half-life.

    ``credit_recent`` is the value as of ``credit_recent_at``; readers decay it to "now" (pure
    function in ``coordinator.credit.ledger``), so rows need no periodic rewrite.
    """

    credit_total: Mapped[float] = mapped_column(Float, default=0.0, nullable=False)
    credit_recent: Mapped[float] = mapped_column(Float, default=0.0, nullable=False)
    credit_recent_at: Mapped[float] = mapped_column(Float, default=0.0, nullable=False)  # unix time


class Team(CreditMixin, Base):
    __tablename__ = "teams"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_MAX), unique=True, nullable=False)
    name_skeleton: Mapped[str | None] = mapped_column(String(SKELETON_MAX), nullable=True, index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    accounts: Mapped[list[Account]] = relationship(back_populates="team")
    __table_args__ = (
        Index("ix_teams_credit_total", "credit_total"),
        Index("ix_teams_credit_recent", "credit_recent"),
        # The site's prefix search (coordinator.site.search); text_pattern_ops lets LIKE 'x%' use it
        # under any PostgreSQL collation.
        Index(
            "ix_teams_name_lower",
            func.lower(name).label("name_lower"),
            postgresql_ops={"name_lower": "text_pattern_ops"},
        ),
    )


class Account(CreditMixin, Base):
    __tablename__ = "accounts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_MAX), unique=True, nullable=False)
    # coordinator.accounts.confusables.skeleton(name): look-alike names share it, and are refused as taken.
    name_skeleton: Mapped[str | None] = mapped_column(String(SKELETON_MAX), nullable=True, index=True)
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"), nullable=True, index=True)
    role: Mapped[str] = mapped_column(String(16), default="volunteer", nullable=False)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    team: Mapped[Team | None] = relationship(back_populates="accounts")
    hosts: Mapped[list[Host]] = relationship(back_populates="account")
    __table_args__ = (
        Index("ix_accounts_credit_total", "credit_total"),
        Index("ix_accounts_credit_recent", "credit_recent"),
        # Enabled accounts by credit, without reading the table: the site's counts (pages, ranks).
        Index("ix_accounts_listed", "disabled", "credit_total"),
        Index(
            "ix_accounts_name_lower",
            func.lower(name).label("name_lower"),
            postgresql_ops={"name_lower": "text_pattern_ops"},
        ),
    )


class Host(CreditMixin, Base):
    """A machine (peer key) bound to an account. The peer id is the hash of the public key."""

    __tablename__ = "hosts"
    peer_id: Mapped[str] = mapped_column(String(PEER_ID_LEN), primary_key=True)
    public_key: Mapped[bytes] = mapped_column(LargeBinary(32), nullable=False)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), nullable=False, index=True)
    bound_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_seen: Mapped[float] = mapped_column(Float, default=0.0, nullable=False)
    requests_served: Mapped[int] = mapped_column(BigInteger, default=0, nullable=False)
    flagged: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)
    # The node's own estimate of energy spent on contributed work (NVML power, or a CPU TDP share),
    # reported by the host with its account token: shown, never credited.
    energy_kwh: Mapped[float] = mapped_column(Float, default=0.0, server_default="0", nullable=False)
    # When the last energy report came (unix time; 0: none yet): a report is bounded by the time since.
    energy_reported_at: Mapped[float] = mapped_column(Float, default=0.0, server_default="0", nullable=False)
    account: Mapped[Account] = relationship(back_populates="hosts")
    __table_args__ = (
        Index("ix_hosts_credit_total", "credit_total"),
        Index("ix_hosts_credit_recent", "credit_recent"),
    )


class AllowlistEntry(Base):
    """In allowlist mode only these account names may register (as collaborations run)."""

    __tablename__ = "allowlist"
    name: Mapped[str] = mapped_column(String(NAME_MAX), primary_key=True)


class Invite(Base):
    """An invitation in allowlist mode: the name it is for and a secret code, single use, expiring.

    Only a hash of the code is kept, so the table does not hand out registrations if it leaks.
    """

    __tablename__ = "invites"
    code_hash: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex of the code
    name: Mapped[str] = mapped_column(String(NAME_MAX), nullable=False, index=True)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    expires_at: Mapped[float] = mapped_column(Float, nullable=False)
    used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    used_by: Mapped[int | None] = mapped_column(ForeignKey("accounts.id"), nullable=True)


class RevokedToken(Base):
    __tablename__ = "revoked_tokens"
    jti: Mapped[str] = mapped_column(String(32), primary_key=True)
    expires_at: Mapped[float] = mapped_column(Float, nullable=False, index=True)  # prunable after this


class RateBucket(Base):
    """A token bucket shared by every replica (PostgreSQL): ``tokens`` as of ``at``, the database's
    clock in unix seconds, so a replica whose own clock is off refills it no faster or slower.
    ``granted``: whether the last take succeeded (what the one UPDATE ... RETURNING reports)."""

    __tablename__ = "rate_buckets"
    scope: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float, nullable=False)
    at: Mapped[float] = mapped_column(Float, nullable=False)
    granted: Mapped[bool] = mapped_column(Boolean, nullable=False)


class Receipt(Base):
    """One signed statement by a trainer: this host served this expert for so many samples."""

    __tablename__ = "receipts"
    receipt_id: Mapped[str] = mapped_column(String(32), primary_key=True)  # idempotency key (hex)
    trainer_peer_id: Mapped[str] = mapped_column(String(PEER_ID_LEN), nullable=False)
    host_peer_id: Mapped[str] = mapped_column(ForeignKey("hosts.peer_id"), nullable=False)
    expert_uid: Mapped[str] = mapped_column(String(128), nullable=False)
    samples: Mapped[int] = mapped_column(Integer, nullable=False)
    backward: Mapped[bool] = mapped_column(Boolean, nullable=False)
    served_at: Mapped[float] = mapped_column(Float, nullable=False)
    credit: Mapped[float] = mapped_column(Float, nullable=False)
    withheld: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)
    # When the credit was added to the recent sums (ingestion time): a reversal decays from here.
    credited_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # What the receipt earned before any withholding (``credit`` is then 0): an operator's undo of a
    # reversal gives this back. Null on receipts stored before it existed (those cannot be restored).
    earned: Mapped[float | None] = mapped_column(Float, nullable=True)
    __table_args__ = (Index("ix_receipts_host_time", "host_peer_id", "served_at"),)


class CreditDay(Base):
    """Credit per subject per UTC day, for charts; subject_kind is 'account', 'team' or 'host'."""

    __tablename__ = "credit_days"
    subject_kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    subject_id: Mapped[str] = mapped_column(String(PEER_ID_LEN), primary_key=True)
    day: Mapped[int] = mapped_column(Integer, primary_key=True)  # days since the epoch
    credit: Mapped[float] = mapped_column(Float, default=0.0, nullable=False)
    # The site's range leaderboards sum a window of days over every subject: this index holds all
    # they read, so a refresh reads the window's rows only.
    __table_args__ = (Index("ix_credit_days_day", "day", "subject_kind", "subject_id", "credit"),)


class CreditRange(Base):
    """Credit per subject over the last ``days`` UTC days (1, 7, 30), summed from ``credit_days`` by
    the site's periodic refresh (``coordinator.site.ranges``): range leaderboards read this indexed
    table instead of summing rollups (or receipts) per page view. ``computed_at`` (unix time) names
    the refresh that wrote the row: a generation, published in ``credit_range_runs``."""

    __tablename__ = "credit_ranges"
    subject_kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    days: Mapped[int] = mapped_column(Integer, primary_key=True)
    computed_at: Mapped[float] = mapped_column(Float, primary_key=True)
    subject_id: Mapped[str] = mapped_column(String(PEER_ID_LEN), primary_key=True)
    credit: Mapped[float] = mapped_column(Float, nullable=False)
    # The whole page order (credit, then id, both descending): a page is the index read backwards.
    __table_args__ = (
        Index("ix_credit_ranges_rank", "subject_kind", "days", "computed_at", "credit", "subject_id"),
    )


class CreditRangeRun(Base):
    """Which generation of ``credit_ranges`` pages read, per window: the last complete refresh, and
    how many rows of each kind it wrote (the pages' counts)."""

    __tablename__ = "credit_range_runs"
    days: Mapped[int] = mapped_column(Integer, primary_key=True)
    computed_at: Mapped[float] = mapped_column(Float, nullable=False)
    accounts: Mapped[int] = mapped_column(Integer, nullable=False)
    teams: Mapped[int] = mapped_column(Integer, nullable=False)
    hosts: Mapped[int] = mapped_column(Integer, nullable=False)


class SpotCheckFlag(Base):
    """A trainer re-ran a request on another host and the outputs disagreed."""

    __tablename__ = "spot_check_flags"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_peer_id: Mapped[str] = mapped_column(ForeignKey("hosts.peer_id"), nullable=False, index=True)
    reporter_peer_id: Mapped[str] = mapped_column(String(PEER_ID_LEN), nullable=False)
    expert_uid: Mapped[str] = mapped_column(String(128), nullable=False)
    period_start: Mapped[float] = mapped_column(Float, nullable=False)
    period_end: Mapped[float] = mapped_column(Float, nullable=False)
    reason: Mapped[str] = mapped_column(String(256), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # The reporter's account when reported: a flag withholds that account's own receipts, and every
    # trainer's only where flags of two accounts or more agree (``coordinator.credit.spot_checks``).
    reporter_account_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    report_id: Mapped[str | None] = mapped_column(String(32), nullable=True)  # a replay is refused
    reported_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # unix time: per-day caps
    undone_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # an operator undid it
    __table_args__ = (
        Index("ix_spot_check_flags_reporter", "reporter_account_id", "host_peer_id", "reported_at"),
        Index("ux_spot_check_flags_report_id", "report_id", unique=True),
    )


class Assignment(Base):
    """Which host was told to serve which expert of which experiment, until when."""

    __tablename__ = "assignments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_peer_id: Mapped[str] = mapped_column(ForeignKey("hosts.peer_id"), nullable=False, index=True)
    experiment: Mapped[str] = mapped_column(String(NAME_MAX), nullable=False)
    expert_uid: Mapped[str] = mapped_column(String(128), nullable=False)
    assigned_at: Mapped[float] = mapped_column(Float, nullable=False)
    expires_at: Mapped[float] = mapped_column(Float, nullable=False, index=True)
    __table_args__ = (
        UniqueConstraint("host_peer_id", "experiment", "expert_uid"),
        Index("ix_assignments_expert", "experiment", "expert_uid"),
    )


class AssignmentSpan(Base):
    """When a host held an expert: ``assignments`` keeps only the current ones (renewed in place,
    deleted when they lapse), and a receipt is credited only for a host that held the expert when it
    served (``coordinator.credit.rules``). One row per unbroken holding; a renewal extends it.
    ``device`` and ``memory_bytes``: the capacity the node declared, which bounds its credit per hour."""

    __tablename__ = "assignment_spans"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    host_peer_id: Mapped[str] = mapped_column(ForeignKey("hosts.peer_id"), nullable=False)
    expert_uid: Mapped[str] = mapped_column(String(128), nullable=False)
    held_from: Mapped[float] = mapped_column(Float, nullable=False)
    held_until: Mapped[float] = mapped_column(Float, nullable=False)
    device: Mapped[str] = mapped_column(String(8), nullable=False)
    memory_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    __table_args__ = (Index("ix_assignment_spans_host", "host_peer_id", "held_until"),)


class CreditHour(Base):
    """Credit a trainer account granted a host per hour of serving: what the per-hour caps are checked
    against (the host's total for the hour is the sum of its rows)."""

    __tablename__ = "credit_hours"
    host_peer_id: Mapped[str] = mapped_column(String(PEER_ID_LEN), primary_key=True)
    trainer_account_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hour: Mapped[int] = mapped_column(Integer, primary_key=True)  # hours since the epoch
    credit: Mapped[float] = mapped_column(Float, default=0.0, nullable=False)


class CreditRefusal(Base):
    """Receipts and spot-check reports refused, counted per UTC day, kind and reason code: what the
    operator reads (``lah coordinator refusals``)."""

    __tablename__ = "credit_refusals"
    day: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)  # "receipt" or "report"
    reason: Mapped[str] = mapped_column(String(32), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, default=0, nullable=False)


class CollabStatus(Base):
    """A collaborative trainer's latest report of its collaboration (``coordinator.swarm.collab_status``):
    the swarm page's panel. Rows older than a few minutes are deleted as new reports arrive."""

    __tablename__ = "collab_status"
    experiment: Mapped[str] = mapped_column(String(NAME_MAX), primary_key=True)
    peer_id: Mapped[str] = mapped_column(ForeignKey("hosts.peer_id"), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), nullable=False, index=True)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False)
    samples_accumulated: Mapped[int] = mapped_column(BigInteger, nullable=False)
    samples_per_s: Mapped[float] = mapped_column(Float, nullable=False)
    peers: Mapped[int] = mapped_column(Integer, nullable=False)
    last_round_epoch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_round_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_round_outcome: Mapped[str] = mapped_column(String(16), nullable=False)
    reported_at: Mapped[float] = mapped_column(Float, nullable=False, index=True)  # unix time


class TrainerWork(Base):
    """A trainer key's training work for one experiment: what it claims, what its receipts prove.

    ``receipt_samples`` is kept by the ledger as receipts are ingested (the forward samples this key's
    accepted receipts say it sent to the experiment's experts); ``samples_claimed`` sums the increases of
    the processed-samples counter in the key's status reports (``run_id``/``run_samples``: the counter of
    the current trainer process). Credited training samples are the smaller of the two."""

    __tablename__ = "trainer_work"
    peer_id: Mapped[str] = mapped_column(ForeignKey("hosts.peer_id"), primary_key=True)
    experiment: Mapped[str] = mapped_column(String(NAME_MAX), primary_key=True)
    receipt_samples: Mapped[int] = mapped_column(BigInteger, default=0, nullable=False)
    samples_claimed: Mapped[int] = mapped_column(BigInteger, default=0, nullable=False)
    run_id: Mapped[str] = mapped_column(String(32), default="", nullable=False)
    run_samples: Mapped[int] = mapped_column(BigInteger, default=0, nullable=False)
    updated_at: Mapped[float] = mapped_column(Float, default=0.0, nullable=False)


class Replica(Base):
    """A coordinator process of a group sharing one PostgreSQL (``coordinator.hub.presence``).

    ``heartbeat_at`` is the database's clock, never the replica's, so a replica whose clock is off
    is judged alive or dead like the others; ``listening`` is false while its relay listener is away.
    """

    __tablename__ = "replicas"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    heartbeat_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), index=True
    )
    listening: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)


class Presence(Base):
    """Which replica holds a peer's signaling socket; ``conn`` names that one socket."""

    __tablename__ = "presence"
    peer_id: Mapped[str] = mapped_column(String(PEER_ID_LEN), primary_key=True)
    replica_id: Mapped[str] = mapped_column(
        ForeignKey("replicas.id", ondelete="CASCADE"), nullable=False, index=True
    )
    conn: Mapped[str] = mapped_column(String(32), nullable=False)
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class SignalFrame(Base):
    """A relayed signal too large for a NOTIFY payload: the notification carries this row's id."""

    __tablename__ = "signal_frames"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    replica_id: Mapped[str] = mapped_column(String(32), nullable=False, index=True)
    body: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ExperimentProgress(Base):
    """One evaluation a trainer account reported for an experiment (``coordinator.swarm.progress``): a point
    of its validation-loss curve on the experiment's page, and maybe the text its model generated then.

    Bounded per (experiment, account): a trainer's rows always grow in ``train_tokens`` (a report at
    or below earlier tokens replaces those), only the newest sample is kept, and a long history is
    thinned to every other point, so the whole run stays in at most a few hundred rows."""

    __tablename__ = "experiment_progress"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    experiment: Mapped[str] = mapped_column(String(NAME_MAX), nullable=False)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), nullable=False, index=True)
    step: Mapped[int] = mapped_column(BigInteger, nullable=False)
    train_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    val_loss: Mapped[float] = mapped_column(Float, nullable=False)
    tokens_per_s: Mapped[float] = mapped_column(Float, nullable=False)
    sample: Mapped[str | None] = mapped_column(Text, nullable=True)
    reported_at: Mapped[float] = mapped_column(Float, nullable=False)  # unix time
    __table_args__ = (Index("ix_experiment_progress_curve", "experiment", "account_id", "train_tokens"),)

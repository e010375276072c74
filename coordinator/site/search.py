"""Name search for the site: users and teams by name, hosts by peer id; prefix match, paginated.

Every lookup is an index range scan: names are matched on ``lower(name)`` (indexed, migration 0003) and
peer ids on the primary key, so a search costs the same with ten accounts or a million.

What a visitor types is normalised before it reaches SQL (pure functions, tested without a database):

- NFKC, surrounding blanks trimmed: full-width letters find their ASCII forms;
- ``%``, ``_`` and ``\\`` are escaped: they match themselves, never act as wildcards;
- longer than any name can be (``MAX_QUERY``): refused with a ``SearchError`` (a 400 page);
- empty: no query at all, the page just shows the form;
- confusables: a query written with Cyrillic or Greek lookalikes ("Ada" typed with a Cyrillic A) also
  searches its Latin skeleton ("ada"), so a lookalike finds the name it imitates.

SQLite's ``lower()`` folds ASCII letters only (PostgreSQL's folds all of Unicode), so the query is folded
the way the database folds the column (``fold``): on SQLite, non-ASCII letters match as typed.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import and_, func, literal_column, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from ..db.models import NAME_MAX, PEER_ID_LEN, Account, Host, Team

Scope = Literal["users", "teams", "hosts"]
SCOPES: tuple[Scope, ...] = ("users", "teams", "hosts")
MAX_QUERY = NAME_MAX  # no name is longer, so a longer query cannot match anything
MAX_PAGE = 200
HEX = frozenset("0123456789abcdef")
TOP = "\U0010ffff"  # above every other code point: "abc" <= x < "abc" + TOP holds every x starting "abc"

#: Lookalikes from other scripts and their Latin twins (the common subset of Unicode's confusables):
#: Cyrillic a, ve, ie, io, ka, em, en, o, er, es, te, u, ha, i, yi, je, dze, shha, komi de, qa, we,
#: palochka; Greek alpha, beta, epsilon, iota, kappa, nu, omicron, rho, tau, upsilon, chi, gamma, omega.
CONFUSABLES = str.maketrans(
    "\u0430\u0432\u0435\u0451\u043a\u043c\u043d\u043e\u0440\u0441\u0442"
    "\u0443\u0445\u0456\u0457\u0458\u0455\u04bb\u0501\u051b\u051d\u04cf"
    "\u03b1\u03b2\u03b5\u03b9\u03ba\u03bd\u03bf\u03c1\u03c4\u03c5\u03c7\u03b3\u03c9",
    "abeekmhopctyxiijshdqwlabeikvoptuxyw",
)


class SearchError(ValueError):
    """A query the search refuses (too long, unknown scope): shown as a 400 page."""


@dataclass(frozen=True)
class Hit:
    scope: Scope
    key: str  # account id, team id or peer id
    name: str
    detail: str | None  # users: team; hosts: owner's name
    total: float


@dataclass(frozen=True)
class Results:
    query: str  # normalised
    scope: Scope
    page: int
    per_page: int
    has_more: bool
    hits: list[Hit]
    variants: tuple[str, ...]  # what was looked up (the query, and its Latin skeleton if different)


def normalise(raw: str) -> str:
    """NFKC with blanks trimmed and runs of blanks collapsed; raises SearchError when too long."""
    if len(raw) > 4 * MAX_QUERY:  # before NFKC, which can grow a string
        raise SearchError(f"search text is limited to {MAX_QUERY} characters (names are no longer)")
    text = " ".join(unicodedata.normalize("NFKC", raw).split())
    if len(text) > MAX_QUERY:
        raise SearchError(f"search text is limited to {MAX_QUERY} characters (names are no longer)")
    return text


def skeleton(text: str) -> str:
    """Lowercase, with other scripts' lookalikes replaced by their Latin twins."""
    return text.lower().translate(CONFUSABLES)


def fold(text: str, dialect: str) -> str:
    """``text`` lowered the way the database's ``lower()`` lowers a column."""
    if dialect == "postgresql":
        return text.lower()
    return "".join(c.lower() if c.isascii() else c for c in text)


def escape_like(text: str) -> str:
    """``text`` as a LIKE prefix pattern with ``\\`` as the escape character."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def variants(query: str, dialect: str) -> tuple[str, ...]:
    """The folded query, then its Latin skeleton when that differs."""
    out = [fold(query, dialect)]
    skel = fold(skeleton(query), dialect)
    if skel not in out:
        out.append(skel)
    return tuple(out)


def name_order(column: Any, dialect: str) -> Any:
    """Order by ``lower(column)`` as the index holds it, so the index gives the order and a page reads
    only its rows: byte order (``text_pattern_ops``'s ``~<~``) on PostgreSQL, BINARY on SQLite."""
    if dialect == "postgresql":
        return literal_column(f"lower({column.table.name}.{column.name}) USING ~<~")
    return func.lower(column)


def _name_match(column: Any, prefixes: tuple[str, ...], dialect: str) -> Any:
    low = func.lower(column)
    terms: list[Any] = []
    for p in prefixes:
        like = low.like(escape_like(p), escape="\\")
        if dialect == "postgresql":
            terms.append(like)  # text_pattern_ops: the planner turns a constant prefix into a range
        else:
            terms.append(and_(low >= p, low < p + TOP, like))  # the range is what SQLite indexes
    return or_(*terms)


async def search(session: AsyncSession, raw: str, scope: Scope, page: int = 1, per_page: int = 25) -> Results:
    if scope not in SCOPES:
        raise SearchError(f"search in one of: {', '.join(SCOPES)}")
    if not 1 <= page <= MAX_PAGE:
        raise SearchError(f"page must be 1..{MAX_PAGE}")
    query = normalise(raw)
    dialect = session.get_bind().dialect.name
    found = variants(query, dialect) if query else ()
    hits: list[Hit] = []
    rows: list[Any] = []
    offset = (page - 1) * per_page
    q: Any
    if scope == "users" and query:
        q = (
            select(Account.id, Account.name, Team.name, Account.credit_total)
            .outerjoin(Team, Team.id == Account.team_id)
            .where(_name_match(Account.name, found, dialect), Account.disabled.is_(False))
            .order_by(name_order(Account.name, dialect), Account.id)
        )
        rows = list((await session.execute(q.offset(offset).limit(per_page + 1))).all())
        hits = [Hit("users", str(i), n, t, float(c)) for i, n, t, c in rows[:per_page]]
    elif scope == "teams" and query:
        q = (
            select(Team.id, Team.name, Team.credit_total)
            .where(_name_match(Team.name, found, dialect))
            .order_by(name_order(Team.name, dialect), Team.id)
        )
        rows = list((await session.execute(q.offset(offset).limit(per_page + 1))).all())
        hits = [Hit("teams", str(i), n, None, float(c)) for i, n, c in rows[:per_page]]
    elif scope == "hosts" and query:
        prefix = query.lower()
        if prefix and len(prefix) <= PEER_ID_LEN and set(prefix) <= HEX:
            q = (
                select(Host.peer_id, Account.name, Host.credit_total)
                .join(Account, Account.id == Host.account_id)
                # Peer ids are lowercase hex: "g" sorts after every digit and letter they use.
                .where(Host.peer_id >= prefix, Host.peer_id < prefix + "g")
                .order_by(Host.peer_id)
            )
            rows = list((await session.execute(q.offset(offset).limit(per_page + 1))).all())
            hits = [Hit("hosts", p, p, n, float(c)) for p, n, c in rows[:per_page]]
    return Results(query, scope, page, per_page, len(rows) > per_page, hits, found)

"""Skeletons of display names, so that names which look alike are refused as duplicates.

UTS #39 defines a string's *skeleton*: each character replaced by the prototype it is confusable with
(Cyrillic U+0430 and Latin "a" both become "a", "m" becomes "rn"), in NFD. Two names with one skeleton
look the same to a reader. The data is Unicode's confusables.txt as shipped by the
``confusable-homoglyphs`` package (kept up to date there; we only read its table). That table lists
each confusable pair in both directions, so the prototype of a character is recovered as its class:
confusables.txt maps every source to exactly one target and no target is a source, so the pairs form
stars around their prototypes, and any fixed member (here the smallest code point) stands for the
class as well as the prototype would. Multi-character targets are expanded.

Names are compared case-insensitively as well: the skeleton is taken before and after case folding
(``skeleton("BiII") == skeleton("Bill")``), NFKC first so that compatibility forms (full-width letters,
ligatures) collapse too.
"""

from __future__ import annotations

import functools
import unicodedata

from confusable_homoglyphs.utils import load

_MARKS = "\u200e\u200f"  # the package wraps right-to-left characters in direction marks


def _clean(text: str) -> str:
    return text.strip(_MARKS)


@functools.cache
def _table() -> dict[str, str]:
    """Character -> its replacement (a class representative, or an expansion)."""
    data: dict[str, list[dict[str, str]]] = load("confusables.json")
    parent: dict[str, str] = {}

    def find(c: str) -> str:
        root = c
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(c, c) != root:  # path compression
            parent[c], c = root, parent[c]
        return root

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    expansions: dict[str, str] = {}
    for key, entries in data.items():
        source = _clean(key)
        if len(source) != 1:
            continue
        for entry in entries:
            target = _clean(entry["c"])
            if len(target) == 1:
                parent.setdefault(source, source)
                parent.setdefault(target, target)
                union(source, target)
            elif len(entries) == 1 and target:  # a source whose prototype is several characters
                expansions[source] = target
    table = {c: find(c) for c in parent if find(c) != c}
    for source, target in expansions.items():
        table[source] = "".join(table.get(t, t) for t in target)
    return table


def _map(text: str) -> str:
    table = _table()
    return unicodedata.normalize("NFD", "".join(table.get(c, c) for c in unicodedata.normalize("NFD", text)))


def skeleton(name: str) -> str:
    """The form two names share when they look alike (case, width and confusable letters ignored)."""
    return _map(_map(unicodedata.normalize("NFKC", name)).casefold())

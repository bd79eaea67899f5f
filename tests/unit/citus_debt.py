"""The routing debt, exact (issue 38 item 3): what the routing test finds today.

Each entry is (table or statement, rule broken, what: the key, or the table referenced).
tests/unit/test_citus_routing.py and tests/integration/test_citus_routing_run.py assert that
the findings equal these lists: a new unpinned statement or key fails them, and so does a
fixed one until its entry is removed here (a ratchet). Issue 38 items 1 (tenant on every
table, in every key) and 2 (every statement pins it) empty them. docs/scaling.md says what
each rule means.
"""

from __future__ import annotations

__all__ = ["EXECUTED", "KEYS", "STATEMENTS"]

Entry = tuple[str, str, str]

# the schema's keys (tests.citus_rules.key_findings)
KEYS: frozenset[Entry] = frozenset()

# the hot statements (a) and the cold ones collected statically (b)
STATEMENTS: frozenset[Entry] = frozenset()

# the statements a run executed that (a) and (b) do not name (built inside a function), by
# their shape: "executed <VERB> <tables>" (tests/integration/test_citus_routing_run.py)
EXECUTED: frozenset[Entry] = frozenset()

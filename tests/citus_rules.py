"""Citus's routing rules, checked without Citus (docs/scaling.md, issue 38 item 3).

On Citus, distributed by ``tenant``, a statement reaches one node only when every reference
to a distributed table in it names the tenant; a table's keys are enforced per shard only
when they start with it. This module checks both on what we have here:

* :func:`key_findings`, the schema's keys, from the SQLAlchemy metadata: each table names its
  kind in ``Table(..., info=service.store.tables.citus(kind))``; a distributed table has a
  ``tenant`` column, and its primary key, every unique constraint and unique index and every
  foreign key to another distributed table start with it; a reference or local table has no
  foreign key to a distributed one, and a distributed table none to a local one.
* :func:`statement_findings`, one statement's SQL, parsed with PostgreSQL's own parser
  (``pglast``): every reference to a distributed table (top level, CTEs, subqueries,
  UPDATE/DELETE targets, joins) is pinned by ``tenant = <parameter or constant>`` or by
  ``tenant = <a pinned table's tenant>`` among the ANDed conditions of its WHERE and its
  joins' ON (an enclosing query's pinned tables count in a subquery); every INSERT into a
  distributed table sets ``tenant``; ``FOR UPDATE``/``FOR SHARE`` never covers an unpinned
  reference. A statement carrying :data:`MARKER` (``/* spans tenants: <why> */``) is
  accepted as spanning tenants on purpose and only listed.

Imported by tests only: the server never loads it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pglast import ast as pglast_ast
from pglast import parse_sql
from pglast.enums import A_Expr_Kind, BoolExprType, SetOperation
from sqlalchemy import MetaData, Table, UniqueConstraint

from service.store.tables import CITUS_KINDS

__all__ = [
    "KEY_RULES",
    "MARKER",
    "STATEMENT_RULES",
    "Finding",
    "Schema",
    "key_findings",
    "spans_tenants",
    "statement_findings",
    "unkinded_tables",
]

# the parser's node classes, untyped here: a node's fields are checked by the code that reads
# them (pglast's stubs make every field optional)
ast: Any = pglast_ast
TENANT = "tenant"
# a statement that spans tenants on purpose says why, in a comment of its SQL
MARKER = re.compile(r"/\*\s*spans tenants:\s*(?P<why>.+?)\s*\*/", re.DOTALL)

STATEMENT_RULES = ("unpinned", "insert-without-tenant", "for-update-unpinned")
KEY_RULES = (
    "no-tenant-column",
    "primary-key-without-tenant",
    "unique-without-tenant",
    "foreign-key-without-tenant",
    "foreign-key-from-reference-to-distributed",
    "foreign-key-from-local-to-distributed",
    "foreign-key-from-distributed-to-local",
)


@dataclass(frozen=True, order=True)
class Finding:
    """A rule ``rule`` broken by ``name`` (a statement, or a table) about ``subject`` (the
    table referenced, or the key)."""

    name: str
    rule: str
    subject: str

    def as_tuple(self) -> tuple[str, str, str]:
        return (self.name, self.rule, self.subject)


@dataclass(frozen=True)
class Schema:
    """What the statement rules need of the metadata: each table's kind and its columns."""

    kinds: Mapping[str, str]
    columns: Mapping[str, frozenset[str]]

    @classmethod
    def of(cls, metadata: MetaData) -> Schema:
        return cls(
            kinds={table.name: _kind(table) or "" for table in metadata.tables.values()},
            columns={
                table.name: frozenset(column.name for column in table.columns)
                for table in metadata.tables.values()
            },
        )

    def distributed(self, table: str | None) -> bool:
        return table is not None and self.kinds.get(table) == "distributed"


def _kind(table: Table) -> str | None:
    kind = table.info.get("citus")
    return kind if kind in CITUS_KINDS else None


def unkinded_tables(metadata: MetaData) -> list[str]:
    """The tables that declare no Citus kind (or one not in ``CITUS_KINDS``)."""
    return sorted(table.name for table in metadata.tables.values() if _kind(table) is None)


# -- the keys rule -----------------------------------------------------------------------------


def key_findings(metadata: MetaData) -> list[Finding]:
    """Every key of ``metadata`` that Citus could not enforce per tenant (see the module)."""
    found: list[Finding] = []
    for table in sorted(metadata.tables.values(), key=lambda t: t.name):
        kind = _kind(table)
        if kind == "distributed":
            found += sorted(set(_distributed_keys(table)))
        for fk in sorted(table.foreign_key_constraints, key=lambda c: str(c.name)):
            target = _kind(fk.referred_table)
            rule = None
            if kind == "reference" and target == "distributed":
                rule = "foreign-key-from-reference-to-distributed"
            elif kind == "local" and target == "distributed":
                rule = "foreign-key-from-local-to-distributed"
            elif kind == "distributed" and target == "local":
                rule = "foreign-key-from-distributed-to-local"
            if rule is not None:
                found.append(Finding(table.name, rule, _fk_name(fk)))
    return found


def _distributed_keys(table: Table) -> Iterator[Finding]:
    if TENANT not in table.columns:
        yield Finding(table.name, "no-tenant-column", TENANT)
    if not _leads(table.primary_key.columns):
        yield Finding(table.name, "primary-key-without-tenant", _names(table.primary_key.columns))
    uniques = [
        (_names(c.columns), c.columns) for c in table.constraints if isinstance(c, UniqueConstraint)
    ]
    uniques += [(_names(c.columns), c.columns) for c in table.columns if c.unique]
    uniques += [(str(i.name), i.columns) for i in table.indexes if i.unique]
    for name, columns in sorted(uniques, key=lambda u: u[0]):
        if not _leads(columns):
            yield Finding(table.name, "unique-without-tenant", name)
    for fk in sorted(table.foreign_key_constraints, key=lambda c: str(c.name)):
        if _kind(fk.referred_table) != "distributed":
            continue
        referred = [element.column for element in fk.elements]
        if not (_leads(fk.columns) and _leads(referred)):
            yield Finding(table.name, "foreign-key-without-tenant", _fk_name(fk))


def _leads(columns: Iterable[Any]) -> bool:
    first = next(iter(columns), None)
    return first is not None and first.name == TENANT


def _names(columns: Iterable[Any]) -> str:
    return "(" + ", ".join(column.name for column in columns) + ")"


def _fk_name(fk: Any) -> str:
    return f"{_names(fk.columns)} -> {fk.referred_table.name}"


# -- the statement rule --------------------------------------------------------------------


def spans_tenants(sql: str) -> str | None:
    """Why ``sql`` spans tenants, if it carries :data:`MARKER`."""
    marked = MARKER.search(sql)
    return None if marked is None else marked.group("why")


def statement_findings(name: str, sql: str, schema: Schema) -> list[Finding]:
    """The routing rules ``sql`` breaks (none when it carries :data:`MARKER`); a statement
    PostgreSQL cannot parse raises ``pglast.parser.ParseError``."""
    parsed = parse_sql(sql)
    if spans_tenants(sql) is not None:
        return []
    check = _Check(name, schema)
    for raw in parsed:
        check.statement(raw.stmt, None, frozenset())
    return sorted(set(check.found))


@dataclass
class _Scope:
    """The ranges of one SELECT/UPDATE/DELETE: alias -> table (None: a CTE or subquery)."""

    ranges: dict[str, str | None]
    outer: _Scope | None
    pinned: set[str] = field(default_factory=set)

    def lookup(self, alias: str) -> tuple[_Scope, str] | None:
        scope: _Scope | None = self
        while scope is not None:
            if alias in scope.ranges:
                return scope, alias
            scope = scope.outer
        return None


_STATEMENTS = (ast.SelectStmt, ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)


class _Check:
    def __init__(self, name: str, schema: Schema) -> None:
        self.name = name
        self.schema = schema
        self.found: list[Finding] = []

    def flag(self, rule: str, table: str) -> None:
        self.found.append(Finding(self.name, rule, table))

    def statement(self, node: Any, outer: _Scope | None, ctes: frozenset[str]) -> None:
        with_clause = getattr(node, "withClause", None)
        if with_clause is not None:
            names = frozenset(cte.ctename for cte in with_clause.ctes)
            if with_clause.recursive:
                ctes |= names
            for cte in with_clause.ctes:
                self.statement(cte.ctequery, None, ctes)
            ctes |= names
        if isinstance(node, ast.SelectStmt):
            self._select(node, outer, ctes)
        elif isinstance(node, ast.InsertStmt):
            table = node.relation.relname
            if self.schema.distributed(table) and not _sets_tenant(node):
                self.flag("insert-without-tenant", table)
            for part in (node.selectStmt, node.onConflictClause, node.returningClause):
                self.walk(part, outer, ctes)
        elif isinstance(node, ast.UpdateStmt):
            self._scoped(node, [node.relation, *(node.fromClause or ())], outer, ctes)
        elif isinstance(node, ast.DeleteStmt):
            self._scoped(node, [node.relation, *(node.usingClause or ())], outer, ctes)

    def _select(self, node: ast.SelectStmt, outer: _Scope | None, ctes: frozenset[str]) -> None:
        if node.op is not None and node.op != SetOperation.SETOP_NONE:
            self.statement(node.larg, outer, ctes)
            self.statement(node.rarg, outer, ctes)
            return
        scope = self._scoped(node, list(node.fromClause or ()), outer, ctes)
        if node.lockingClause:
            locked = {
                rel.alias.aliasname if rel.alias else rel.relname
                for clause in node.lockingClause
                for rel in clause.lockedRels or ()
            }
            for alias, table in scope.ranges.items():
                if (
                    self.schema.distributed(table)
                    and alias not in scope.pinned
                    and (not locked or alias in locked)
                ):
                    self.flag("for-update-unpinned", str(table))

    def _scoped(
        self, node: Any, froms: list[Any], outer: _Scope | None, ctes: frozenset[str]
    ) -> _Scope:
        """Collect ``node``'s ranges, pin what its conditions pin, flag the rest, then check
        what it nests (subqueries see this scope)."""
        scope = _Scope({}, outer)
        conditions: list[Any] = [node.whereClause]
        for item in froms:
            self._ranges(item, scope, ctes, conditions)
        equalities = [
            (_bare(e.lexpr), _bare(e.rexpr))
            for c in conditions
            for e in _conjuncts(c)
            if isinstance(e, ast.A_Expr)
            and e.kind == A_Expr_Kind.AEXPR_OP
            and [n.sval for n in e.name] == ["="]
        ]
        moved = True
        while moved:
            moved = False
            for left, right in equalities + [(b, a) for a, b in equalities]:
                target = self._tenant_of(left, scope)
                if target is None or target[1] in target[0].pinned:
                    continue
                if self._pins(right, scope):
                    target[0].pinned.add(target[1])
                    moved = True
        for alias, table in scope.ranges.items():
            if self.schema.distributed(table) and alias not in scope.pinned:
                self.flag("unpinned", str(table))
        skip = {"withClause", "larg", "rarg", "relation"}
        for slot in node.__slots__:
            if slot not in skip:
                self.walk(getattr(node, slot), scope, ctes)
        return scope

    def _ranges(
        self, item: Any, scope: _Scope, ctes: frozenset[str], conditions: list[Any]
    ) -> None:
        if isinstance(item, ast.RangeVar):
            alias = item.alias.aliasname if item.alias else item.relname
            is_cte = item.schemaname is None and item.relname in ctes
            scope.ranges[alias] = None if is_cte else item.relname
        elif isinstance(item, ast.JoinExpr):
            self._ranges(item.larg, scope, ctes, conditions)
            self._ranges(item.rarg, scope, ctes, conditions)
            conditions.append(item.quals)
        elif isinstance(item, (ast.RangeSubselect, ast.RangeFunction)) and item.alias:
            scope.ranges[item.alias.aliasname] = None

    def walk(self, node: Any, scope: _Scope | None, ctes: frozenset[str]) -> None:
        """Check every statement nested in ``node`` (subqueries, sublinks, INSERT ...
        SELECT), with ``scope`` as their enclosing one."""
        if isinstance(node, (list, tuple)):
            for item in node:
                self.walk(item, scope, ctes)
        elif isinstance(node, _STATEMENTS):
            self.statement(node, scope, ctes)
        elif isinstance(node, ast.RangeSubselect):
            self.statement(node.subquery, scope, ctes)
        elif isinstance(node, ast.Node) and not isinstance(node, ast.RangeVar):
            for slot in node.__slots__:
                self.walk(getattr(node, slot), scope, ctes)

    def _tenant_of(self, node: Any, scope: _Scope) -> tuple[_Scope, str] | None:
        """The (scope, alias) whose ``tenant`` column ``node`` is, if it is one."""
        if not isinstance(node, ast.ColumnRef):
            return None
        fields = [f.sval for f in node.fields if isinstance(f, ast.String)]
        if len(fields) != len(node.fields) or not fields or fields[-1] != TENANT:
            return None
        if len(fields) >= 2:
            return scope.lookup(fields[-2])
        at: _Scope | None = scope
        while at is not None:  # an unqualified tenant: the one range of a scope that has it
            having = [
                alias
                for alias, table in at.ranges.items()
                if table is None or TENANT in self.schema.columns.get(table, ())
            ]
            if len(at.ranges) == 1 or len(having) == 1:
                return at, (having or list(at.ranges))[0]
            at = at.outer
        return None

    def _pins(self, node: Any, scope: _Scope) -> bool:
        """``node`` names one tenant: a parameter, a constant, or a pinned table's tenant."""
        if isinstance(node, ast.ParamRef):
            return True
        if isinstance(node, ast.A_Const):
            return not node.isnull
        other = self._tenant_of(node, scope)
        return other is not None and other[1] in other[0].pinned


def _conjuncts(node: Any) -> Iterator[Any]:
    if node is None:
        return
    if isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR:
        for arg in node.args:
            yield from _conjuncts(arg)
    else:
        yield node


def _bare(node: Any) -> Any:
    while isinstance(node, ast.TypeCast):
        node = node.arg
    return node


def _sets_tenant(node: ast.InsertStmt) -> bool:
    """An INSERT names ``tenant`` among its columns (or names none: every column)."""
    return not node.cols or any(target.name == TENANT for target in node.cols)


def summary(
    metadata: MetaData,
    checked: Mapping[str, Mapping[str, str]],
    findings: Iterable[Finding],
    spanning: Mapping[str, str],
) -> str:
    """The counts a run prints: tables by kind, statements checked by source, findings by
    rule, and the statements accepted as spanning tenants."""
    found = list(findings)
    kinds: dict[str, int] = {}
    for table in metadata.tables.values():
        kinds[_kind(table) or "none"] = kinds.get(_kind(table) or "none", 0) + 1
    rules: dict[str, int] = {}
    for finding in found:
        rules[finding.rule] = rules.get(finding.rule, 0) + 1
    unpinned = {f.name for f in found if f.rule in STATEMENT_RULES}
    lines = [
        "tables: " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())),
        "statements checked: "
        + ", ".join(f"{len(stmts)} {source}" for source, stmts in checked.items())
        + f"; {len(unpinned)} break a statement rule",
        "findings: " + ", ".join(f"{n} {rule}" for rule, n in sorted(rules.items())),
        f"spanning tenants (marked): {len(spanning)}",
        *(f"  {name}: {why}" for name, why in sorted(spanning.items())),
    ]
    return "\n".join(lines)


def tables_in(sql: str) -> set[str]:
    """The tables (and CTEs) ``sql`` names in its ranges."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, (list, tuple)):
            for item in node:
                visit(item)
        elif isinstance(node, ast.RangeVar):
            found.add(node.relname)
        elif isinstance(node, ast.Node):
            for slot in node.__slots__:
                visit(getattr(node, slot))

    for raw in parse_sql(sql):
        visit(raw.stmt)
    return found

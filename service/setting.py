"""One setting of :class:`service.config.Settings`, declared once as a dataclass field.

``setting(default, why, rule=..., secret=...)`` is the whole declaration; the field's name
gives the variable (``SETTLEMENT_`` + NAME) and its type how the variable is read: ``float``
is seconds, ``int`` an integer, ``bool`` a flag, an ``Enum`` one of its values, ``str`` the
text as is. From that one field come reading the environment, the per-setting check, the
``settlement config`` lines (secrets masked) and the settings table of docs/operations.md
(``settlement config --markdown``).
"""

from __future__ import annotations

import enum
import math
import re
import typing
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

__all__ = [
    "PREFIX",
    "ConfigError",
    "Rule",
    "Setting",
    "above",
    "at_least",
    "between",
    "config_lines",
    "declared",
    "is_url",
    "markdown_table",
    "masked",
    "one_of",
    "setting",
    "strong_key",
]

T = TypeVar("T")

PREFIX = "SETTLEMENT_"


class ConfigError(ValueError):
    """A ``SETTLEMENT_*`` variable holds a value the server cannot run with."""


@dataclass(frozen=True, slots=True)
class Rule:
    """What one value must be: ``ok`` says whether it is, ``text`` ends "... must be "."""

    text: str
    ok: Callable[[Any], bool]


def above(bound: int) -> Rule:
    return Rule(f"> {bound}", lambda value: bool(value > bound))


def at_least(bound: int) -> Rule:
    return Rule(f">= {bound}", lambda value: bool(value >= bound))


def between(low: int, high: int) -> Rule:
    return Rule(f"{low}-{high}", lambda value: bool(low <= value <= high))


def one_of(*choices: str) -> Rule:
    return Rule(_listed(choices), lambda value: value in choices)


is_url = Rule("a URL (scheme://...)", lambda value: "://" in value)

# The API key format (service.store.principals.new_key makes such keys: sk_ and 43 characters
# of 32 random bytes); a longer body is allowed, e.g. sk_ and 64 hex digits.
KEY_FORMAT = re.compile(r"sk_[A-Za-z0-9_-]{43,}")
# What a key must be worth against guessing: the 128 bits an API key needs.
KEY_BITS = 128


def estimated_bits(text: str) -> float:
    """An estimate of the entropy of ``text`` in bits: the Shannon entropy of its characters'
    frequencies times its length, its repeats not counted (the length is that of its distinct
    three-character runs). A short, repetitive or few-letter text scores low (``aaaa...``: 0,
    ``adminadmin...``: 16); one patterned without repeats (``abcdefgh...``) is not caught. A
    random 43-character key scores about 210 (never below 170 in 200,000 draws)."""
    n = len(text)
    per_char = -sum(c / n * math.log2(c / n) for c in Counter(text).values())
    runs = {text[i : i + 3] for i in range(n - 2)}
    return per_char * min(n, len(runs) + 2)


strong_key = Rule(
    f"an API key: sk_ then 43 or more random characters of A-Z a-z 0-9 - _ ({KEY_BITS} bits "
    "or more; e.g. sk_$(openssl rand -hex 32))",
    lambda value: KEY_FORMAT.fullmatch(value) is not None and estimated_bits(value[3:]) >= KEY_BITS,
)


def _listed(choices: Sequence[str]) -> str:
    """``a, b or c``"""
    return f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else choices[0]


def setting(
    default: Any, why: str, *, rule: Rule | None = None, secret: bool = False, urls: bool = False
) -> Any:
    """A field of Settings: its default, the rule its value keeps (unset values are not
    checked) and the one-line reason it exists. A ``secret`` one is left out of the repr, so
    no log or traceback shows it, and shown by ``settlement config`` as ``***``, or, when it
    holds ``urls`` (which may carry a password), with each URL's password masked
    (:func:`masked`)."""
    return field(
        default=default,
        repr=not secret,
        metadata={"why": why, "rule": rule, "secret": secret, "urls": urls},
    )


@dataclass(frozen=True, slots=True)
class Setting:
    """One declared setting, as the environment, the checks and the printouts see it."""

    name: str
    kind: type
    default: Any
    why: str
    rule: Rule | None
    secret: bool
    urls: bool = False

    @property
    def variable(self) -> str:
        return PREFIX + self.name.upper()

    def parse(self, raw: str) -> Any:
        """The value of the variable's text ``raw``; ConfigError naming the variable."""
        name, text = self.variable, raw.strip()
        if self.kind is bool:
            return _flag(name, raw)
        if self.kind is int:
            return _number(int, "an integer", name, raw)
        if self.kind is float:
            return _number(float, "a number of seconds", name, raw)
        if issubclass(self.kind, enum.Enum):
            try:
                return self.kind(text)
            except ValueError:
                choices = _listed([member.value for member in self.kind])
                raise ConfigError(f"{name} must be {choices}, got {raw!r}") from None
        return raw

    def check(self, value: Any) -> None:
        """ConfigError naming the variable when a set ``value`` breaks the rule."""
        if self.rule is not None and value is not None and not self.rule.ok(value):
            raise ConfigError(f"{self.variable} must be {self.rule.text}")

    def shown(self, value: Any) -> str:
        """``value`` for ``settlement config``: a secret as ``***``; URLs (a secret's or any
        other setting's) without their passwords (:func:`masked`)."""
        if value is None:
            return "unset"
        if self.secret and not self.urls:
            return "***"
        return masked(str(value))

    def takes(self) -> str:
        """What the variable takes, for the table: its kind and its rule."""
        kind = {float: "seconds", int: "integer", bool: "1 or 0"}.get(self.kind)
        if kind is None:
            text = self.rule.text if self.rule else "text"
        else:
            text = f"{kind} {self.rule.text}" if self.rule else kind
        return f"{text}, secret" if self.secret else text


def declared(cls: type[Any]) -> tuple[Setting, ...]:
    """The settings the dataclass ``cls`` declares with :func:`setting`, in order."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in fields(cls):
        kinds = [kind for kind in typing.get_args(hints[f.name]) if kind is not type(None)]
        found.append(
            Setting(
                name=f.name,
                kind=kinds[0] if kinds else hints[f.name],
                default=f.default,
                why=f.metadata["why"],
                rule=f.metadata["rule"],
                secret=f.metadata["secret"],
                urls=f.metadata["urls"],
            )
        )
    return tuple(found)


def config_lines(rows: Iterable[tuple[str, str, str]]) -> str:
    """``settlement config``: one line per setting, VARIABLE=value, then # and its reason."""
    pairs = [(f"{name}={shown}", why) for name, shown, why in rows]
    width = max(len(pair) for pair, _ in pairs)
    return "\n".join(f"{pair:<{width}}  # {why}" for pair, why in pairs)


def markdown_table(settings: Iterable[Setting]) -> str:
    """``settlement config --markdown``: the table of every setting and its default (the one
    in docs/operations.md)."""
    lines = ["| variable | default | takes | why |", "|---|---|---|---|"]
    for one in settings:
        cells = (f"`{one.variable}`", _default(one.default), one.takes(), one.why)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def _default(value: Any) -> str:
    if value is None or value == "":
        return "unset" if value is None else "empty"
    if isinstance(value, bool):
        return f"`{int(value)}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


# A URL's password: scheme://user:PASSWORD@, up to the last @ before the next URL (or a
# space), so a raw @, comma, / or # in it is masked whole (a list of URLs keeps its others);
# and a password=... query parameter (libpq and redis-py both read one).
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
_URL_PASSWORD = re.compile(rf"({_SCHEME}[^\s:/?#@,]*:)(?:(?!{_SCHEME})\S)*@")
_QUERY_PASSWORD = re.compile(r"(?i)([?&](?:password|sslpassword)=)[^&#\s,]*")


def masked(text: str) -> str:
    """``text`` with the password of every URL in it as ``***`` (``user:***@``,
    ``password=***``), the rest as it is: the one mask of a URL-valued setting (each URL of a
    list too) wherever settings are printed or logged."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def _number(kind: Callable[[str], T], what: str, name: str, raw: str) -> T:
    try:
        value = kind(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be {what}, got {raw!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {raw!r}")
    return value


def _flag(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be 1 or 0, got {raw!r}")

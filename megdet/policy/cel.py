"""The MegDet policy's rules as CEL, and their evaluation in the controller: the very text the
API server evaluates (``s``: the run's spec; ``variables.<key>``: the policy's values), with the
Rust CEL interpreter ``megdet validate`` uses, each compiled once per process. Kubernetes' CEL
string functions the rules call (``split``, ``join``, ``trim``) come from ``cel.stdlib``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import cel

__all__ = ["Rule", "cel_join", "cel_quote", "context", "evaluate", "read_fields"]

#: Kubernetes' CEL string functions the rules call (see the module doc).
_STRING_FUNCTIONS = ("split", "join", "trim")


class Policy(Protocol):
    """What a rule reads of :class:`megdet.policy.Policy`: its chart-values form."""

    def values(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Rule:
    """One policy rule, written once in CEL (``s``: the spec; ``variables``: the policy)."""

    name: str
    #: The spec field it is about (the problem's path, and the admission message's prefix).
    path: str
    #: CEL that is true when the spec passes.
    expression: str
    #: CEL building the message when it fails: the field's value and the allowed values.
    message: str

    def check(self, spec: Any, policy: Policy) -> str | None:
        """This rule's problem with ``spec`` under ``policy`` (its message), or None."""
        return evaluate(self, context(spec, policy.values(), read_fields([self])))


def cel_quote(text: str) -> str:
    """A Python string as a CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def cel_join(expr: str) -> str:
    """CEL: a list of names for a message, each in double quotes and comma-separated, or
    ``none`` for an empty list (not JSON: a quote inside a value stays as it is)."""
    return f"({expr}.size() == 0 ? 'none' : {expr}.map(x, '\"' + x + '\"').join(', '))"


@functools.cache
def _program(text: str) -> cel.Program:
    # Imported here: the controller extra's package; the training image builds the `megdet`
    # command (which lists the controller's subcommands) without it.
    import cel

    return cel.compile(text)


def _plain(value: Any) -> Any:
    """``value`` as the API server's CEL sees a stored object: a null field is absent."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


#: A spec field a rule reads (``s.<field>``).
_SPEC_FIELD = re.compile(r"\bs\.([A-Za-z_][A-Za-z0-9_]*)")


def read_fields(rules: Iterable[Rule]) -> frozenset[str]:
    """The spec's top-level fields that ``rules`` read: the rest need not become CEL values
    (converting the whole defaulted spec costs more than evaluating every rule)."""
    return frozenset(
        name for rule in rules for text in (rule.expression, rule.message)
        for name in _SPEC_FIELD.findall(text)
    )  # fmt: skip


def context(
    spec: Any, values: Mapping[str, Any], fields: frozenset[str] | None = None
) -> cel.Context:
    """The evaluation context of every rule for one spec: ``s`` (only ``fields`` of it, when
    given: the ones the rules read) and ``variables``."""
    if fields is not None and isinstance(spec, Mapping):
        spec = {k: v for k, v in spec.items() if k in fields}
    import cel
    from cel.stdlib import EXTENSIONS

    ctx = cel.Context({"s": _plain(spec), "variables": dict(values)})
    for name in _STRING_FUNCTIONS:
        ctx.add_function(name, EXTENSIONS["strings"][name])
    return ctx


def evaluate(rule: Rule, ctx: cel.Context) -> str | None:
    """The rule's message when the spec in ``ctx`` fails it, else None; never raises. A rule
    that cannot be evaluated on this spec is about a mistyped field, which the CRD's schema
    refuses before any policy is asked (docs/operations.md, "Who may do what")."""
    try:
        if _program(rule.expression).execute(ctx) is not False:
            return None
        message = _program(rule.message).execute(ctx)
    except Exception:  # mistyped spec: the schema's business, not the policy's
        return None
    return message if isinstance(message, str) else None

"""Safe PromQL construction: escaping of untrusted label values and rendering of query templates.

Two kinds of values reach a query:

* **trusted** ones from the operator's settings (metric names, label names, extra matchers, windows): inserted as
  written, because they *are* PromQL;
* **untrusted** ones from users (a policy's namespace and Deployment name, which a tenant controls): always inserted
  inside a string literal and escaped for it, so that no value can end the literal and add PromQL of its own.

Placeholders are ``{identifier}`` tokens. PromQL's own braces (``up{job="x"}``) never look like that, so templates
need no doubled braces, unlike ``str.format``.

A tenant's rendered override is also checked for what it *reads* (``check_confined``): the controller runs it with
its own Prometheus credentials, so every selector must be pinned to the tenant's namespace, as prom-label-proxy pins
a dashboard's queries.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping

import promql_parser

# Kubernetes pod names of a Deployment: <deployment>-<pod-template-hash>-<random>. Both suffixes use the alphabet of
# k8s.io/apimachinery's rand.SafeEncodeString (no vowels, no 0/1/3, so that no words or look-alikes appear); the hash
# is the decimal uint32 template hash re-encoded (1-10 characters), the random part is 5 characters.
POD_HASH_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
POD_NAME_SUFFIX_RE = f"-[{POD_HASH_ALPHABET}]{{1,10}}-[{POD_HASH_ALPHABET}]{{5}}"
# RE2 and Python agree on this syntax; Prometheus anchors label regexes on both ends, Python needs fullmatch.
# Names cut by generateName (see below) do not match it: their Deployment cannot be read from them.
POD_TO_DEPLOYMENT_RE = f"(.+){POD_NAME_SUFFIX_RE}"

# generateName (k8s.io/apiserver/pkg/storage/names, SimpleNameGenerator) cuts the base "<deployment>-<hash>-" to
# 58 characters and appends 5 random ones: a name stays within 63. With the longest hash (10 characters) a
# Deployment name of up to 46 characters is never cut; from 47 on its pods may be named <first 58 characters of
# "<deployment>-<hash>-"><random>, exactly 63 characters: the hash cut short and no dash before the random part,
# and from 58 characters on the Deployment name itself cut.
POD_NAME_MAX_LENGTH = 63
POD_RANDOM_LENGTH = 5
POD_GENERATED_BASE_LENGTH = POD_NAME_MAX_LENGTH - POD_RANDOM_LENGTH  # 58
POD_HASH_MAX_LENGTH = 10
LONGEST_UNCUT_DEPLOYMENT_NAME = POD_GENERATED_BASE_LENGTH - POD_HASH_MAX_LENGTH - 2  # 46


def pod_names_may_be_cut(deployment: str) -> bool:
    """True when generateName may cut the names of this Deployment's pods (a name of more than 46 characters)."""
    return len(deployment) > LONGEST_UNCUT_DEPLOYMENT_NAME


def deployment_pods_re(deployment: str) -> str:
    """RE2 matching (anchored, as Prometheus anchors label regexes) every name generateName can give the pods of
    ``deployment``, cut or not, and no other name of at most 63 characters, except the pods of a Deployment whose
    pods' names are cut to the same form (the only ambiguity, inherent to the names):

    * up to 46 characters: ``<name>-<hash of 1-10>-<5>`` (never cut; :data:`POD_NAME_SUFFIX_RE`);
    * 47 to 56: ``<name>-<hash of 1..56-n>-<5>`` when the hash fits, else ``<name>-<62-n characters>`` (63 in all);
      a Deployment ``<name>-<s>`` whose ``s`` starts with enough hash-alphabet characters (56-n or more, no dash)
      has pods named alike;
    * 57 and more: ``<first 58 characters of "<name>-"><5>`` (63 in all); any Deployment with the same first 58
      characters of ``<name>-`` has pods named alike.
    """
    chars = f"[{POD_HASH_ALPHABET}]"
    n = len(deployment)
    if n <= LONGEST_UNCUT_DEPLOYMENT_NAME:
        return escape_regex(deployment) + POD_NAME_SUFFIX_RE
    if n + 1 >= POD_GENERATED_BASE_LENGTH:  # the cut falls at or before the dash after the name
        return escape_regex((deployment + "-")[:POD_GENERATED_BASE_LENGTH]) + f"{chars}{{{POD_RANDOM_LENGTH}}}"
    cut = f"{chars}{{{POD_NAME_MAX_LENGTH - n - 1}}}"  # the hash's first characters and the random ones
    longest_hash = POD_GENERATED_BASE_LENGTH - n - 2  # the longest hash that fits with both dashes
    if longest_hash < 1:
        return f"{escape_regex(deployment)}-{cut}"
    whole = f"{chars}{{1,{longest_hash}}}-{chars}{{{POD_RANDOM_LENGTH}}}"
    return f"{escape_regex(deployment)}-(?:{whole}|{cut})"

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")

# RE2 metacharacters. Escaping every one of them makes the value match itself literally, whatever it holds.
_REGEX_META = frozenset(r"\.+*?()|[]{}^$")


class PromQLError(ValueError):
    """A template or value that cannot be turned into a safe query."""


def escape_string(value: str, quote: str = '"') -> str:
    """``value`` escaped for a PromQL string literal delimited by ``quote`` (without the quotes).

    Backslash first (so the escapes we add are not doubled), then the quote, then line breaks and other control
    characters, which Go's string-literal syntax forbids raw in interpreted strings.
    """
    if quote not in ('"', "'"):
        raise PromQLError(f"cannot escape for quote {quote!r}")
    out = []
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == quote:
            out.append("\\" + quote)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def escape_regex(value: str) -> str:
    """``value`` as an RE2 pattern matching exactly itself (metacharacters backslash-escaped)."""
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in value)


def string_literal(value: str) -> str:
    """A complete double-quoted PromQL string literal holding ``value``."""
    return '"' + escape_string(value) + '"'


def matcher(label: str, op: str, value: str) -> str:
    """One label matcher. For ``=~``/``!~`` pass an already built regex (e.g. from ``escape_regex``)."""
    if not LABEL_NAME.match(label):
        raise PromQLError(f"invalid label name {label!r}")
    if op not in ("=", "!=", "=~", "!~"):
        raise PromQLError(f"invalid matcher operator {op!r}")
    return f"{label}{op}{string_literal(value)}"


def selector(matchers: Iterable[str], extra: str = "") -> str:
    """``{m1,m2,...}`` from matchers and the operator's raw extra matchers; empty string when there are none."""
    parts = [m for m in matchers if m]
    if extra.strip():
        parts.append(extra.strip().strip(","))
    return "{" + ",".join(parts) + "}" if parts else ""


def placeholders(template: str) -> set[str]:
    return set(PLACEHOLDER.findall(template))


def render(template: str, trusted: Mapping[str, str], untrusted: Mapping[str, str] | None = None) -> str:
    """Fill ``template``'s ``{placeholders}``.

    ``trusted`` values are inserted verbatim. ``untrusted`` ones must sit inside a string literal; they are escaped
    for the literal's quote, and additionally regex-escaped when the literal is the value of a ``=~``/``!~``
    matcher. An untrusted placeholder outside a literal, inside a raw (backquoted) string it could end, or any
    unknown placeholder, raises ``PromQLError``: better no query than one a user can steer.
    """
    untrusted = untrusted or {}
    out: list[str] = []
    i = 0
    n = len(template)
    quote: str | None = None  # the delimiter of the string literal we are in, or None
    regex_literal = False
    while i < n:
        ch = template[i]
        m = PLACEHOLDER.match(template, i)
        if m:
            name = m.group(1)
            if name in untrusted:
                value = untrusted[name]
                if quote is None:
                    raise PromQLError(
                        f'placeholder {{{name}}} must be inside a quoted string, e.g. namespace="{{{name}}}"'
                    )
                if regex_literal:
                    value = escape_regex(value)
                if quote == "`":
                    if "`" in value:
                        raise PromQLError(f"value for {{{name}}} contains a backquote; use a double-quoted string")
                    out.append(value)
                else:
                    out.append(escape_string(value, quote))
                i = m.end()
                continue
            if name in trusted:
                out.append(trusted[name])
                i = m.end()
                continue
            known = ", ".join("{" + k + "}" for k in sorted({*trusted, *untrusted}))
            raise PromQLError(f"unknown placeholder {{{name}}} in query template {template!r} (known: {known})")
        if quote is None:
            if ch in ('"', "'", "`"):
                quote = ch
                regex_literal = _preceded_by_regex_op(template, i)
            elif ch == "#":  # a PromQL comment runs to the end of the line
                end = template.find("\n", i)
                end = n if end < 0 else end
                out.append(template[i:end])
                i = end
                continue
        elif ch == "\\" and quote != "`" and i + 1 < n:
            out.append(template[i : i + 2])
            i += 2
            continue
        elif ch == quote:
            quote = None
            regex_literal = False
        out.append(ch)
        i += 1
    if quote is not None:
        raise PromQLError(f"unterminated string literal in query template {template!r}")
    return "".join(out)


def check_template(template: str, trusted: Iterable[str], untrusted: Iterable[str] = ()) -> None:
    """Raise ``PromQLError`` if ``template`` cannot be rendered with these placeholder names (checked at load)."""
    render(template, {k: "x" for k in trusted}, {k: "x" for k in untrusted})


def _preceded_by_regex_op(text: str, pos: int) -> bool:
    j = pos - 1
    while j >= 0 and text[j] in " \t\r\n":
        j -= 1
    return j >= 1 and text[j] == "~" and text[j - 1] in "=!"


_CLOSERS = {")": "(", "]": "[", "}": "{"}


def check_self_contained(query: str) -> None:
    """Raise ``PromQLError`` unless ``query`` is one self-contained expression fragment.

    The adapter wraps a per-service override as ``label_replace((<query>), ...)`` and joins several with ``or``:
    a query whose parentheses, brackets or braces do not balance outside string literals could close that wrapper
    and add series tagged as another service; a ``#`` comment or a line break could hide the rest of the wrapper.
    """
    if "\n" in query or "\r" in query:
        raise PromQLError("the query must be on one line (no line breaks)")
    stack: list[str] = []
    quote: str | None = None
    i, n = 0, len(query)
    while i < n:
        ch = query[i]
        if quote is not None:
            if ch == "\\" and quote != "`":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in ('"', "'", "`"):
            quote = ch
        elif ch == "#":
            raise PromQLError("comments (#) are not allowed in the query")
        elif ch in "([{":
            stack.append(ch)
        elif ch in _CLOSERS and (not stack or stack.pop() != _CLOSERS[ch]):
            raise PromQLError(f"unbalanced {ch!r} at offset {i}: parentheses, brackets and braces must balance")
        i += 1
    if quote is not None:
        raise PromQLError("unterminated string literal")
    if stack:
        raise PromQLError(f"unclosed {stack[-1]!r}: parentheses, brackets and braces must balance")


# promql-parser recurses on the native stack and takes time quadratic in the depth of the tree: 20,000 nested
# parentheses (40 kB, far less than a Kubernetes object may hold) killed the process with SIGSEGV, and 5,000 unary
# minus signs took 2 s. Every node of the tree takes at least one character outside string literals, so bounding
# those characters bounds the depth (1,000: about 0.1 s at worst, nine times the longest example's), while a
# long regex in a literal costs nothing. The total bounds what the verdict cache holds.
MAX_CONFINED_CODE_CHARS = 1000
MAX_CONFINED_QUERY_CHARS = 16_384
_MATCH_OPS = (  # pairs: MatchOp is not hashable
    (promql_parser.MatchOp.Equal, "="),
    (promql_parser.MatchOp.NotEqual, "!="),
    (promql_parser.MatchOp.Re, "=~"),
    (promql_parser.MatchOp.NotRe, "!~"),
)
_SHOWN_SELECTOR_CHARS = 200  # the adapter cuts a reason at 500 characters: leave room for the hint after it


def check_confined(query: str, namespace_label: str, namespace: str) -> None:
    """Raise ``PromQLError`` unless every series ``query`` reads is in ``namespace``: every vector selector (matrix
    selectors and subqueries included) carries the exact matcher ``<namespace_label>="<namespace>"`` -- in each of
    its ``or`` alternatives, if it has some. Other matchers on that label are ANDed with it, so they can only narrow
    the selection. A query without selectors (``vector(3)``) reads nothing and passes.

    Only checks: the query runs as its author wrote it, so the check and Prometheus must read the same text. It is
    parsed by promql-parser (Prometheus 2.45's grammar), whose string literals decode as Go's, as Prometheus's do;
    newer syntax it does not know is refused, never guessed at.
    """
    problem = _confinement_problem(query, namespace_label, namespace)
    if problem is not None:
        raise PromQLError(problem)


@functools.lru_cache(maxsize=1024)
def _confinement_problem(query: str, namespace_label: str, namespace: str) -> str | None:
    # Cached: a rendered override is the same text every tick, and the worst query allowed costs 0.1 s to parse.
    if len(query) > MAX_CONFINED_QUERY_CHARS:
        return f"too long to check: {len(query)} characters, at most {MAX_CONFINED_QUERY_CHARS}"
    code = _code_chars(query)
    if code > MAX_CONFINED_CODE_CHARS:
        return f"too complex to check: {code} characters besides string literals, at most {MAX_CONFINED_CODE_CHARS}"
    try:
        expr = promql_parser.parse(query)
    except ValueError as exc:
        return f"not valid PromQL: {exc}"
    except BaseException as exc:
        # A Rust panic arrives as pyo3's PanicException, a BaseException that the tick's ``except Exception``
        # would let through: a tenant's text must not stop the controller.
        if type(exc).__name__ != "PanicException":
            raise
        return f"not valid PromQL: the parser failed ({exc})"
    wanted = promql_parser.Matcher(promql_parser.MatchOp.Equal, namespace_label, namespace)
    try:
        for found in _selectors(expr):
            # promql-parser puts every matcher of {a="1", b="2" or c="3"} in the alternatives; were there both,
            # requiring the pin in each is right whether they are ANDed or ORed.
            plain, groups = found.matchers.matchers, found.matchers.or_matchers
            alternatives = [*groups, plain] if plain or not groups else groups
            if all(_pins(matchers, wanted) for matchers in alternatives):
                continue
            pin = f"{namespace_label}={string_literal(namespace)}"
            return (
                f"selector {_shown(found)} does not select {pin}: an override may read only its own namespace "
                f'(add {namespace_label}="{{namespace}}" to every selector)'
            )
    except PromQLError as exc:
        return str(exc)
    return None


def _pins(matchers: Iterable[promql_parser.Matcher], wanted: promql_parser.Matcher) -> bool:
    return any(m.op == wanted.op and m.name == wanted.name and m.value == wanted.value for m in matchers)


def _selectors(expr: promql_parser.Expr) -> Iterator[promql_parser.VectorSelector]:
    """Every vector selector of ``expr``, in the order they are written.

    Not ``promql_parser.walk``: it copies each subtree into Python at every level (7 s for a chain of 400
    additions, cubic in the depth); reading each child once is linear. A kind of node this does not know
    (a later promql-parser) is refused rather than skipped, since its children could hold a selector.
    """
    p = promql_parser
    stack: list[object] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, p.VectorSelector):
            yield node
        elif isinstance(node, p.MatrixSelector):
            stack.append(node.vector_selector)
        elif isinstance(node, p.BinaryExpr):
            stack += [node.rhs, node.lhs]
        elif isinstance(node, p.ParenExpr | p.UnaryExpr | p.SubqueryExpr):
            stack.append(node.expr)
        elif isinstance(node, p.AggregateExpr):
            # topk(scalar(x), y): the parameter is an expression too
            stack += [node.expr] if node.param is None else [node.expr, node.param]
        elif isinstance(node, p.Call):
            if node.func.name == "info":
                # Prometheus 3's info() joins in target_info series by their job and instance alone.
                raise PromQLError(
                    "info() may not be used in an override: it reads series (target_info) that no selector of the "
                    "query names"
                )
            stack += reversed(node.args)
        elif not isinstance(node, p.NumberLiteral | p.StringLiteral):
            raise PromQLError(f"cannot check a {type(node).__name__} in an override")


def _shown(found: promql_parser.VectorSelector) -> str:
    """A selector as a reason names it: its metric name and matchers, values escaped (``str()`` does not)."""

    def joined(matchers: Iterable[promql_parser.Matcher]) -> str:
        return ",".join(f"{m.name}{_match_op(m.op)}{string_literal(m.value)}" for m in matchers)

    groups = found.matchers.or_matchers
    inside = " or ".join(joined(g) for g in groups) if groups else joined(found.matchers.matchers)
    shown = (found.name or "") + (f"{{{inside}}}" if inside or not found.name else "")
    return shown if len(shown) <= _SHOWN_SELECTOR_CHARS else shown[: _SHOWN_SELECTOR_CHARS - 3] + "..."


def _match_op(op: promql_parser.MatchOp) -> str:
    return next((text for known, text in _MATCH_OPS if op == known), "?")


def _code_chars(query: str) -> int:
    """Characters of ``query`` outside string literals, counting generously where unsure (quotes, comments,
    escapes): an overcount only refuses a query, an undercount would let a deep one reach the parser."""
    count = 0
    quote: str | None = None
    i, n = 0, len(query)
    while i < n:
        ch = query[i]
        if quote is None:
            count += 1
            if ch in ('"', "'", "`"):
                quote = ch
            elif ch == "#":  # a comment runs to the end of the line; quotes in it open nothing
                end = query.find("\n", i)
                end = n if end < 0 else end
                count += end - i - 1
                i = end
                continue
        elif ch == quote or (ch == "\n" and quote != "`"):
            # A line break ends no literal in PromQL except a raw one; counting on from it never undercounts.
            count += 1
            quote = None
        elif ch == "\\" and quote != "`":
            i += 2
            continue
        i += 1
    return count

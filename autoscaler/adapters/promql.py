"""Safe PromQL construction: escaping of untrusted label values and rendering of query templates.

Two kinds of values reach a query:

* **trusted** ones from the operator's settings (metric names, label names, extra matchers, windows): inserted as
  written, because they *are* PromQL;
* **untrusted** ones from users (a policy's namespace and Deployment name, which a tenant controls): always inserted
  inside a string literal and escaped for it, so that no value can end the literal and add PromQL of its own.

Placeholders are ``{identifier}`` tokens. PromQL's own braces (``up{job="x"}``) never look like that, so templates
need no doubled braces, unlike ``str.format``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

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

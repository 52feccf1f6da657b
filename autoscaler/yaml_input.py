"""YAML input written by people (controller settings files, simulator scenarios): safe loading, duplicate keys refused,
and every way a text can fail to be YAML turned into one ``YamlProblem`` with where it is."""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (not: the last one wins)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):
            # `!!map [1]`, `!!set x`: the base class refuses it with its position (iterating it as key-value pairs
            # raised a TypeError, or a ValueError without a position)
            return super().construct_mapping(node, deep=deep)
        seen: set[Any] = set()
        merges = 0
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                # `<<: *base`: the keys written beside it override the merged ones, as YAML says. Given twice, the
                # first would win and the second's values go without a word: several merges are `<<: [*a, *b]`.
                merges += 1
                if merges > 1:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        "found duplicate key '<<' (merge several mappings with <<: [*a, *b])", key_node.start_mark,
                    )  # fmt: skip
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


# Numbers as kubectl and the API server read them (sigs.k8s.io/yaml: any scalar Go's ParseInt(s, 0, 64) or the
# YAML 1.2 float pattern takes), where PyYAML's YAML 1.1 resolvers read a string: an exponent without a dot or a
# sign (`1e-6`, `1e3`, `2.5e3`) and a `0o` octal. Otherwise a scenario or `--policy` file and `kubectl apply` of the
# same text would disagree (`target: 1e-6` refused here, `name: 1e3` a name here but a number to kubectl).
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)
UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?0o[0-7_]+$"), list("-+0"))


def _no_base_60(kind: str) -> Any:
    """YAML 1.1's base-60 numbers (``1:30`` -> 90) stay strings, as kubectl (go-yaml, which never had them) sends
    them: ``coldStartSeconds: 1:30`` is then refused here as the apiserver refuses it, not read as 90."""
    base = yaml.SafeLoader.yaml_constructors[f"tag:yaml.org,2002:{kind}"]

    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        if isinstance(node, yaml.ScalarNode) and ":" in str(node.value):
            return loader.construct_scalar(node)
        return base(loader, node)

    return construct


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _no_base_60("int"))
UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _no_base_60("float"))


@dataclass(frozen=True)
class YamlProblem(Exception):
    """Why a text is not YAML the loader accepts; ``line`` and ``column`` count from 1 (None: not known)."""

    problem: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        return self.problem


def decode_utf8(raw: bytes) -> str:
    """UTF-8 text (a leading byte-order mark dropped); ``YamlProblem`` naming the first bad byte and where it is."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        # the utf-8-sig decoder counts from after a byte-order mark: the position is in ``raw`` without it
        text = raw[3:] if raw.startswith(codecs.BOM_UTF8) else raw
        line = text.count(b"\n", 0, exc.start) + 1
        column = exc.start - (text.rfind(b"\n", 0, exc.start) + 1) + 1
        raise YamlProblem(
            f"not UTF-8 text (byte 0x{text[exc.start]:02x} at line {line}, column {column})", line, column
        ) from None


def load_yaml(text: str) -> Any:
    """The document in ``text`` (``UniqueKeyLoader``: no arbitrary objects, no duplicate keys). ``YamlProblem`` for
    invalid YAML, nesting too deep to load, or a value Python refuses (an integer of more than 4,300 digits)."""
    return _loaded(lambda: yaml.load(text, Loader=UniqueKeyLoader))


def load_yaml_all(text: str) -> list[Any]:
    """Every document in ``text`` (``---``-separated), loaded and refused as ``load_yaml`` does."""
    return _loaded(lambda: list(yaml.load_all(text, Loader=UniqueKeyLoader)))


def _loaded(load: Callable[[], T]) -> T:
    try:
        return load()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if mark is None:
            raise YamlProblem(problem) from None
        raise YamlProblem(problem, mark.line + 1, mark.column + 1) from None
    except RecursionError:
        raise YamlProblem("nested too deeply") from None
    except ValueError as exc:
        raise YamlProblem(str(exc)) from None

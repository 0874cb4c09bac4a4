"""YAML loading that remembers line numbers, so a bad rule is reported as ``file:line: what``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from doctor.evidence.errors import RuleError


class Located(dict):
    """A mapping that also knows the line of each of its keys (1-based)."""

    lines: dict[str, int]
    line: int

    def line_of(self, key: str) -> int:
        return self.lines.get(key, self.line)


#: Rule files are small: a YAML that composes to more nodes than this, or nests deeper, is refused.
#: Aliases are the reason for the first: ``*a`` re-uses a node, so nine levels of nine aliases
#: (411 bytes) would expand to 387 million values.
MAX_NODES = 100_000
MAX_DEPTH = 100


class _Budget:
    """Counts the nodes ``_convert`` expands (an alias counts each time it is used)."""

    def __init__(self, path: Path) -> None:
        self.path, self.left = path, MAX_NODES

    def spend(self, node: yaml.Node, depth: int) -> None:
        self.left -= 1
        line = node.start_mark.line + 1
        if self.left < 0:
            raise RuleError(f"{self.path}:{line}: more than {MAX_NODES} values (an alias bomb?); refusing")
        if depth > MAX_DEPTH:
            raise RuleError(f"{self.path}:{line}: nested deeper than {MAX_DEPTH} levels; refusing")


def _convert(node: yaml.Node, path: Path, budget: _Budget | None = None, depth: int = 0) -> Any:
    budget = budget or _Budget(path)
    budget.spend(node, depth)
    if isinstance(node, yaml.MappingNode):
        out = Located()
        out.lines = {}
        out.line = node.start_mark.line + 1
        for knode, vnode in node.value:
            key = _convert(knode, path, budget, depth + 1)
            if not isinstance(key, (str, int, float, bool)):
                raise RuleError(f"{path}:{knode.start_mark.line + 1}: mapping keys must be plain scalars")
            if key in out:
                raise RuleError(f"{path}:{knode.start_mark.line + 1}: duplicate key {key!r}")
            out[key] = _convert(vnode, path, budget, depth + 1)
            out.lines[str(key)] = knode.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(v, path, budget, depth + 1) for v in node.value]
    # Scalars: let the safe constructor resolve the tag (int, float, bool, null, str).
    return _scalar(node)


_CONSTRUCTOR = yaml.constructor.SafeConstructor()
#: The C parser when PyYAML was built with libyaml; composing is most of a rule file's load time.
_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _scalar(node: yaml.ScalarNode) -> Any:
    """Resolve a scalar with the safe constructor (int, float, bool, null, str: never objects)."""
    return _CONSTRUCTOR.construct_object(node, deep=True)


def _measure(node: yaml.Node, path: Path) -> None:
    """Refuse alias bombs and deep nesting before anything is built (same limits as rules)."""
    budget = _Budget(path)
    stack = [(node, 0)]
    while stack:
        n, depth = stack.pop()
        budget.spend(n, depth)
        if isinstance(n, yaml.MappingNode):
            stack.extend((c, depth + 1) for kv in n.value for c in kv)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend((c, depth + 1) for c in n.value)


def safe_data(text: str, path: Path = Path("<yaml>")) -> Any:
    """``yaml.safe_load`` through the C parser when present: same safe constructor, faster,
    and bounded like :func:`load` (aliases counted each time they are used)."""
    loader = _COMPOSER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node, path)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load(path: Path) -> Any:
    """Parse one YAML document safely, keeping line numbers on every mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}:1: cannot read ({exc})") from None
    try:
        node = yaml.compose(text, Loader=_COMPOSER)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise RuleError(f"{path}:{line}: invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise RuleError(f"{path}:1: invalid YAML: {exc}") from None
    except RecursionError:
        raise RuleError(f"{path}:1: invalid YAML: nested too deeply") from None
    if node is None:
        return None
    try:
        return _convert(node, path)
    except yaml.constructor.ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise RuleError(f"{path}:{line}: {exc.problem}") from None

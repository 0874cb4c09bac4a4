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


def _convert(node: yaml.Node, path: Path) -> Any:
    if isinstance(node, yaml.MappingNode):
        out = Located()
        out.lines = {}
        out.line = node.start_mark.line + 1
        for knode, vnode in node.value:
            key = _convert(knode, path)
            if not isinstance(key, (str, int, float, bool)):
                raise RuleError(f"{path}:{knode.start_mark.line + 1}: mapping keys must be plain scalars")
            if key in out:
                raise RuleError(f"{path}:{knode.start_mark.line + 1}: duplicate key {key!r}")
            out[key] = _convert(vnode, path)
            out.lines[str(key)] = knode.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(v, path) for v in node.value]
    # Scalars: let the safe constructor resolve the tag (int, float, bool, null, str).
    return _scalar(node)


_CONSTRUCTOR = yaml.constructor.SafeConstructor()
#: The C parser when PyYAML was built with libyaml; composing is most of a rule file's load time.
_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _scalar(node: yaml.ScalarNode) -> Any:
    """Resolve a scalar with the safe constructor (int, float, bool, null, str: never objects)."""
    return _CONSTRUCTOR.construct_object(node, deep=True)


def safe_data(text: str) -> Any:
    """``yaml.safe_load`` through the C parser when present: same safe constructor, faster."""
    loader = _COMPOSER(text)
    try:
        return loader.get_single_data()
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
    if node is None:
        return None
    try:
        return _convert(node, path)
    except yaml.constructor.ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise RuleError(f"{path}:{line}: {exc.problem}") from None

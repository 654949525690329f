"""Untrusted config text and values, refused before anything renders, stores or validates them.

- YAML: aliases and anchors are refused while parsing (a 316-byte body of nested aliases
  would otherwise expand to megabytes when shown or validated), as are texts over
  `MAX_TEXT_BYTES` and nesting deeper than `MAX_DEPTH`.
- JSON: too deep a body is a clear error, not a RecursionError.
- Values (`value_errors`): no NUL characters (PostgreSQL text cannot hold them), no
  non-finite floats (`1e999`, `.inf`: the JSON column refuses them), no integers beyond
  64 bits, bounded depth and size. Errors are keyed by the dotted field path.
"""

from __future__ import annotations

import json
import math
from typing import Any

import yaml

MAX_TEXT_BYTES = 256 * 1024
MAX_DEPTH = 32
MAX_NODES = 20_000
MAX_INT = 2**63 - 1


class UnsafeInput(ValueError):
    """Input refused before parsing finished; the message says why (and where, for YAML)."""


class _NoAliasSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses anchors/aliases and deep nesting while composing."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise UnsafeInput(f"YAML aliases and anchors (*name, &name) are not accepted (line {mark.line + 1}, column {mark.column + 1})")
        event = self.peek_event()
        if getattr(event, "anchor", None):
            mark = event.start_mark
            raise UnsafeInput(f"YAML aliases and anchors (*name, &name) are not accepted (line {mark.line + 1}, column {mark.column + 1})")
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                raise UnsafeInput(f"the YAML is nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str, max_bytes: int = MAX_TEXT_BYTES) -> Any:
    """Parse untrusted YAML; UnsafeInput (a ValueError) on aliases, size, depth or bad syntax."""
    if "\x00" in text:
        raise UnsafeInput("the text contains a NUL character")
    if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise UnsafeInput(f"the text is over {max_bytes // 1024} KB")
    loader = _NoAliasSafeLoader(text)
    try:
        return loader.get_single_data()
    except UnsafeInput:
        raise
    except yaml.YAMLError as exc:
        raise UnsafeInput(f"not valid YAML: {exc}") from exc
    except (ValueError, RecursionError, OverflowError) as exc:  # e.g. an integer of 5,000 digits
        raise UnsafeInput(f"not valid YAML: {str(exc)[:200]}") from exc
    finally:
        loader.dispose()


def load_json(raw: bytes | str) -> Any:
    """Parse untrusted JSON; UnsafeInput on syntax, depth (RecursionError) or huge numbers."""
    try:
        return json.loads(raw)
    except RecursionError as exc:
        raise UnsafeInput("the JSON is nested too deeply") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnsafeInput(f"the body is not valid JSON: {str(exc)[:200]}") from exc


def value_errors(value: Any, path: str = "") -> dict[str, list[str]]:
    """Problems of a parsed config value, keyed by dotted path ("config" for the top)."""
    errors: dict[str, list[str]] = {}
    budget = [MAX_NODES]

    def add(where: str, message: str) -> None:
        errors.setdefault(where or "config", []).append(message)

    def walk(node: Any, where: str, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            if budget[0] == -1:
                add("config", f"the config has more than {MAX_NODES} values")
            return
        if depth > MAX_DEPTH:
            add(where, f"nested more than {MAX_DEPTH} levels deep")
            return
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    add(where, f"keys must be text, got {type(key).__name__}")
                    continue
                if "\x00" in key:
                    add(where, "a key contains a NUL character")
                    continue
                walk(child, f"{where}.{key}" if where else key, depth + 1)
        elif isinstance(node, (list, tuple)):
            for index, child in enumerate(node):
                walk(child, f"{where}.{index}" if where else str(index), depth + 1)
        elif isinstance(node, bool) or node is None:
            return
        elif isinstance(node, float):
            if not math.isfinite(node):
                add(where, f"must be a finite number, not {node}")
        elif isinstance(node, int):
            if not -MAX_INT - 1 <= node <= MAX_INT:
                add(where, "the number is out of range")
        elif isinstance(node, str):
            if "\x00" in node:
                add(where, "contains a NUL character")

    walk(value, path, 0)
    return errors


"""The create-run form, generated from `rl_core.config.run_config.RunConfig` so it never drifts.

Each pydantic field becomes one input named by its dotted path (`trainer.lr`),
with the field's `description` as help text; nested models become fieldsets.
Posted values go back through `RunConfig` itself, and its errors
(`rl_core.config.files.field_errors`) are shown next to the field they name.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from inflight.runs.actions import deep_merge
from inflight.runs.safe_input import UnsafeInput, load_yaml
from rl_core.config.run_config import RunConfig
from rl_core.config.files import run_default_values, with_run_defaults

REPO_ROOT = Path(__file__).resolve().parents[3]

# Presets offered on the create page: (key, label, YAML file under the repo root).
PRESETS: tuple[tuple[str, str, str], ...] = (
    ("tiny-cpu", "Tiny CPU demo (arithmetic, minutes on a laptop)", "examples/tiny-cpu.yaml"),
    # The multi-turn env (issue 34): the same demo with a Python tool the policy may call.
    ("tiny-cpu-tools", "Tiny CPU demo with a Python tool (multi-turn: env math_python_tool)", "examples/tiny-cpu-tools.yaml"),
    ("qwen2.5-math-1.5b-math", "Qwen2.5-Math-1.5B on MATH (GPU: vLLM + DeepSpeed)", "examples/qwen2.5-math-1.5b-math.yaml"),
)
# What the create page opens with when no preset is asked for: the demo's values (a run that
# finishes on a laptop); `?preset=` gives a run's defaults alone (rl_core.config.files.RUN_DEFAULTS).
DEFAULT_PRESET = "tiny-cpu"


@dataclass
class FormField:
    """One leaf input of the form."""

    path: str
    label: str
    help: str
    kind: str  # "bool" | "choice" | "int" | "float" | "text" | "json"
    value: Any
    optional: bool = False
    choices: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class FormSection:
    """A nested config model: a fieldset with its own fields and subsections."""

    path: str
    title: str
    help: str
    fields: list[FormField] = field(default_factory=list)
    sections: list[FormSection] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def is_switch_section(self) -> bool:
        # Acceleration sections lead with an `enabled` switch.
        return bool(self.fields) and self.fields[0].path.endswith(".enabled")


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _model_class(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _kind(annotation: Any) -> tuple[str, list[Any]]:
    if typing.get_origin(annotation) is Literal:
        return "choice", list(typing.get_args(annotation))
    if annotation is bool:
        return "bool", []
    if annotation is int:
        return "int", []
    if annotation is float:
        return "float", []
    if annotation is str:
        return "text", []
    return "json", []  # lists and dicts are edited as JSON (which is also YAML)


def _display(kind: str, value: Any) -> Any:
    if kind == "bool":
        return bool(value)
    if value is None:
        return ""
    if kind == "json":
        return json.dumps(value)
    return str(value)


def build_sections(
    values: Mapping[str, Any] | None = None,
    errors: Mapping[str, list[str]] | None = None,
    raw: Mapping[str, Any] | None = None,
) -> tuple[list[FormField], list[FormSection], list[str]]:
    """Top-level fields, sections and section-less errors of RunConfig filled with `values`.

    `raw` holds the strings the user typed (shown back as typed after an error);
    `errors` are keyed by dotted path and attached to the nearest field or section.
    """
    values = values if values is not None else run_default_values()
    errors = dict(errors or {})
    raw = raw or {}
    top = FormSection(path="", title="Run", help="")
    _fill(top, RunConfig, values, raw, "")
    _attach_errors(top, errors)
    leftovers = [f"{path}: {message}" if path not in ("", "config") else message for path, messages in errors.items() for message in messages]
    top.errors.extend(leftovers)
    return top.fields, top.sections, top.errors


def _fill(section: FormSection, model: type[BaseModel], values: Mapping[str, Any], raw: Mapping[str, Any], prefix: str) -> None:
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation, optional = _unwrap_optional(info.annotation)
        value = values.get(name) if isinstance(values, Mapping) else None
        child = _model_class(annotation)
        if child is not None:
            sub = FormSection(path=path, title=name.replace("_", " "), help=_help(info))
            _fill(sub, child, value if isinstance(value, Mapping) else {}, raw, path + ".")
            section.sections.append(sub)
            continue
        kind, choices = _kind(annotation)
        shown = raw[path] if path in raw and kind != "bool" else _display(kind, value)
        section.fields.append(
            FormField(
                path=path,
                label=name.replace("_", " "),
                help=_help(info),
                kind=kind,
                value=shown,
                optional=optional,
                choices=[str(choice) for choice in choices],
            )
        )
    # Put the on/off switch first in a section (acceleration toggles read as switches).
    section.fields.sort(key=lambda f: 0 if f.path.endswith(".enabled") else 1)


def _help(info: FieldInfo) -> str:
    return info.description or ""


def _attach_errors(section: FormSection, errors: dict[str, list[str]]) -> None:
    """Move each error to the field whose path is the longest prefix of the error's path."""
    for form_field in section.fields:
        for path in list(errors):
            if path == form_field.path or path.startswith(form_field.path + "."):
                form_field.errors.extend(errors.pop(path))
    for sub in section.sections:
        _attach_errors(sub, errors)
        if sub.path in errors:
            sub.errors.extend(errors.pop(sub.path))


@dataclass(frozen=True)
class ErrorLink:
    """One line of the create page's error summary: what is wrong and the element it links to."""

    path: str
    message: str
    anchor: str  # the id of the field's input, or of the section's fieldset


def error_summary(top_fields: list[FormField], sections: list[FormSection], start_from_errors: list[str]) -> list[ErrorLink]:
    """Every error attached to the form, in page order, each linking to where it is shown:
    the summary at the top of the page, so an error three screens down is seen at once."""
    links = [ErrorLink("start from checkpoint", message, "f-start_from") for message in start_from_errors]
    links += [ErrorLink(f.path, message, f"f-{f.path}") for f in top_fields for message in f.errors]

    def walk(section: FormSection) -> None:
        links.extend(ErrorLink(section.path, message, f"s-{section.path}") for message in section.errors)
        links.extend(ErrorLink(f.path, message, f"f-{f.path}") for f in section.fields for message in f.errors)
        for sub in section.sections:
            walk(sub)

    for section in sections:
        walk(section)
    return links


def iter_fields(sections: list[FormSection]) -> typing.Iterator[FormField]:
    for section in sections:
        yield from section.fields
        yield from iter_fields(section.sections)


def config_from_post(post: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, list[str]], dict[str, str]]:
    """Nested config dict from the posted form, errors found before validation, and raw strings.

    Every leaf is posted (unchecked boxes are absent, meaning False). Numbers are
    left as strings for pydantic to coerce, so its message ("Input should be a valid
    integer") names the field; JSON fields that do not parse are reported here.
    """
    top_fields, sections, _ = build_sections()
    data: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    raw: dict[str, str] = {}
    for form_field in [*top_fields, *iter_fields(sections)]:
        parts = form_field.path.split(".")
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        if form_field.kind == "bool":
            node[parts[-1]] = form_field.path in post
            continue
        text = str(post.get(form_field.path, "")).strip()
        raw[form_field.path] = text
        if text == "" and form_field.optional:
            node[parts[-1]] = None
        elif text == "" and form_field.kind == "json":
            continue  # blank list/mapping: the schema's default
        elif text == "" and form_field.kind != "text":
            errors.setdefault(form_field.path, []).append("a value is required")
        elif form_field.kind == "choice":
            node[parts[-1]] = _choice_value(form_field.path, text)
        elif form_field.kind == "json":
            try:
                node[parts[-1]] = load_yaml(text, max_bytes=16 * 1024)
            except UnsafeInput as exc:
                reason = str(exc).splitlines()[0].removeprefix("not valid YAML: ")
                errors.setdefault(form_field.path, []).append(f"not valid JSON/YAML: {reason}")
        else:
            node[parts[-1]] = text
    return data, errors, raw


def _choice_value(path: str, text: str) -> Any:
    """The Literal member whose text is `text` (so `zero_stage` gets the int 2, not "2")."""
    model: type[BaseModel] = RunConfig
    parts = path.split(".")
    for part in parts[:-1]:
        annotation, _ = _unwrap_optional(model.model_fields[part].annotation)
        model = _model_class(annotation) or model
    annotation, _ = _unwrap_optional(model.model_fields[parts[-1]].annotation)
    for choice in typing.get_args(annotation):
        if str(choice) == text:
            return choice
    return text  # not a member: pydantic names the allowed values


def load_preset(key: str) -> dict[str, Any]:
    """The preset's config dict (ValueError for an unknown or missing preset)."""
    for preset_key, _, relative in PRESETS:
        if preset_key == key:
            path = REPO_ROOT / relative
            if not path.is_file():
                raise ValueError(f"preset {key!r}: {relative} is missing")
            data = yaml.safe_load(path.read_text()) or {}
            if not isinstance(data, dict):
                raise ValueError(f"preset {key!r}: {relative} is not a mapping")
            return data
    raise ValueError(f"unknown preset {key!r}; choose one of {', '.join(k for k, _, _ in PRESETS)}")


def available_presets() -> list[dict[str, str]]:
    return [{"key": key, "label": label, "file": relative} for key, label, relative in PRESETS if (REPO_ROOT / relative).is_file()]


def parse_yaml_config(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """A config dict from the raw YAML editor, or an error message (aliases, oversized or
    too deep texts are refused while parsing: `inflight.runs.safe_input`)."""
    try:
        data = load_yaml(text) if text.strip() else {}
    except UnsafeInput as exc:
        return None, str(exc)
    if not isinstance(data, dict):
        return None, "the top level must be a mapping of config sections"
    return data, None


def resolved_values(data: Mapping[str, Any]) -> dict[str, Any]:
    """Full config values for display, as a submission would resolve them (the run defaults where
    `data` is silent): validated where possible, else the raw data over the defaults."""
    try:
        return RunConfig.model_validate(with_run_defaults(dict(data))).model_dump(mode="json")
    except Exception:  # noqa: BLE001 - invalid input is shown as typed, with its errors
        return deep_merge(run_default_values(), dict(data))


def config_view_rows(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The run page's config view: `[{"path", "value", "default"}]` per field of a stored config,
    `default` true where the value is a run's default (rl_core.config.files.RUN_DEFAULTS over the
    schema), so what the submitter chose stands out from what every run gets."""
    from inflight.web.selectors import flatten_config

    defaults = flatten_config(run_default_values())
    missing = object()
    return [
        {"path": path, "value": value, "default": _comparable(defaults.get(path, missing)) == _comparable(value)}
        for path, value in flatten_config(config).items()
    ]


def form_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """What each input of the form shows for `values` (path → text, or bool for a switch):
    the clone page's script compares the inputs against these to show the diff as one edits."""
    top_fields, sections, _ = build_sections(values)
    return {form_field.path: form_field.value for form_field in [*top_fields, *iter_fields(sections)]}


def changed_fields(source: Mapping[str, Any], values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`[{"path", "source", "new"}]` for every config field whose value differs between the
    source run's config and `values` (dotted paths, sorted); `name` is not a difference."""
    from inflight.web.selectors import flatten_config

    before, after = flatten_config(source), flatten_config(values)
    missing = "—"
    rows = []
    for path in sorted(set(before) | set(after)):
        if path == "name":
            continue
        old, new = before.get(path, missing), after.get(path, missing)
        if _comparable(old) != _comparable(new):
            rows.append({"path": path, "source": old, "new": new})
    return rows


def _comparable(value: Any) -> Any:
    """Posted numbers are still text until they validate: '3' and 3, '1e-4' and 0.0001 are equal."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value.strip()
    return value


def unshown_paths(data: Mapping[str, Any]) -> list[str]:
    """What a YAML config holds that the form has no input for, as dotted paths: a key the
    schema does not know, a section given as something other than a mapping, a mapping where the
    form has one input. The create page says so instead of dropping it when the form is edited."""
    top_fields, sections, _ = build_sections()
    leaves = {form_field.path for form_field in [*top_fields, *iter_fields(sections)]}
    section_paths = set()

    def walk_sections(items: list[FormSection]) -> None:
        for section in items:
            section_paths.add(section.path)
            walk_sections(section.sections)

    walk_sections(sections)
    out: list[str] = []

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if path in leaves:
                continue
            if path in section_paths and isinstance(value, Mapping):
                walk(value, path + ".")
            elif path in section_paths and value is None:
                continue  # an empty section: the defaults
            else:
                out.append(path)

    walk(data, "")
    return out


def comment_lines(text: str) -> int:
    """Lines of a YAML text that hold a comment (a line whose first non-blank is '#'): the form
    has nowhere to keep them, so the page says they go when the form rewrites the YAML."""
    return sum(1 for line in text.splitlines() if line.lstrip().startswith("#"))


"""Configs are dataclasses with a help string on every field, checked when built, loadable from YAML.

Declared: every field has `metadata=help_text("...")`; `config_help(cls)` lists every field with its help
for `--help` texts and the docs.

Checked: a config made of parts (`Section`: the trainers' sections, the environment's settings, the SFT and
reward-model schedule) runs, when built, the `check` each of its classes defines for its own fields
(`check_sections`); `require`, `require_int` and `require_choice` raise a `ConfigError` naming the field.

Loaded: `load_config(cls, path, overrides)` reads a YAML file into the dataclass (nested dataclasses too),
refusing unknown keys and wrong types with a message that names the file and the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from searchrl.common.io import atomic_write_text

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is wrong; the message says where and how to fix it."""


def help_text(text: str) -> dict[str, str]:
    """A dataclass field's metadata holding its help: `field(default=..., metadata=help_text("..."))`.

    The help is what `config_help` lists for `--help` texts and the docs; every config field has one."""
    return {"help": text}


def field_help(cls: type, name: str) -> str:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("help", "")
    raise KeyError(name)


def config_help(cls: type) -> list[tuple[str, str, Any]]:
    """(name, help, default) for every field of a config dataclass."""
    out = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        out.append((f.name, f.metadata.get("help", ""), default))
    return out


# -- checking: a config refuses wrong values when it is built, naming the field ---------------------------


def require(condition: bool, name: str, value: object, rule: str) -> None:
    """Raise `ConfigError("name=value rule.")` unless `condition` holds."""
    if not condition:
        raise ConfigError(f"{name}={value!r} {rule}.")


def require_choice(value: object, name: str, choices: tuple[str, ...]) -> None:
    """Raise `ConfigError("name=value is not one of [...].")` unless `value` is one of `choices`."""
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {list(choices)}.")


def require_int(condition: bool, name: str, value: object, rule: str = ">= 1") -> None:
    """`require` that `value` is an integer (not a bool) and `condition` holds: "must be an integer {rule}"."""
    require(
        isinstance(value, int) and not isinstance(value, bool) and condition,
        name,
        value,
        f"must be an integer {rule}",
    )


def check_sections(cfg: Any) -> None:
    """Run the `check` of every class `cfg` is, base classes first, each on the fields it declares.

    Each section (and each trainer config) defines `check` for its own fields only; looking the method up
    in each class's own namespace calls every one of them exactly once, however the classes are combined.
    """
    for klass in reversed(type(cfg).__mro__):
        check = klass.__dict__.get("check")
        if check is not None:
            check(cfg)


class Section:
    """Base of a config made of parts (the trainers' sections, the environment's and the schedule's settings):
    it checks itself when it is built (`check_sections`)."""

    def __post_init__(self) -> None:
        check_sections(self)


# -- loading from YAML ------------------------------------------------------------------------------


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):  # a parent's default for a section the file did not name
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return _from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        return [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        vt = args[1] if len(args) == 2 else Any
        return {k: _coerce(v, vt, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def _from_dict(cls: type[T], data: dict, where: str) -> T:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        # A typo is the usual cause: name the closest real field first, then list them all.
        guesses = {u: difflib.get_close_matches(u, names, n=1) for u in unknown}
        hint = "; ".join(f"did you mean {g[0]!r} for {u!r}?" for u, g in guesses.items() if g)
        raise ConfigError(
            f"{where}: unknown field(s) {unknown} for {cls.__name__}"
            + (f"; {hint}" if hint else "")
            + f"; known fields: {sorted(names)}"
        )
    _refuse_misplaced_fields(hints, data, where)
    data = {k: _with_section_defaults(cls, k, v) for k, v in data.items()}
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where or cls.__name__}: {e}") from e


def _refuse_misplaced_fields(hints: dict[str, Any], data: dict, where: str) -> None:
    """A key under one section that is a field of a sibling section: say which section it belongs in.

    Why: a config made of sections declares each setting once (a demo's `max_turns` lives in `environment:`,
    not in `ppo:`). Naming the right section turns a bare "unknown field" into the fix.
    """
    sections = {
        name: tp for name, tp in hints.items() if isinstance(tp, type) and dataclasses.is_dataclass(tp)
    }
    for name, value in data.items():
        if name not in sections or not isinstance(value, dict):
            continue
        own = {f.name for f in dataclasses.fields(sections[name]) if f.init}
        for key in sorted(set(value) - own):
            homes = [
                other
                for other, tp in sections.items()
                if other != name and key in {f.name for f in dataclasses.fields(tp) if f.init}
            ]
            if homes:
                at = f"{where}.{name}" if where else name
                raise ConfigError(
                    f"{at}: {key!r} is not a {name} setting; it belongs in {homes[0]}: (set once there for every "
                    f"stage), so move it to {homes[0]}.{key}"
                )


def _with_section_defaults(cls: type, name: str, value: Any) -> Any:
    """A nested section given as a mapping, completed from the parent's default for that section.

    Why: `DemoConfig.sft` defaults to the demo's SFT settings (a `default_factory`), not to
    `SFTWarmStartConfig()`'s. A file that says only `sft: {trl_loss: false}` means "the demo's SFT
    settings with TRL's loss off"; building the section from the mapping alone would silently reset every
    other SFT field to the class defaults. Deeper sections are completed the same way.
    """
    if not isinstance(value, dict):
        return value
    f = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    if f is None or f.default_factory is dataclasses.MISSING:
        return value
    default = f.default_factory()
    if not dataclasses.is_dataclass(default):
        return value
    return _merge_into(default, value)


def _merge_into(default: Any, value: dict) -> dict:
    """`default`'s init fields as a mapping, overridden by `value` (recursively for nested sections)."""
    merged = {x.name: getattr(default, x.name) for x in dataclasses.fields(default) if x.init}
    for key, sub in value.items():
        current = merged.get(key)
        merged[key] = (
            _merge_into(current, sub) if isinstance(sub, dict) and dataclasses.is_dataclass(current) else sub
        )
    return merged


def config_from_dict(cls: type[T], data: dict, source: str = "") -> T:
    return _from_dict(cls, data, source)


def load_config(cls: type[T], path: str | Path | None = None, overrides: dict | None = None) -> T:
    """Build `cls` from a YAML file (optional) and a dict of overrides (dotted keys allowed)."""
    data: dict = {}
    src = ""
    if path is not None:
        path = Path(path)
        src = str(path)
        if not path.exists():
            raise ConfigError(f"{path}: config file not found")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from e
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of field: value")
        data = loaded
    for key, value in (overrides or {}).items():
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return _from_dict(cls, data, src)


def config_to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path) -> None:
    atomic_write_text(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))

"""Config files and validation: YAML → typed dataclasses, with errors that name the field and the fix."""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from ..runtime.errors import ConfigError
from ..runtime.files import atomic_write_text
from ..runtime.settings import respell_booleans, resumable

C = TypeVar("C")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _kind(tp: Any) -> str:
    """A type in the words of an error message: ``a number``, ``'auto'``."""
    if get_origin(tp) is Literal:
        return " or ".join(repr(v) for v in get_args(tp))
    names = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}
    if get_origin(tp) is dict:
        return "a mapping"
    return names.get(tp, "a list" if get_origin(tp) in (list, tuple) else getattr(tp, "__name__", str(tp)))


def _check_value(name: str, tp: Any, value: Any) -> Any:
    origin = get_origin(tp)
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"`{name}` must be one of {list(get_args(tp))}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"`{name}` must not be null")
        kinds = [a for a in args if a is not type(None)]
        for a in kinds:
            try:
                return _check_value(name, a, value)
            except ConfigError as e:
                error = e
        if len(kinds) == 1:
            raise error
        raise ConfigError(f"`{name}` must be {' or '.join(_kind(a) for a in kinds)}, got {value!r}")
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"`{name}` must be a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"`{name}` must be an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"`{name}` must be true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"`{name}` must be a string, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"`{name}` must be a list, got {value!r}")
        inner = get_args(tp)
        if origin is tuple and inner and inner[-1] is not Ellipsis:
            if len(value) != len(inner):
                raise ConfigError(f"`{name}` must have {len(inner)} items, got {value!r}")
            return tuple(_check_value(f"{name}[{i}]", t, v) for i, (t, v) in enumerate(zip(inner, value)))
        item = inner[0] if inner else Any
        return origin(_check_value(f"{name}[{i}]", item, v) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"`{name}` must be a mapping (e.g. {{key: value}}), got {value!r}")
        key_type, value_type = get_args(tp) or (str, Any)
        return {_check_value(name, key_type, k): _check_value(f"{name}.{k}", value_type, v) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, prefix=name)
    return value


def from_dict(cls: type[C], data: dict[str, Any] | None, *, prefix: str = "", base: C | None = None) -> C:
    """Build ``cls`` from nested dicts, starting from ``base`` (or the defaults).

    Unknown keys raise :class:`ConfigError` with the closest known name.
    """
    obj = base if base is not None else cls()
    if data is None:
        return obj
    if not isinstance(data, dict):
        raise ConfigError(f"`{prefix or 'config'}` must be a mapping, got {data!r}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in respell_renamed(cls, data, where=prefix).items():
        norm = str(key).replace("-", "_")
        full = f"{prefix}.{norm}" if prefix else norm
        if norm not in names:
            close = difflib.get_close_matches(norm, names, n=1)
            hint = f"; did you mean `{close[0]}`?" if close else f"; known fields: {', '.join(names)}"
            raise ConfigError(f"unknown config field `{full}`{hint}")
        tp = hints[norm]
        if dataclasses.is_dataclass(tp):
            setattr(obj, norm, from_dict(tp, value, prefix=full, base=getattr(obj, norm)))
        else:
            setattr(obj, norm, _check_value(full, tp, value))
    return obj


def _norm(key: Any) -> str:
    return str(key).replace("-", "_")


def respell_renamed(cls: type, data: dict[str, Any], *, where: str = "", notice: bool = True) -> dict[str, Any]:
    """``data`` (nested sections of ``cls``) with each setting ``cls.RENAMED`` lists under an old dotted
    name moved to its new one, and one line saying so (``notice``); the caller's dicts are left as they
    are. Old and new name both given is a :class:`ConfigError`."""
    renamed = getattr(cls, "RENAMED", None)
    if not renamed:
        return data
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    moved = []
    for old, new in renamed.items():
        (old_section, old_field), (new_section, new_field) = old.split("."), new.split(".")
        section = data.get(old_section)
        key = next((k for k in section if _norm(k) == old_field), None) if isinstance(section, dict) else None
        if key is None:
            continue
        target = data.get(new_section)
        if target is None:
            target = data[new_section] = {}
        if not isinstance(target, dict):
            continue  # `critic: 3`: from_dict names the section that is not a mapping
        at = f"{where}." if where else ""
        if any(_norm(k) == new_field for k in target):
            raise ConfigError(f"`{at}{old}` and `{at}{new}` are both given: `{old}` is the older name of `{new}`; "
                              f"keep `{new}` alone")
        target[new_field] = section.pop(key)
        moved.append(f"`{at}{old}` → `{at}{new}`")
    if moved and notice:
        warnings.warn(f"renamed settings read under their new names: {', '.join(moved)}; write them so "
                      "(docs/training.md, \"Renamed settings\")", stacklevel=2)
    return data


def renamed_flags(cls: type, argv: list[str]) -> list[str]:
    """``argv`` with each flag of a setting ``cls.RENAMED`` lists under its old name
    (``--optim.critic-lr 1e-4``, ``--model.critic=shared``) given its new name, and one line saying so."""
    renamed = {old.replace("_", "-"): new.replace("_", "-") for old, new in getattr(cls, "RENAMED", {}).items()}
    out, moved = [], []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        new = renamed.get(flag[2:].replace("_", "-")) if flag.startswith("--") else None
        if new is None:
            out.append(arg)
            continue
        out.append(f"--{new}{eq}{value}")
        moved.append(f"`{flag}` → `--{new}`")
    if moved:
        warnings.warn(f"renamed flags read under their new names: {', '.join(moved)}; write them so "
                      "(docs/training.md, \"Renamed settings\")", stacklevel=2)
    return out


def _bool_fields(cls: type, prefix: str = "") -> dict[str, bool]:
    """The flag names (``log.progress``, dashes for underscores) of the fields of ``cls`` and its nested
    configs that hold a boolean: True for a plain ``bool`` (a ``--x``/``--no-x`` switch on the command
    line), False for a union with one (``bool | Literal["auto"]``: the flag takes a value)."""
    out: dict[str, bool] = {}
    for name, tp in _hints(cls).items():
        flag = prefix + name.replace("_", "-")
        if dataclasses.is_dataclass(tp):
            out.update(_bool_fields(tp, flag + "."))
        elif tp is bool:
            out[flag] = True
        elif get_origin(tp) in (typing.Union, types.UnionType) and bool in get_args(tp):
            out[flag] = False
    return out


def _switch_off(flag: str) -> str:
    """``--log.progress`` → ``--log.no-progress``, ``--resume`` → ``--no-resume``: the command line's
    spelling of a switch set to false."""
    head, dot, last = flag[2:].rpartition(".")
    return f"--{head}{dot}no-{last}"


def yaml_bool_flags(cls: type, argv: list[str]) -> list[str]:
    """``argv`` with each boolean a flag of ``cls`` is given in a YAML spelling (``--log.progress false``,
    ``--algo.bootstrap-truncated=no``; any case, or 1/0) written the way the command-line parser takes
    it: a switch as ``--log.no-progress`` / ``--log.progress``, a value as ``False`` / ``True``. Other
    words and flags pass unchanged (a switch keeps its bare form, an ``auto`` stays a value)."""
    fields = _bool_fields(cls)

    def spelling(flag: str):
        flag = flag.replace("_", "-")  # the parser takes either; the switch's `no-` form is built on dashes
        switch = fields.get(flag[2:]) if flag.startswith("--") else None
        if switch is None:
            return None
        return (lambda on: [flag if on else _switch_off(flag)]) if switch else (lambda on: [flag, str(on)])

    return respell_booleans(argv, spelling)


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-4`` (an exponent, no dot) as a string; read it as a number, as YAML 1.2 and
    Python do — learning rates are written that way."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
                              list("-+0123456789."))


def load_yaml(path: str | Path, cls: type[C]) -> C:
    """``cls`` from a YAML file of its sections (errors name the file or the field)."""
    return from_dict(cls, read_yaml(path))


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file of sections as a nested dict; a missing file, a directory, non-UTF-8 text, bad YAML
    or a top level that is not a mapping is a :class:`ConfigError` naming the file."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {p} is a directory; pass the YAML file itself (e.g. {p / 'config.yaml'})")
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_Loader) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not a text (UTF-8) file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of sections, got a {type(data).__name__}")
    return data


def to_dict(cfg: Any) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        return x

    return plain(d)


def dump_yaml(cfg: Any, path: str | Path) -> None:
    """``cfg`` (a config dataclass, or its :func:`to_dict`) as YAML at ``path``, written atomically."""
    atomic_write_text(path, yaml.safe_dump(cfg if isinstance(cfg, dict) else to_dict(cfg), sort_keys=False))


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"policy": "x"}}`` → ``{"model.policy": "x"}``; lists, empty mappings and other values
    as they are."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_saved_config(path: str | Path, cls: type | None = None) -> dict[str, Any]:
    """A run's config.yaml as a plain nested dict (empty when unreadable); with ``cls``, its settings
    under the names ``cls`` gives them now (a run written before a rename; quietly: the run's own
    file is not the user's to rewrite)."""
    try:
        data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_Loader) or {}  # as --config reads
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    if not isinstance(data, dict):
        return {}
    if cls is None:
        return data
    try:
        return respell_renamed(cls, data, notice=False)
    except ConfigError:
        return data


def resume_differences(cfg: Any, saved: dict[str, Any]) -> list[str]:
    """``field: X here, Y in the run`` for every setting of ``cfg`` that differs from the run's saved
    config (as nested dicts), except those its fields declare a resume may change
    (``setting(resume=True)``: its length, logging, the devices and the speed settings that do not
    change results; everything else defines the experiment)."""
    changeable = resumable(type(cfg))

    def may_change(key: str) -> bool:
        return any(key.startswith(m) if m.endswith(".") else key == m for m in changeable)

    now, then = flatten(to_dict(cfg)), flatten(saved)
    return [f"{k}: {now[k]!r} here, {then[k]!r} in the run" for k in now
            if k in then and now[k] != then[k] and not may_change(k)]


def check_types(cfg: Any, prefix: str = "") -> None:
    """Re-check every field against its annotation (catches bad values set from Python or the CLI)."""
    hints = _hints(type(cfg))
    for f in dataclasses.fields(cfg):
        name = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            check_types(value, name)
        else:
            _check_value(name, hints[f.name], value)

"""The user's own code as the run meets it: importing what a spec names (``'path/to/file.py:name'``
or ``'module:name'``), showing where it failed by its own frames, in one line, and taking the numbers
it returns only when they are numbers. Free of torch, so an environment's worker process
(:mod:`ppo_lm.rollout.envs.env_worker`) starts in a fraction of a second."""

from __future__ import annotations

import importlib
import math
import numbers
import os
import sys
import traceback
from pathlib import Path

PACKAGE = str(Path(__file__).resolve().parents[1])
"""ppo-lm's own source folder: frames inside it are not the user's."""


class SpecError(ValueError):
    """The spec itself is wrong (as opposed to the user's module failing on import)."""


def load_object(spec: str, field: str, kind: str = "function") -> object:
    """The ``kind`` of object (a word for the messages) a ``'path/to/file.py:name'`` or ``'module:name'``
    spec names; a ValueError naming ``field`` otherwise. A module is imported with the current directory on the import path, as
    ``python -m`` and ``python script.py`` users expect (a console script does not put it there); a
    file is loaded as a module named after it, with its own folder importable, as for a script."""
    if ":" not in spec:
        raise SpecError(f"`{field}`={spec!r}: expected 'module:{kind}' or 'path/to/file.py:{kind}'")
    mod_name, name = spec.rsplit(":", 1)
    try:
        module = _import_file(mod_name, field, spec) if mod_name.endswith(".py") else _import_module(mod_name)
    except SpecError:
        raise
    except ImportError as e:
        raise ValueError(f"`{field}`={spec!r}: cannot import module {mod_name!r} ({e}); the current directory "
                         f"is searched, or give a file: 'path/to/file.py:{kind}'") from None
    except Exception as e:  # the user's module fails while it is imported
        raise ValueError(f"`{field}`={spec!r}: importing {mod_name!r} raised {type(e).__name__}: {one_line(e)}"
                         f"{user_frames(e)}") from None
    obj = module
    for part in name.split("."):  # a nested class: 'file.py:Outer.Inner'
        obj = getattr(obj, part, None)
    if obj is None:
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise ValueError(f"`{field}`={spec!r}: {mod_name!r} has no {kind} {name!r}"
                         + (f" (it defines: {', '.join(found[:8])})" if found else ""))
    return obj


def _import_module(name: str):
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def module_name_of_file(file: Path) -> str:
    """The module name a file spec is loaded under (one per file stem)."""
    return f"ppo_lm_reward_{file.stem}"


def _import_file(path: str, field: str, spec: str):
    import importlib.util

    file = Path(path).expanduser()
    if not file.is_file():
        raise SpecError(f"`{field}`={spec!r}: no such file {str(file)!r}")
    name = module_name_of_file(file)
    module_spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(module_spec)
    folder = str(file.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module  # before executing it: dataclasses and pickling look the module up
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def user_frames(e: BaseException, limit: int = 3) -> str:
    """The last ``limit`` frames of ``e``'s traceback that are not ppo-lm's own, as indented
    ``file:line in function`` lines with their source: where the user's code failed."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not str(Path(f.filename).resolve()).startswith(PACKAGE)]
    if isinstance(e, SyntaxError) and e.filename:
        return f"\n  {e.filename}:{e.lineno}: {(e.text or '').strip()}"
    return "".join(f"\n  {f.filename}:{f.lineno} in {f.name}" + (f": {f.line.strip()}" if f.line else "")
                   for f in frames[-limit:])


def one_line(e: BaseException | str, width: int = 300) -> str:
    """An exception's message on one line: its first line, cut at ``width`` characters, with ``…`` where
    something was left out (a multi-line message would bury the line that says what failed)."""
    text = str(e).strip()
    first = text.split("\n", 1)[0].rstrip()
    short = first[:width]
    return short + (" …" if short != text else "")


def reward_number(value: object, finite: bool = True) -> float:
    """``value`` as a reward: a real number (bool, int, float, a NumPy scalar, a one-element tensor)
    that is finite (``finite``: else the caller checks). A str is refused even when it spells a number — the docs promise a number, and
    ``"0.5"`` is more often a verifier's bug (a label returned by mistake) than a score. TypeError or
    ValueError with the reason otherwise."""
    if isinstance(value, (str, bytes, bytearray)):
        raise TypeError(f"of type {type(value).__name__} ({str(value)[:40]!r}); give a number")
    if not isinstance(value, numbers.Real):
        if not hasattr(value, "__float__") or getattr(value, "ndim", 0) not in (0, None):
            raise TypeError(f"of type {type(value).__name__}; give a number")
    out = float(value)
    if finite and not math.isfinite(out):
        raise ValueError(f"{out}: the reward must be finite")
    return out

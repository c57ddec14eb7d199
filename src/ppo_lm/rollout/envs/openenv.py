"""OpenEnv environments behind ppo-lm's protocol (docs/environments.md, "OpenEnv environments"): a
subclass of OpenEnv's ``Environment`` (PyPI ``openenv``: ``reset(seed=None, episode_id=None, **kw) ->
Observation``, ``step(action) -> Observation``) named by ``rollout.env`` runs in the environment workers
like any environment, one instance per episode, through :func:`adapt`.

An OpenEnv server is the same through its own client (``rollout.env: openenv+ws://HOST:PORT``, or
``openenv+http://``): :func:`remote`, each episode one session of the server, its Action and Observation
found from the server's ``/schema``.

The mapping, both ways:

- the policy's text → the environment's ``Action``: the Action class's one text field (found: its only
  ``str`` field besides ``metadata``; or named by ``rollout.env_action``), or ``rollout.env_action``'s
  function ``parse_action(text) -> Action``. A text the Action refuses (pydantic's check, or the
  function raising ValueError) is not the run's error but the model's: the episode goes on with the
  refusal as the next user turn and a reward of 0, as a bad tool call does;
- the ``Observation`` → the next user turn: its one text field besides ``done``, ``reward`` and
  ``metadata`` (found, or named by ``rollout.env_observation``), or that setting's function
  ``render(observation) -> str``;
- ``done`` and ``reward`` from the observation; ``reward=None`` (an observation that carries none, as a
  reset's does) is 0.

``reset`` receives the group's seed (one task a group, as for every environment) and, by name, the
columns of the prompt row its signature asks for. The Action and Observation classes are the
environment's generic parameters (``Environment[MyAction, MyObservation, State]``), else the
annotations of its ``step``; where neither names them the fields are found from the first observation.
"""

from __future__ import annotations

import inspect
import time
import typing
from collections.abc import Callable

from ...runtime.user_code import load_object, one_line

BASE = ("openenv.core.env_server.interfaces", "Environment")
SKIP_OBSERVATION = ("done", "reward", "metadata")


def is_openenv(cls: type) -> bool:
    """Whether ``cls`` subclasses OpenEnv's ``Environment`` (told without importing openenv)."""
    return any((b.__module__, b.__qualname__) == BASE for b in getattr(cls, "__mro__", ()))


def _types(cls: type) -> tuple[type | None, type | None]:
    """(Action class, Observation class) of an OpenEnv environment, or None where it does not say."""
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin, args = typing.get_origin(base), typing.get_args(base)
            if origin is not None and is_openenv(origin) and len(args) >= 2 and all(isinstance(a, type) for a in args[:2]):
                return args[0], args[1]
    try:
        hints = typing.get_type_hints(cls.step)
    except Exception:  # noqa: BLE001 (an annotation that does not resolve: found from the first observation)
        hints = {}
    action = next((h for n, h in hints.items() if n not in ("return", "timeout_s") and isinstance(h, type)), None)
    observation = hints.get("return")
    return action, observation if isinstance(observation, type) else None


def _text_fields(model: type, skip: tuple[str, ...]) -> list[str]:
    fields = getattr(model, "model_fields", {})
    return [n for n, f in fields.items() if n not in skip and f.annotation in (str, str | None)]


def _pick(named: str | None, fields: list[str], text_fields: list[str], setting: str, name: str, role: str) -> str:
    """The field ``named`` names (it must be one of ``fields``), or the only one of ``text_fields``; a
    ValueError naming ``setting`` otherwise. ``name``, ``role``: the class and what it is, for the message."""
    if named is not None:
        if named not in fields:
            raise ValueError(f"`{setting}`={named!r}: {name} has no field {named!r} (its fields: {', '.join(fields)})")
        return named
    if len(text_fields) == 1:
        return text_fields[0]
    found = f"its text fields are {', '.join(text_fields)}" if text_fields else "it has no text field"
    raise ValueError(f"`{setting}`: {name} is the {role}, and {found}; name the field "
                     f"(`--{setting.replace('_', '-')} FIELD`) or give a function 'file.py:name'")


def _field(model: type, named: str | None, skip: tuple[str, ...], setting: str, what: str) -> str:
    """The text field of the pydantic ``model`` that ``named`` names, or its only one."""
    fields = [n for n in getattr(model, "model_fields", {}) if n not in skip]
    return _pick(named, fields, _text_fields(model, skip), setting, model.__name__, f"environment's {what}")


def action_maker(action_cls: type | None, setting: str | None) -> Callable[[str], object]:
    """The policy's text → an Action (module docstring)."""
    if setting is not None and ":" in setting:
        return load_object(setting, "rollout.env_action")
    if action_cls is None:
        raise ValueError("`rollout.env_action`: the environment's step does not say which Action it takes (neither "
                         "Environment[Action, Observation, State] nor an annotation); give a function "
                         "'file.py:parse_action' that makes one from the text")
    name = _field(action_cls, setting, ("metadata",), "rollout.env_action", "Action")
    return lambda text: action_cls(**{name: text})


def observation_renderer(obs_cls: type | None, setting: str | None) -> Callable[[object], str] | None:
    """An Observation → the next user turn (module docstring); None: found from the first observation."""
    if setting is not None and ":" in setting:
        return load_object(setting, "rollout.env_observation")
    if obs_cls is None:
        return None
    name = _field(obs_cls, setting, SKIP_OBSERVATION, "rollout.env_observation", "Observation")
    return lambda obs: getattr(obs, name)


def _refusal(e: ValueError) -> str:
    """Why the Action refused the text, in one line: pydantic's field errors (``digit: Input should be a
    valid integer``), or the function's message."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            return "; ".join(f"{'.'.join(map(str, x.get('loc', ()))) or 'action'}: {x.get('msg', '')}" for x in errors())
        except Exception:  # noqa: BLE001 (another library's error type with an errors attribute)
            pass
    return one_line(e)


class _Refused(ValueError):
    """The server refused an action (its VALIDATION_ERROR): the model's mistake, told to it."""


class _Episode:
    """What an in-process environment and a server's session share: the policy's text → an Action (a
    text it refuses told to the model, reward 0), the observation → the next turn (none after done),
    ``reward=None`` → 0. ``maps``: ``action`` and ``render`` (None: found from the first observation by
    the ``observation`` setting); ``_act`` steps the environment."""

    maps: dict

    def _text(self, obs) -> str:
        if self.maps["render"] is None:  # no class named: the observation's own
            self.maps["render"] = observation_renderer(type(obs), self.maps["observation"])
        text = self.maps["render"](obs)
        if not isinstance(text, str):
            raise TypeError(f"the observation gave {type(text).__name__} for the next turn, not text; set "
                            "`rollout.env_observation`")
        return text

    def _act(self, action) -> tuple[object, float | None, bool]:
        raise NotImplementedError

    def step(self, text: str) -> tuple[str | None, float, bool]:
        try:
            action = self.maps["action"](text)
        except ValueError as e:  # pydantic's ValidationError is one
            return f"That action could not be read: {_refusal(e)}\n", 0.0, False
        try:
            obs, reward, done = self._act(action)
        except _Refused as e:
            return f"That action could not be read: {one_line(e)}\n", 0.0, False
        done = bool(done)
        return (None if done else self._text(obs)), (0.0 if reward is None else reward), done


def adapt(cls: type, action: str | None = None, observation: str | None = None) -> type:
    """A class of ppo-lm's protocol whose instances each hold one instance of the OpenEnv environment
    ``cls``; ``action``/``observation``: ``rollout.env_action``/``rollout.env_observation``. A ValueError
    naming the setting where the mapping cannot be found."""
    action_cls, obs_cls = _types(cls)
    make_action = action_maker(action_cls, action)
    render = observation_renderer(obs_cls, observation)
    params = inspect.signature(cls.reset).parameters
    columns = [n for n, p in params.items() if n not in ("self", "seed", "episode_id")
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]

    class OpenEnvEpisode(_Episode):
        environment = cls
        maps = {"action": make_action, "render": render, "observation": observation}

        def __init__(self):
            self.env = cls()

        def reset(self, row: dict, seed: int) -> str:
            return self._text(self.env.reset(seed=seed, **{k: row[k] for k in columns if k in row}))

        def _act(self, action) -> tuple[object, float | None, bool]:
            obs = self.env.step(action)
            return obs, obs.reward, obs.done

        def close(self) -> None:
            self.env.close()

    OpenEnvEpisode.__name__ = OpenEnvEpisode.__qualname__ = f"OpenEnv({cls.__name__})"
    return OpenEnvEpisode


SCHEME = "openenv+"
"""``rollout.env`` naming a running OpenEnv server: ``openenv+ws://127.0.0.1:8000``."""
RETRIES = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Seconds between a refused session's tries (a server at its session limit, or not up yet)."""


def is_remote(spec: str) -> bool:
    return spec.startswith(SCHEME)


def _http(url: str) -> str:
    base = url[len(SCHEME):]
    return "http" + base[2:] if base.startswith("ws") else base


def _schema_text_fields(schema: dict, skip: tuple[str, ...]) -> list[str]:
    props = schema.get("properties", {}) or {}
    return [n for n, p in props.items() if n not in skip and (p.get("type") == "string" or any(
        a.get("type") == "string" for a in p.get("anyOf", ()) if isinstance(a, dict)))]


def _schema_field(schema: dict, named: str | None, skip: tuple[str, ...], setting: str, what: str) -> str:
    """The text field of a JSON schema (the server's ``/schema``) that ``named`` names, or its only one."""
    fields = [n for n in (schema.get("properties") or {}) if n not in skip]
    return _pick(named, fields, _schema_text_fields(schema, skip), setting, schema.get("title", "?"),
                 f"server's {what}")


def server_schema(url: str) -> dict:
    """The server's ``/schema`` (its Action's and Observation's JSON schemas); a ValueError naming
    ``rollout.env`` where the server cannot be reached."""
    import requests

    try:
        reply = requests.get(_http(url).rstrip("/") + "/schema", timeout=10)
        reply.raise_for_status()
        return reply.json()
    except (requests.RequestException, ValueError) as e:
        raise ValueError(f"`rollout.env`={url!r}: the OpenEnv server does not answer ({type(e).__name__}: "
                         f"{one_line(e)}); start it, or check the address") from None


def remote(url: str, action: str | None = None, observation: str | None = None) -> type:
    """A class of ppo-lm's protocol whose instances each hold one session of the OpenEnv server at
    ``url`` (through OpenEnv's own ``GenericEnvClient``); the mapping as for :func:`adapt`, from the
    server's schemas. A session the server refuses (at its limit) is tried again after each of
    :data:`RETRIES`, then one line names the limit and ``rollout.env_sessions``."""
    import importlib.util

    if importlib.util.find_spec("openenv") is None:
        raise ValueError(f"`rollout.env`={url!r} names an OpenEnv server, whose client is the openenv package: "
                         "pip install 'ppo-lm[openenv]'")
    schema = server_schema(url)
    if action is not None and ":" in action:
        make_action = load_object(action, "rollout.env_action")
    else:
        name = _schema_field(schema.get("action", {}), action, ("metadata",), "rollout.env_action", "Action")
        make_action = lambda text: {name: text}  # noqa: E731
    if observation is not None and ":" in observation:
        render = load_object(observation, "rollout.env_observation")
    else:
        obs_name = _schema_field(schema.get("observation", {}), observation, SKIP_OBSERVATION,
                                 "rollout.env_observation", "Observation")
        render = lambda obs: obs.get(obs_name)  # noqa: E731

    class OpenEnvSession(_Episode):
        server = url
        maps = {"action": make_action, "render": render, "observation": observation}

        def __init__(self):
            from openenv.core.generic_client import GenericEnvClient

            self.client = GenericEnvClient(base_url=_http(url)).sync()

        def _call(self, what: str, fn):
            from websockets.exceptions import ConnectionClosed

            for pause in (*RETRIES, None):
                try:
                    return fn()
                except RuntimeError as e:
                    if "CAPACITY_REACHED" not in str(e):
                        raise RuntimeError(f"the OpenEnv server at {url} answered the {what} with an error: "
                                           f"{one_line(e)}") from None
                    if pause is None:
                        raise RuntimeError(f"set `rollout.env_sessions` to the limit of the OpenEnv server at {url} "
                                           f"(its max_concurrent_envs): it refused a session {len(RETRIES) + 1} times "
                                           f"over {sum(RETRIES):g} s ({one_line(e, 120)})") from None
                except (ConnectionError, OSError, ConnectionClosed) as e:
                    raise RuntimeError(f"the OpenEnv server at {url} went away during the {what} ({type(e).__name__}: "
                                       f"{one_line(e)}); the run's checkpoints are intact (resume with --resume once "
                                       "it is back)") from None
                time.sleep(pause)

        def reset(self, row: dict, seed: int) -> str:
            return self._text(self._call("reset", lambda: self.client.reset(seed=seed)).observation)

        def _act(self, action) -> tuple[object, float | None, bool]:
            try:
                result = self._call("step", lambda: self.client.step(action))
            except RuntimeError as e:
                if "VALIDATION_ERROR" not in str(e):
                    raise
                raise _Refused(str(e)) from None
            return result.observation, result.reward, result.done

        def close(self) -> None:
            self.client.close()

    OpenEnvSession.__name__ = OpenEnvSession.__qualname__ = "OpenEnvSession"
    return OpenEnvSession

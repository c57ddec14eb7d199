"""A user's environment (docs/environments.md): loading its class, the protocol's checks of what it
returns, and rendering its messages to observation tokens. The environment's own code runs in worker
processes (:mod:`ppo_lm.rollout.envs.env_pool`), where a time limit can stop it; nothing here imports torch.

The protocol, one instance per episode::

    class MyEnv:
        def reset(self, row: dict, seed: int) -> str | list[dict]: ...     # the first prompt
        def step(self, text: str) -> tuple[str | list[dict] | None, float, bool]: ...
            # (what the environment answers, or None; this turn's reward; done)

``seed`` is the group's: the G episodes of one row in an iteration (``rollout.samples_per_prompt``)
play one task; a ``reset`` that takes a ``sample`` argument gets the episode's index in its group.
Text prompts and answers are appended as they are; messages are rendered by the chat template, and
the trained sequence takes only the tokens the rendering adds.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from ...data.messages import is_conversation
from ...runtime.errors import UserError
from ...runtime.user_code import load_object, one_line, reward_number, user_frames
from . import openenv

SENTINEL = "\u2063ppo-lm-turn\u2063"
"""Assistant content used to find what a chat template writes after an assistant message."""


class EnvError(UserError, RuntimeError):
    """The environment raised, returned the wrong types or ran past its time limit."""


@dataclass(frozen=True)
class EnvSpec:
    """What a worker loads: ``rollout.env``, and for an OpenEnv environment how its actions and
    observations map to text (``rollout.env_action``, ``rollout.env_observation``; rollout/envs/openenv.py)."""

    env: str
    action: str | None = None
    observation: str | None = None


def load_env(spec: EnvSpec | str, field_name: str = "rollout.env") -> type:
    """The environment class of ``'path/to/env.py:Class'`` or ``'module:Class'`` (ValueError naming the
    field otherwise) — or a built-in one (``builtin:equations_retry``); it must have ``reset`` and ``step``.
    An OpenEnv environment comes wrapped in ppo-lm's protocol (:func:`~ppo_lm.rollout.envs.openenv.adapt`)."""
    spec = EnvSpec(spec) if isinstance(spec, str) else spec
    if openenv.is_remote(spec.env):
        return openenv.remote(spec.env, spec.action, spec.observation)
    cls = _load_class(spec.env, field_name)
    if openenv.is_openenv(cls):
        return openenv.adapt(cls, spec.action, spec.observation)
    for setting, value in (("rollout.env_action", spec.action), ("rollout.env_observation", spec.observation)):
        if value is not None:
            raise ValueError(f"`{setting}`={value!r} maps an OpenEnv environment's text; {cls.__name__} follows "
                             "ppo-lm's own protocol (its reset and step take and give text): leave it out")
    return cls


def _load_class(spec: str, field_name: str) -> type:
    if spec.startswith("builtin:"):
        from ...tasks.retry import BUILTIN_ENVS

        if spec not in BUILTIN_ENVS:
            raise ValueError(f"`{field_name}`={spec!r}: the built-in environments are {', '.join(sorted(BUILTIN_ENVS))}")
        return BUILTIN_ENVS[spec]
    try:
        cls = load_object(spec, field_name, kind="class")
    except ValueError as e:
        if "No module named 'openenv'" not in str(e):
            raise
        raise ValueError(f"{e}; an OpenEnv environment needs the openenv package: pip install 'ppo-lm[openenv]'") from None
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing or not isinstance(cls, type):
        raise ValueError(f"`{field_name}`={spec!r}: an environment is a class with reset(row, seed) and step(text) "
                         f"(docs/environments.md); {getattr(cls, '__name__', cls)!r} "
                         + (f"has no {' or '.join(missing)}" if missing else "is not a class"))
    return cls


def takes_sample(cls: type) -> bool:
    """Whether ``cls.reset`` accepts the ``sample`` keyword (the episode's index in its group)."""
    try:
        params = inspect.signature(cls.reset).parameters
    except (TypeError, ValueError):
        return False
    return "sample" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def call_user(fn, *args, what: str, **kwargs):
    """``fn(*args, **kwargs)``; what the user's code raises becomes one :class:`EnvError` line (the
    message's first line) with the user's own frames."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise EnvError(f"the environment's {what} raised {type(e).__name__}: {one_line(e)}{user_frames(e)}") from e


def plain(value: object, depth: int = 0) -> bool:
    """Data JSON could write — str, int, float, bool, None, lists and str-keyed dicts of them — which is
    what crosses from an environment's worker to the trainer (anything else could run the user's code,
    or fail, when the trainer unpickles it)."""
    if type(value) in (str, bool, int, float, type(None)):  # exact types: a subclass could unpickle as code
        return True
    if depth > 50:
        return False
    if type(value) is list:
        return all(plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) is str and plain(v, depth + 1) for k, v in value.items())
    return False


def _check_messages(out, what: str) -> None:
    if isinstance(out, list) and not plain(out):
        raise EnvError(f"the environment's {what} returned messages holding something other than str, numbers, "
                       "bools, None, lists and dicts of them; give plain data (it is sent to the trainer)")


def check_reset(out, row_index: int):
    if isinstance(out, str) and out or is_conversation(out):
        _check_messages(out, "reset")
        return out
    raise EnvError(f"the environment's reset returned {type(out).__name__} {str(out)[:60]!r} for row {row_index}; "
                   "it must return the first prompt: a non-empty str, or a list of {'role', 'content'} messages")


def check_step(out) -> tuple[str | list[dict] | None, float, bool]:
    if not (isinstance(out, tuple) and len(out) == 3):
        raise EnvError(f"the environment's step returned {type(out).__name__} {str(out)[:60]!r}; it must return "
                       "(observation: str | list of messages | None, reward: float, done: bool)")
    obs, reward, done = out
    if not (obs is None or isinstance(obs, str) or is_conversation(obs)):
        raise EnvError(f"the environment's step returned an observation of type {type(obs).__name__}; give a str, "
                       "a list of {'role', 'content'} messages, or None")
    try:
        reward = reward_number(reward)
    except TypeError as e:
        raise EnvError(f"the environment's step returned a reward {e}") from None
    except ValueError:
        raise EnvError(f"the environment's step returned the reward {reward}; give a finite number") from None
    if not isinstance(done, bool):
        if getattr(getattr(done, "dtype", None), "kind", None) != "b" or getattr(done, "ndim", None) != 0:
            raise EnvError(f"the environment's step returned done={done!r}; give True or False")
        done = bool(done)  # a NumPy bool (what `guess == secret` gives with NumPy numbers)
    _check_messages(obs, "step")
    return obs, reward, done


@dataclass
class Renderer:
    """Observation tokens for an environment's answers. An episode whose first prompt is text appends
    text as it is; one whose first prompt is messages is rendered by the chat template (``template``,
    Jinja source; None = the tokenizer's), and only the tokens the rendering adds are appended."""

    tokenizer: object
    template: str | None = None
    chat: bool = True  # False: `data.chat_template` none, messages are refused
    _closing: str | None = field(default=None, repr=False)

    @property
    def has_template(self) -> bool:
        return self.chat and (self.template is not None or bool(getattr(self.tokenizer, "chat_template", None)))

    def render(self, messages: list[dict], generation_prompt: bool, tools: list | None = None) -> str:
        """The template's text of ``messages``; a template that refuses them (a role it does not know,
        tools it cannot render: jinja's ``TemplateError``, a ``raise_exception`` in the template) is an
        :class:`EnvError` line naming the roles, not a traceback from inside jinja."""
        try:
            return self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                      add_generation_prompt=generation_prompt, tools=tools)
        except Exception as e:  # noqa: BLE001 (jinja raises what the template's author wrote)
            roles = ", ".join(dict.fromkeys(m.get("role", "?") for m in messages))
            raise EnvError(f"the chat template cannot render the environment's conversation (roles: {roles}"
                           f"{'; with tools' if tools else ''}): {type(e).__name__}: {one_line(e)}; give "
                           "`data.chat_template` a template that renders them, or answer with roles it "
                           "knows") from None

    def first_prompt(self, out: str | list[dict], tools: list | None = None) -> tuple[list[int], list[dict] | None]:
        """The first prompt's ids (as the single-turn rollout encodes prompts) and the conversation
        (None for a text prompt)."""
        if isinstance(out, str):
            return self.tokenizer(out, add_special_tokens=True)["input_ids"], None
        if not self.has_template:
            raise EnvError("the environment's reset returned chat messages but the tokenizer has no chat template; "
                           "return text, or set `data.chat_template` to a Jinja file")
        return self.tokenizer(self.render(out, True, tools), add_special_tokens=False)["input_ids"], list(out)

    def closing(self, history: list[dict], tools: list | None = None) -> str:
        """What the template writes after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
        if self._closing is None:
            text = self.render([*history, {"role": "assistant", "content": SENTINEL}], False, tools)
            self._closing = text[text.rindex(SENTINEL) + len(SENTINEL):] if SENTINEL in text else ""
        return self._closing

    def observation(self, history: list[dict] | None, text: str, stop_text: str | None,
                    obs: str | list[dict], tools: list | None = None) -> tuple[list[int], list[dict] | None]:
        """The tokens that follow the sampled ones. Text: its tokens. Messages: the rest of the assistant
        turn's closing after the sampled stop token, then the new messages and the next assistant
        opening — what the template's rendering with them adds to the rendering without. ``stop_text``:
        the decoded stop token the turn ended with (None when cut by the length limit). Returns the ids
        and the conversation with the assistant's text and ``obs`` appended."""
        if history is None:
            if not isinstance(obs, str):
                raise EnvError("the environment's step returned chat messages in an episode that reset started "
                               "with text; return text")
            return self.tokenizer(obs, add_special_tokens=False)["input_ids"], None
        if isinstance(obs, str):
            raise EnvError("the environment's step returned text in an episode that reset started with chat "
                           "messages; return a list of {'role', 'content'} messages")
        done = [*history, {"role": "assistant", "content": text}]
        before, after = self.render(done, False, tools), self.render([*done, *obs], True, tools)
        if not after.startswith(before):
            raise EnvError("the chat template renders the conversation differently once the environment's messages "
                           "are added (not prefix-stable); multi-turn training needs a template that appends turns")
        closing = self.closing(history, tools)
        if stop_text and closing.startswith(stop_text):
            closing = closing[len(stop_text):]
        return self.tokenizer(closing + after[len(before):], add_special_tokens=False)["input_ids"], [*done, *obs]

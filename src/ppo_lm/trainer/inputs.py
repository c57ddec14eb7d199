"""What a run samples from: the prompt rows (files, the built-in task), the prompts as the rollout
encodes them with their stop tokens, and an environment's setup (its worker pool, the renderer of its
answers, the episodes' limits)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from torch import nn

from ..config.train import DataConfig, TrainConfig
from ..data import prompts
from ..runtime.errors import ConfigError
from ..tasks import reasoning_gym
from . import seeds
from .roles import ensure_pad_token, generation_stop_ids, single_token_id

if TYPE_CHECKING:  # imported where used: the environment's pool only with `rollout.env`
    from ..rollout.envs.env_pool import EnvPool
    from ..rollout.envs.environment import Renderer
    from ..rollout.sample.producer import EpisodeSettings


def read_prompt_rows(cfg: DataConfig, *, seed: int, held_out: bool = False, env: bool = False) -> list[dict]:
    """The training prompts of ``cfg`` (``held_out``: its evaluation prompts), read and checked by their
    columns (no tokenizer needed; ``env``: rows for an environment's reset, any columns)."""
    source, field = (cfg.eval_prompts, "data.eval_prompts") if held_out else (cfg.prompts, "data.prompts")
    if reasoning_gym.task_of(source) is not None:
        try:
            rows = _task_rows(cfg, seed, held_out=held_out)
        except reasoning_gym.TaskError as e:
            raise ConfigError(str(e)) from None
    elif source == "builtin:equations":
        from ..tasks.equations import make_prompts

        if cfg.prompt_column != "prompt":
            raise ConfigError(f"`data.prompt_column`={cfg.prompt_column!r}: the built-in prompts' column is "
                              f"'prompt' (set `{field}` to your file to use another column)")
        rows = (make_prompts(cfg.builtin_eval_prompts, seed=seeds.builtin_held_out_seed(seed), split="heldout",
                             unique=True) if held_out
                else make_prompts(cfg.builtin_num_prompts, seed=seed, split="train"))
    else:
        from ..data.rows import load_rows

        try:
            # columns checked below: the prompt column may hold chat messages as well as text
            rows = load_rows(source, [], name=f"prompt data (`{field}`)", split=cfg.eval_split if held_out else cfg.split)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if held_out and cfg.eval_max_prompts:
        rows = rows[:cfg.eval_max_prompts]
    prompts.check_prompt_rows(rows, None if env else cfg.prompt_column, source=f"`{field}`")
    return rows


def _task_rows(cfg: DataConfig, seed: int, *, held_out: bool) -> list[dict]:
    """A reasoning-gym task's problems: held out from their own seed, or for training from the run's,
    leaving out every question of the held-out set where it is the same task (tasks/reasoning_gym.py)."""
    if cfg.prompt_column != "prompt":
        raise ConfigError(f"`data.prompt_column`={cfg.prompt_column!r}: a reasoning-gym task's prompts are in "
                          "'prompt' (leave `data.prompt_column` out)")
    chat = cfg.chat_template != "none"
    if held_out:
        return reasoning_gym.make_rows(reasoning_gym.task_of(cfg.eval_prompts), cfg.task_config, cfg.task_eval_size,
                                       seeds.task_held_out_seed(seed), chat=chat, field="data.eval_prompts")
    exclude = ()
    if cfg.eval_prompts == cfg.prompts:
        exclude = {r["prompt"][0]["content"] if chat else r["prompt"] for r in _task_rows(cfg, seed, held_out=True)}
    return reasoning_gym.make_rows(reasoning_gym.task_of(cfg.prompts), cfg.task_config, cfg.task_size, seed, chat=chat,
                                   exclude=exclude)


class PromptSet(NamedTuple):
    """The prompts a run trains and evaluates on, as the rollout encodes them."""

    rows: list[dict]  # training rows, the prompt column rendered to text
    eval_rows: list[dict] | None  # held-out rows, likewise (None: no evaluation)
    chat: bool  # rendered by the chat template (which writes its own special tokens)
    stop_ids: tuple[int, ...]  # EOS, the generation config's end-of-turn ids, rollout.stop_tokens
    longest_prompt: int | None = None  # tokens of the longest training prompt (None: an environment's)


def build_prompts(cfg: TrainConfig, tokenizer, policy_lm: nn.Module, rows: list[dict],
                  eval_rows: list[dict] | None, *, given: bool = False, env: bool = False) -> PromptSet:
    """Stop tokens (and a pad token that is none of them, for the tokenizer the checkpoints save:
    :func:`ensure_pad_token`), then the prompt rows — checked when
    ``given`` from Python (read rows were checked by the start-up checks) — and the held-out rows,
    their chat messages rendered with the chat template, each prompt checked against the context.
    ``env``: the rows as they are, for a multi-turn environment's reset."""
    stop_ids = [tokenizer.eos_token_id, *generation_stop_ids(policy_lm)]
    for s in cfg.rollout.stop_tokens:
        stop_ids.append(single_token_id(tokenizer, s, "rollout.stop_tokens"))
    stop_ids = list(dict.fromkeys(stop_ids))
    ensure_pad_token(tokenizer, stop_ids)

    d = cfg.data
    if given:
        prompts.check_prompt_rows(rows, None if env else d.prompt_column, source="`prompt_rows`")
    if env:  # the rows go to the environment's reset as they are; it writes the prompts
        return PromptSet(rows, eval_rows, False, tuple(stop_ids))
    rows, chat = prompts.render_prompts(rows, d.prompt_column, d.chat_template, tokenizer)
    context = getattr(policy_lm.config, "max_position_embeddings", None) or 10**9
    fits = dict(max_prompt_tokens=context - cfg.rollout.max_new_tokens, add_special_tokens=not chat)
    longest = prompts.check_prompt_lengths(rows, d.prompt_column, tokenizer, **fits)
    if eval_rows is not None:
        eval_rows, eval_chat = prompts.render_prompts(eval_rows, d.prompt_column, d.chat_template, tokenizer)
        if eval_chat != chat:
            raise ConfigError("`data.eval_prompts` and `data.prompts` hold different kinds of prompts (plain text "
                              "and chat messages); use one kind")
        prompts.check_prompt_lengths(eval_rows, d.prompt_column, tokenizer, **fits)
    return PromptSet(rows, eval_rows, chat, tuple(stop_ids), longest)


class EpisodeSetup(NamedTuple):
    envs: EnvPool
    renderer: Renderer
    episodes: EpisodeSettings


def episode_setup(cfg: TrainConfig, tokenizer, policy_lm: nn.Module) -> EpisodeSetup:
    """With ``rollout.env``: the pool of worker processes the environment runs in (started on first use),
    the renderer of its answers (the chat template of ``data.chat_template``) and the episodes' limits
    (``max_episode_tokens`` 0 = the policy's context)."""
    from ..rollout.envs.env_pool import EnvPool
    from ..rollout.envs.environment import EnvSpec
    from ..rollout.sample.producer import EpisodeSettings

    r = cfg.rollout
    settings = EpisodeSettings(r.max_turns, episode_tokens(cfg, policy_lm), r.env_sessions)
    pool = EnvPool(EnvSpec(r.env, r.env_action, r.env_observation), workers=env_workers(r.env_workers),
                   timeout_s=r.env_timeout_s)
    return EpisodeSetup(pool, renderer_of(cfg, tokenizer), settings)


def load_agent(spec: str):
    """``rollout.agent``: the user's ``run(client, row)``, imported and checked before any model loads."""
    import importlib.util
    import inspect

    from ..runtime.user_code import load_object

    missing = [m for m in ("openai", "starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"`rollout.agent` needs the extra `pip install 'ppo-lm[agents]'` ({', '.join(missing)} "
                          "not installed): the policy is served to the agent's openai client")

    try:
        run = load_object(spec, "rollout.agent")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        inspect.signature(run).bind(None, None)
    except TypeError:
        raise ConfigError(f"`rollout.agent`={spec!r}: the agent is called as run(client, row); give it those two "
                          "arguments") from None
    except ValueError:  # a callable without a signature: called as it is
        pass
    return run


def agent_setup(cfg: TrainConfig, renderer: Renderer, sampling, policy_lm: nn.Module):
    """With ``rollout.agent``: its episodes against the endpoint that serves the policy (started on first
    use), each cut at ``rollout.agent_timeout_s``, a prompt and its answers within ``rollout.max_episode_tokens``
    (0 = the policy's context)."""
    from ..rollout.agents.endpoint import AgentEndpoint
    from ..rollout.agents.episodes import AgentEpisodes

    r = cfg.rollout
    endpoint = AgentEndpoint(renderer, sampling, max_context=episode_tokens(cfg, policy_lm))
    return AgentEpisodes(load_agent(r.agent), endpoint, timeout_s=r.agent_timeout_s)


def episode_tokens(cfg: TrainConfig, policy_lm: nn.Module) -> int:
    """``rollout.max_episode_tokens``, 0 = and at most the policy's context."""
    context = getattr(policy_lm.config, "max_position_embeddings", None) or 10**9
    return min(cfg.rollout.max_episode_tokens or context, context)


def renderer_of(cfg: TrainConfig, tokenizer) -> Renderer:
    """The chat rendering of episodes: ``data.chat_template``'s template, or the tokenizer's."""
    from ..rollout.envs.environment import Renderer

    d = cfg.data
    template = Path(d.chat_template).read_text() if d.chat_template not in ("auto", "none") else None
    return Renderer(tokenizer, template, chat=d.chat_template != "none")


def env_workers(setting: int | str) -> int:
    """``rollout.env_workers``; auto: this process's share of the host's cores (``LOCAL_WORLD_SIZE``
    processes under torchrun), at most 4 — what an environment that computes can use. One that waits
    (a service, a sandbox) gains from more: docs/benchmarks.md, "Environments that wait"."""
    if setting != "auto":
        return int(setting)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(4, (os.cpu_count() or 1) // local))

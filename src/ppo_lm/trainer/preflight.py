"""Every check of a run that needs no model, done before the first model loads: a typo in a path
costs a second, not the minutes a big model takes to load (docs/errors.md).

Order: settings → output directory (creatable, writable, no other run unless resuming) → resume
(a checkpoint is there, the settings match the run's) → model and tokenizer directories (by their
``config.json`` and file names) → the reward function (imported) → the prompt data (read, columns) →
the settings this run would ignore (config/unused.py: refused, once the files they name were checked).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..config.io import flatten, from_dict, load_saved_config, resume_differences, to_dict
from ..config.specs import is_model_path, reward_spec, reward_specs
from ..config.train import AlgoConfig, TrainConfig
from ..config.unused import Facts, check_unused
from ..config.validate import effective_algo, validate_config
from ..data.prompts import is_conversation
from ..models.loading import check_model_dir, check_tokenizer_dir
from ..records.trackers import check_trackers
from ..rollout.envs import env_worker
from ..rollout.envs.env_pool import check_env
from ..rollout.envs.environment import EnvError, EnvSpec
from ..runtime import distributed as dist
from ..runtime.errors import ConfigError
from ..runtime.files import OutputDirLock, prepare_output_dir
from . import inputs, roles
from .checkpoint.folders import MANIFEST, list_checkpoints, verify
from .checkpoint.state import DamagedCheckpointError


@dataclass
class Preflight:
    """What the checks found or loaded on the way, so nothing is done twice."""

    resuming: bool
    """The run continues from a checkpoint (``--resume``, or ``--auto-resume`` with one there)."""
    verifiers: dict[str, object]
    """The imported verifiers of ``model.reward`` by spec (empty when verifiers were given from Python)."""
    gold_verifier: object | None
    prompt_rows: list[dict] | None
    """The prompt rows read from ``data`` (their token lengths are checked once the tokenizer is
    loaded); None when rows were given from Python."""
    eval_rows: list[dict] | None
    """The held-out prompts of ``data.eval_prompts``; None without."""


def preflight(cfg: TrainConfig, *, policy_given: bool = False, tokenizer_given: bool = False,
              verifier_given: bool = False, prompt_rows_given: bool = False) -> Preflight:
    """Run the checks of the module docstring in order; the first failure raises :class:`ConfigError`
    (or :class:`~ppo_lm.models.loading.ModelLoadError`) naming the setting and the fix. ``*_given``:
    that object comes from Python, so its setting is not checked."""
    if env_worker.SERVING:  # this process is an environment's worker: the module it imported trains
        raise ConfigError("a training run was started while an environment's module was imported in its worker; "
                          "guard the module's own training code with `if __name__ == \"__main__\":`")
    keep = _resumed_settings(cfg)
    validate_config(cfg, dist.world_size(), keep=keep)
    check_trackers(cfg.log.report_to)
    out = Path(cfg.output_dir)
    if dist.is_main():
        try:
            prepare_output_dir(out)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        OutputDirLock(out).acquire().release()  # a run already writing there: said before any model loads
    resuming = _check_resume(cfg, out)

    m = cfg.model
    if not policy_given and m.policy != "builtin":
        config = check_model_dir(m.policy, "model.policy", "causal-lm")
        _check_context(config, cfg)
    tokenizer_dir = m.tokenizer or m.policy
    if not tokenizer_given and tokenizer_dir != "builtin":
        check_tokenizer_dir(tokenizer_dir, "model.tokenizer" if m.tokenizer else "model.policy")
    specs = [] if verifier_given else reward_specs(cfg)  # given verifiers replace model.reward
    for spec, _ in specs:
        if is_model_path(spec):
            _check_one_label(check_model_dir(spec, "model.reward", "sequence-classification"), spec)
    if cfg.critic.init not in ("auto", "policy", "reward"):
        check_model_dir(cfg.critic.init, "critic.init")

    if cfg.data.chat_template not in ("auto", "none"):
        _check_chat_template(cfg.data.chat_template)  # read and parsed even where the prompts are text

    if cfg.rollout.agent is not None:  # its returns replace model.reward (docs/agents.md)
        inputs.load_agent(cfg.rollout.agent)
    if cfg.rollout.env is not None:  # its turn rewards replace model.reward (docs/environments.md)
        try:  # in a worker, as the run will (its module is never imported here), with its tools' schemas
            r = cfg.rollout
            check_env(EnvSpec(r.env, r.env_action, r.env_observation), r.env_timeout_s)
        except EnvError as e:
            raise ConfigError(str(e)) from None
    # imported even with an environment, which ignores them: a broken reward is named
    verifiers = {spec: roles.load_reward_verifier(spec, cfg) for spec, _ in specs if not is_model_path(spec)}
    gold = roles.build_gold_verifier(cfg)
    rows = None if prompt_rows_given else inputs.read_prompt_rows(cfg.data, seed=cfg.seed,
                                                                    env=cfg.rollout.episodic)
    eval_rows = None
    if cfg.data.eval_prompts is not None:
        if m.gold_reward is None and any(is_model_path(spec) for spec, _ in specs):
            raise ConfigError("`data.eval_prompts`: evaluation scores with a verifier, but `model.reward` includes a "
                              "reward model; set `model.gold_reward` to the verifier to evaluate with")
        eval_rows = inputs.read_prompt_rows(cfg.data, seed=cfg.seed, held_out=True, env=cfg.rollout.episodic)
    _check_unused(cfg, keep, rows, eval_rows)
    return Preflight(resuming, verifiers, gold, rows, eval_rows)


def _resumed_settings(cfg: TrainConfig) -> dict:
    """The settings of the run this start resumes (its config.yaml, flattened); empty for a new run. They
    were accepted when the run began and a resume must keep them, so the check of unused settings does
    not refuse them again (a rule added since would leave the run impossible to continue)."""
    out = Path(cfg.output_dir)
    if not (cfg.resume or cfg.auto_resume) or not list_checkpoints(out):
        return {}
    return flatten(load_saved_config(out / "config.yaml", TrainConfig))


def _check_chat_template(path: str) -> None:
    """A ``data.chat_template`` file is a readable Jinja template, whether or not the prompts use it."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"`data.chat_template` {path!r} is not a file; give a Jinja template file, 'auto' (the "
                          "tokenizer's template) or 'none'")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = "it is not a text (UTF-8) file" if isinstance(e, UnicodeDecodeError) else e.strerror or str(e)
        raise ConfigError(f"`data.chat_template` {path!r} cannot be read: {why}") from None
    if not text.strip():
        raise ConfigError(f"`data.chat_template` {path!r} is empty; give a Jinja template")
    import jinja2

    try:  # as transformers compiles a chat template (its own tags, e.g. {% generation %}, where it has them)
        from transformers.utils.chat_template_utils import _compile_jinja_template as compile_template
    except ImportError:
        compile_template = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).from_string
    try:
        compile_template(text)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"`data.chat_template` {path!r} is not a valid Jinja template: {e.message} "
                          f"(line {e.lineno})") from None


def _check_unused(cfg: TrainConfig, keep: dict, rows: list[dict] | None, eval_rows: list[dict] | None) -> None:
    """The settings this run ignores (config/unused.py), now that every file they name has been read:
    refused, or — where a shipped workflow writes them — warned about."""
    chat = None
    if rows is not None and not cfg.rollout.episodic:  # an environment's rows: its reset reads them
        column = cfg.data.prompt_column
        chat = any(is_conversation(r[0][column]) for r in (rows, eval_rows or []) if r)
    cuda = roles.resolve_device(cfg.model.device).type == "cuda" if cfg.model.cpu_lanes else None
    facts = Facts(files_read=True, torchrun=dist.is_initialized(), cuda=cuda, chat_prompts=chat)
    check_unused(cfg, facts, keep, warn=True)


def _check_one_label(config: dict, spec: str) -> None:
    labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)
    if labels != 1:
        raise ConfigError(f"`model.reward` {spec!r} has {labels} labels; a reward model has one (`ppo-lm rm` "
                          "writes such models)")


def _check_context(config: dict, cfg: TrainConfig) -> None:
    """The response length fits the policy's context, with room for a prompt."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    context = text.get("max_position_embeddings")
    limit = cfg.rollout.max_new_tokens  # auto resolves to at most half the context (config/sizing.py)
    if isinstance(context, int) and limit != "auto" and limit >= context:
        raise ConfigError(
            f"`rollout.max_new_tokens`={cfg.rollout.max_new_tokens} leaves no room for a prompt in the policy's "
            f"context of {context} tokens (max_position_embeddings); lower it below {context}"
        )


def _check_resume(cfg: TrainConfig, out: Path) -> bool:
    """Whether the run resumes; errors for ``--resume`` without a checkpoint and for a new run in a
    directory that holds one, and checks that a resumed run's settings are its own."""
    has_checkpoint = bool(list_checkpoints(out))
    if cfg.resume and not has_checkpoint:
        raise ConfigError(
            f"--resume: {str(out)!r} holds no checkpoint to resume from; start the run without "
            "--resume, or use --auto-resume (resumes when there is a checkpoint, starts fresh otherwise)"
        )
    resuming = cfg.resume or (cfg.auto_resume and has_checkpoint)
    # --auto-resume without a checkpoint starts over, even after a run killed before its first save
    if not resuming and not cfg.auto_resume and dist.is_main() and ((out / "metrics.jsonl").exists() or has_checkpoint):
        raise ConfigError(
            f"`output_dir` {str(out)!r} already holds a run: pass --resume to continue it, "
            "or choose another --output-dir"
        )
    if resuming:
        check_resume_config(cfg, out)
        _check_some_checkpoint_is_whole(out)
    return resuming


def _check_some_checkpoint_is_whole(out: Path) -> None:
    """Before any model loads: at least one checkpoint has every file its manifest lists, at its size
    (resume then verifies the checksums of the one it loads, and falls back past damaged ones). A
    checkpoint without a manifest (an older ppo-lm's) counts as whole: its files are checked on load."""
    problems = []
    for _, path in reversed(list_checkpoints(out)):
        if not (path / MANIFEST).exists() or (problem := verify(path, checksums=False)) is None:
            return
        problems.append(f"{path}: {problem}")
    if problems:
        raise DamagedCheckpointError("no intact checkpoint to resume from: " + "; ".join(problems))


def _reward_as_here(cfg: TrainConfig, saved: dict) -> dict:
    """``saved`` with its ``model.reward`` written as here where both name the same reward, one as
    ``auto`` (a run written when the default was 'builtin:equations' resumes with today's 'auto')."""
    then = (saved.get("model") or {}).get("reward")
    if then is None or then == cfg.model.reward:
        return saved
    try:
        same = reward_spec(cfg) == reward_spec(from_dict(TrainConfig, saved))
    except ConfigError:
        return saved
    return {**saved, "model": {**saved["model"], "reward": cfg.model.reward}} if same else saved


def check_resume_config(cfg: TrainConfig, out: Path) -> None:
    """A resumed run must be the same experiment as the run it continues (its config.yaml): other
    settings would silently make the rest of the run a different one, or fail to load."""
    saved = load_saved_config(out / "config.yaml", TrainConfig)
    if not saved:
        return
    try:  # algo compared as it computes: "auto" resolved, and "no KL" written one way, on both sides
        saved = {**saved, "algo": to_dict(effective_algo(from_dict(AlgoConfig, saved.get("algo") or {})))}
    except ConfigError:
        pass  # an algo field that no longer exists: compare what both have
    saved = _reward_as_here(cfg, saved)
    diffs = resume_differences(dataclasses.replace(cfg, algo=effective_algo(cfg.algo)), saved)
    if diffs:
        raise ConfigError(
            f"--resume of {str(out)!r} with settings that differ from the run's config.yaml: "
            + "; ".join(diffs) + ". Resume with the run's own settings (`ppo-lm train --output-dir DIR "
            "--resume --iterations N` reads them from DIR/config.yaml), or start a new run in another "
            "--output-dir"
        )
    o, before = cfg.optim, saved.get("iterations")
    if o.schedule != "constant" and before is not None and before != cfg.iterations:
        warnings.warn(
            f"`optim.schedule`={o.schedule!r}: the run so far followed a schedule over {before} iterations; "
            f"from here it follows one over {cfg.iterations}, so the learning rate jumps and the run "
            "differs from an uninterrupted one of that length", stacklevel=3)

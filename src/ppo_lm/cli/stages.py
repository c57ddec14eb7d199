"""`ppo-lm sft` and `ppo-lm rm`: the stages before PPO, as commands.

The stage commands work as `ppo-lm train` does: every check that needs no model runs first — the
settings, the output directory (creatable, writable, no finished stage there unless --overwrite), the
model and tokenizer directories (by config.json and file names), the data (read, columns) — so a
mistake is one line (`ppo-lm: error: …`, status 2) within a second whatever the model's size. Then
the tokenizer and the model load, with a line saying so, and training prints a plain, flushed line
every `log_every` steps (also written to OUTPUT_DIR/{sft,rm}_log.jsonl).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..data.rows import InputError
from ..stages.rm import RMConfig
from ..stages.sft import SFTConfig
from ..tasks.equations import BUILTIN_HEADS


@dataclass
class SFTCommand:
    """Supervised fine-tuning of a causal LM on (prompt, response) rows."""

    output_dir: str = "runs/sft"
    """Directory the fine-tuned model, its tokenizer, sft_metrics.json and sft_log.jsonl are written to.
    It must not hold a model or another stage's outputs already, unless --overwrite is given."""
    overwrite: bool = False
    """Replace what a previous stage wrote in output_dir (config.json, weights, metrics, logs)."""
    model: str = "builtin"
    """Causal LM checkpoint directory (written by save_pretrained or by ppo-lm), or 'builtin' for the
    tiny Qwen2-architecture model of the built-in equation task."""
    tokenizer: str | None = None
    """Tokenizer directory; None: the model's (or the built-in character tokenizer)."""
    data: str = "builtin:equations"
    """A local JSONL, JSON, CSV, Parquet or Arrow file, a directory of such files or one written by
    datasets' save_to_disk, with columns 'prompt' (text, or a list of {"role", "content"} chat messages,
    rendered with the tokenizer's chat template) and 'response' (text, or a list of one assistant
    message), or instead 'messages' (a conversation ending with the assistant turn to train on); or
    'builtin:equations' (demonstrations of the equation task)."""
    split: str = "train"
    """The split of data to read where it has several (a saved DatasetDict, or a directory of files per
    split such as train.jsonl / test.jsonl)."""
    eval_data: str | None = None
    """Held-out rows, in the same form as data; None: sft.heldout_fraction of data is held out."""
    eval_split: str = "test"
    """The split of eval_data to read where it has several."""
    builtin_demos: int = 4000
    """Built-in data only: number of demonstrations."""
    builtin_error_rate: float = 0.3
    """Built-in data only: share of demonstrations with a wrong answer, in [0, 1]."""
    builtin_hidden_size: int = 64
    """Built-in model only: hidden size, a multiple of 8 (its MLP is 4 times as wide)."""
    seed: int = 0
    """Seeds everything: the built-in model and data, the held-out split, the batch order and torch's RNG."""
    threads: int = 0
    """torch CPU threads; 0 = leave torch's default."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Optimisation and data settings of the stage."""


@dataclass
class RMCommand:
    """Bradley-Terry reward model on (prompt, chosen, rejected) rows, initialised from a causal LM."""

    output_dir: str = "runs/rm"
    """Directory the reward model, its tokenizer, rm_metrics.json and rm_log.jsonl are written to.
    It must not hold a model or another stage's outputs already, unless --overwrite is given."""
    overwrite: bool = False
    """Replace what a previous stage wrote in output_dir (config.json, weights, metrics, logs)."""
    model: str = "builtin"
    """Causal LM checkpoint directory whose transformer body initialises the reward model (e.g. the
    output of ppo-lm sft; the score head starts fresh), or 'builtin' for the tiny built-in model."""
    tokenizer: str | None = None
    """Tokenizer directory; None: the model's (or the built-in character tokenizer)."""
    data: str = "builtin:equations"
    """A local JSONL, JSON, CSV, Parquet or Arrow file, a directory of such files or one written by
    datasets' save_to_disk, with columns 'prompt' (text, or a list of {"role", "content"} chat messages,
    rendered with the tokenizer's chat template), 'chosen' and 'rejected' (text, or a list of one
    assistant message each), or, without 'prompt', 'chosen' and 'rejected' conversations that differ
    only in their last (assistant) turn; or 'builtin:equations' (pairs of the equation task)."""
    split: str = "train"
    """The split of data to read where it has several (a saved DatasetDict, or a directory of files per
    split such as train.jsonl / test.jsonl)."""
    eval_data: str | None = None
    """Held-out pairs, in the same form as data; None: rm.heldout_fraction of data is held out."""
    eval_split: str = "test"
    """The split of eval_data to read where it has several."""
    builtin_pairs: int = 2000
    """Built-in data only: number of preference pairs."""
    builtin_hidden_size: int = 64
    """Built-in model only: hidden size, a multiple of 8 (its MLP is 4 times as wide)."""
    seed: int = 0
    """Seeds everything: the built-in model and pairs, the score head, the held-out split, the batch
    order and torch's RNG."""
    threads: int = 0
    """torch CPU threads; 0 = leave torch's default."""
    rm: RMConfig = field(default_factory=RMConfig)
    """Optimisation and data settings of the stage."""


# ----------------------------------------------------------------------------------------------
# Checks that need no model
# ----------------------------------------------------------------------------------------------


def _check_command(c: SFTCommand | RMCommand, section: str) -> None:
    """Every setting of a stage command, before anything is read or built."""
    from ..stages._common import check_stage_config

    check_stage_config(getattr(c, section), section)
    if c.threads < 0:
        raise InputError(f"`threads` must be >= 0 (0: torch's default), got {c.threads}")
    builtin_n = ("builtin_demos", c.builtin_demos) if isinstance(c, SFTCommand) else ("builtin_pairs", c.builtin_pairs)
    if c.data == "builtin:equations" and builtin_n[1] < 1:
        raise InputError(f"`{builtin_n[0]}` must be >= 1, got {builtin_n[1]}")
    if isinstance(c, SFTCommand):
        rate = c.builtin_error_rate
        if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
            raise InputError(f"`builtin_error_rate` must be in [0, 1], got {rate}")
    if c.model == "builtin":
        h = c.builtin_hidden_size
        if h < 1 or h % (2 * BUILTIN_HEADS):
            raise InputError(f"`builtin_hidden_size` must be a positive multiple of {2 * BUILTIN_HEADS} (2 × the "
                             f"built-in model's {BUILTIN_HEADS} heads: RoPE splits each head's width in halves), got {h}")
        if c.tokenizer is not None:
            raise InputError("`tokenizer` cannot be set with `model` 'builtin': the built-in model is made for the "
                             "built-in character tokenizer; give a model directory, or leave `tokenizer` unset")


def prepare_stage_output(path: str, overwrite: bool) -> Path:
    """Create ``path`` and check that it is writable and holds no finished stage (unless ``overwrite``)."""
    from ..runtime.files import prepare_output_dir
    from ..stages._common import STAGE_OUTPUTS

    try:
        out = prepare_output_dir(path, "output_dir")
    except ValueError as e:
        raise InputError(str(e)) from None
    found = [name for name in STAGE_OUTPUTS if (out / name).exists()]
    if found and not overwrite:
        raise InputError(f"`output_dir` {path!r} already holds a model or a stage's outputs ({', '.join(found[:4])}); "
                         "pass --overwrite to replace them, or choose another --output-dir")
    return out


def _check_model_dirs(c: SFTCommand | RMCommand, stage: str) -> None:
    """The model and tokenizer directories, by their config.json and file names."""
    from ..models.loading import ModelLoadError, check_model_dir, check_tokenizer_dir

    if c.model != "builtin":
        try:
            check_model_dir(c.model, "model", "causal-lm")
        except ModelLoadError as e:
            if stage == "rm":  # the reason a causal LM is needed is not a policy's head here
                raise ModelLoadError(str(e).replace(
                    "(a policy needs its language-model head)",
                    "(`ppo-lm rm` starts from a causal LM's body, such as `ppo-lm sft` output, with a fresh score "
                    "head)")) from None
            raise
    tokenizer_dir = c.tokenizer or c.model
    if tokenizer_dir != "builtin":
        field_name = "tokenizer" if c.tokenizer else "model"
        try:
            check_tokenizer_dir(tokenizer_dir, field_name)
        except ModelLoadError as e:  # the hint names train's setting
            raise ModelLoadError(str(e).replace("set `model.tokenizer`", "set `tokenizer`")) from None


def _rows(spec: str | None, stage: str, field_name: str, split: str):
    """The rows of ``spec`` (None: None) as the stage reads them: SFT rows or preference pairs."""
    from ..data.examples import load_preference_rows, load_sft_rows

    if spec is None:
        return None
    load = load_sft_rows if stage == "sft" else load_preference_rows
    return load(spec, name=f"`{field_name}`", split=split)


def _check_chat_template(tok, data: dict) -> None:
    """Rows of chat messages need a tokenizer with a chat template (checked before the model loads)."""
    from ..data.examples import check_chat_template

    for field_name, rows in data.items():
        if rows is not None:
            check_chat_template(tok, rows, f"`{field_name}`")


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def _say(stage: str, text: str) -> None:
    print(f"{stage}: {text}", flush=True)


def _load_tokenizer(c: SFTCommand | RMCommand):
    from ..models.hf_compat import load_tokenizer
    from ..models.loading import ModelLoadError
    from ..tasks.equations import build_tokenizer

    if c.model == "builtin":
        return build_tokenizer()
    source = c.tokenizer or c.model
    field_name = "tokenizer" if c.tokenizer else "model"
    try:
        tok = load_tokenizer(source)
    except Exception as e:  # noqa: BLE001 (whatever a damaged tokenizer file makes transformers raise)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"`{field_name}` {source!r}: the tokenizer could not be loaded: {first}") from None
    if tok.eos_token_id is None:
        raise ModelLoadError(f"`{field_name}` {source!r}: the tokenizer has no eos_token, so responses cannot end; "
                             "set eos_token in its tokenizer_config.json")
    return tok


def _load_causal_lm(c: SFTCommand | RMCommand, tok, stage: str):
    """The causal LM of ``c.model`` (built-in: built from ``c.seed``); rm needs only its body."""
    from transformers import AutoModelForCausalLM

    from ..models.loading import load_model
    from ..tasks.equations import build_tiny_policy

    if c.model == "builtin":
        return build_tiny_policy(tok, seed=c.seed, hidden_size=c.builtin_hidden_size)
    _say(stage, f"loading model {c.model} …")
    lm = load_model(AutoModelForCausalLM, c.model, "model", "causal-lm", require_head=stage == "sft")
    embeddings = lm.get_input_embeddings().num_embeddings
    if len(tok) > embeddings:
        where = f"`tokenizer` {c.tokenizer!r}" if c.tokenizer else f"the tokenizer of `model` {c.model!r}"
        raise InputError(f"{where} has {len(tok)} tokens but the model's embedding has only {embeddings} rows; "
                         "give the tokenizer the model was trained with")
    return lm


class _StageLog:
    """Prints each log entry as a plain, flushed line and appends it to OUTPUT_DIR/<stage>_log.jsonl."""

    def __init__(self, path: Path):
        self.file = path.open("w", encoding="utf-8")

    def __call__(self, entry: dict) -> None:
        from ..stages._common import format_log_entry

        print(format_log_entry(entry), flush=True)
        self.file.write(json.dumps(entry) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _n_params(model) -> str:
    n = sum(p.numel() for p in model.parameters())
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.1f}k"


def _fmt(x) -> str:
    return "n/a (nothing held out)" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


# ----------------------------------------------------------------------------------------------
# The commands
# ----------------------------------------------------------------------------------------------


def run_sft(c: SFTCommand) -> dict:
    from ..stages.sft import train_sft
    from ..tasks.equations import sft_demonstrations

    _check_command(c, "sft")
    out = prepare_stage_output(c.output_dir, c.overwrite)
    _check_model_dirs(c, "sft")
    if c.data == "builtin:equations":
        rows = sft_demonstrations(c.builtin_demos, seed=c.seed, error_rate=c.builtin_error_rate)
    else:
        rows = _rows(c.data, "sft", "data", c.split)
    eval_rows = _rows(c.eval_data, "sft", "eval_data", c.eval_split)

    import torch

    if c.threads:
        torch.set_num_threads(c.threads)
    tok = _load_tokenizer(c)
    _check_chat_template(tok, {"data": rows, "eval_data": eval_rows})
    model = _load_causal_lm(c, tok, "sft")
    _say("sft", f"{len(rows)} rows{'' if eval_rows is None else f' (+{len(eval_rows)} held out)'}; model "
         f"{_n_params(model)} parameters; seed {c.seed}")
    log = _StageLog(out / "sft_log.jsonl")
    try:
        metrics = train_sft(model, tok, rows, c.sft, output_dir=out, eval_rows=eval_rows, log_fn=log, seed=c.seed)
    finally:
        log.close()
    print(f"held-out loss {_fmt(metrics['heldout_loss_before'])} → {_fmt(metrics['heldout_loss_after'])}; "
          f"saved to {c.output_dir}", flush=True)
    return metrics


def run_rm(c: RMCommand) -> dict:
    from ..stages.rm import build_reward_model_from_policy_config, train_reward_model
    from ..tasks.equations import preference_pairs

    _check_command(c, "rm")
    out = prepare_stage_output(c.output_dir, c.overwrite)
    _check_model_dirs(c, "rm")
    rows = preference_pairs(c.builtin_pairs, seed=c.seed) if c.data == "builtin:equations" else \
        _rows(c.data, "rm", "data", c.split)
    eval_rows = _rows(c.eval_data, "rm", "eval_data", c.eval_split)

    import torch

    if c.threads:
        torch.set_num_threads(c.threads)
    tok = _load_tokenizer(c)
    _check_chat_template(tok, {"data": rows, "eval_data": eval_rows})
    lm = _load_causal_lm(c, tok, "rm")
    rm = build_reward_model_from_policy_config(lm.config, causal_lm=lm, pad_token_id=tok.pad_token_id, seed=c.seed)
    del lm
    _say("rm", f"{len(rows)} pairs{'' if eval_rows is None else f' (+{len(eval_rows)} held out)'}; reward model "
         f"{_n_params(rm)} parameters; seed {c.seed}")
    log = _StageLog(out / "rm_log.jsonl")
    try:
        metrics = train_reward_model(rm, tok, rows, c.rm, output_dir=out, eval_rows=eval_rows, log_fn=log,
                                     seed=c.seed)
    finally:
        log.close()
    before, after = metrics["heldout_accuracy_before"], metrics["heldout_accuracy_after"]
    print(f"held-out pairwise accuracy {_fmt(before)} → {_fmt(after)}; saved to {c.output_dir}", flush=True)
    return metrics


def cmd_sft(argv: list[str]) -> int:
    from .main import _parse, _run

    c = _parse(SFTCommand, argv, "ppo-lm sft", "Supervised fine-tuning on (prompt, response) pairs.")
    return _run(lambda: run_sft(c))


def cmd_rm(argv: list[str]) -> int:
    from .main import _parse, _run

    c = _parse(RMCommand, argv, "ppo-lm rm", "Bradley–Terry reward model on (prompt, chosen, rejected) pairs.")
    return _run(lambda: run_rm(c))

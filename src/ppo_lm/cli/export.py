"""`ppo-lm export RUN_DIR --output DIR [--iteration N]`: a run's trained policy as a standalone model
directory — weights, config, generation config, tokenizer and chat template — that
``AutoModelForCausalLM.from_pretrained(DIR)`` and ``AutoTokenizer.from_pretrained(DIR)`` load with
no ppo-lm installed. The checkpoint is verified against its manifest first (docs/errors.md)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..runtime.errors import ArgumentParser, UserError
from ..runtime.files import prepare_output_dir
from ..trainer.checkpoint.folders import list_checkpoints, verify


class ExportError(UserError):
    """A run directory, checkpoint or output directory that cannot be exported from or to."""


def checkpoint_to_export(run_dir: Path, iteration: int | None) -> Path:
    """The checkpoint directory of ``iteration`` (default: the newest intact one), verified."""
    if not run_dir.is_dir():
        raise ExportError(f"run directory {str(run_dir)!r} does not exist; give a train run's --output-dir")
    found = list_checkpoints(run_dir)
    if not found:
        raise ExportError(f"{str(run_dir)!r} holds no checkpoint (no checkpoints/iter_*); train first, or give "
                          "the run's --output-dir")
    if iteration is not None:
        chosen = [p for it, p in found if it == iteration]
        if not chosen:
            raise ExportError(f"--iteration {iteration}: {str(run_dir)!r} has checkpoints of iterations "
                              f"{[it for it, _ in found]}")
        problem = verify(chosen[0])
        if problem is not None and (chosen[0] / "manifest.json").exists():
            raise ExportError(f"checkpoint {chosen[0]} is damaged ({problem}); export another --iteration")
        return chosen[0]
    damaged = []
    for _, path in reversed(found):
        problem = verify(path) if (path / "manifest.json").exists() else None
        if problem is None:
            return path
        damaged.append(f"{path}: {problem}")
    raise ExportError("no intact checkpoint to export: " + "; ".join(damaged))


def export_policy(run_dir: str | Path, output: str | Path, iteration: int | None = None, *,
                  overwrite: bool = False) -> Path:
    """Copy the policy of a run's checkpoint to ``output`` (written beside it, then renamed into
    place); returns ``output``."""
    source = checkpoint_to_export(Path(run_dir), iteration) / "policy"
    out = Path(output)
    occupied = out.is_file() or (out.is_dir() and any(out.iterdir()))
    if occupied and not overwrite:
        raise ExportError(f"--output {str(out)!r} exists and is not empty; pass --overwrite to replace it, or "
                          "choose another --output")
    try:
        prepare_output_dir(out.parent if str(out.parent) else Path("."), field="output")
    except ValueError as e:
        raise ExportError(str(e)) from None
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export-"))
    try:
        if (source / "adapter_config.json").is_file():
            merge_adapters(Path(run_dir), source, tmp)
        else:
            shutil.copytree(source, tmp, dirs_exist_ok=True)
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def merge_adapters(run_dir: Path, source: Path, out: Path) -> None:
    """A LoRA run's policy with its adapters merged into the weights (W + (alpha/r)·B·A), written to
    ``out``: the base model is rebuilt from the run's config.yaml (model.policy), checked against the
    fingerprint the checkpoint recorded, then peft loads the adapters and merges them."""
    from peft import PeftModel

    from ..config.io import load_yaml
    from ..config.train import TrainConfig
    from ..models import lora
    from ..models.hf_compat import load_tokenizer
    from ..runtime.errors import ConfigError
    from ..trainer import roles
    from ..trainer.checkpoint.state import read_trainer_state

    try:
        cfg = load_yaml(run_dir / "config.yaml", TrainConfig)
    except (OSError, ConfigError) as e:
        raise ExportError(f"{run_dir}/config.yaml is needed to rebuild the base model under the LoRA adapters: "
                          f"{e}") from None
    tokenizer = load_tokenizer(str(source))
    base = roles.build_policy(cfg, tokenizer)
    model = PeftModel.from_pretrained(base, str(source))
    saved = read_trainer_state(source.parent / "trainer_state.pt")
    fingerprint = (saved.get("lora_base") or {}).get("policy")
    now = lora.base_fingerprint(model.base_model.model.state_dict())
    if fingerprint is not None and not lora.same_base(now, fingerprint):
        raise ExportError(f"the base model {cfg.model.policy!r} of {run_dir}/config.yaml is not the one the "
                          "adapters were trained on (its weights changed); export with the original model")
    merged = model.merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def export_command(argv: list[str]) -> Path:
    p = ArgumentParser(prog="ppo-lm export", description="A run's trained policy as a standalone model directory "
                       "(loads with AutoModelForCausalLM / AutoTokenizer.from_pretrained).")
    p.add_argument("run_dir", help="a train run's OUTPUT_DIR")
    p.add_argument("--output", required=True, help="the directory to write")
    p.add_argument("--iteration", type=int, default=None, help="the checkpoint to export (default: the newest intact)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output")
    a = p.parse_args(argv)
    out = export_policy(a.run_dir, a.output, a.iteration, overwrite=a.overwrite)
    print(out, flush=True)
    return out


def cmd_export(argv: list[str]) -> int:
    from .main import _run

    return _run(lambda: export_command(argv))

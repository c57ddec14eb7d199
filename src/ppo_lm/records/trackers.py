"""Experiment trackers (`log.report_to`): TensorBoard, Weights & Biases, MLflow and Trackio, each
mirroring the rows of metrics.jsonl — which stays the record — to its own store.

Every tracker is configured by its own environment variables as well, so a run goes wherever the user
has pointed that tool:

- ``tensorboard``: event files in OUTPUT_DIR/tensorboard (``tensorboard --logdir OUTPUT_DIR``); when
  TensorBoard is not installed, a one-time notice and metrics.jsonl only.
- ``wandb``: ``wandb.init(project=$WANDB_PROJECT or "ppo-lm", dir=OUTPUT_DIR)`` (``$WANDB_DIR`` when
  set); every other ``WANDB_*`` variable applies as usual, e.g. ``WANDB_MODE=offline`` (then
  ``wandb sync OUTPUT_DIR/wandb/offline-run-*``), ``WANDB_ENTITY``, ``WANDB_API_KEY``.
- ``mlflow``: the tracking URI of ``MLFLOW_TRACKING_URI`` (or ``mlflow.set_tracking_uri``); unset =
  ``sqlite:///OUTPUT_DIR/mlflow.db`` (MLflow's own default, ``sqlite:///mlflow.db``, kept with the run;
  ``mlflow ui --backend-store-uri sqlite:///OUTPUT_DIR/mlflow.db`` shows it). The experiment is
  ``$MLFLOW_EXPERIMENT_NAME`` (or ``$MLFLOW_EXPERIMENT_ID``), else "ppo-lm"; the run's settings are its
  params (flattened, ``model.policy``; values cut to MLflow's length limit). A ``file:`` store needs
  ``MLFLOW_ALLOW_FILE_STORE=true`` on MLflow 3 and cannot hold both ``score`` and ``score/<name>``
  (one would be a file and a directory), so there '/' in metric names is written as '.'; characters
  MLflow refuses in a name are written as '_'.
- ``trackio``: its local mode — a SQLite database per project under ``$TRACKIO_DIR`` (default
  ``$HF_HOME/trackio``; ``trackio show`` opens the dashboard), project ``$TRACKIO_PROJECT`` or
  "ppo-lm"; ``TRACKIO_SPACE_ID`` / ``TRACKIO_SERVER_URL`` send it elsewhere, as trackio documents.

The run's name (``log.run_name``, default the output directory's name) names the run in each. A
resumed run continues the same tracker runs: their ids are kept in OUTPUT_DIR/trackers.json. The
iterations it logs again (those after its checkpoint) replace the earlier ones in TensorBoard, are
dropped by W&B (steps must increase) and added once more in MLflow and Trackio.

Values that are NaN or infinite are left out of every tracker (metrics.jsonl writes them as null). A
tracker that fails while logging is reported once and left out for the rest of the run; one that fails
to start fails the run before its first iteration.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import posixpath
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from ..config.io import flatten
from ..runtime.errors import ConfigError
from ..runtime.files import atomic_write_text

STATE_FILE = "trackers.json"
"""Under the output directory: each tracker's run id, so that a resumed run continues it."""

DEFAULT_PROJECT = "ppo-lm"

_PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow-skinny"), "trackio": ("trackio", "trackio")}
"""Tracker → (module it imports, the package that provides it)."""


class Tracker(Protocol):
    name: str

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """``metrics``: finite floats only."""

    def close(self, failed: bool = False) -> None:
        """``failed``: the run ends by an exception (marked so where the tracker records it)."""


# ---------------------------------------------------------------------------------------------- checks

def _install_hint(name: str) -> str:
    return f"pip install 'ppo-lm[{name}]' (or pip install {_PACKAGES[name][1]})"


def check_trackers(report_to: Iterable[str]) -> None:
    """Before any model loads: each tracker named in ``report_to`` (but TensorBoard, which is skipped
    with a notice when missing) imports, and MLflow's store can be opened. Raises :class:`ConfigError`."""
    for name in report_to:
        if name not in _PACKAGES:
            continue
        module = _PACKAGES[name][0]
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name not in (module, None) and not (e.name or "").startswith(module + "."):
                raise ConfigError(f"`log.report_to` names {name!r}, which fails to import ({e}); reinstall it: "
                                  f"{_install_hint(name)}") from None
            raise ConfigError(f"`log.report_to` names {name!r}, which is not installed: {_install_hint(name)}, "
                              f"or leave it out of `log.report_to`") from None
        except Exception as e:  # a broken install (e.g. a protobuf version it does not support)
            raise ConfigError(f"`log.report_to` names {name!r}, which fails to import ({type(e).__name__}: {e}); "
                              f"reinstall it: {_install_hint(name)}") from None
        if name == "mlflow":
            _check_mlflow_store(_mlflow_uri(None))


def _check_mlflow_store(uri: str) -> None:
    scheme = urlparse(uri).scheme
    if scheme == "sqlite" or scheme.startswith(("postgresql", "mysql", "mssql")):
        missing = [m for m in ("sqlalchemy", "alembic") if importlib.util.find_spec(m) is None]
        if missing:
            where = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else \
                "MLflow's local store (sqlite:///OUTPUT_DIR/mlflow.db, used while MLFLOW_TRACKING_URI is unset)"
            raise ConfigError(f"`log.report_to` names 'mlflow', and {where} needs {' and '.join(missing)}: "
                              f"{_install_hint('mlflow')}")
    elif _is_file_store(uri):
        import mlflow.environment_variables as env

        allow = getattr(env, "MLFLOW_ALLOW_FILE_STORE", None)
        if allow is not None and not allow.get():
            raise ConfigError(f"`log.report_to` names 'mlflow' with the file store MLFLOW_TRACKING_URI={uri}, which "
                              "this MLflow refuses unless MLFLOW_ALLOW_FILE_STORE=true; set that, or unset "
                              "MLFLOW_TRACKING_URI (a SQLite store in the output directory)")


# ---------------------------------------------------------------------------------------------- helpers

def _finite(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out[k] = f
    return out


def _is_file_store(uri: str) -> bool:
    if uri.startswith("databricks"):  # "databricks", "databricks-uc": no scheme, not a path
        return False
    scheme = urlparse(uri).scheme
    return scheme == "file" or scheme == "" or len(scheme) == 1  # a path (a Windows drive letter too)


_MLFLOW_BAD_CHARS = re.compile(r"[^/\w.\- :]")


def _mlflow_key(key: str, file_store: bool) -> str:
    """A metric name MLflow accepts: characters it refuses (e.g. in a reward model's directory name,
    `score/<name>`) as '_'; '/' as '.' in a file store, and where the name is not a plain path."""
    key = _MLFLOW_BAD_CHARS.sub("_", key)
    if file_store or posixpath.normpath(key) != key:
        key = key.replace("/", ".")
    return key


def _mlflow_uri(output_dir: Path | None) -> str:
    """The tracking URI the user set (environment or ``mlflow.set_tracking_uri``), else a SQLite store
    in the output directory (``output_dir`` None: only its scheme matters)."""
    import mlflow

    set_ = getattr(mlflow, "is_tracking_uri_set", None)
    if set_ is not None and set_():
        return str(mlflow.get_tracking_uri())
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    path = (Path(output_dir) if output_dir is not None else Path("OUTPUT_DIR")).resolve() / "mlflow.db"
    return "sqlite:///" + path.as_posix()


# ---------------------------------------------------------------------------------------------- trackers

class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, output_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # ImportError without the tensorboard package

        self._writer_cls = SummaryWriter
        self.dir = output_dir / "tensorboard"
        self.writer = None

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.writer is None:  # opened at the first row: a resumed run hides the rows it logs again
            resumed = self.dir.is_dir() and any(self.dir.glob("events.out.tfevents.*"))
            self.writer = self._writer_cls(str(self.dir), purge_step=step if resumed else None)
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        if self.writer is not None:
            self.writer.close()


class WandbTracker:
    name = "wandb"

    def __init__(self, run_name: str, name_given: bool, output_dir: Path, config: dict | None, state: dict):
        import wandb

        kwargs: dict[str, Any] = {
            "project": os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            # an explicit log.run_name wins; else WANDB_NAME when set (wandb reads it), else the default
            "name": run_name if name_given or not os.environ.get("WANDB_NAME") else None,
            "config": config, "resume": "allow",
        }
        if state.get("id"):  # else WANDB_RUN_ID when set (wandb reads it), else a new id
            kwargs["id"] = state["id"]
        if not os.environ.get("WANDB_DIR"):
            kwargs["dir"] = str(output_dir)
        self.run = wandb.init(**kwargs)
        state["id"] = self.run.id

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class MlflowTracker:
    name = "mlflow"

    def __init__(self, run_name: str, output_dir: Path, config: dict | None, state: dict):
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        self.uri = _mlflow_uri(output_dir)
        _check_mlflow_store(self.uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.file_store = _is_file_store(self.uri)
        self.run_id = state.get("run_id") if state.get("tracking_uri") == self.uri else None
        if self.run_id:
            try:
                self.client.update_run(self.run_id, status="RUNNING")
            except MlflowException:  # deleted, or another store at the same URI
                self.run_id = None
        if not self.run_id:
            self.run_id = self.client.create_run(self._experiment_id(), run_name=run_name).info.run_id
        state.update(run_id=self.run_id, tracking_uri=self.uri)
        if config:
            self._log_params(config)

    def _experiment_id(self) -> str:
        if os.environ.get("MLFLOW_EXPERIMENT_ID"):
            return os.environ["MLFLOW_EXPERIMENT_ID"]
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        exp = self.client.get_experiment_by_name(name)
        return exp.experiment_id if exp is not None else self.client.create_experiment(name)

    def _log_params(self, config: dict) -> None:
        from mlflow.entities import Param
        from mlflow.utils import validation

        max_val = getattr(validation, "MAX_PARAM_VAL_LENGTH", 500)
        max_key = getattr(validation, "MAX_ENTITY_KEY_LENGTH", 250)
        per_batch = getattr(validation, "MAX_PARAMS_TAGS_PER_BATCH", 100)
        # a resumed run keeps the params it has (MLflow refuses to change one, e.g. `iterations`)
        have = self.client.get_run(self.run_id).data.params
        params = [Param(k[:max_key], ("None" if v is None else str(v))[:max_val])
                  for k, v in flatten(config).items() if k[:max_key] not in have]
        for i in range(0, len(params), per_batch):
            self.client.log_batch(self.run_id, params=params[i:i + per_batch])

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric
        from mlflow.utils import validation

        per_batch = getattr(validation, "MAX_METRICS_PER_BATCH", 1000)
        ms = int(time.time() * 1000)
        rows = [Metric(_mlflow_key(k, self.file_store), v, ms, step) for k, v in metrics.items()]
        for i in range(0, len(rows), per_batch):
            self.client.log_batch(self.run_id, metrics=rows[i:i + per_batch])

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class TrackioTracker:
    name = "trackio"

    def __init__(self, run_name: str, config: dict | None, state: dict):
        import trackio

        project = os.environ.get("TRACKIO_PROJECT") or DEFAULT_PROJECT
        resume = "allow" if state.get("name") == run_name and state.get("project") == project else "never"
        self.trackio = trackio
        self.run = trackio.init(project=project, name=run_name, config=config, resume=resume)
        state.update(project=project, name=run_name)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self, failed: bool = False) -> None:
        current = getattr(getattr(self.trackio, "context_vars", None), "current_run", None)
        if current is not None and current.get() is self.run:
            self.trackio.finish()  # also forgets it as the current run (or trackio finishes it again at exit)
        else:
            self.run.finish()


# ---------------------------------------------------------------------------------------------- all of them

class Trackers:
    """The trackers of one run: built together, each row sent to each, closed together."""

    def __init__(self, report_to: Iterable[str], run_name: str | None, output_dir: str | Path,
                 config: Mapping[str, Any] | None = None, *, tensorboard_missing: Callable[[], None] | None = None):
        """``tensorboard_missing``: called when 'tensorboard' is named but not installed (it is then
        skipped); MetricsLogger passes its one-time notice."""
        self.dir = Path(output_dir)
        self.run_name = run_name or self.dir.resolve().name
        self.state_path = self.dir / STATE_FILE
        state = self._read_state()
        config = dict(config) if config is not None else None
        self.trackers: list[Tracker] = []
        try:
            for name in dict.fromkeys(report_to):  # each once, in order
                if name == "tensorboard":
                    try:
                        self.trackers.append(TensorBoardTracker(self.dir))
                    except ImportError:
                        if tensorboard_missing is not None:
                            tensorboard_missing()
                    continue
                if name not in _PACKAGES:
                    raise ConfigError(f"`log.report_to`: unknown tracker {name!r}; choose from tensorboard, "
                                      f"{', '.join(_PACKAGES)}")
                check_trackers([name])
                s = state.setdefault(name, {})
                if name == "wandb":
                    self.trackers.append(WandbTracker(self.run_name, run_name is not None, self.dir, config, s))
                elif name == "mlflow":
                    self.trackers.append(MlflowTracker(self.run_name, self.dir, config, s))
                else:
                    self.trackers.append(TrackioTracker(self.run_name, config, s))
        except BaseException:
            self.close(failed=True)
            raise
        if any(t.name != "tensorboard" for t in self.trackers):
            atomic_write_text(self.state_path, json.dumps(state, indent=1) + "\n")

    def _read_state(self) -> dict:
        try:
            state = json.loads(self.state_path.read_text())
            return state if isinstance(state, dict) else {}
        except (OSError, ValueError):
            return {}

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        values = _finite(metrics)
        for t in list(self.trackers):
            try:
                t.log(step, values)
            except Exception as e:  # a mirror must not end the run: metrics.jsonl has the row
                self.trackers.remove(t)
                print(f"ppo-lm: warning: {t.name} failed to log iteration {step} ({type(e).__name__}: {e}); it is "
                      "left out for the rest of the run (metrics.jsonl keeps every row)", file=sys.stderr, flush=True)
                _close_quietly(t, failed=True)

    def close(self, failed: bool | None = None) -> None:
        """``failed`` None: whether an exception is propagating (close() called from a ``finally``)."""
        if failed is None:
            failed = sys.exc_info()[0] is not None
        trackers, self.trackers = self.trackers, []
        for t in trackers:
            _close_quietly(t, failed)


def _close_quietly(t: Tracker, failed: bool) -> None:
    try:
        t.close(failed)
    except Exception as e:
        print(f"ppo-lm: warning: closing {t.name} failed ({type(e).__name__}: {e})", file=sys.stderr, flush=True)

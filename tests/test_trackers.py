"""`log.report_to`: each tracker in its offline/local mode stores the values of metrics.jsonl (NaN/inf
left out), under the run's name, with the run's settings; a resumed run continues the same tracker
run; an unknown tracker, or one named but not installed, is a one-line error before any model loads."""

from __future__ import annotations

import glob
import importlib.util
import json
import math
import struct
import sys
import time

import pytest
from trainer_helpers import count_sevens, length_reward, tiny_config

from ppo_lm.records import trackers as trackers_mod
from ppo_lm.records.metrics_log import MetricsLogger
from ppo_lm.runtime.errors import ConfigError

ROWS = [  # iteration 0 (the eval before training), then two training iterations, one NaN value
    (0, {"eval_score": 0.25}),
    (1, {"score": 0.5, "score/sevens": 0.25, "value_loss": 1.5}),
    (2, {"score": 0.75, "score/sevens": 0.5, "value_loss": float("nan")}),
]
CONFIG = {"model": {"policy": "builtin", "reward": "a.py:fn"}, "algo": {"kl_coef": 0.05}, "iterations": 2,
          "data": {"prompts": "x" * 10_000}}


def _log_rows(out, report_to, rows=ROWS, **kw):
    logger = MetricsLogger(out, report_to=report_to, config=kw.pop("config", CONFIG), progress=False, **kw)
    for it, m in rows:
        logger.log(it, m)
    logger.close()
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _expected(jsonl, key):
    """{step: value} of one key in metrics.jsonl, nulls (NaN/inf) left out as the trackers leave them."""
    return {r["iteration"]: r[key] for r in jsonl if r.get(key) is not None}


def _check(jsonl, read):
    """``read(key)`` → {step: value} from the tracker, for a plain key and one with '/'."""
    assert jsonl[2]["value_loss"] is None  # metrics.jsonl writes the NaN as null ...
    for key in ("score", "score/sevens", "value_loss", "eval_score"):
        got = read(key)
        assert got == pytest.approx(_expected(jsonl, key)), key  # ... the trackers leave it out
    assert 2 not in read("value_loss")


# ------------------------------------------------------------------------------------------ tensorboard

def test_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    out.mkdir()
    jsonl = _log_rows(out, ["tensorboard"])
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    _check(jsonl, lambda key: {e.step: e.value for e in acc.Scalars(key)} if key in acc.Tags()["scalars"] else {})
    assert not (out / trackers_mod.STATE_FILE).exists()  # nothing to resume for TensorBoard


def test_tensorboard_resumed_run_replaces_the_iterations_it_logs_again(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_rows(tmp_path, ["tensorboard"], rows=[(1, {"score": 1.0}), (2, {"score": 2.0}), (3, {"score": 3.0})])
    _log_rows(tmp_path, ["tensorboard"], rows=[(3, {"score": 30.0}), (4, {"score": 40.0})])  # from checkpoint 2
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("score")] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_tensorboard_switch_and_empty_report_to(tmp_path):
    for kw in ({"report_to": ["tensorboard"], "tensorboard": False}, {"report_to": []}):
        logger = MetricsLogger(tmp_path, progress=False, **kw)
        assert logger.trackers.trackers == []
        logger.close()
    assert not (tmp_path / "tensorboard").exists()


# ------------------------------------------------------------------------------------------------ wandb

def _wandb_records(path):
    """The records of an offline run's .wandb file (a LevelDB-style log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf = open(path, "rb").read(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # padding to the end of a block
            pos += room
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            r = pb.Record()
            r.ParseFromString(buf)
            buf = b""
            yield r


def _wandb_run(out):
    (path,) = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    def read():
        try:
            records = list(_wandb_records(path))
        except Exception:  # cut mid-record
            return None
        return records if any(r.WhichOneof("record_type") == "exit" for r in records) else None

    for _ in range(100):  # wandb's service may still be writing the file when finish() returns
        records = read()
        if records is not None:
            break
        time.sleep(0.1)
    else:  # still not: stopping the service writes it out
        import wandb

        wandb.teardown()
        records = read() or []
    run, history, exit_code = None, {}, None
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run = r.run
        elif kind == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            history[row["_step"]] = row
        elif kind == "exit":
            exit_code = r.exit.exit_code
    return run, history, exit_code


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for var in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    for var, sub in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / sub))


def test_wandb_offline(tmp_path, wandb_offline):
    out = tmp_path / "my-run"
    out.mkdir()
    jsonl = _log_rows(out, ["wandb"])
    run, history, exit_code = _wandb_run(out)
    assert run is not None and exit_code == 0
    assert run.project == "ppo-lm" and run.display_name == "my-run"  # the output directory's name
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["model"]["reward"] == "a.py:fn" and config["algo"]["kl_coef"] == 0.05
    _check(jsonl, lambda key: {s: row[key] for s, row in history.items() if key in row})
    assert exit_code == 0
    assert json.loads((out / trackers_mod.STATE_FILE).read_text())["wandb"]["id"] == run.run_id


# ----------------------------------------------------------------------------------------------- mlflow

@pytest.fixture
def mlflow_env(monkeypatch):
    pytest.importorskip("mlflow")
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(var, raising=False)


def _mlflow_read(client, run_id, rename=lambda k: k):
    def read(key):
        return {m.step: m.value for m in client.get_metric_history(run_id, rename(key))}
    return read


def test_mlflow_local_sqlite_store_and_resume(tmp_path, mlflow_env):
    """Unset MLFLOW_TRACKING_URI: a SQLite store in the output directory. A resumed run (the same
    output directory) logs to the same MLflow run; one that raises is marked FAILED."""
    pytest.importorskip("sqlalchemy")
    from mlflow import MlflowClient

    out = tmp_path / "run"
    out.mkdir()
    jsonl = _log_rows(out, ["mlflow"], run_name="first try")
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ppo-lm").experiment_id])
    assert run.info.run_name == "first try" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["model.reward"] == "a.py:fn" and params["algo.kl_coef"] == "0.05"
    assert 0 < len(params["data.prompts"]) < 10_000  # cut to MLflow's limit
    _check(jsonl, _mlflow_read(client, run.info.run_id))

    with pytest.raises(RuntimeError):  # resumed: the same run, a changed setting does not clash
        logger = MetricsLogger(out, report_to=["mlflow"], config={**CONFIG, "iterations": 3}, progress=False)
        try:
            logger.log(3, {"score": 1.0})
            raise RuntimeError("the run fails")
        finally:
            logger.close()
    (again,) = client.search_runs([run.info.experiment_id])
    assert again.info.run_id == run.info.run_id and again.info.status == "FAILED"
    assert _mlflow_read(client, run.info.run_id)("score") == {1: 0.5, 2: 0.75, 3: 1.0}


def test_mlflow_file_store(tmp_path, mlflow_env, monkeypatch):
    """A file store (MLFLOW_TRACKING_URI=file://...) cannot hold `score` beside `score/sevens`: there
    '/' is written as '.'. MLflow 3 refuses a file store without MLFLOW_ALLOW_FILE_STORE: said before
    the run starts."""
    from mlflow import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "exp")
    import mlflow.environment_variables as env

    if hasattr(env, "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
        with pytest.raises(ConfigError, match="MLFLOW_ALLOW_FILE_STORE=true"):
            trackers_mod.check_trackers(["mlflow"])
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    trackers_mod.check_trackers(["mlflow"])
    out = tmp_path / "run"
    out.mkdir()
    jsonl = _log_rows(out, ["mlflow"])
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert run.info.run_name == "run"
    _check(jsonl, _mlflow_read(client, run.info.run_id, lambda k: k.replace("/", ".")))


# ---------------------------------------------------------------------------------------------- trackio

@pytest.fixture(scope="module")
def trackio_dir(tmp_path_factory):
    """trackio reads TRACKIO_DIR once, when imported: import it here, with a temporary directory."""
    if importlib.util.find_spec("trackio") is None:  # (importorskip would import it)
        pytest.skip("trackio is not installed")
    if "trackio" in sys.modules:
        d = sys.modules["trackio"].utils.TRACKIO_DIR
        if not str(d).startswith(str(tmp_path_factory.getbasetemp())):
            pytest.skip(f"trackio was imported before this module, with its directory {d}")
        return d
    d = tmp_path_factory.mktemp("trackio")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACKIO_DIR", str(d))
        import trackio

        assert trackio.utils.TRACKIO_DIR == d
    return d


def _trackio_read(project, run):
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs(project, run)

    def read(key):
        return {r["step"]: r[key] for r in logs if r.get(key) is not None}
    return read, SQLiteStorage.get_run_config(project, run)


def test_trackio_local(tmp_path, trackio_dir, monkeypatch):
    monkeypatch.delenv("TRACKIO_PROJECT", raising=False)
    for var in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "trackio-run"
    out.mkdir()
    jsonl = _log_rows(out, ["trackio"])
    assert (trackio_dir / "ppo-lm.db").is_file()
    read, config = _trackio_read("ppo-lm", "trackio-run")
    _check(jsonl, read)
    assert config["model"]["reward"] == "a.py:fn" and config["iterations"] == 2


# ------------------------------------------------------------------------------------------------ errors

def test_unknown_tracker_is_a_config_error(tmp_path):
    from ppo_lm.config.validate import validate_config

    with pytest.raises(ConfigError, match=r"`log.report_to`: unknown tracker\(s\) \['comet'\]"):
        validate_config(tiny_config(tmp_path, log__report_to=["tensorboard", "comet"]), 1)
    with pytest.raises(ConfigError, match="unknown tracker 'comet'"):
        MetricsLogger(tmp_path, report_to=["comet"], progress=False)


@pytest.mark.parametrize("name,package", [("wandb", "wandb"), ("mlflow", "mlflow-skinny"), ("trackio", "trackio")])
def test_named_tracker_not_installed_is_one_line(name, package, monkeypatch):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ModuleNotFoundError
    with pytest.raises(ConfigError) as e:
        trackers_mod.check_trackers(["tensorboard", name])
    msg = str(e.value)
    assert "\n" not in msg and "`log.report_to`" in msg and repr(name) in msg and "not installed" in msg
    assert f"pip install 'ppo-lm[{name}]'" in msg and f"pip install {package}" in msg


def test_mlflow_local_store_needs_sqlalchemy(monkeypatch, mlflow_env):
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    with pytest.raises(ConfigError, match=r"sqlalchemy.*pip install 'ppo-lm\[mlflow\]'"):
        trackers_mod.check_trackers(["mlflow"])




def test_missing_tracker_fails_before_any_model_loads(tmp_path, monkeypatch, capsys):
    from ppo_lm.trainer.ppo import PPOTrainer

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"`log.report_to` names 'wandb', which is not installed"):
        PPOTrainer(tiny_config(tmp_path / "run", log__report_to=["wandb"]), verifier=count_sevens)
    assert "policy" not in capsys.readouterr().out  # the banner (printed once models load) never came


def test_a_tracker_that_fails_to_log_is_dropped_with_a_warning(tmp_path, capsys):
    class Broken:
        name = "broken"
        closed = None

        def log(self, step, metrics):
            raise OSError("disk full")

        def close(self, failed=False):
            Broken.closed = failed

    logger = MetricsLogger(tmp_path, report_to=[], progress=False)
    logger.trackers.trackers.append(Broken())
    logger.log(1, {"score": 1.0})
    logger.log(2, {"score": 2.0})
    logger.close()
    err = capsys.readouterr().err
    assert err.count("broken failed to log iteration 1 (OSError: disk full)") == 1 and Broken.closed is True
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_mlflow_metric_names():
    assert trackers_mod._mlflow_key("score/rm@v2+x", False) == "score/rm_v2_x"
    assert trackers_mod._mlflow_key("score/sevens", True) == "score.sevens"
    assert trackers_mod._mlflow_key("a//b", False) == "a..b"
    assert not trackers_mod._is_file_store("databricks") and trackers_mod._is_file_store("./mlruns")


def test_flatten_and_finite():
    assert trackers_mod.flatten({"a": {"b": 1, "c": {"d": [1]}}, "e": {}}) == {"a.b": 1, "a.c.d": [1], "e": {}}
    assert trackers_mod._finite({"a": 1, "b": math.inf, "c": float("nan"), "d": "x"}) == {"a": 1.0}


# ------------------------------------------------------------------------------------- a training run



def test_a_training_run_reports_to_every_tracker(tmp_path, monkeypatch, wandb_offline, mlflow_env, trackio_dir):
    """The whole path: `log.report_to` and `log.run_name` of a tiny run, read back from each store."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("sqlalchemy")
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ppo_lm.trainer.ppo import PPOTrainer

    out = tmp_path / "run"
    cfg = tiny_config(out, iterations=2, log__report_to=["tensorboard", "wandb", "mlflow", "trackio"],
                      log__run_name="sevens-e2e", log__tensorboard=True)
    PPOTrainer(cfg, verifier=[count_sevens, length_reward]).train()  # two rewards: score/count_sevens too
    jsonl = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in jsonl] == [1, 2]
    keys = ["score", "ref_kl", "score/count_sevens"]

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    run, history, _ = _wandb_run(out)
    assert run.display_name == "sevens-e2e"
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (ml_run,) = client.search_runs([client.get_experiment_by_name("ppo-lm").experiment_id])
    assert ml_run.info.run_name == "sevens-e2e" and ml_run.data.params["iterations"] == "2"
    tio, _ = _trackio_read("ppo-lm", "sevens-e2e")
    for key in keys:
        want = _expected(jsonl, key)
        assert {e.step: e.value for e in acc.Scalars(key)} == pytest.approx(want), key
        assert {s: r[key] for s, r in history.items() if key in r} == pytest.approx(want), key
        assert _mlflow_read(client, ml_run.info.run_id)(key) == pytest.approx(want), key
        assert tio(key) == pytest.approx(want), key

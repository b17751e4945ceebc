"""The three trackers behind stabexp.tracking.Trackers, each through its own library:
torch.utils.tensorboard's SummaryWriter, MLflow's MlflowClient, and wandb. Each is built for
one run (a RunInfo), and takes `start(hyper-parameters)`, `scalars(step, values)`,
`finish(summary values, status, figures)` and `close()`."""

from __future__ import annotations

import os
import re
import secrets
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from stabexp.paths import outputs_dir


class Backend:
    """What the trackers share: the steps a resumed run must not log again."""

    name = ""
    run_id = None
    skip_until = -1  # steps up to this one are in the tracker already (a resumed run)

    def scalars(self, step: int, values: Dict[str, float]) -> None:
        if step > self.skip_until:
            self._log(step, values)
            self.last_step = step

    def _log(self, step: int, values: Dict[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _plain(value):
    """A hyper-parameter value every tracker takes: numbers, bools and strings as they are."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)


class TensorBoard(Backend):
    """Event files in <log dir>/<run folder name>/, the log dir one per sweep. A new run hides
    what an earlier run of the same folder wrote there (overwrite=true, or a restart before the
    first checkpoint); a resumed one what followed its checkpoint: TensorBoard's purge_step,
    which the resumed run then writes again."""

    name = "tensorboard"
    # summary.json fields the HParams dashboard shows beside the hyper-parameters
    HPARAM_METRICS = ("final_eval_loss", "best_eval_loss", "test_bleu", "diverged_at_step")

    def __init__(self, info, options):
        from torch.utils.tensorboard import SummaryWriter

        self.info, self.last_step = info, 0
        self.logdir = Path(options.dir) if options.dir else info.sweep_dir / "tensorboard"
        purge = info.checkpoint_step + 1 if info.resumed else 0
        self.writer = SummaryWriter(str(self.logdir / info.name), purge_step=purge)

    def start(self, params: Dict[str, object]) -> None:
        from torch.utils.tensorboard.summary import hparams

        experiment, start, end = hparams({k: _plain(v) for k, v in params.items()},
                                         {f"summary/{k}": 0.0 for k in self.HPARAM_METRICS})
        for summary in (experiment, start, end):
            self.writer.file_writer.add_summary(summary)
        text = "\n".join(f"    {k}: {v}" for k, v in params.items())  # indented: a code block in markdown
        self.writer.add_text("config", text, 0)

    def _log(self, step: int, values: Dict[str, float]) -> None:
        # One event holding every value of the step (what add_scalar writes one event per value
        # for): a 100-layer model's probe step is some 2,000 scalars.
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in values.items()])
        self.writer.file_writer.add_summary(summary, step)

    def finish(self, values: Dict[str, float], status, figures: List[Tuple[str, object]]) -> None:
        step = int(values.get("steps_done", self.last_step))
        for key, value in values.items():
            self.writer.add_scalar(f"summary/{key}", value, step)
        self.writer.add_text("summary/status", str(status), step)
        for name, fig in figures:
            self.writer.add_figure(f"figures/{name}", fig, step, close=False)

    def close(self) -> None:
        self.writer.close()


RUN_DIR_TAG = "stabexp.run_dir"
MLFLOW_STATUS = {"completed": "FINISHED", "diverged": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}


@contextmanager
def _exclusive(path: Optional[Path]):
    """An exclusive flock on `path` while the block runs (nothing when None)."""
    if path is None:
        yield
        return
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class Mlflow(Backend):
    """One MLflow run per run folder, in one experiment per sweep (its folder's name)."""

    name = "mlflow"
    BATCH = 1000  # metrics per log_batch call: MLflow's own limit
    PARAMS = 100  # params per call, likewise
    PARAM_LENGTH = 6000

    def __init__(self, info, options):
        self.info, self.last_step = info, 0
        uri = (options.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
               or f"sqlite:///{outputs_dir() / 'mlflow.db'}")
        # A database file keeps its experiments' artifacts (the figures) beside it, not in the
        # working directory's mlruns/ (MLflow's default).
        self.artifacts, lock_path = None, None
        if uri.startswith("sqlite:///"):
            database = Path(uri[len("sqlite:///"):])
            database.parent.mkdir(parents=True, exist_ok=True)
            self.artifacts = database.parent / "mlartifacts"
            lock_path = database.with_name(database.name + ".lock")
        # The jobs of a packed sweep start side by side: one at a time creates the database's
        # tables (MLflow's migrations race otherwise) and the experiment.
        with _exclusive(lock_path):
            self._open(uri, options, info)

    def _open(self, uri: str, options, info) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment = self._experiment(options.experiment or info.sweep)
        self.run_id = info.ids.get("mlflow")
        if self.run_id is not None:  # a resumed run continues its MLflow run
            self.client.update_run(self.run_id, status="RUNNING")
            self.skip_until = info.logged_until
        else:
            self._end_stale_runs(experiment, info)
            run = self.client.create_run(experiment, run_name=info.name,
                                         tags={RUN_DIR_TAG: str(info.out_dir), "stabexp.sweep_dir": str(info.sweep_dir)})
            self.run_id = run.info.run_id

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        where = str(self.artifacts / re.sub(r"[^A-Za-z0-9._-]", "_", name)) if self.artifacts else None
        try:
            return self.client.create_experiment(name, artifact_location=where)
        except Exception:  # another job of the sweep made it meanwhile
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _end_stale_runs(self, experiment: str, info) -> None:
        """A run of this folder that never finished (killed before its first checkpoint, or run
        again with overwrite=true) ends as KILLED: a new MLflow run starts."""
        folder = str(info.out_dir).replace("'", "\\'")
        for run in self.client.search_runs([experiment], f"tags.`{RUN_DIR_TAG}` = '{folder}' "
                                                         "and attributes.status = 'RUNNING'"):
            self.client.set_terminated(run.info.run_id, status="KILLED")

    def start(self, params: Dict[str, object]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], str(_plain(v))[:self.PARAM_LENGTH]) for k, v in params.items()]
        for i in range(0, len(items), self.PARAMS):
            self.client.log_batch(self.run_id, params=items[i:i + self.PARAMS])

    def _metrics(self, step: int, values: Dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(items), self.BATCH):
            self.client.log_batch(self.run_id, metrics=items[i:i + self.BATCH])

    _log = _metrics

    def finish(self, values: Dict[str, float], status, figures: List[Tuple[str, object]]) -> None:
        self._metrics(int(values.get("steps_done", self.last_step)), {f"summary/{k}": v for k, v in values.items()})
        self.client.set_tag(self.run_id, "status", str(status))
        for name, fig in figures:
            self.client.log_figure(self.run_id, fig, f"figures/{name}.png")
        self.client.set_terminated(self.run_id, status=MLFLOW_STATUS.get(status, "FINISHED"))


WANDB_HOST = ("api.wandb.ai", 443)


def wandb_mode(option) -> str:
    """logger.wandb.mode, else $WANDB_MODE, else online when W&B's service answers within 2 s and
    offline otherwise (a machine without network: `wandb sync` uploads the run later)."""
    if option:
        return option
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    try:
        socket.create_connection(WANDB_HOST, timeout=2).close()
        return "online"
    except OSError:
        return "offline"


class Wandb(Backend):
    """One W&B run per run folder, grouped by sweep; its id kept in the checkpoint."""

    name = "wandb"

    def __init__(self, info, options):
        import wandb

        self.info, self.last_step, self.wandb = info, 0, wandb
        self.run_id = info.ids.get("wandb") or secrets.token_hex(4)  # W&B ids: 8 of [a-z0-9]
        if info.ids.get("wandb"):
            self.skip_until = info.logged_until
        folder = Path(options.dir) if options.dir else info.sweep_dir
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=options.project, entity=options.entity, group=options.group or info.sweep,
                              name=info.name, id=self.run_id, resume="allow", dir=str(folder),
                              mode=wandb_mode(options.mode), settings=wandb.Settings(console="off"))

    def start(self, params: Dict[str, object]) -> None:
        self.run.config.update({k: _plain(v) for k, v in params.items()}, allow_val_change=True)

    def _log(self, step: int, values: Dict[str, float]) -> None:
        self.run.log(values, step=step)

    def finish(self, values: Dict[str, float], status, figures: List[Tuple[str, object]]) -> None:
        self.run.summary.update({**values, "status": str(status)})
        if figures:
            self.run.log({f"figures/{name}": self.wandb.Image(fig) for name, fig in figures}, step=self.last_step)

    def close(self) -> None:
        self.run.finish()


BACKENDS = {"tensorboard": TensorBoard, "mlflow": Mlflow, "wandb": Wandb}

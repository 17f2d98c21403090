"""The write job of one batch, submitted to a Spark cluster with the Spark provider's SparkSubmitHook.

Only the batch id travels on the command line, and the ledger URL (without its password) and
the secrets the ledger does not store in the environment (spark.write_job.secrets_environment); the
job reads everything else from the ledger. What the job needs besides pyspark goes with
the submission: the Kafka connector jars (`--jars`, unless `spark_conf` already names
them) and a zip of this package and of the transform's module (`--py-files`).

The Spark provider is optional (the `spark-submit` extra): without it this module fails to
import with a MissingExtraError naming the extra, and only a pipeline with `spark_conn_id`
imports it (operators/write_launch.py hands it to spark/launch/submit.py when the write task runs).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any, Sequence

from airflow_exactly_once.core.errors import ConfigurationError, MissingExtraError

try:
    from airflow.providers.apache.spark.hooks.spark_submit import DEFAULT_SPARK_BINARY, SparkSubmitHook
except ImportError as exc:
    if not (exc.name or "").startswith("airflow.providers.apache.spark"):
        raise  # the provider is there but broken: its own error says more
    raise MissingExtraError("spark_conn_id (the write on a Spark cluster, through SparkSubmitHook)",
                            "spark-submit", exc.name) from exc

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.spark.packages import Package, spark_home, with_connectors
from airflow_exactly_once.spark.parent_death import die_with_parent
from airflow_exactly_once.spark.shipping import build_bundle
from airflow_exactly_once.spark.write_job import secrets_environment

__all__ = ["WriteJobSubmitHook"]


def _join(*parts: str | None) -> str:
    return ",".join(p for p in parts if p)


class WriteJobSubmitHook(SparkSubmitHook):
    """A SparkSubmitHook for `airflow_exactly_once.spark.write_job`; `on_kill` is the provider's own."""

    def __init__(self, *, spark_conn_id: str, batch_id: BatchId, ledger_url: str, transform: str | None = None,
                 spark_conf: dict[str, Any] | None = None, config: PipelineConfig | None = None,
                 packages: Sequence[Package] = ()) -> None:
        conf = {k: str(v) for k, v in with_connectors(spark_conf or {}, packages).items()}
        master = conf.pop("spark.master", None)
        # --jars and --py-files replace spark.jars and spark.submit.pyFiles: merge, never drop the user's.
        user_jars = conf.pop("spark.jars", None)
        self.user_py_files = conf.pop("spark.submit.pyFiles", None)
        self.batch_id = batch_id
        self.ledger_url = ledger_url
        self.transform = transform
        super().__init__(conf=conf, conn_id=spark_conn_id, name=f"exactly-once {batch_id}",
                         jars=user_jars or None,
                         application_args=["--batch-id", str(batch_id)],
                         env_vars=secrets_environment(ledger_url, config))
        if master and master != self._connection["master"]:
            self.log.warning("spark_conf sets spark.master=%s; the %s connection's master %s is used instead",
                             master, spark_conn_id, self._connection["master"])
        self._check_deploy_mode()

    def _check_deploy_mode(self) -> None:
        if self._connection["deploy_mode"] != "cluster":
            # The driver runs here, in this interpreter (it has the package's dependencies); the
            # executors' Python workers too unless told otherwise (PYSPARK_PYTHON, spark_conf), as
            # PySpark wants the same Python release on both sides.
            self._conf.setdefault("spark.pyspark.driver.python", sys.executable)
            self._conf.setdefault("spark.pyspark.python", os.environ.get("PYSPARK_PYTHON", sys.executable))
            return
        if self._connection["master"].startswith("spark://"):
            raise ConfigurationError(
                "Spark standalone clusters cannot run Python applications in cluster deploy mode; set the "
                "connection's deploy-mode to client (the driver then runs on the Airflow worker)")
        if self.ledger_url.startswith("sqlite"):
            raise ConfigurationError(
                "in cluster deploy mode the Spark driver runs on the cluster and cannot open the embedded "
                "SQLite ledger; give the pipeline a PostgreSQL ledger (ledger_conn_id=...)")

    def _get_spark_binary_path(self) -> list[str]:
        binary = self._connection["spark_binary"]
        if binary == DEFAULT_SPARK_BINARY and shutil.which(binary) is None:
            return [str(spark_home() / "bin" / DEFAULT_SPARK_BINARY)]  # the one in the pyspark wheel
        return [binary]

    def submit_write(self) -> None:
        """Run the job until it ends; raises AirflowException when spark-submit fails.

        spark-submit gets SIGTERM if this process dies (even by SIGKILL), so no write job
        outlives the task that started it. It runs in the submission's temporary folder, so
        what a killed driver leaves in its working directory goes away with it.
        """
        with tempfile.TemporaryDirectory(prefix="exactly-once-submit-") as folder:
            bundle = build_bundle(folder, self.transform)
            self._py_files = _join(str(bundle.py_files), self.user_py_files)
            self.log.info("shipping %s to the driver and executors in %s", ", ".join(bundle.modules),
                          bundle.py_files.name)
            self.submit(str(bundle.launcher), preexec_fn=die_with_parent, cwd=folder)

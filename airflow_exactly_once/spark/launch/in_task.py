"""The write in the task's own process: a Spark driver of its own (local[*], or spark_conf's master)."""

from __future__ import annotations

from typing import Any, Callable

from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.spark.in_process_session import build_spark_session, stop_spark
from airflow_exactly_once.spark.launch.launcher import Stopwatch, WriteLauncher
from airflow_exactly_once.spark.packages import pipeline_packages
from airflow_exactly_once.spark.write_job import run_write
from airflow_exactly_once.spark.write_report import WriteReport


class InTaskWrite(WriteLauncher):
    """`start` starts the driver (a JVM per write task), `wait` runs the job in it and stops it."""

    def __init__(self, coordinator: BatchCoordinator, spark_conf: dict[str, Any] | None,
                 transform: str | Callable | None) -> None:
        self.coordinator = coordinator
        self.spark_conf = spark_conf
        self.transform = transform

    def start(self, batch_id: BatchId) -> None:
        self.batch_id = batch_id
        self.clock = Stopwatch()
        self.spark = build_spark_session(f"exactly-once {batch_id}", self.spark_conf,
                                         packages=pipeline_packages(self.coordinator.config))
        self.clock.session_ready()

    def wait(self) -> WriteReport:
        try:
            report = run_write(self.spark, self.coordinator, self.batch_id, transform=self.transform)
        finally:
            stop_spark(self.spark)
        report["seconds"] = self.clock.seconds()
        return report

    def cancel(self) -> None:
        """Nothing to do: the driver's JVM is a child of the task's process and ends with it."""

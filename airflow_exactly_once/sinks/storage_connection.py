"""A sink's `aws_conn_id` as S3 settings: read where a task runs (plan, the write's driver, notify_complete), never
on the executors, which get the resolved `S3Access` (this module imports Airflow's connection reader; s3_client
does not, so executors without Airflow can use it). A spec holds only the connection's id. Shared by the sinks
that write to object storage (Parquet, Iceberg)."""

from __future__ import annotations

from airflow_exactly_once.airflow_integration.connections import aws_connection_settings
from airflow_exactly_once.storage.s3_client import S3Access


def connection_access(conn_id: str | None, user: str) -> S3Access:
    """The Airflow `aws` connection `conn_id` as S3 settings; no connection: boto3's own credential chain. `user`
    names the sink in errors ("the parquet sink")."""
    return S3Access.from_settings(aws_connection_settings(conn_id, user)) if conn_id else S3Access()

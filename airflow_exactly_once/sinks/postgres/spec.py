"""The PostgreSQL sink's settings, declared once (docs table, unknown keys, dead-letter defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from airflow_exactly_once.core.declaration import SinkSpec, argument
from airflow_exactly_once.records.bad_records import DEAD_LETTER_PG_TYPES, DEAD_LETTER_SUFFIX

MODES = ("insert", "upsert")


@dataclass(kw_only=True)
class PostgresSpec(SinkSpec):
    type_name = "postgres"
    writer_class = "airflow_exactly_once.sinks.postgres.sink_writer:PostgresSinkWriter"
    committer_class = "airflow_exactly_once.sinks.postgres.sink_committer:PostgresSinkCommitter"

    conn_id: str | None = argument(None, "An Airflow `postgres` connection (host, port, login, password, schema = "
                                         "database; extras `sslmode`, `sslrootcert`, `options`, ... are passed to "
                                         "libpq); give exactly one of `conn_id` and `url`",
                                   shown_default="required (or `url`)")
    url: str | None = argument(None, "A URL `postgresql://user:password@host:5432/db` instead of `conn_id`; the ledger "
                                     "stores it without its password, so only the pipeline's tasks (which have the "
                                     "argument) can write; a connection also lets the CLI's rewind reach the table",
                               secret=True, shown_default="required (or `conn_id`)")
    table: str = argument(doc="`name` or `schema.name` (case-sensitive, as Spark's column names); it must exist: "
                              "the sink never creates tables, their types and keys are yours")
    mode: str = argument("insert", "`insert` (append), or `upsert` (`INSERT ... ON CONFLICT (key) DO UPDATE`)",
                         choices=MODES)
    key_columns: list[str] | None = argument(None, "upsert key: the columns of a unique index",
                                             shown_default="the primary key")
    order_by: list[str] | None = argument(None, "upsert: columns that order the rows of one key within a batch; the "
                                                "last one wins (e.g. `[\"offset\"]`). Without it, which of two rows of "
                                                "one key in the same batch wins is not defined")
    writers: int | None = argument(None, "Number of transactions (Spark partitions) per batch",
                                   shown_default="insert: the DataFrame's partitions; upsert: "
                                                 "`spark.sql.shuffle.partitions`")
    marker_schema: str = argument("public", "Schema of the marker table `airflow_exactly_once_markers` (created at "
                                            "plan time)")
    lock_timeout_ms: int = argument(60_000, "A writer waiting longer for a row lock fails instead of hanging")
    page_size: int = argument(1000, "Rows per INSERT statement a writer sends")
    transaction_name: str | None = argument(None, "Set by the pipeline for a dead-letter table (its transactions "
                                                  "never meet the output's), not by users",
                                            shown_default="the pipeline id")
    create_columns: dict[str, str] | None = argument(None, "Set by the pipeline for a dead-letter table: the "
                                                           "columns of the table the sink creates if it is missing")

    @classmethod
    def dead_letter_beside(cls, spec: Mapping[str, Any]) -> dict[str, Any]:
        """A `<table>_dead_letter` table in the output's database."""
        given = {key: spec[key] for key in ("type", "conn_id", "url", "marker_schema") if key in spec}
        return {**given, "table": f"{spec['table']}_dead_letter"}

    @classmethod
    def as_dead_letter(cls, given: dict[str, Any], pipeline_id: str, output: Mapping[str, Any]) -> dict[str, Any]:
        given.setdefault("transaction_name", pipeline_id + DEAD_LETTER_SUFFIX)
        given.setdefault("create_columns", DEAD_LETTER_PG_TYPES)
        return given

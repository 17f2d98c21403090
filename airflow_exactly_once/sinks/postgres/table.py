"""The table a PostgreSQL sink writes, on its server: the spec's settings, the server's URL, and what the
table looks like (its columns, its unique keys), as the sink's writer and committer both ask it.

Spec: {"type": "postgres", "conn_id": "<airflow postgres connection>" | "url": "<URL>",
       "table": "[schema.]name", "mode": "insert" | "upsert", "key_columns": [...],
       "order_by": [...], "marker_schema": "public", "writers": n, "lock_timeout_ms": 60000}

Set by the pipeline, not the user, for a dead-letter table (records.bad_records): "transaction_name"
(names its gids and markers instead of the pipeline id, so they never meet the output's) and
"create_columns" (creates the table if it is missing).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from airflow_exactly_once.core.errors import ConfigurationError, SinkError
from airflow_exactly_once.core.sink import column_names
from airflow_exactly_once.sinks.postgres import server
from airflow_exactly_once.sinks.postgres.errors import two_phase_error

_URL_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg")


def resolve_dsn(spec: dict[str, Any]) -> str:
    """The server URL of a sink spec: its `url`, or its Airflow `postgres` connection's."""
    if spec.get("url"):
        return str(spec["url"])
    from airflow_exactly_once.airflow_integration.connections import postgres_connection_url

    return postgres_connection_url(spec["conn_id"], "the postgres sink", "give the sink a 'url'")


def with_lock_timeout(dsn: str, lock_timeout_ms: int) -> str:
    """The URL with `-c lock_timeout=...` added, so a writer blocked by a lock fails instead of hanging."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    query["options"] = f"{query.get('options', '')} -c lock_timeout={int(lock_timeout_ms)}".strip()
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))  # libpq reads no '+'


class PostgresTable:
    """One sink spec's table and server; the server's URL is resolved (a connection looked up) when first used."""

    def __init__(self, spec: dict[str, Any]) -> None:
        if bool(spec.get("conn_id")) == bool(spec.get("url")):
            raise ConfigurationError(
                "the postgres sink needs exactly one of 'conn_id' (an Airflow postgres connection, recommended: "
                "the spec is stored in the ledger, a connection keeps the password out of it) or 'url' "
                "('postgresql://user@host:5432/db'), e.g. {'type': 'postgres', 'conn_id': 'postgres_default', "
                "'table': 'public.events'}")
        if spec.get("url") and urlsplit(str(spec["url"])).scheme not in _URL_SCHEMES:
            raise ConfigurationError(f"the postgres sink's url must start with postgresql://, not "
                                     f"{urlsplit(str(spec['url'])).scheme or spec['url']!r}://")
        if not isinstance(spec.get("table"), str) or not spec["table"]:
            raise ConfigurationError("the postgres sink needs a 'table' ('name' or 'schema.name'); create the "
                                     "table first: its types and keys are yours to choose")
        self.spec = spec
        self.table: str = spec["table"]
        self.mode: str = spec.get("mode", "insert")
        self.key_columns = column_names(spec.get("key_columns"), "the postgres sink's key_columns")
        self.order_by = column_names(spec.get("order_by"), "the postgres sink's order_by")
        self.marker_schema: str = spec.get("marker_schema", "public")
        self.writers: int | None = int(spec["writers"]) if spec.get("writers") else None
        self.lock_timeout_ms = int(spec.get("lock_timeout_ms", 60_000))
        self.page_size = int(spec.get("page_size", 1000))
        self.transaction_name: str | None = spec.get("transaction_name")
        self.create_columns: dict[str, str] = dict(spec.get("create_columns") or {})
        self._dsn: str | None = None

    @property
    def dsn(self) -> str:
        if self._dsn is None:
            self._dsn = resolve_dsn(self.spec)
        return self._dsn

    def create_if_missing(self) -> None:
        """A dead-letter table is the pipeline's to create; an output table never is."""
        if self.create_columns:
            server.create_table_if_missing(self.dsn, self.table, self.create_columns)

    def query(self, statement: str, params: tuple = ()) -> list[tuple]:
        return server.query(self.dsn, statement, params)

    def columns(self) -> list[str]:
        rows = self.query(
            "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 "
            "AND NOT a.attisdropped ORDER BY a.attnum", (self.regclass(),))
        if not rows:
            exists = self.query("SELECT to_regclass(%s) IS NOT NULL", (self.regclass(),))[0][0]
            if not exists:
                raise ConfigurationError(
                    f"table {self.table} does not exist in {server.describe_dsn(self.dsn)}; create it first (the sink "
                    "never creates tables: their column types and keys are yours to choose), or correct 'table'")
        return [r[0] for r in rows]

    def regclass(self) -> str:
        """The table name as to_regclass reads it: each part quoted, so case is kept."""
        return ".".join('"' + part.replace('"', '""') + '"' for part in self.table.split(".", 1))

    def writable_columns(self, columns: list[str]) -> list[str]:
        existing = self.columns()
        missing = [c for c in columns if c not in existing]
        if missing:
            folded = {c.lower(): c for c in existing}
            hints = [f"{c!r} -> {folded[c.lower()]!r}" for c in missing if c.lower() in folded]
            raise SinkError(
                f"the transform's output has column(s) {missing} that table {self.table} lacks (its columns: "
                f"{existing}). Fix: rename them in the transform (names are case-sensitive"
                f"{'; ' + ', '.join(hints) if hints else ''}), drop them, or add them to the table.")
        return columns

    def upsert_key(self) -> tuple[str, ...]:
        if self.mode != "upsert":
            return ()
        unique = self.query(
            "SELECT array_agg(a.attname ORDER BY a.attname) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL "
            "GROUP BY i.indexrelid, i.indisprimary ORDER BY i.indisprimary DESC", (self.regclass(),))
        keys = [tuple(r[0]) for r in unique]
        if not self.key_columns:
            if not keys:
                raise ConfigurationError(f"mode 'upsert' needs a primary key or unique index on {self.table}, or "
                                         "key_columns naming the columns of one")
            return keys[0]
        if tuple(sorted(self.key_columns)) not in keys:
            raise ConfigurationError(
                f"key_columns {list(self.key_columns)} are not the columns of a unique index of {self.table} "
                f"(unique keys: {[list(k) for k in keys] or 'none'}). Fix: CREATE UNIQUE INDEX ON {self.table} "
                f"({', '.join(self.key_columns)}), or name the columns of an existing one")
        return self.key_columns

    def free_slots(self) -> int:
        limit, used = self.query("SELECT current_setting('max_prepared_transactions')::int, "
                                 "(SELECT count(*) FROM pg_prepared_xacts)")[0]
        if limit <= 0:
            raise ConfigurationError(str(two_phase_error(server.describe_dsn(self.dsn), limit)))
        if limit - used < 1:
            raise SinkError(f"all {limit} prepared-transaction slots of {server.describe_dsn(self.dsn)} are in use; "
                            "commit or roll back the ones left behind (SELECT * FROM pg_prepared_xacts) or raise "
                            "max_prepared_transactions", retriable=True)
        return limit - used

"""psycopg2, the PostgreSQL sink's driver, imported in this one place: without the `postgres` extra, importing any
module of the sink that needs it names the extra to install."""

from __future__ import annotations

from airflow_exactly_once.core.errors import MissingExtraError

try:
    import psycopg2
    import psycopg2.errors
    import psycopg2.extensions
    import psycopg2.extras
    from psycopg2 import sql
except ModuleNotFoundError as exc:
    if exc.name != "psycopg2":
        raise
    raise MissingExtraError("the PostgreSQL sink", "postgres", exc.name) from exc

__all__ = ["psycopg2", "sql"]

"""Where a pipeline's Spark Connect server is: a `spark_connect` connection, or `spark.remote` in spark_conf.

The Spark provider's `spark_connect` connection type: host (with or without `sc://`), port
(default 15002), extra `user_id`, `token`, `use_ssl`. Read here without needing the provider.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow_exactly_once.airflow_integration.compat import BaseHook
from airflow_exactly_once.core.errors import ConfigurationError

CONN_TYPE = "spark_connect"
DEFAULT_PORT = 15002


def connection_url(conn: Any) -> str:
    """The `sc://` URL of a `spark_connect` connection."""
    host = (conn.host or "").strip()
    if host.startswith("sc://"):
        host = host[len("sc://"):]
    if not host:
        raise ConfigurationError(f"the spark_connect connection {conn.conn_id!r} has no host")
    host = host.rstrip("/")
    if ":" not in host:
        host = f"{host}:{conn.port or DEFAULT_PORT}"
    extra = conn.extra_dejson
    params = [f"{key}={quote(str(extra[key]), safe='')}" for key in ("user_id", "token") if extra.get(key)]
    if extra.get("use_ssl"):
        params.append("use_ssl=true")
    return f"sc://{host}" + ("/;" + ";".join(params) if params else "")


def spark_connect_url(spark_conn_id: str | None, spark_conf: dict[str, Any] | None) -> str | None:
    """The server to write on, or None when the write runs in-process or is spark-submitted."""
    if spark_conn_id:
        try:
            conn = BaseHook.get_connection(spark_conn_id)
        except Exception as exc:
            raise ConfigurationError(f"the Spark connection {spark_conn_id!r} cannot be read ({exc}): create it "
                                     "(type spark for spark-submit, spark_connect for a Spark Connect server)") from exc
        return connection_url(conn) if conn.conn_type == CONN_TYPE else None
    remote = str((spark_conf or {}).get("spark.remote") or "")
    if remote and not remote.startswith("sc://"):
        raise ConfigurationError(f"spark.remote={remote!r} is not a Spark Connect URL: give 'sc://host:15002'")
    return remote or None

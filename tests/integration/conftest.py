"""Fixtures of the integration tier: one local Spark session for every test that needs one."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession with the Kafka connector (see SPARK_CONF_DIR in tests/conftest.py)."""
    from airflow_exactly_once.spark.session import build_spark_session, stop_spark

    session = build_spark_session("integration-tests", {"spark.master": "local[2]"})
    yield session
    stop_spark(session)

"""How the write reads its Observations' counts (spark.observed_counts.observed_records): through the Java map's own get on
classic PySpark (its Observation.get iterates the map into an exception at every read), as a dict on Spark
Connect, and None when Spark reported no count."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_exactly_once.spark.observed_counts import observed_records


class JavaMap:
    """A py4j JavaMap: only `get`, no iteration (iterating is what the write must not do)."""

    def __init__(self, values: dict) -> None:
        self.values = values

    def get(self, key: str):
        return self.values.get(key)

    def items(self):
        raise AssertionError("the Java map was iterated")


def classic(values: dict) -> SimpleNamespace:
    return SimpleNamespace(_jo=SimpleNamespace(getAsJava=lambda: JavaMap(values)))


@pytest.mark.parametrize("observation, expected", [
    (classic({"records": 1_000_000}), 1_000_000),
    (classic({}), None),
    (SimpleNamespace(get={"records": 7}), 7),  # Spark Connect's Observation: no _jo, get is a dict
    (SimpleNamespace(get={}), None),
])
def test_the_count_of_an_observation(observation, expected):
    assert observed_records(observation) == expected

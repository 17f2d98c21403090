"""The retry loop of optimistic table commits (Iceberg's and Delta's committers use it): pure logic, fakes."""

from __future__ import annotations

import pytest

from airflow_exactly_once.sinks import optimistic_commit
from airflow_exactly_once.core.errors import SinkError
from airflow_exactly_once.sinks.optimistic_commit import commit_with_retries


class Beaten(Exception):
    pass


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch):
    monkeypatch.setattr(optimistic_commit.time, "sleep", lambda _s: None)


def test_a_beaten_commit_reads_the_table_again_and_retries_until_it_wins():
    versions = iter(range(1, 100))
    tried: list[int] = []

    def step(version: int) -> str:
        tried.append(version)
        if version < 3:
            raise Beaten(f"version {version} is stale")
        return f"committed on {version}"

    assert commit_with_retries("publishing", lambda: next(versions), step, beaten=Beaten,
                               where="t") == "committed on 3"
    assert tried == [1, 2, 3]  # each try on a freshly loaded table


def test_commits_beaten_every_time_end_in_a_retriable_error_naming_the_table():
    def step(_table) -> None:
        raise Beaten("again")

    with pytest.raises(SinkError, match=r"publishing: other writers kept committing to main of db.t first") as error:
        commit_with_retries("publishing", lambda: None, step, beaten=Beaten, where="main of db.t", attempts=4)
    assert error.value.retriable


def test_other_failures_are_explained_or_raised_as_they_are_and_never_retried():
    calls = []

    def step(_table) -> None:
        calls.append(1)
        raise ConnectionError("catalog down")

    explained = SinkError("the catalog at X does not answer: start it", retriable=True)
    with pytest.raises(SinkError, match="does not answer") as error:
        commit_with_retries("publishing", lambda: None, step, beaten=Beaten, where="t", explain=lambda exc: explained)
    assert error.value.__cause__.args == ("catalog down",)
    with pytest.raises(ConnectionError):
        commit_with_retries("publishing", lambda: None, step, beaten=Beaten, where="t", explain=lambda exc: None)
    lost = SinkError("the staged files are gone", retriable=False)

    def lost_step(_table) -> None:
        raise lost

    with pytest.raises(SinkError) as error:  # the step's own SinkError is never passed to explain
        commit_with_retries("publishing", lambda: None, lost_step, beaten=Beaten, where="t",
                            explain=lambda exc: pytest.fail("explained"))
    assert error.value is lost and calls == [1, 1]

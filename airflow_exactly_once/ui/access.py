"""Who may see which pipeline: the rule of the ledger page, apart from Airflow so it can be read and tested alone.

A pipeline belongs to the DAGs that drive it: those its plan tasks recorded in the ledger,
else those whose runs (by run id) recorded its batches. A user sees a pipeline only when
Airflow's auth manager lets them read every one of those DAGs; a pipeline tied to no DAG
(filled by hand, or older than the recording) is shown only to users who may read all DAGs:
who may list DAGs and read each DAG Airflow knows.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping


def pipeline_dag_ids(pipelines: Iterable[str], recorded: Mapping[str, set[str]],
                     derived: Callable[[str], set[str]]) -> dict[str, set[str]]:
    """{pipeline: its DAG ids}: the recorded ones, else `derived(pipeline)` (through its run ids)."""
    return {p: set(recorded.get(p) or ()) or set(derived(p)) for p in pipelines}


def visible_pipelines(dags_of: Mapping[str, set[str]], readable_dags: set[str], reads_all_dags: bool) -> list[str]:
    """The pipelines a user may see, given the DAGs they may read (and whether they may read all DAGs)."""
    return sorted(p for p, dags in dags_of.items() if (dags <= readable_dags if dags else reads_all_dags))


def reads_every_dag(may_list_dags: bool, known_dags: set[str], readable_dags: set[str]) -> bool:
    """Whether a user may read all DAGs: list DAGs, and read each DAG Airflow knows (`known_dags`).

    Listing alone is not enough: `is_authorized_dag(method="GET")` without a DAG asks whether the
    user may list DAGs, which the FAB auth manager grants to anyone who may read a single DAG.
    """
    return may_list_dags and known_dags <= readable_dags

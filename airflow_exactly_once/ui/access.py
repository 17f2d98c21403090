"""Who may see which pipeline: the rule of the ledger page, apart from Airflow so it can be read and tested alone.

A pipeline belongs to the DAGs that drive it: those its plan tasks recorded in the ledger,
else those whose runs (by run id) recorded its batches. A user sees a pipeline only when
Airflow's auth manager lets them read every one of those DAGs; a pipeline tied to no DAG
(filled by hand, or older than the recording) is shown only to users who may read all DAGs.
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

"""Sinks other distributions add: their spec declarations, found through an entry point group.

A distribution registers a sink type by declaring its spec class (a core.declaration.SinkSpec) in the
group `airflow_exactly_once.sinks`, named by the sink type: `jsonl = "jsonl_sink.spec:JsonlSpec"`.
The group is read once, when a sink type is first looked up, from the installed distributions'
metadata; a spec is imported only when a pipeline uses its type, so a distribution whose sink cannot be
imported breaks the pipelines that use it, with an error naming it, and nothing else.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Mapping

from airflow_exactly_once.core.declaration import SinkSpec
from airflow_exactly_once.core.errors import ConfigurationError

ENTRY_POINT_GROUP = "airflow_exactly_once.sinks"
# How a clash names the package's own sinks.
BUILT_IN = "airflow-exactly-once (built in)"


def distribution_of(entry_point: EntryPoint) -> str:
    """The name of the distribution that declares `entry_point`, as pip knows it."""
    dist = getattr(entry_point, "dist", None)
    return str(getattr(dist, "name", None) or "an unnamed distribution")


class InstalledSinks:
    """The sink types declared in an entry point group: their names read once, each spec loaded once, when used."""

    def __init__(self, group: str = ENTRY_POINT_GROUP) -> None:
        self.group = group
        self._declared: dict[str, list[EntryPoint]] | None = None
        self._loaded: dict[str, type[SinkSpec]] = {}

    def declared(self) -> dict[str, list[EntryPoint]]:
        """Every declaring entry point by sink type (more than one: a clash), read from the metadata once."""
        if self._declared is None:
            found: dict[str, list[EntryPoint]] = {}
            for entry_point in entry_points(group=self.group):
                found.setdefault(entry_point.name, []).append(entry_point)
            self._declared = found
        return self._declared

    def names(self) -> list[str]:
        """The sink types other distributions declare (none of them imported)."""
        return sorted(self.declared())

    def forget(self) -> None:
        """Read the group again at the next look-up (a process that installed or removed a sink since)."""
        self._declared = None
        self._loaded.clear()

    def refuse_clash(self, name: str, built_in: Mapping[str, type[SinkSpec]]) -> None:
        """One sink type, one declaration: a type declared twice (by two distributions, or by one and this
        package) is an error naming both, never a silent choice between them."""
        declaring = [f"{distribution_of(e)} ({e.name} = {e.value})" for e in self.declared().get(name, [])]
        if name in built_in:
            declaring.insert(0, BUILT_IN)
        if len(declaring) > 1:
            raise ConfigurationError(
                f"the sink type {name!r} is declared more than once: by {' and by '.join(declaring)}; uninstall "
                f"one of them (pip uninstall <distribution>), or rename its entry point in the group "
                f"{self.group!r} (and its spec's type_name)")

    def spec(self, name: str) -> type[SinkSpec] | None:
        """The spec class a distribution declares for sink type `name`, imported now; None: none declares it.
        Call refuse_clash first."""
        if name in self._loaded:
            return self._loaded[name]
        declaring = self.declared().get(name)
        if not declaring:
            return None
        self._loaded[name] = self._load(declaring[0])
        return self._loaded[name]

    def _load(self, entry_point: EntryPoint) -> type[SinkSpec]:
        """Import the declared spec class; any failure is an error naming the distribution and what to do."""
        where = (f"the {entry_point.name!r} sink of the distribution {distribution_of(entry_point)} (entry point "
                 f"{entry_point.name} = {entry_point.value} in the group {self.group!r})")
        try:
            loaded = entry_point.load()
        except Exception as exc:  # anything its import raises: it is another distribution's code
            raise ConfigurationError(
                f"{where} cannot be loaded: {type(exc).__name__}: {exc}; install what it needs, or a release of "
                f"it that loads, or uninstall it (pip uninstall {distribution_of(entry_point)}) and use another "
                "sink type") from exc
        if not (isinstance(loaded, type) and issubclass(loaded, SinkSpec)):
            raise ConfigurationError(f"{where} names {loaded!r}, which is not a sink spec: the entry point must "
                                     "name a subclass of airflow_exactly_once.core.declaration.SinkSpec")
        if loaded.type_name != entry_point.name:
            raise ConfigurationError(f"{where} names {loaded.__name__}, whose type_name is {loaded.type_name!r}: "
                                     "make the entry point's name and the spec's type_name the same")
        return loaded

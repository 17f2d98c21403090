"""Every name of Airflow's SDK the package uses, imported here once, after a check of the Airflow release.

Names move between Airflow releases: Airflow 3.3 deprecates the exceptions in
`airflow.exceptions` for `airflow.sdk.exceptions`, which 3.1 does not have yet.
apache-airflow-providers-common-compat's `sdk` module picks the right home on each release,
as the official providers do, so hooks, operators, the task group and the assets import from
here and stay free of DeprecationWarnings on every supported release. The other Airflow
imports are not SDK names: the Spark provider (hooks/spark_submit.py, the optional extra),
Airflow's CLI definitions (cli/definition.py, read only by Airflow's own CLI) and the
api-server's own names that the ledger page needs (ui/plugin.py, ui/app.py: the plugin base
class, configuration, authentication, the DB session), which exist only where it runs.
`Stats`, Airflow's metrics layer (airflow_exactly_once.airflow_integration.metrics emits through it), comes from
common-compat too (`airflow.stats` on 3.1, the SDK's observability module on later releases).
`openlineage()` gives the OpenLineage provider's classes when the optional extra is installed.
Airflow's configuration (airflow.cfg and its AIRFLOW__SECTION__OPTION variables) is read here too,
one small function per value the package needs (`legacy_metric_names`, `configured_executors_setting`,
`config_flag`).

Below the floor (`AIRFLOW_FLOOR`) the task SDK lacks what the package needs (Airflow 3.0 has
no `airflow.sdk.BaseHook`), so importing this module there fails at once with the release to
install, instead of deep inside a DAG file.

The protocol core, the sinks' executor side and the Spark job never import this module: they
run where Airflow may not be installed (a spark-submitted driver, the executors).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import airflow

# setup.cfg's floor (tests/unit/test_provider_package.py keeps them equal): 3.1.0 and 3.1.1 do not start beside
# current structlog.
AIRFLOW_FLOOR = (3, 1, 2)


def airflow_release(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of an Airflow version string such as "3.1.8" or "3.2.0.dev0"."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise ImportError(f"cannot read an Airflow release from airflow.__version__={version!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def check_airflow_version(version: str) -> None:
    """Fail with the release to install when `version` is below the floor this package supports."""
    if airflow_release(version) < AIRFLOW_FLOOR:
        floor = ".".join(map(str, AIRFLOW_FLOOR))
        raise ImportError(
            f"airflow-exactly-once needs Apache Airflow >= {floor} (this is Airflow {version}): "
            f"upgrade with pip install 'apache-airflow>={floor},<4'")


check_airflow_version(airflow.__version__)

# After the check: below the floor some of these do not exist.
from airflow.providers.common.compat.sdk import (  # noqa: E402
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
    Asset,
    AssetAlias,
    BaseHook,
    BaseOperator,
    TaskGroup,
    mask_secret,
)
from airflow.sdk import AssetWatcher  # noqa: E402  (3.0+; not in common-compat's sdk map)

# Event-driven scheduling: an AssetWatcher's trigger must be a BaseEventTrigger (Airflow 3.0+). They live
# in airflow.triggers.base on every supported release (the SDK has no home for them yet).
from airflow.triggers.base import BaseEventTrigger, TriggerEvent  # noqa: E402

try:  # where the running release keeps Airflow's metrics layer (StatsD, OpenTelemetry, Datadog, as configured)
    from airflow.providers.common.compat.sdk import Stats  # noqa: E402
except ImportError:  # a common-compat release that does not map it yet: Airflow 3.1's own home
    from airflow.stats import Stats  # noqa: E402


def legacy_metric_names() -> bool:
    """Airflow's `[metrics] legacy_names_on`: whether metrics also go under names that carry their tags' values
    (releases after 3.1 have the option; 3.1 always sends both, so True)."""
    from airflow.configuration import conf

    return conf.getboolean("metrics", "legacy_names_on", fallback=True)


def configured_executors_setting() -> str:
    """Airflow's `[core] executor`: the executors tasks may run under, a comma-separated list, the default first."""
    from airflow.configuration import conf

    return conf.get("core", "executor", fallback="") or ""


def config_flag(section: str, option: str) -> bool:
    """A yes/no option of airflow.cfg (or its AIRFLOW__SECTION__OPTION variable); False when not set."""
    from airflow.configuration import conf

    return conf.getboolean(section, option, fallback=False)


def openlineage() -> SimpleNamespace | None:
    """The OpenLineage provider's OperatorLineage, the client's dataset and facet classes and attrs (its facets
    are attrs classes), or None when the
    [openlineage] extra is not installed. Imported on first use: only the OpenLineage listener asks (through the
    operators' get_openlineage_facets_on_* methods), and only in deployments where it is on."""
    try:
        import attr
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.generated.base import InputDataset, OutputDataset, RunFacet
        from openlineage.client.generated.input_statistics_input_dataset import InputStatisticsInputDatasetFacet
        from openlineage.client.generated.output_statistics_output_dataset import OutputStatisticsOutputDatasetFacet
    except ImportError:
        return None
    return SimpleNamespace(attr=attr, OperatorLineage=OperatorLineage, InputDataset=InputDataset,
                           OutputDataset=OutputDataset,
                           RunFacet=RunFacet, InputStatistics=InputStatisticsInputDatasetFacet,
                           OutputStatistics=OutputStatisticsOutputDatasetFacet)


__all__ = [
    "AIRFLOW_FLOOR",
    "AirflowException",
    "AirflowFailException",
    "AirflowSkipException",
    "Asset",
    "AssetAlias",
    "AssetWatcher",
    "BaseEventTrigger",
    "BaseHook",
    "BaseOperator",
    "Stats",
    "TaskGroup",
    "TriggerEvent",
    "airflow_release",
    "check_airflow_version",
    "config_flag",
    "configured_executors_setting",
    "legacy_metric_names",
    "mask_secret",
    "openlineage",
]

"""The format version on a committable's handles, the JSON the ledger keeps for a PREPARED batch.

A batch left PREPARED by one release is committed by the next one's recovery, so handles
outlive the code that wrote them. Each document carries the version of its format under
VERSION_KEY; a reader checks it before it reads a field. Handles from before formats were
numbered carry no version and are version 1 (read as such forever). Composite handles
(an output and its dead letters) carry one version per part: each part is stamped by its
own committable.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any, Mapping

from airflow_exactly_once.core.errors import HandlesVersionError

# "@" cannot start a Python identifier, so no committable field (nor "records", which the coordinator adds) uses it.
VERSION_KEY = "@version"
UNNUMBERED_VERSION = 1  # handles written before formats were numbered
DISTRIBUTION = "airflow-exactly-once"


def stamped(handles: Mapping[str, Any], version: int) -> dict[str, Any]:
    """`handles` with their format version, as the ledger stores them."""
    return {**handles, VERSION_KEY: version}


def format_version(handles: Mapping[str, Any], committable: str, newest: int) -> int:
    """The format version of `handles`, one that `committable` (its class name) reads: 1 to `newest`.

    Raises HandlesVersionError (not retriable) for a version it does not know: a newer release
    wrote the handles, and only that release (or a later one) can commit the batch.
    """
    version = handles.get(VERSION_KEY, UNNUMBERED_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or version < UNNUMBERED_VERSION:
        raise HandlesVersionError(
            f"the ledger holds {committable} handles with format version {version!r}, which no release writes: "
            f"the batch's handles were changed outside the provider; restore them from a backup of the ledger")
    if version > newest:
        raise HandlesVersionError(
            f"the ledger holds {committable} handles in format version {version}, written by a newer release of "
            f"{DISTRIBUTION}; this worker runs {_installed_release()}, which reads {_versions(newest)}. Upgrade "
            f"{DISTRIBUTION} on this worker to the release that wrote them (or a later one) and run the task again; "
            "the batch stays PREPARED until then")
    return version


def _installed_release() -> str:
    try:
        return f"release {metadata.version(DISTRIBUTION)}"
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "a release"


def _versions(newest: int) -> str:
    return "version 1 only" if newest == UNNUMBERED_VERSION else f"versions 1 to {newest}"

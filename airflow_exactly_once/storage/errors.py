"""What goes wrong between a sink and its object storage, each error saying what to change.

A bucket that does not exist and credentials the server refuses are configuration (not retried: a retry
meets the same answer); an endpoint that does not answer is retriable (a server restarting, a network
blip). They travel from executors to the driver as their base classes (core.errors).
"""

from __future__ import annotations

from airflow_exactly_once.core.errors import ConfigurationError, SinkError


class BucketNotFoundError(ConfigurationError):
    """The path's bucket does not exist at the endpoint."""


class StorageCredentialsError(ConfigurationError):
    """The server refused the credentials (unknown key, wrong secret, no permission), or none were found."""


class StorageUnreachableError(SinkError):
    """The endpoint did not answer; a retry may find it back."""

    retriable = True

"""How a secret is found, stored and kept out of text: the rules the declarations apply.

A field declared `secret=True` is a secret as a whole; a free-form property dict (Spark
settings, an Iceberg catalog's properties) is declared with a key pattern instead, so the
rule is written once on the field rather than as a list of known keys. A URL anywhere in a
spec that carries a password is a secret too. What the ledger keeps in a secret's place is
REDACTED, or the URL with only its password replaced (the host and user stay readable).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

# What the ledger (and every message) holds instead of a secret.
REDACTED = "***"
# Keys of free-form settings whose values are secrets: Spark's own `spark.redaction.regex` default
# ((?i)secret|password|token|access[.]key) that also takes `access-key` (Iceberg's S3 properties), and
# `credential` and an `Authorization` header (Iceberg's REST catalog: `credential`, `header.Authorization`).
SECRET_KEY_PATTERN = r"(?i)secret|password|token|access[.-]key|credential|authorization"
# The Spark session setting whose pattern Spark redacts settings by where it shows them per query (a SQL execution's
# changed settings on the UI's SQL tab, plans' options); Spark's default, "(?i)url", plus spark.redaction.regex, lets
# a catalog's `credential` and `header.Authorization` through.
SPARK_OPTIONS_REDACTION = "spark.sql.redaction.options.regex"
# scheme://user:password@host — the password part (group 2) of a URL with user info.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s'\"]*:)([^@/?#\s'\"]+)(@)")
# A Spark Connect URL's token parameter: sc://host:15002/;token=...
_URL_TOKEN = re.compile(r"(;token=)([^;\s'\"]+)", re.IGNORECASE)


def widened_options_redaction(current: str | None) -> str | None:
    """Spark's options-redaction pattern `current` widened to SECRET_KEY_PATTERN (None: it has it already), so that
    Spark's UI shows `***` for every setting this package takes for a secret."""
    current = current or "(?i)url"
    return None if SECRET_KEY_PATTERN in current else f"{current}|{SECRET_KEY_PATTERN}"


def url_password(value: Any) -> str | None:
    """The password of a URL with user info (`postgresql://user:pw@host/db`), or its Spark Connect token."""
    if not isinstance(value, str) or "://" not in value:
        return None
    match = _URL_PASSWORD.search(value) or _URL_TOKEN.search(value)
    return match.group(2) if match else None


def redacted_value(value: Any) -> Any:
    """What is stored or shown instead of the secret `value`: a URL keeps all but its password."""
    if url_password(value) is not None:
        return _URL_TOKEN.sub(rf"\g<1>{REDACTED}", _URL_PASSWORD.sub(rf"\g<1>{REDACTED}\g<3>", value))
    return REDACTED


def shown_url(url: str) -> str:
    """A URL as messages may show it: its password (or token) hidden, the rest kept (redacted_value hides a URL
    without one whole, as it does any secret)."""
    return redacted_value(url) if url_password(url) is not None else url


def is_redacted(value: Any) -> bool:
    """Whether `value` is already a stored form (nothing left to hide)."""
    return value == REDACTED or (isinstance(value, str) and "://" in value and redacted_value(value) == value)


def matching_key_paths(settings: Any, pattern: str) -> list[list[str]]:
    """Key paths in a (nested) dict whose key matches `pattern`: the declared rule of a free-form dict."""
    if not isinstance(settings, Mapping):
        return []
    found: list[list[str]] = []
    for key, value in settings.items():
        if re.search(pattern, str(key)) and value not in (None, ""):
            found.append([key])
        else:
            found += [[key, *path] for path in matching_key_paths(value, pattern)]
    return found


def url_paths(data: Any) -> list[list[str]]:
    """Key paths in a (nested) dict of string values that are URLs with a password (or a token)."""
    if not isinstance(data, Mapping):
        return []
    found: list[list[str]] = []
    for key, value in data.items():
        if url_password(value) is not None:
            found.append([key])
        else:
            found += [[key, *path] for path in url_paths(value)]
    return found


def secret_values(data: Any, paths: Iterable[list[str]]) -> list[str]:
    """The text of each secret at `paths` in `data`, as a masker must see it (a URL's password alone too)."""
    found = []
    for path in paths:
        value: Any = data
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if value in (None, "") or is_redacted(value):
            continue
        found.append(str(value))
        password = url_password(value)
        if password:
            found.append(password)
    return found


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` (an error, an event) without the given secret values and without any URL's password."""
    for secret in sorted({s for s in secrets if s and len(s) > 2}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return _URL_TOKEN.sub(rf"\g<1>{REDACTED}", _URL_PASSWORD.sub(rf"\g<1>{REDACTED}\g<3>", text))


def scrub_value(value: Any, secrets: Iterable[str] = ()) -> Any:
    """scrub() over every string in a JSON-like value (what a task returns as its XCom)."""
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, Mapping):
        return {k: scrub_value(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_value(v, secrets) for v in value]
    return value

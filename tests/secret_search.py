"""Search stores for planted secrets: which secret was found where, with an excerpt that does not repeat it.

A test plants distinct markers (one per place a secret can be given), runs pipelines, then hands
`find_secrets` every store as (name, text or bytes) pairs made by the readers below: files
(bytes as written, so a SQLite file's free pages count too), every table of a SQLite or
PostgreSQL database, HTTP responses, command output. A marker is also looked for in the forms a
store may keep it in: percent-encoded, JSON-escaped, and base64 of it at any of the three byte
alignments.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import quote

Store = tuple[str, "str | bytes"]


@dataclass(frozen=True)
class Hit:
    place: str  # which secret (the marker's name)
    store: str  # where it was found: a file, a table and column, a response
    excerpt: str  # the text around it, every marker replaced by <place>

    def __str__(self) -> str:
        return f"secret {self.place!r} in {self.store}: ...{self.excerpt}..."


def _forms(marker: str) -> set[str]:
    """The marker as text stores may hold it."""
    forms = {marker, quote(marker, safe=""), json.dumps(marker)[1:-1]}
    raw = marker.encode()
    for shift in range(3):  # base64 of a longer text holds the marker's encoding at one of three alignments
        encoded = base64.b64encode(b"\0" * shift + raw).decode()
        # only the characters whose 6 bits all come from the marker's bytes
        forms.add(encoded[-(-8 * shift // 6):8 * (shift + len(raw)) // 6])
    return {f for f in forms if len(f) >= 16}


def find_secrets(markers: Mapping[str, str], stores: Iterable[Store], context: int = 70,
                 per_store: int = 2) -> list[Hit]:
    """Every place of `markers` ({place: secret}) found in `stores`, at most `per_store` hits per secret and store."""
    forms = {place: _forms(marker) for place, marker in markers.items()}
    hits = []
    for name, content in stores:
        text = content.decode("utf-8", errors="replace") if isinstance(content, bytes) else str(content)
        for place, variants in forms.items():
            found = 0
            for variant in variants:
                start = text.find(variant)
                while start >= 0 and found < per_store:
                    hits.append(Hit(place, name, _excerpt(text, start, len(variant), context, forms)))
                    found += 1
                    start = text.find(variant, start + len(variant))
    return hits


def _excerpt(text: str, start: int, length: int, context: int, forms: Mapping[str, set[str]]) -> str:
    excerpt = text[max(0, start - context):start + length + context]
    for place, variants in forms.items():
        for variant in sorted(variants, key=len, reverse=True):
            excerpt = excerpt.replace(variant, f"<{place}>")
    return " ".join(excerpt.split())


def files(root: str | Path, label: str, skip_suffixes: tuple[str, ...] = ()) -> Iterator[Store]:
    """Every file under `root` (or `root` itself), as bytes; named `label/<relative path>`."""
    root = Path(root)
    paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    for path in paths:
        if path.name.endswith(skip_suffixes):
            continue
        try:
            data = path.read_bytes()
        except OSError:  # removed meanwhile
            continue
        yield f"{label}/{path.relative_to(root)}" if path != root else label, data


def _cell_text(value: Any) -> str:
    if isinstance(value, memoryview):
        value = value.tobytes()
    if isinstance(value, bytes):
        try:
            value = zlib.decompress(value)
        except zlib.error:
            pass
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def _columns(label: str, table: str, columns: list[str], rows: Iterable[tuple]) -> Iterator[Store]:
    cells: dict[str, list[str]] = {c: [] for c in columns}
    for row in rows:
        for column, value in zip(columns, row):
            cells[column].append(_cell_text(value))
    for column, texts in cells.items():
        yield f"{label} table {table} column {column}", "\n".join(texts)


def sqlite_tables(path: str | Path, label: str) -> Iterator[Store]:
    """Every column of every table of a SQLite file, as text (compressed blobs inflated), read-only."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)
    try:
        tables = [r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            cursor = connection.execute(f'SELECT * FROM "{table}"')
            yield from _columns(label, table, [d[0] for d in cursor.description], cursor.fetchall())
    finally:
        connection.close()


def postgres_tables(dsn: str, label: str) -> Iterator[Store]:
    """Every column of every table of a PostgreSQL database outside its system schemas, as text."""
    import psycopg2

    connection = psycopg2.connect(dsn)
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT table_schema, table_name FROM information_schema.tables WHERE table_type = "
                           "'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')")
            tables = cursor.fetchall()
            for schema, table in tables:
                cursor.execute(f'SELECT * FROM "{schema}"."{table}"')
                yield from _columns(label, f"{schema}.{table}", [d[0] for d in cursor.description], cursor.fetchall())
            # Prepared (two-phase) transactions the sink left: their ids are stored too.
            cursor.execute("SELECT gid FROM pg_prepared_xacts")
            yield f"{label} pg_prepared_xacts", "\n".join(r[0] for r in cursor.fetchall())
    finally:
        connection.close()

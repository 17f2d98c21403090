"""How the CLI prints: rows as a table or JSON, times and missing values, a batch as a dict."""

from __future__ import annotations

import argparse
import json
from typing import Any

from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.timestamps import iso
from airflow_exactly_once.core.topics import topics_of


def print_rows(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return
    if not rows:
        print("(none)")
        return
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in columns).rstrip())


def time_text(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if hasattr(value, "strftime") else dash(value)


def dash(value: Any) -> str:
    return "-" if value is None else str(value)


def batch_dict(batch: Batch, interval: tuple[int, int] | None) -> dict[str, Any]:
    return {"pipeline_id": batch.pipeline_id, "seq": batch.seq, "state": batch.state.value, "run_id": batch.run_id,
            "epoch": batch.epoch, "interval": [iso(interval[0]), iso(interval[1])] if interval else None,
            "topics": topics_of((r.topic, r.partition) for r in batch.ranges),
            "ranges": [r.as_dict() for r in batch.ranges],
            "input_records": batch.input_records, "output_records": batch.output_records,
            "handles": batch.handles, "details": batch.details, "error": batch.error,
            "created_at": time_text(batch.created_at), "updated_at": time_text(batch.updated_at)}

"""The demo's check of its Parquet-on-S3 output (devtools/demo.py verify_s3) against a real s3proxy: it counts only
what the committed batches' `_manifest/` entries list, as a reader that wants whole batches reads the folder."""

from __future__ import annotations

import io
import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq

from devtools import demo


def parquet(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def put_batch(client, prefix: str, n: int, ids: list[int], dead_keys: list[bytes]) -> None:
    """Batch n as the S3 Parquet sink leaves it: its files, then its manifest entries (output and dead letters)."""
    client.put_object(Bucket=demo.S3_BUCKET, Key=f"{prefix}/batch_seq={n}/part-0.parquet",
                      Body=parquet(pa.table({"id": ids})))
    client.put_object(Bucket=demo.S3_BUCKET, Key=f"{prefix}/_manifest/batch-{n}.json",
                      Body=json.dumps({"files": [f"batch_seq={n}/part-0.parquet"]}))
    client.put_object(Bucket=demo.S3_BUCKET, Key=f"{prefix}/_dead_letter/batch_seq={n}/part-0.parquet",
                      Body=parquet(pa.table({"key": dead_keys})))
    client.put_object(Bucket=demo.S3_BUCKET, Key=f"{prefix}/_dead_letter/_manifest/batch-{n}.json",
                      Body=json.dumps({"files": [f"batch_seq={n}/part-0.parquet"]}))


def test_the_demos_s3_check_counts_what_the_manifests_list_and_nothing_else(object_storage, unique):
    client = object_storage.client()
    if demo.S3_BUCKET not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        object_storage.create_bucket(demo.S3_BUCKET)
    prefix = f"demo-check-{unique}"
    put_batch(client, prefix, 1, [0, 1, 2], [b"bad-0"])
    # A file of a batch whose manifest entry is not there yet (a commit in flight): not counted.
    client.put_object(Bucket=demo.S3_BUCKET, Key=f"{prefix}/batch_seq=2/part-0.parquet",
                      Body=parquet(pa.table({"id": [3, 4]})))
    good_in, bad_in = Counter([0, 1, 2, 3, 4]), Counter([b"bad-0"])

    line, ok = demo.verify_s3(object_storage, prefix, good_in, bad_in)
    assert not ok and "out=3 dead_letters=1 duplicates=0 missing=2" in line, line

    put_batch(client, prefix, 2, [3, 4], [])
    line, ok = demo.verify_s3(object_storage, prefix, good_in, bad_in)
    assert ok and "in=6 out=5 dead_letters=1 duplicates=0 missing=0" in line, line

    put_batch(client, prefix, 3, [4], [])  # a batch that wrote id 4 again
    line, ok = demo.verify_s3(object_storage, prefix, good_in, bad_in)
    assert not ok and "duplicates=1 missing=0" in line, line

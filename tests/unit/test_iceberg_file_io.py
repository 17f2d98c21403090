"""The Iceberg sink's warehouse on object storage, as rules: the one set of Iceberg `s3.*` properties that Spark's
S3FileIO and pyiceberg's PyArrowFileIO both read, made from an Airflow `aws` connection when a client is built
(the spec keeps only the connection's id), the AWS SDK bundle for Spark, the variant, and placement."""

from __future__ import annotations

import json

import pytest

from airflow_exactly_once.airflow_integration.placement import local_folder_problems
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.sinks import spec_local_folders
from airflow_exactly_once.sinks.iceberg.catalog import CatalogSpec
from airflow_exactly_once.sinks.iceberg.file_io import (AWS_BUNDLE_PACKAGE, PYARROW_FILE_IO, S3_FILE_IO, access_of,
                                                        s3_properties)
from airflow_exactly_once.sinks.iceberg.sink_writer import IcebergSinkWriter
from airflow_exactly_once.sinks.iceberg.spec import IcebergSpec
from airflow_exactly_once.storage.errors import BucketNotFoundError, StorageCredentialsError
from airflow_exactly_once.storage.s3_client import S3Access

SECRET = "conn-s3cr3t"
PREFIX = "spark.sql.catalog.lake."


@pytest.fixture
def lake_connection(monkeypatch) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps(
        {"conn_type": "aws", "login": "AKIDLAKE", "password": SECRET,
         "extra": {"endpoint_url": "http://minio:9000", "region_name": "eu-west-1"}}))
    return "lake"


def spec(warehouse: str = "s3://bucket/wh", catalog: dict | None = None, **more) -> dict:
    return {"type": "iceberg", "table": "db.events", "warehouse": warehouse,
            "catalog": catalog or {"type": "postgres", "name": "lake", "url": "postgresql://u@db/cat"}, **more}


def test_one_access_gives_the_properties_both_file_ios_read():
    local = S3Access("http://127.0.0.1:9000", None, "AKID", "sk", "tok")
    assert s3_properties(local) == {"s3.endpoint": "http://127.0.0.1:9000", "s3.path-style-access": "true",
                                    "client.region": "us-east-1", "s3.access-key-id": "AKID",
                                    "s3.secret-access-key": "sk", "s3.session-token": "tok"}
    assert s3_properties(S3Access(region_name="eu-west-1")) == {"client.region": "eu-west-1"}  # AWS, default chain
    assert s3_properties(S3Access()) == {}
    virtual = S3Access("https://s3.example", "r", "k", "s", path_style=False)
    assert access_of(s3_properties(virtual)) == virtual  # the bucket check uses what the clients get


def test_the_connection_becomes_s3_properties_of_spark_and_pyiceberg_at_run_time(lake_connection):
    given = spec(aws_conn_id=lake_connection)
    catalog = CatalogSpec.from_spec(given)
    assert SECRET not in repr(catalog) + json.dumps(given)  # the spec (what the ledger keeps) holds only the id
    conf = catalog.spark_conf()
    assert conf[PREFIX + "io-impl"] == S3_FILE_IO
    expected = {"s3.endpoint": "http://minio:9000", "s3.path-style-access": "true", "client.region": "eu-west-1",
                "s3.access-key-id": "AKIDLAKE", "s3.secret-access-key": SECRET}
    assert {k[len(PREFIX):]: v for k, v in conf.items() if k[len(PREFIX):] in expected} == expected
    pyiceberg = catalog.client_properties("pyiceberg")
    assert pyiceberg == {**expected, "py-io-impl": PYARROW_FILE_IO}
    rest = CatalogSpec.from_spec(spec(catalog={"type": "rest", "uri": "http://cat:8181"}, aws_conn_id="lake"))
    assert rest.rest_properties("spark")["s3.secret-access-key"] == SECRET  # a REST catalog's clients too
    assert rest.rest_properties("spark")["io-impl"] == S3_FILE_IO


def test_the_specs_own_properties_win_but_credentials_live_in_one_place(lake_connection):
    properties = {"s3.endpoint": "http://other:9000", "s3.path-style-access": "false"}
    catalog = CatalogSpec.from_spec(spec(catalog={"type": "postgres", "url": "postgresql://u@db/c",
                                                  "properties": properties}, aws_conn_id="lake"))
    assert catalog.client_properties("spark")["s3.endpoint"] == "http://other:9000"
    assert catalog.client_properties("spark")["s3.path-style-access"] == "false"
    with pytest.raises(ConfigurationError, match="s3.secret-access-key.*keep them in the connection only") as err:
        CatalogSpec.from_spec(spec(catalog={"type": "postgres", "url": "postgresql://u@db/c",
                                            "properties": {"s3.secret-access-key": "inline-s3cr3t"}},
                                   aws_conn_id="lake"))
    assert "inline-s3cr3t" not in str(err.value)


def test_without_a_connection_the_given_properties_else_the_default_chain():
    alone = CatalogSpec.from_spec(spec())
    assert alone.client_properties("spark") == {"io-impl": S3_FILE_IO}  # the AWS SDK's own credentials
    given = CatalogSpec.from_spec(spec(catalog={"type": "postgres", "url": "postgresql://u@db/c",
                                                "properties": {"s3.access-key-id": "k", "s3.secret-access-key": "s"}}))
    assert given.client_properties("pyiceberg") == {"py-io-impl": PYARROW_FILE_IO, "s3.access-key-id": "k",
                                                    "s3.secret-access-key": "s"}
    assert CatalogSpec.from_spec(spec("/data/lake")).client_properties("spark") == {}  # a disk: no FileIO set


def test_spark_gets_the_aws_bundle_only_for_object_storage():
    assert AWS_BUNDLE_PACKAGE in IcebergSinkWriter(spec()).spark_packages()
    assert AWS_BUNDLE_PACKAGE.startswith("org.apache.iceberg:iceberg-aws-bundle:")
    assert AWS_BUNDLE_PACKAGE not in IcebergSinkWriter(spec("/data/lake")).spark_packages()


def test_the_variant_and_the_schemes():
    assert IcebergSpec.variant(spec()) == "s3" and IcebergSpec.variant(spec("s3a://b/wh")) == "s3"
    assert IcebergSpec.variant(spec("/data/lake")) is None
    rest = {"type": "rest", "uri": "http://cat:8181"}
    assert IcebergSpec.variant(spec("lake", rest)) is None  # a warehouse the REST catalog names
    with pytest.raises(ConfigurationError, match="gs:// is not supported for object storage; supported: s3://"):
        IcebergSpec.check_values(spec("gs://bucket/wh"))
    IcebergSpec.check_values(spec("gs-lake://main", rest))  # the REST server's own spelling passes through


def test_the_embedded_catalog_with_an_s3_warehouse_is_a_file_of_one_machine(monkeypatch, tmp_path):
    embedded = {"type": "embedded", "name": "lake"}
    with pytest.raises(ConfigurationError, match="give catalog 'path'"):
        CatalogSpec.from_spec(spec(catalog=embedded))
    given = spec(catalog={**embedded, "path": "/var/lib/cat.sqlite"})
    catalog = CatalogSpec.from_spec(given)
    assert catalog.client_properties("spark")["io-impl"] == S3_FILE_IO
    assert IcebergSpec.local_folders(given) == [("catalog path", "/var/lib/cat.sqlite")]
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    (problem,) = local_folder_problems(spec_local_folders(given))
    assert problem.startswith("sink catalog path '/var/lib/cat.sqlite' is a local path")
    assert local_folder_problems(spec_local_folders(spec())) == []  # a PostgreSQL catalog: safe on every worker


def test_storage_errors_from_spark_name_the_fix_and_are_not_retried():
    storage = CatalogSpec.from_spec(spec(aws_conn_id="lake")).storage
    assert storage is not None
    missing = storage.explain_spark_error("S3Exception: The specified bucket does not exist (Service: S3, Status "
                                          "Code: 404)", "db.events")
    assert isinstance(missing, BucketNotFoundError) and not missing.retriable
    assert "change the sink's warehouse" in str(missing)
    refused = storage.explain_spark_error("S3Exception: ... (Service: S3, Status Code: 403)", "db.events")
    assert isinstance(refused, StorageCredentialsError) and not refused.retriable
    assert "the aws connection 'lake'" in str(refused)
    assert storage.explain_spark_error("AnalysisException: something else", "db.events") is None

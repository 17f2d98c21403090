"""The Iceberg sink's REST catalog, without a server: the spec, the properties both clients get, its secrets, what
its failures mean, and the gateway's notion of a commit."""

from __future__ import annotations

import pytest
import requests
from pyiceberg.exceptions import CommitStateUnknownException, ForbiddenError, OAuthError, RESTError, UnauthorizedError

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError, SinkError
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks.iceberg.catalog import CatalogSpec
from airflow_exactly_once.sinks.iceberg.outcomes import CommitOutcomeUnknown
from airflow_exactly_once.sinks.iceberg.rest_client import failure
from airflow_exactly_once.sinks.iceberg.sink_writer import IcebergSinkWriter
from airflow_exactly_once.sinks.iceberg.spec import IcebergSpec
from devtools.iceberg_rest import catalog_environment
from devtools.rest_gateway import is_commit

SECRETS = ["cred-s3cr3t", "tok-s3cr3t", "Bearer hdr-s3cr3t", "s3-s3cr3t"]


def rest_spec(**catalog) -> dict:
    return {"type": "iceberg", "table": "db.orders", "warehouse": "lake",
            "catalog": {"type": "rest", "name": "cat", "uri": "https://catalog.example:8181/api/catalog", **catalog}}


def test_a_rest_catalogs_properties_reach_pyiceberg_and_spark_alike():
    catalog = CatalogSpec.from_spec(rest_spec(credential="client:cred-s3cr3t", headers={"X-Tenant": "analytics"},
                                              properties={"scope": "PRINCIPAL_ROLE:ALL",
                                                          "rest.client.socket-timeout-ms": "5000"}))
    expected = {"uri": "https://catalog.example:8181/api/catalog", "warehouse": "lake",
                "credential": "client:cred-s3cr3t", "header.X-Tenant": "analytics", "scope": "PRINCIPAL_ROLE:ALL",
                "rest.client.connection-timeout-ms": "10000", "rest.client.socket-timeout-ms": "5000"}
    assert catalog.rest_properties() == expected
    conf = catalog.spark_conf()
    assert conf["spark.sql.catalog.cat"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.cat.type"] == "rest" and conf["spark.sql.catalog.cat.cache-enabled"] == "false"
    assert {k[len("spark.sql.catalog.cat."):]: v for k, v in conf.items()
            if k.startswith("spark.sql.catalog.cat.") and k[len("spark.sql.catalog.cat."):] in expected} == expected
    assert catalog.jdbc_package() is None  # no JDBC driver for Spark to resolve
    assert IcebergSinkWriter(rest_spec()).spark_packages() == [IcebergSinkWriter(rest_spec()).spark_packages()[0]]


def test_the_warehouse_may_be_given_once_in_either_place_or_left_to_the_catalog():
    inside = {**rest_spec(warehouse="lake")}
    del inside["warehouse"]
    assert CatalogSpec.from_spec(inside).warehouse == "lake"
    none = {k: v for k, v in rest_spec().items() if k != "warehouse"}
    assert "warehouse" not in CatalogSpec.from_spec(none).rest_properties()
    with pytest.raises(ConfigurationError, match="differ"):
        CatalogSpec.from_spec(rest_spec(warehouse="other"))
    assert IcebergSpec.local_folders(rest_spec()) == []  # the catalog's warehouse, not a folder of this machine
    assert IcebergSpec.local_folders({"warehouse": "/data/lake"}) == [("warehouse", "/data/lake")]


@pytest.mark.parametrize("catalog, message", [
    ({"uri": None}, "exactly one of 'uri'"),
    ({"conn_id": "rest_catalog"}, "exactly one of 'uri'"),
    ({"uri": "thrift://metastore:9083"}, "http:// or https://"),
    ({"credential": "a:b", "token": "t"}, "not both"),
    ({"headers": ["X-Tenant: a"]}, "'headers' must be a dict"),
    ({"url": "http://x"}, r"not \['url'\].*'properties'"),
])
def test_a_rest_catalog_spec_that_cannot_work_is_refused_with_the_fix(catalog, message):
    spec = rest_spec(**catalog)
    spec["catalog"] = {k: v for k, v in spec["catalog"].items() if v is not None}
    with pytest.raises(ConfigurationError, match=message):
        CatalogSpec.from_spec(spec)


def test_a_rest_catalogs_secrets_stay_out_of_repr_messages_and_the_stored_config():
    spec = rest_spec(token="tok-s3cr3t", headers={"Authorization": "Bearer hdr-s3cr3t"},
                     properties={"s3.secret-access-key": "s3-s3cr3t"})
    catalog = CatalogSpec.from_spec(spec)
    shown = repr(catalog) + catalog.describe()
    assert not [s for s in SECRETS if s in shown] and "catalog.example" in catalog.describe()
    cfg = checked(PipelineConfig(pipeline_id="p", topics=["t"], sink=spec, bootstrap_servers="127.0.0.1:9092"))
    stored = cfg.to_stored_dict()
    assert not [s for s in SECRETS if s in repr(stored)]
    assert stored["sink"]["catalog"]["uri"] == spec["catalog"]["uri"]  # the rest stays readable
    assert {"tok-s3cr3t", "Bearer hdr-s3cr3t", "s3-s3cr3t"} <= set(cfg.secret_texts())
    assert PipelineConfig.from_dict(stored).with_secrets(cfg.secrets()).sink == cfg.sink


URI, TABLE = "http://catalog:8181", "db.orders"


@pytest.mark.parametrize("exc", [UnauthorizedError("bad token"), ForbiddenError("no grant"),
                                 OAuthError("invalid_client")])
def test_refused_credentials_are_not_retried_and_name_what_to_change(exc):
    error = failure(exc, uri=URI, warehouse="lake", committing="publishing batch p:1")
    assert isinstance(error, SinkError) and not error.retriable
    assert "refused the sink's credentials" in str(error) and "'token'" in str(error) and "'credential'" in str(error)


@pytest.mark.parametrize("exc", [CommitStateUnknownException("502"), requests.ConnectionError("reset"),
                                 requests.ReadTimeout("read timed out")])
def test_a_commit_without_an_answer_has_an_unknown_outcome_resolved_by_the_retry(exc):
    error = failure(exc, uri=URI, warehouse=None, table=TABLE, committing="publishing batch p:1")
    assert isinstance(error, CommitOutcomeUnknown) and error.retriable
    assert "outcome of the commit to table db.orders is unknown" in str(error)
    assert "nothing was deleted" in str(error) and "reads the table's snapshots" in str(error)


def test_outside_a_commit_no_answer_means_unreachable_and_a_refused_config_a_warehouse_not_served():
    unreachable = failure(requests.ConnectionError("refused"), uri=URI, warehouse=None)
    assert not isinstance(unreachable, CommitOutcomeUnknown) and unreachable.retriable and URI in str(unreachable)
    served = failure(RESTError("NoSuchWarehouseException: no"), uri=URI, warehouse="lake", connecting=True)
    assert isinstance(served, ConfigurationError) and "does not serve the warehouse 'lake'" in str(served)
    assert failure(ValueError("a bug"), uri=URI, warehouse=None, committing="x") is None  # not the catalog's: raised


def test_the_server_reads_catalog_properties_from_its_environment_and_the_gateway_knows_a_commit():
    assert catalog_environment({"uri": "jdbc:sqlite:/x", "rest.port": "1", "io-impl": "y"}) == {
        "CATALOG_URI": "jdbc:sqlite:/x", "CATALOG_REST_PORT": "1", "CATALOG_IO__IMPL": "y"}
    assert is_commit("POST", "/v1/namespaces/db/tables/t") and is_commit("POST", "/v1/pfx/namespaces/db/tables/t")
    assert is_commit("POST", "/v1/transactions/commit")
    assert not is_commit("POST", "/v1/namespaces/db/tables")  # create table
    assert not is_commit("POST", "/v1/namespaces/db/tables/t/metrics") and not is_commit("GET",
                                                                                       "/v1/namespaces/db/tables/t")


def test_an_airflow_connection_gives_the_uri_and_the_token_or_credential_at_run_time(monkeypatch):
    import json

    monkeypatch.setenv("AIRFLOW_CONN_REST_CATALOG", json.dumps(
        {"conn_type": "http", "host": "catalog", "port": 8181, "password": "tok-s3cr3t",
         "extra": {"headers": {"X-Tenant": "a"}, "properties": {"scope": "all"}}}))
    monkeypatch.setenv("AIRFLOW_CONN_REST_CLIENT", json.dumps(
        {"conn_type": "generic", "host": "https://catalog:8443/api", "login": "client", "password": "cred-s3cr3t"}))
    spec = rest_spec(uri=None, conn_id="rest_catalog")
    spec["catalog"].pop("uri")
    catalog = CatalogSpec.from_spec(spec)
    assert "tok-s3cr3t" not in repr(catalog) + catalog.describe()  # the spec holds the connection's id only
    assert catalog.rest_properties() == {"uri": "http://catalog:8181", "token": "tok-s3cr3t", "header.X-Tenant": "a",
                                         "scope": "all", "warehouse": "lake",
                                         "rest.client.connection-timeout-ms": "10000",
                                         "rest.client.socket-timeout-ms": "60000"}
    spec["catalog"]["conn_id"] = "rest_client"
    properties = CatalogSpec.from_spec(spec).rest_properties()
    assert properties["uri"] == "https://catalog:8443/api" and properties["credential"] == "client:cred-s3cr3t"

"""The sink contract runs every registered sink: one added to the registry without an adapter fails it."""

from __future__ import annotations

import pytest

from airflow_exactly_once.core.declaration import SinkSpec
from airflow_exactly_once.sinks import SPECS
from tests.integration import test_sink_contract as contract


def test_every_registered_sink_has_a_contract_adapter():
    assert contract.registered_sinks() == contract.contract_cases(list(SPECS))
    assert "parquet:s3" in contract.registered_sinks()  # a variant a declaration names runs the contract too
    for kind in contract.registered_sinks():
        assert contract.adapter_for(kind) is contract.ADAPTERS[kind]
    assert set(contract.ADAPTERS) <= set(contract.registered_sinks()), "an adapter of a sink no longer registered"
    assert {variant.sink_type for variant in contract.VARIANTS.values()} <= set(SPECS), "a variant of no sink"


def test_a_sink_registered_without_an_adapter_fails_the_contract(monkeypatch):
    class FakeSpec(SinkSpec):
        type_name = "fake"
        writer_class = "somewhere.fake:FakeSinkWriter"
        committer_class = "somewhere.fake:FakeSinkCommitter"

    monkeypatch.setitem(SPECS, "fake", FakeSpec)
    assert "fake" in contract.registered_sinks()  # the contract's scenarios run it...
    with pytest.raises(pytest.fail.Exception, match="'fake' sink is registered in SPECS .* has no adapter"):
        contract.adapter_for("fake")  # ...and fail on it
    with pytest.raises(pytest.fail.Exception):
        test_every_registered_sink_has_a_contract_adapter()


def test_a_variant_declared_without_an_adapter_fails_the_contract(monkeypatch):
    class GcsParquetSpec(SPECS["parquet"]):  # type: ignore[misc,valid-type]
        variant_classes = {**SPECS["parquet"].variant_classes, "gcs": ("somewhere:W", "somewhere:C")}

    monkeypatch.setitem(SPECS, "parquet", GcsParquetSpec)
    assert "parquet:gcs" in contract.registered_sinks()
    with pytest.raises(pytest.fail.Exception, match="'parquet:gcs' sink .* has no adapter"):
        contract.adapter_for("parquet:gcs")

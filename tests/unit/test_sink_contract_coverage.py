"""The sink contract runs every registered sink: one added to the registry without an adapter fails it."""

from __future__ import annotations

import pytest

from airflow_exactly_once.sinks import SINK_TYPES
from tests.integration import test_sink_contract as contract


def test_every_registered_sink_has_a_contract_adapter():
    assert contract.registered_sinks() == sorted(SINK_TYPES)
    for kind in contract.registered_sinks():
        assert contract.adapter_for(kind) is contract.ADAPTERS[kind]
    assert set(contract.ADAPTERS) <= set(SINK_TYPES), "an adapter of a sink that is no longer registered"


def test_a_sink_registered_without_an_adapter_fails_the_contract(monkeypatch):
    monkeypatch.setitem(SINK_TYPES, "fake", "somewhere.fake:FakeSink")
    assert "fake" in contract.registered_sinks()  # the contract's scenarios run it...
    with pytest.raises(pytest.fail.Exception, match="'fake' sink is registered in SINK_TYPES .* has no adapter"):
        contract.adapter_for("fake")  # ...and fail on it
    with pytest.raises(pytest.fail.Exception):
        test_every_registered_sink_has_a_contract_adapter()

"""Alias of airflow_exactly_once.airflow_integration.provider_info, the entry point an installed 0.1 metadata names."""

import sys

from airflow_exactly_once.airflow_integration import provider_info

sys.modules[__name__] = provider_info

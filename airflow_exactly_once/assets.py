"""Alias of airflow_exactly_once.airflow_integration.assets, the path DAGs written before 0.2 import."""

import sys

from airflow_exactly_once.airflow_integration import assets

sys.modules[__name__] = assets

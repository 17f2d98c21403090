"""Airflow names this package uses, imported in one place so that the Airflow versions it supports agree."""

from __future__ import annotations

from airflow.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from airflow.sdk import Asset, AssetAlias, BaseHook, BaseOperator, TaskGroup

__all__ = ["AirflowException", "AirflowFailException", "AirflowSkipException", "Asset", "AssetAlias", "BaseHook",
           "BaseOperator", "TaskGroup"]

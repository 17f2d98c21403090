"""What ties the package to Airflow: its compat layer, provider metadata, connections, Assets, lineage, metrics and
executors. Nothing here knows a sink: callers hand in what the sinks name (folders, datasets)."""

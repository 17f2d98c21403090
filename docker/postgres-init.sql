-- Four databases on the stack's PostgreSQL: Airflow's metadata, the exactly-once offset ledger (and the PostgreSQL
-- example's table), the Iceberg sink's JDBC catalog and the Schema Registry's schemas (devtools/docker_stack.py:
-- ICEBERG_CATALOG_DATABASE, SCHEMA_REGISTRY_DATABASE).
CREATE DATABASE airflow;
CREATE DATABASE exactly_once;
CREATE DATABASE iceberg_catalog;
CREATE DATABASE schema_registry;

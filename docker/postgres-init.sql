-- Three databases on the stack's PostgreSQL: Airflow's metadata, the exactly-once offset ledger and the Iceberg
-- sink's JDBC catalog (devtools/docker_stack.py: ICEBERG_CATALOG_DATABASE).
CREATE DATABASE airflow;
CREATE DATABASE exactly_once;
CREATE DATABASE iceberg_catalog;

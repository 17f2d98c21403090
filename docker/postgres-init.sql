-- Two databases on the stack's PostgreSQL: Airflow's metadata and the exactly-once offset ledger.
CREATE DATABASE airflow;
CREATE DATABASE exactly_once;

"""The ledger page in Airflow's UI: an Airflow plugin (a FastAPI app and a nav entry), read-only."""

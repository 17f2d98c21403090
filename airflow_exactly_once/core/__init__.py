"""The protocol core: ledger, batch states, planner and the sink interface.

Imports neither Airflow nor PySpark, so it can be reasoned about and unit-tested alone.
"""

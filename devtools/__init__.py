"""Real local services (Kafka, Spark jars, PostgreSQL) for tests, the demo and benchmarks.

Not used by pipelines in production: there, brokers and clusters are the user's own.
"""

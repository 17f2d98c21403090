"""Kafka as the source: client settings, access diagnostics, offsets and consumer groups."""

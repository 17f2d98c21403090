"""Kafka clients: settings, access diagnostics and which servers answer (the source and the Kafka sink share them),
and Kafka as the source: offsets, the local range read and consumer groups."""

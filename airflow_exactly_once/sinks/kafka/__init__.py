"""The Kafka sink: transactional writer, committable and committer (see sink.py)."""

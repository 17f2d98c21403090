"""The PostgreSQL sink: prepared transactions per partition, committed by notify_complete (see sink.py)."""

"""Apache Iceberg: a batch is a staged (write-audit-publish) snapshot, published to main by notify_complete."""

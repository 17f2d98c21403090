"""Read models of the ledger: the backlog (lag, waiting records, batches in flight), drift between the ledger and a
consumer group, and the tiling audit. The UI, the triggers, the CLI and the metrics read them; the protocol does not."""

"""The Parquet sink: batches staged under a folder and published with one atomic rename."""

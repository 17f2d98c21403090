"""Delta Lake: a batch is staged as Parquet files inside the table's folder and published by one Delta commit."""

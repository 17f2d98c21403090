"""The Parquet sink on object storage (s3://, s3a://): files staged as open multipart uploads, published by
completing them and writing the batch's manifest entry (the layout: sinks.parquet.s3.layout)."""

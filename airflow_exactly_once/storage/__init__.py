"""Object storage (S3 and S3-compatible servers) for the sinks that write files there: the client made from a
connection's settings, errors that say what to change, and multipart uploads left open until a commit.

Imports boto3 (the `s3` extra); core/ never imports this package (core.object_location parses paths).
"""

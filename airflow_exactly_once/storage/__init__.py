"""Object storage (S3 and S3-compatible servers) for the sinks that write files there: where an object lives
(`object_location`, pure parsing), the client made from a connection's settings, errors that say what to change, and
multipart uploads left open until a commit.

The client modules import boto3 (the `s3` extra); `object_location` does not, so a sink may parse a path without it.
"""

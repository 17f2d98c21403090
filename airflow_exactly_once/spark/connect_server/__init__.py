"""A Spark Connect server as the write task uses it: its session (opened, reused, released) and stopping the
operations an earlier attempt left running on it."""

"""The three ways a write task launches the write job: in the task, on a Spark Connect server, spark-submitted;
launcher.py is the interface they share."""

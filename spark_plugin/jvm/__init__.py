"""The JVM reader of format("rmq") (Java sources in src/, built into rmq-spark.jar by build.py)."""

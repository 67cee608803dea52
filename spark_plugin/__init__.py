"""rmq topics in Spark: RDDs by offset range and the Spark data source "rmq".

    import spark_plugin
    ranges = spark_plugin.offset_ranges("127.0.0.1:9876", "TopicA")
    rdd = spark_plugin.create_rdd(sc, "127.0.0.1:9876", "TopicA")
    spark_plugin.commit_offsets("127.0.0.1:9876", "G", rdd.offset_ranges)
    spark_plugin.save_to_topic(rdd, "127.0.0.1:9876", "TopicB")
    spark_plugin.register(spark)    # spark.read / readStream / write .format("rmq")

The JVM reader (columnar, pruned; built into the package when a JDK and pyspark were there):
    SparkSession.builder.config("spark.jars", spark_plugin.jar_path())...

Needs the `spark` extra (`pip install rmq[spark]`: pyspark, pyarrow).  pyspark is imported only by
the data source module (spark_plugin.datasource), on first use of `register`.
"""
from spark_plugin.offsets import DataLossError, OffsetRange, commit_offsets, offset_ranges
from spark_plugin.rdd import create_rdd, save_to_topic


def jar_path() -> str | None:
    """The path of rmq-spark.jar (the JVM reader of format("rmq")), None when it was not built."""
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm", "rmq-spark.jar")
    return path if os.path.exists(path) else None


def register(spark) -> None:
    """Register the Spark data source "rmq" with the session `spark` (the Python source; when the
    session has the jar, format("rmq") reads in the JVM and the Python source serves its writes
    and streaming reads as "rmq_python")."""
    from spark_plugin.datasource import register as _register
    _register(spark)


__all__ = ["OffsetRange", "DataLossError", "offset_ranges", "create_rdd", "commit_offsets", "save_to_topic",
           "register", "jar_path"]

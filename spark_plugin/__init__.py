"""rmq topics in Spark: RDDs by offset range and the Spark data source "rmq".

    import spark_plugin
    ranges = spark_plugin.offset_ranges("127.0.0.1:9876", "TopicA")
    rdd = spark_plugin.create_rdd(sc, "127.0.0.1:9876", "TopicA")
    spark_plugin.commit_offsets("127.0.0.1:9876", "G", rdd.offset_ranges)
    spark_plugin.save_to_topic(rdd, "127.0.0.1:9876", "TopicB")
    spark_plugin.register(spark)    # spark.read / readStream / write .format("rmq")

Needs the `spark` extra (`pip install rmq[spark]`: pyspark, pyarrow).  pyspark is imported only by
the data source module (spark_plugin.datasource), on first use of `register`.
"""
from spark_plugin.offsets import DataLossError, OffsetRange, commit_offsets, offset_ranges
from spark_plugin.rdd import create_rdd, save_to_topic


def register(spark) -> None:
    """Register the Spark data source "rmq" with the session `spark`."""
    from spark_plugin.datasource import register as _register
    _register(spark)


__all__ = ["OffsetRange", "DataLossError", "offset_ranges", "create_rdd", "commit_offsets", "save_to_topic",
           "register"]

"""Reads of format("rmq") in a Spark session of its own, as JSON on stdout: a session without
rmq-spark.jar, or a Spark Connect session (remote("local[2]")).  Each session of one process
shares one JVM, so the tests run this in a subprocess of their own:

    python -m tests.spark.fallback_read NAMESRV TOPIC READS_JSON [--connect]

READS_JSON: a list of {"options": {...}, "filter": SQL or null}; the output: {"session": the session class's
module, "jvm_reader": bool, "reads": [{"schema": DDL, "rows": [...]}]}, rows as comparable_rows
makes them."""
import json
import sys


def comparable(value):
    """A column value as JSON: bytes as hex, a map as sorted pairs, a timestamp in ISO form."""
    import datetime

    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return sorted([k, v] for k, v in value.items())
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return value


def comparable_rows(df) -> list:
    return sorted([comparable(v) for v in r] for r in df.collect())


def read_all(spark, namesrv, topic, reads) -> list:
    out = []
    for spec in reads:
        r = spark.read.format("rmq").option("namesrv", namesrv).option("topic", topic)
        for k, v in spec["options"].items():
            r = r.option(k, v)
        df = r.load()
        if spec.get("filter"):
            df = df.filter(spec["filter"])
        out.append({"schema": df.schema.simpleString(), "rows": comparable_rows(df)})
    return out


def main(argv) -> None:
    from spark_plugin.datasource import jvm_reader_loaded
    from tests.spark.conftest import spark_session

    namesrv, topic, reads = argv[0], argv[1], json.loads(argv[2])
    spark = spark_session("rmq-fallback", jar=False, remote="--connect" in argv)
    try:
        result = {"session": type(spark).__module__, "jvm_reader": jvm_reader_loaded(spark),
                  "reads": read_all(spark, namesrv, topic, reads)}
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])

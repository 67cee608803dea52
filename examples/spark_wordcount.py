"""Word count over a topic: produce a few thousand messages into an embedded rmq broker, read
them into a Spark DataFrame with the "rmq" data source, count the words, print the top ones.

    python examples/spark_wordcount.py [--messages 3000] [--store DIR]

Needs the spark extra (pip install 'rmq[spark]') and Java 17.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

WORDS = "broker queue topic offset commit pull push consumer producer message tag".split()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--store", default=None, help="store directory (default: a temporary one)")
    args = ap.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this interpreter
    import rmq_core
    from rmq_core import Message, Producer
    from pyspark.sql import SparkSession, functions as F

    import spark_plugin

    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp, rmq_core.standalone(store=args.store or tmp) as cluster:
        ns = cluster.tcp_namesrv  # Spark's executors are other processes: they reach the broker over TCP
        with Producer("WordCountProducer", namesrv=ns) as producer:
            lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(args.messages)]
            for i in range(0, len(lines), 500):
                producer.send_batch([Message("WordCountTopic", line) for line in lines[i:i + 500]])
        spark = (SparkSession.builder.master("local[2]").appName("rmq-wordcount")
                 .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            spark_plugin.register(spark)
            df = spark.read.format("rmq").option("namesrv", ns).option("topic", "WordCountTopic").load()
            counts = (df.select(F.explode(F.split(F.col("body").cast("string"), " ")).alias("word"))
                      .groupBy("word").count().orderBy(F.desc("count"), "word"))
            rows = counts.collect()
            print(f"{df.count()} messages, {sum(r['count'] for r in rows)} words")
            print(f"{'word':<10} {'count':>6}")
            for r in rows:
                print(f"{r['word']:<10} {r['count']:>6}")
            expected = {}
            for line in lines:
                for w in line.split():
                    expected[w] = expected.get(w, 0) + 1
            if {r["word"]: r["count"] for r in rows} != expected:
                print("MISMATCH: the counts differ from what was produced", file=sys.stderr)
                return 1
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

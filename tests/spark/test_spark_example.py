"""examples/spark_wordcount.py runs end to end in its own process (its embedded broker, its own
Spark session) and prints counts that match what it produced."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_wordcount.py"


@pytest.mark.slow  # (a Spark session of its own, ~20 s; the data source and RDD tests cover its steps by default)
def test_spark_wordcount_example(tmp_path):
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    out = subprocess.run([sys.executable, str(EXAMPLE), "--messages", "3000", "--store", str(tmp_path / "store")],
                         capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("3000 messages, ")
    words = {line.split()[0]: int(line.split()[1]) for line in lines[2:] if line.strip()}
    assert set(words) <= set("broker queue topic offset commit pull push consumer producer message tag".split())
    assert sum(words.values()) == int(lines[0].split(", ")[1].split()[0])

import os
import tests.bench.test_bench_simple_consumer as b
b.MODES = tuple(os.environ.get("MODES", "aio_16").split(","))
from tests.bench.test_bench_simple_consumer import test_simple_consume_interleaved, backlog  # noqa

"""Sends/s of two producers that differ in one setting (traced or not, signed for ACL or not),
measured in the same run: rounds of sync sends one at a time or async sends with many in flight,
and both producers' rounds taken turn about (a load drifting between tests hits both)."""
from __future__ import annotations

import statistics
import time

from rmq_core import Message


def send_round(p, mode: str, topic: str, n: int, in_flight: int, size: int = 128) -> None:
    """`n` sends of `size` bytes: sync one at a time, or async in rounds of `in_flight`."""
    body = b"x" * size
    if mode == "sync":
        for _ in range(n):
            p.send(Message(topic, body))
    else:
        for _ in range(n // in_flight):
            for f in [p.send_async(Message(topic, body)) for _ in range(in_flight)]:
                f.result(30)


def bench_rounds(benchmark, group: str, p, mode: str, topic: str, n: int, in_flight: int, rounds: int) -> None:
    benchmark.group = group
    benchmark.pedantic(send_round, args=(p, mode, topic, n, in_flight), rounds=rounds, iterations=1, warmup_rounds=1)
    benchmark.extra_info["records_per_s"] = n / benchmark.stats.stats.median


def interleaved(benchmark, group: str, producers: dict, mode: str, topic: str, n: int, in_flight: int,
                rounds: int) -> dict[str, float]:
    """Rounds of each producer in turn, the order turned each round; returns each one's sends/s
    (the median round, the first dropped as a warm-up).  extra_info gets each one's best round
    too (`<name>_best_per_s`): on a shared machine other work only ever slows a round down, so the
    best rounds compare the two with the least of it."""
    benchmark.group = group
    times: dict[str, list[float]] = {name: [] for name in producers}
    turns = [list(producers.items()), list(reversed(producers.items()))]
    rounds_run = [0]

    def run():
        # the order turns each round: what one producer leaves behind (a trace worker still
        # sending, a broker still flushing) falls on each side alike
        order = turns[rounds_run[0] % 2]
        rounds_run[0] += 1
        for name, p in order:
            t = time.perf_counter()
            send_round(p, mode, topic, n, in_flight)
            times[name].append(time.perf_counter() - t)

    benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update({f"{name}_best_per_s": n / min(t[1:] or t) for name, t in times.items()})
    return {name: n / statistics.median(t[1:] or t) for name, t in times.items()}

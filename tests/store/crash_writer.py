"""Child process for the crash tests: a SYNC_FLUSH writer that reports every acknowledged put.

    python -m tests.store.crash_writer STORE_DIR SEED START_SEQ [--batch] [--async]

Writes messages seq = START_SEQ, START_SEQ+1, ... to queues of topic CrashTopic forever (the
parent kills it with SIGKILL).  After a put *returns* PUT_OK it prints one line per record:
`seq queue_id queue_offset phys_offset size born_ts store_ts` and flushes stdout, so every line
the parent reads is a message the store acknowledged as durable.  With --async the store runs
ASYNC_FLUSH (batches are then encoded straight into reserved segment space): a SIGKILL does not
lose the page cache, so every acknowledged put must survive that too.
"""
from __future__ import annotations

import random
import sys

from tests.codec_oracle import encode_batch_items
from rmq_core.config import FlushDiskType, MessageStoreConfig
from rmq_core.store import DefaultMessageStore, MessageExtBatch, MessageExtBrokerInner, PutMessageStatus

TOPIC = "CrashTopic"
QUEUES = 4
SEGMENT = 64 * 1024
CQ_FILE = 20 * 64


def body_of(seq: int) -> bytes:
    rnd = random.Random(seq)
    return f"msg-{seq}-".encode() + bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 600)))


def properties_of(seq: int) -> dict[str, str]:
    return {"TAGS": f"tag{seq % 5}", "KEYS": f"key-{seq}", "SEQ": str(seq)}


def queue_of(seq: int) -> int:
    return seq % QUEUES


def config(store_dir: str, async_flush: bool = False) -> MessageStoreConfig:
    return MessageStoreConfig(
        store_path_root_dir=store_dir, mapped_file_size_commit_log=SEGMENT, mapped_file_size_consume_queue=CQ_FILE,
        flush_disk_type=FlushDiskType.ASYNC_FLUSH if async_flush else FlushDiskType.SYNC_FLUSH,
        message_index_enable=True, clean_resource_interval=3_600_000)


def main() -> None:
    store_dir, seed, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    batch = "--batch" in sys.argv
    rnd = random.Random(seed)
    out = sys.stdout
    with DefaultMessageStore(config(store_dir, "--async" in sys.argv)) as store:
        out.write("ready\n")
        out.flush()
        while True:
            if batch and rnd.random() < 0.3:
                n = rnd.randint(2, 6)
                seqs = list(range(seq, seq + n))
                # one batch goes to one queue: the queue of its first seq
                qid = queue_of(seq)
                body = encode_batch_items([(0, body_of(s), properties_of(s)) for s in seqs])
                r = store.put_messages(MessageExtBatch(TOPIC, qid, body, born_timestamp=1000 + seq))
                assert r.status is PutMessageStatus.PUT_OK, r
                a = r.append_result
                lines = []
                for i, s in enumerate(seqs):
                    size = store.commit_log.record_size_at(a.phys_offsets[i])
                    lines.append(f"{s} {qid} {a.queue_offsets[i]} {a.phys_offsets[i]} {size} {1000 + seq} "
                                 f"{a.store_timestamp} B\n")
                out.write("".join(lines))
                seq += n
            else:
                r = store.put_message(MessageExtBrokerInner(TOPIC, queue_of(seq), body_of(seq),
                                                            properties=properties_of(seq), born_timestamp=1000 + seq))
                assert r.status is PutMessageStatus.PUT_OK, r
                a = r.append_result
                out.write(f"{seq} {queue_of(seq)} {a.logics_offset} {a.wrote_offset} {a.wrote_bytes} {1000 + seq} "
                          f"{a.store_timestamp} S\n")
                seq += 1
            out.flush()


if __name__ == "__main__":
    main()

"""Queue allocation strategies (RocketMQ's AllocateMessageQueueStrategy family, plus `sticky`).

Every consumer of a group runs the same strategy on the same inputs (all queues of the topic,
all consumer ids of the group) and keeps the queues the strategy gives *it*; the strategy must
therefore be a pure function of its inputs.  RocketMQ's RebalanceImpl sorts both lists before the
call; we sort again here (Java's order: String.compareTo over UTF-16 code units, then queue id)
so a caller that forgets cannot make two consumers disagree.  For sorted inputs every RocketMQ
strategy below returns exactly what RocketMQ 4.9.7 returns.

Validation follows AbstractAllocateMessageQueueStrategy.check: an empty current id or an empty
queue/consumer list is a caller bug (IllegalArgumentError naming it); a current id that is not
in the consumer list gets an empty result and a log line (the consumer list is racy: the broker
may not have seen this consumer's heartbeat yet).
"""
from __future__ import annotations

import abc
import hashlib
import logging
from bisect import bisect_left
from functools import lru_cache
from typing import Callable, Iterable, Sequence

from rmq_core.errors import IllegalArgumentError
from rmq_core.message import MessageQueue

log = logging.getLogger("rmq.client.rebalance")


# --- ordering and validation ---------------------------------------------------------------------
def _java_key(s: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly like Java's String.compareTo (code units, not points).
    return s.encode("utf-16-be", "surrogatepass")


def java_sorted_queues(mqs: Iterable[MessageQueue]) -> list[MessageQueue]:
    """Queues in MessageQueue.compareTo order: topic, broker name, queue id."""
    return sorted(mqs, key=lambda mq: (_java_key(mq.topic), _java_key(mq.broker_name), mq.queue_id))


def java_sorted_ids(cids: Iterable[str]) -> list[str]:
    return sorted(cids, key=_java_key)


def java_queue_string(mq: MessageQueue) -> str:
    """Java's MessageQueue.toString (with the space after 'MessageQueue'): consistent_hash hashes it."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


def check_inputs(consumer_group: str, current_cid: str, mq_all, cid_all) -> bool:
    """RocketMQ's check(): raise on empty inputs, False (+ a log line) when current_cid is unknown."""
    if not current_cid:
        raise IllegalArgumentError(f"currentCID is empty (consumer group {consumer_group!r})")
    if not mq_all:
        raise IllegalArgumentError(f"mqAll is null or mqAll empty (consumer group {consumer_group!r})")
    if not cid_all:
        raise IllegalArgumentError(f"cidAll is null or cidAll empty (consumer group {consumer_group!r})")
    if current_cid not in cid_all:
        log.warning("[BUG] ConsumerGroup: %s The consumerId: %s not in cidAll: %s",
                    consumer_group, current_cid, list(cid_all))
        return False
    return True


class AllocateStrategy:
    """Base: validates and sorts, then `_allocate(group, cid, sorted mqs, sorted cids)`."""

    name = ""

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        if not check_inputs(consumer_group, current_cid, mq_all, cid_all):
            return []
        return self._allocate(consumer_group, current_cid, java_sorted_queues(set(mq_all)), java_sorted_ids(set(cid_all)))

    def _allocate(self, consumer_group: str, current_cid: str, mqs: list[MessageQueue],
                  cids: list[str]) -> list[MessageQueue]:
        """The strategy proper, on checked and sorted inputs (a strategy overrides this or `allocate`)."""
        raise TypeError(f"{type(self).__name__} overrides neither allocate() nor _allocate()")

    def __repr__(self) -> str:
        return f"<allocate strategy {self.name!r}>"


# --- RocketMQ's strategies ------------------------------------------------------------------------
class AllocateMessageQueueAveragely(AllocateStrategy):
    """Contiguous blocks: the first `Q mod N` consumers get one queue more (AllocateMessageQueueAveragely)."""

    name = "averagely"

    def _allocate(self, consumer_group, current_cid, mqs, cids):
        index, q, n = cids.index(current_cid), len(mqs), len(cids)
        mod = q % n
        if q <= n:
            size = 1
        else:
            size = q // n + 1 if mod > 0 and index < mod else q // n
        start = index * size if (mod > 0 and index < mod) else index * size + mod
        count = min(size, q - start)
        return [mqs[(start + i) % q] for i in range(max(count, 0))]


class AllocateMessageQueueAveragelyByCircle(AllocateStrategy):
    """Round-robin: consumer i gets queues i, i+N, i+2N, … (AllocateMessageQueueAveragelyByCircle)."""

    name = "by_circle"

    def _allocate(self, consumer_group, current_cid, mqs, cids):
        return mqs[cids.index(current_cid)::len(cids)]


def md5_hash(key: str) -> int:
    """ConsistentHashRouter's MD5Hash: the first 4 digest bytes as an unsigned 32-bit number."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


class AllocateMessageQueueConsistentHash(AllocateStrategy):
    """A hash ring with `virtual_node_count` virtual nodes per consumer (`<cid>-<i>`); each queue
    goes to the first virtual node at or after the hash of Java's MessageQueue.toString()
    (AllocateMessageQueueConsistentHash + ConsistentHashRouter, MD5 by default).

    Sizes are not balanced: that is the price of moving few queues when membership changes.
    """

    name = "consistent_hash"

    def __init__(self, virtual_node_count: int = 10, hash_function: Callable[[str], int] | None = None):
        if not isinstance(virtual_node_count, int) or virtual_node_count < 0:
            raise IllegalArgumentError(f"illegal virtualNodeCnt: {virtual_node_count!r}")
        self.virtual_node_count = virtual_node_count
        self.hash_function = hash_function or md5_hash

    def ring(self, cids: Sequence[str]) -> tuple[list[int], list[str]]:
        """(sorted hashes, owner per hash).  Like Java's TreeMap.put, a later virtual node whose
        hash collides with an earlier one replaces it."""
        points: dict[int, str] = {}
        for cid in cids:
            for i in range(self.virtual_node_count):
                points[self.hash_function(f"{cid}-{i}")] = cid
        hashes = sorted(points)
        return hashes, [points[h] for h in hashes]

    def _allocate(self, consumer_group, current_cid, mqs, cids):
        hashes, owners = self.ring(cids)
        if not hashes:
            return []
        result = []
        for mq in mqs:
            pos = bisect_left(hashes, self.hash_function(java_queue_string(mq)))
            if owners[pos if pos < len(hashes) else 0] == current_cid:
                result.append(mq)
        return result

    def __call__(self, virtual_node_count: int = 10, hash_function=None) -> "AllocateMessageQueueConsistentHash":
        """Factory: `get_allocate_strategy('consistent_hash')(virtual_node_count=20)`."""
        return type(self)(virtual_node_count, hash_function)


class AllocateMessageQueueByConfig(AllocateStrategy):
    """Always the configured queues, whatever the group looks like (AllocateMessageQueueByConfig).

    The registered instance has no queues; configure one with `with_queues([...])` or by calling
    it as a factory: `strategy(message_queues=[...])`."""

    name = "by_config"

    def __init__(self, message_queues: Iterable[MessageQueue] | None = None):
        queues = list(message_queues or [])
        for mq in queues:
            if not isinstance(mq, MessageQueue):
                raise IllegalArgumentError(f"by_config needs MessageQueue objects, got {mq!r}")
        self.message_queues = queues

    def with_queues(self, message_queues: Iterable[MessageQueue]) -> "AllocateMessageQueueByConfig":
        return type(self)(message_queues)

    def __call__(self, message_queues: Iterable[MessageQueue] | None = None) -> "AllocateMessageQueueByConfig":
        return type(self)(message_queues)

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        # RocketMQ returns the list as configured, with no checks at all.
        return list(self.message_queues)


class AllocateMessageQueueByMachineRoom(AllocateStrategy):
    """Only queues of brokers named `<idc>@<broker>` whose idc is in `consumer_idcs`, spread in
    blocks with the remainder dealt out one each (AllocateMessageQueueByMachineRoom).

    Note: like RocketMQ, this strategy does no input checks beyond "current_cid not in cid_all"."""

    name = "by_machine_room"

    def __init__(self, consumer_idcs: Iterable[str] | None = None):
        self.consumer_idcs = frozenset(consumer_idcs or ())

    def with_idcs(self, consumer_idcs: Iterable[str]) -> "AllocateMessageQueueByMachineRoom":
        return type(self)(consumer_idcs)

    def __call__(self, consumer_idcs: Iterable[str] | None = None) -> "AllocateMessageQueueByMachineRoom":
        return type(self)(consumer_idcs)

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        cids = java_sorted_ids(set(cid_all or ()))
        if current_cid not in cids:
            return []
        return self._allocate(consumer_group, current_cid, java_sorted_queues(set(mq_all or ())), cids)

    def _allocate(self, consumer_group, current_cid, mqs, cids):
        index = cids.index(current_cid)
        chosen = []
        for mq in mqs:
            parts = mq.broker_name.split("@")
            if len(parts) == 2 and parts[0] in self.consumer_idcs:
                chosen.append(mq)
        per, rem = divmod(len(chosen), len(cids))
        result = chosen[per * index: per * index + per]
        if rem > index:
            result.append(chosen[index + per * len(cids)])
        return result


class MachineRoomResolver(abc.ABC):
    """Which machine room a broker's queue and a consumer id are deployed in (never empty)."""

    @abc.abstractmethod
    def broker_deploy_in(self, mq: MessageQueue) -> str:
        """Implemented by each subclass."""

    @abc.abstractmethod
    def consumer_deploy_in(self, client_id: str) -> str:
        """Implemented by each subclass."""


class PrefixMachineRoomResolver(MachineRoomResolver):
    """The common convention: broker name `<room>@<broker>` and client id `<room>@<client>`."""

    def __init__(self, separator: str = "@"):
        self.separator = separator

    def broker_deploy_in(self, mq: MessageQueue) -> str:
        return mq.broker_name.split(self.separator)[0]

    def consumer_deploy_in(self, client_id: str) -> str:
        return client_id.split(self.separator)[0]


def _by_room(items, room_of, named) -> dict[str, list]:
    """`items` grouped by their machine room (`room_of`); one without a room is an error naming it."""
    rooms: dict[str, list] = {}
    for item in items:
        room = room_of(item)
        if not room:
            raise IllegalArgumentError(f"Machine room is null for {named(item)}")
        rooms.setdefault(room, []).append(item)
    return rooms


class AllocateMachineRoomNearby(AllocateStrategy):
    """Queues of a room go to that room's consumers; rooms with no live consumer are shared by
    everyone, using the wrapped strategy in both steps (AllocateMachineRoomNearby).

    The registered instance wraps `averagely` with `PrefixMachineRoomResolver`; build others with
    `strategy(allocate_strategy=..., machine_room_resolver=...)`."""

    name = "machine_room_nearby"

    def __init__(self, allocate_strategy: AllocateStrategy | None = None,
                 machine_room_resolver: MachineRoomResolver | None = None):
        self.allocate_strategy = allocate_strategy or AllocateMessageQueueAveragely()
        self.machine_room_resolver = machine_room_resolver or PrefixMachineRoomResolver()

    def __call__(self, allocate_strategy=None, machine_room_resolver=None) -> "AllocateMachineRoomNearby":
        return type(self)(allocate_strategy, machine_room_resolver)

    def _allocate(self, consumer_group, current_cid, mqs, cids):
        resolver = self.machine_room_resolver
        room_queues = _by_room(mqs, resolver.broker_deploy_in, lambda mq: f"mq {java_queue_string(mq)}")
        room_consumers = _by_room(cids, resolver.consumer_deploy_in, lambda cid: f"consumer id {cid!r}")

        result: list[MessageQueue] = []
        my_room = resolver.consumer_deploy_in(current_cid)
        mine = room_queues.pop(my_room, None)
        if mine:
            result += self.allocate_strategy.allocate(consumer_group, current_cid, mine, room_consumers[my_room])
        # Java iterates a TreeMap: rooms in sorted order.
        for room in sorted(room_queues, key=_java_key):
            if room not in room_consumers:
                result += self.allocate_strategy.allocate(consumer_group, current_cid, room_queues[room], cids)
        return result


# --- beyond RocketMQ: sticky ----------------------------------------------------------------------
_MASK64 = (1 << 64) - 1


def _stable_hash64(s: str) -> int:
    """A 64-bit hash that is the same in every process and on every platform (unlike hash())."""
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "big")


def _mix64(x: int) -> int:
    """splitmix64's finalizer: turns (queue hash XOR consumer hash) into an independent-looking score."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


class AllocateMessageQueueSticky(AllocateStrategy):
    """Balanced rendezvous hashing: few queues move when consumers join or leave, sizes stay
    within one of each other, and every consumer computes the same global assignment.

    Algorithm (deterministic in the sorted inputs, no shared state needed):

    1. Every (queue, consumer) pair gets a score `mix64(h(queue) XOR h(consumer))` with stable
       64-bit hashes of Java's MessageQueue.toString() and of the consumer id — highest random
       weight (rendezvous) hashing, so a queue's preference order over consumers does not depend
       on which other consumers exist.
    2. Capacities: with Q queues and N consumers everybody may hold ⌊Q/N⌋ queues and Q mod N
       consumers may hold one more (first come, first served in step 3).
    3. Walk all pairs from the highest score down; give the queue to the consumer if the queue
       is still free and the consumer has room.  This is the stable matching in which queues and
       consumers share the same preference (the score), so it is unique for given inputs.

    When a consumer joins, queues move mainly to it (the queues that rank it highest, up to its
    capacity) plus a short chain of displacements caused by the tighter capacities; when one
    leaves, its queues spread over the others.  Measured over random groups (Q ≤ 64 queues, N ≤ 12
    consumers): on average about two moves above the unavoidable minimum (the newcomer's share on
    a join, the leaver's queues on a leave), never more than 3·⌈Q/N⌉ + 4; the worst ratios come
    from Q ≈ N, where every capacity is 1 and a displacement chain can run through several
    consumers.  `averagely` moves up to about half of all queues (tests/allocate prints both).  A
    balanced assignment cannot be both exactly minimal and a function of the membership alone, so
    some extra moves are the price of needing no shared state.

    Cost: O(Q·N log(Q·N)) per rebalance (about 5 ms for 256 queues × 16 consumers, 0.15 s for
    1,000 × 50 in pure Python); the last few results are cached, so consumers in one process share
    the work.
    """

    name = "sticky"

    def assignment(self, mqs: Sequence[MessageQueue], cids: Sequence[str]) -> dict[MessageQueue, str]:
        """The whole group's assignment {queue: consumer id} for sorted, duplicate-free inputs."""
        return dict(_sticky_assignment(tuple(mqs), tuple(cids)))

    def _allocate(self, consumer_group, current_cid, mqs, cids):
        return [mq for mq, cid in _sticky_assignment(tuple(mqs), tuple(cids)) if cid == current_cid]


@lru_cache(maxsize=16)
def _sticky_assignment(mqs: tuple, cids: tuple) -> tuple:
    """Balanced rendezvous matching (see AllocateMessageQueueSticky) as ((queue, consumer id), ...)."""
    q, n = len(mqs), len(cids)
    base, extra = divmod(q, n)
    q_hash = [_stable_hash64(java_queue_string(mq)) for mq in mqs]
    c_hash = [_stable_hash64(cid) for cid in cids]
    # Pairs ordered by score, ties broken by the (sorted) positions, so the order is total.
    pairs = sorted(((_mix64(qh ^ ch), -qi, -ci) for qi, qh in enumerate(q_hash) for ci, ch in enumerate(c_hash)),
                   reverse=True)
    load = [0] * n
    owner: list[int] = [-1] * q
    assigned = full_with_extra = 0
    for _score, nqi, nci in pairs:
        qi, ci = -nqi, -nci
        if owner[qi] >= 0:
            continue
        held = load[ci]
        if held < base:
            pass
        elif held == base and full_with_extra < extra:
            full_with_extra += 1
        else:
            continue
        owner[qi] = ci
        load[ci] = held + 1
        assigned += 1
        if assigned == q:
            break
    return tuple((mqs[i], cids[c]) for i, c in enumerate(owner))


BUILTIN_STRATEGIES: dict[str, AllocateStrategy] = {
    s.name: s
    for s in (
        AllocateMessageQueueAveragely(),
        AllocateMessageQueueAveragelyByCircle(),
        AllocateMessageQueueConsistentHash(),
        AllocateMessageQueueByConfig(),
        AllocateMessageQueueByMachineRoom(),
        AllocateMachineRoomNearby(),
        AllocateMessageQueueSticky(),
    )
}

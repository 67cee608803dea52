"""Built-in allocate plugins: RocketMQ's queue allocation strategies plus `sticky`.

Names (config `allocateMessageQueueStrategy`): averagely, by_circle, consistent_hash, by_config,
by_machine_room, machine_room_nearby, sticky.  The configurable ones are also factories
(`get_allocate_strategy("by_config")(message_queues=[...])`).
"""
from rmq_core.plugins import hookimpl
from rmq_plugins.allocate.strategies import (  # noqa: F401 - re-exported for users and tests
    BUILTIN_STRATEGIES,
    AllocateMachineRoomNearby,
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueByConfig,
    AllocateMessageQueueByMachineRoom,
    AllocateMessageQueueConsistentHash,
    AllocateMessageQueueSticky,
    AllocateStrategy,
    MachineRoomResolver,
    PrefixMachineRoomResolver,
)


@hookimpl
def rmq_allocate_strategies():
    return dict(BUILTIN_STRATEGIES)

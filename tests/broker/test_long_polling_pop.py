"""The long-polling table with pops held beside pulls: an arrival wakes every pull waiting past it,
but of each pop group only as many held pops as the new messages can feed, oldest first."""
import asyncio

from rmq_core.broker.long_polling import POP_WAKE_BATCH, PullRequestHoldService


def test_an_arrival_wakes_one_held_pop_per_group_and_every_pull():
    async def main():
        hold = PullRequestHoldService(asyncio.get_running_loop())
        hold.bind_thread()
        pops_a = [hold.hold("T", 0, 10, group="A") for _ in range(5)]
        pops_b = [hold.hold("T", 0, 10, group="B") for _ in range(2)]
        pull = hold.hold("T", 0, 10)
        hold.notify_message_arriving("T", 0, 11)
        assert [f.done() for f in pops_a] == [True, False, False, False, False]  # the oldest of A
        assert [f.done() for f in pops_b] == [True, False]
        assert pull.done()
        # a burst: one more of A per POP_WAKE_BATCH new messages
        hold.notify_message_arriving("T", 0, 10 + 2 * POP_WAKE_BATCH)
        assert [f.done() for f in pops_a] == [True, True, True, False, False]
        assert all(f.done() for f in pops_b) and hold.held_count() == 2
        # a pop of another queue's table, or one already past the end, is not woken
        late = hold.hold("T", 0, 10 + 2 * POP_WAKE_BATCH, group="C")
        other = hold.hold("T", 1, 10, group="A")
        hold.notify_message_arriving("T", 0, 10 + 2 * POP_WAKE_BATCH)
        assert not late.done() and not other.done()

    asyncio.run(main())

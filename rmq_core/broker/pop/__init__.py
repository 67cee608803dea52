"""Pop consumption (RocketMQ 5's SimpleConsumer and 5.x PushConsumer): consumers of a group share
queues; a received message is invisible for a while and comes back, its delivery attempt raised,
unless acked; after the group's retryMaxTimes it goes to %DLQ%<group>.

`PopService` (rmq_core.broker.pop.service) is the one owner of these semantics.  The broker creates
one as `BrokerController.pop_service`; the remoting processor (POP_MESSAGE, ACK_MESSAGE,
CHANGE_MESSAGE_INVISIBLETIME) and the gRPC front end (rmq_core.proxy) both call it:

    result = await pop_service.pop(group=..., topic=..., max_nums=32, invisible_ms=30_000,
                                   sub=SubscriptionData, poll_ms=20_000, client_id="...",
                                   fifo=None, attempt_id=None, queue_id=-1)
    # -> PopResult(status, batches=[PoppedBatch ...], pop_time, invisible_ms, revive_qid, rest_num);
    #    result.messages: [PoppedMessage ...], made from the batches when asked for
    await pop_service.ack(group=..., topic=..., receipt_handle="...")         # -> AckOutcome
    new_handle = await pop_service.change_invisible_time(group=..., topic=..., receipt_handle="...",
                                                         invisible_ms=...)
    await pop_service.forward_to_dead_letter(group=..., topic=..., receipt_handle="...")
    pop_service.inflight(group, topic)   # received and neither acked nor revived yet
    outcomes = await pop_service.ack_batch(group=..., topic=..., receipt_handles=[...])
    # -> per handle an AckOutcome or the PopError refusing it; one ack record per checkpoint
    refusals = await pop_service.ack_offsets(group=..., topic=..., checkpoint=ExtraInfo, offsets=[...])
    # -> the PopErrors refusing some offsets of one checkpoint (BATCH_ACK_MESSAGE: no handle per offset)

begin_pop(...) and begin_ack_offsets(...) (same arguments as pop / ack_offsets) answer without a
coroutine when nothing needs waiting for (no durability wait, no long poll): the PopResult / the
refusals list, else an awaitable of it; pop() and ack_offsets() are them awaited.

pop() also takes init_mode="MIN"|"MAX" (where a group without a pop offset in a queue starts;
the remoting header's initMode) and alive=callable (is the asker still connected: a long poll
that wakes after it left hands nothing out).  PopResult.status is "FOUND" or "POLLING_NOT_FOUND"; refusals
raise `PopError` (service.py) with `.kind` (INVALID_RECEIPT_HANDLE, ILLEGAL_INVISIBLE_TIME,
GROUP_NOT_FOUND, TOPIC_NOT_FOUND, FORBIDDEN, NOT_MASTER, ILLEGAL_FILTER, BAD_REQUEST, INTERNAL)
and `.code` (the remoting ResponseCode), its message naming the bad value.  AckOutcome.status
is "OK", or "ALREADY_ACKED" for a repeated ack.  The broker takes invisible times of 1 s to 12 h.

A PoppedBatch is what one checkpoint handed out of one queue: `buffer` (the stored records as they
are, what a pull answer's body is), `offsets`, `topic`, `real_topic`, `queue_id`, `ck_offset`,
`attempts` (None: each record's reconsume times + 1) and `handle_prefix` (a message's receipt
handle is it + str(offset)); the remoting answer sends the buffers without a per-message object.
A PoppedMessage carries the stored record bytes as they are (`record`, what a pull would send), the
topic the consumer subscribed to (a retry message reports its original topic), queue id and offset,
`receipt_handle` (RocketMQ 5's extraInfo text; rmq_core.common.pop_extra_info.ExtraInfo owns it)
and `delivery_attempt` (1 for a first delivery, reconsume times + 1 after).
"""

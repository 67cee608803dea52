"""Hook specifications (pluggy project "rmq").  Only specs live here.

Registry hooks return a dict of *named* implementations; every plugin's dicts are merged and
configuration picks one by name (`allocateMessageQueueStrategy = by_circle`, expression type
`SQL92`, offset store `local_file`, transport scheme `tcp`).  Resolve a name once per
subscription / rebalance / connection and keep the object: a hook call costs about a microsecond,
so no hook is ever called per message on the hot path.

Interception hooks mirror RocketMQ's RPCHook / SendMessageHook / ConsumeMessageHook /
FilterMessageHook.  They are only called when at least one plugin implements them.
"""
import pluggy

hookspec = pluggy.HookspecMarker("rmq")


# --- registries ----------------------------------------------------------------------------------
@hookspec
def rmq_allocate_strategies():
    """Return {name: strategy} of queue allocation strategies.

    A strategy is an object with `name` and
    `allocate(consumer_group, current_cid, mq_all: list[MessageQueue], cid_all: list[str]) -> list[MessageQueue]`
    following AllocateMessageQueueStrategy: inputs are sorted by the caller; the result is the
    queues `current_cid` owns.  Called when a PushConsumer / lite PullConsumer starts (to resolve
    `allocate_strategy=` by name)."""


@hookspec
def rmq_filters():
    """Return {expression_type: factory} of message filters (e.g. "TAG", "SQL92").

    `factory(expression: str) -> compiled filter` raises `FilterExpressionError` (with the
    position) for a malformed expression.  Called when a subscription is registered (client and
    broker side), never per message."""


@hookspec
def rmq_offset_stores():
    """Return {name: factory} of consumer offset stores (e.g. "remote", "local_file").

    `factory(group: str, *, broker_api=None, offset_dir=None, client_id=None) -> OffsetStore`
    (load/update_offset/read_offset/persist/persist_all/remove_offset/clone_offset_table/
    update_consume_offset_to_broker, as rmq_plugins.store.offset_store).
    Called when a consumer starts."""


@hookspec
def rmq_transports():
    """Return {scheme: transport} (e.g. "tcp", "inproc").

    A transport turns an address of its scheme into a connection or a listening server for the
    remoting layer.  Called when a remoting client or server is created."""


@hookspec
def rmq_metrics_exporters():
    """Return {name: factory} of metrics exporters (e.g. "PROM", "LOG"), chosen by
    `metricsExporterType`.

    `factory(settings: rmq_core.metrics.ExporterSettings) -> exporter` with `start()` and
    `stop()`; the exporter reads `settings.collect()` (a list of rmq_core.metrics.MetricFamily,
    the server's stats snapshot) when it is scraped or on its own interval, never per message.
    Called when a broker or name server starts."""


@hookspec
def rmq_access_validators():
    """Return {name: factory} of access validators (e.g. "plain"), chosen by `accessValidator`
    when `aclEnable=true`.

    `factory(broker_config: rmq_core.config.BrokerConfig) -> validator`: a broker-side request step
    (`before(remote_addr, request, connection)` raising rmq_core.remoting.RequestRefused to refuse,
    `after(...)`), with `close()` and the ACL admin calls (`update_access_config(dict)`,
    `delete_access_config(access_key)`, `update_global_white_addrs(addresses, acl_file)`,
    `version()`, `all_config()`).  Called once when a broker starts."""


# --- interception (RocketMQ hook equivalents) ----------------------------------------------------
@hookspec
def rmq_before_send(context):
    """SendMessageHook.sendMessageBefore: `context` has producer_group, message, queue, broker_addr."""


@hookspec
def rmq_after_send(context):
    """SendMessageHook.sendMessageAfter: `context` also has send_result or exception."""


@hookspec
def rmq_before_consume(context):
    """ConsumeMessageHook.consumeMessageBefore: `context` has consumer_group, queue, messages."""


@hookspec
def rmq_after_consume(context):
    """ConsumeMessageHook.consumeMessageAfter: `context` also has status and success."""


@hookspec
def rmq_filter_message(context):
    """FilterMessageHook: `context` has consumer_group, messages (after the broker's filter);
    a plugin may drop messages by mutating `context.messages`."""


# --- request steps (RocketMQ's RPCHook, one hook per side; see rmq_core.remoting.steps) -----------
@hookspec
def rmq_client_before_request(remote_addr, request):
    """Runs once per request a client of rmq sends (producers, consumers, admin, Spark, aio; a
    broker's own calls to name servers count as a client's), on every route and transport, before
    it leaves.  May add or replace ext fields of `request` (e.g. a signature): the change is what
    is sent.  Raising fails that request only.  Per-client steps (`request_steps=`) run after.
    `request` has code, opaque, flag, ext_fields, body; a producer's send comes before it is
    written (a SendRequest: its ext_fields a mapping over the header writer's values, a field
    added is written after them), any other request as a command decoded only when read."""


@hookspec
def rmq_client_after_response(remote_addr, request, response):
    """Runs once per answer a client receives, with its request; raising fails that request."""


@hookspec
def rmq_broker_before_request(remote_addr, request, connection):
    """Runs once per request a broker receives (not the name server), on every route (the native
    send lane included), before the processor.  Raising
    `rmq_core.remoting.RequestRefused(remark, code=ResponseCode.SYSTEM_ERROR)` refuses it: the
    processor never runs, the answer carries that code and remark, the connection keeps serving.
    `connection` has `remote_address` and `attributes` (a per-connection dict, gone when it
    closes).  `request` has code, opaque, flag, ext_fields, body, decoded from the frame only when
    read (a plain send on the native send lane: a LaneRequest, its ext_fields a mapping over the
    values the lane parsed).  The broker's own steps (its processor table's `request_steps`) run first."""


@hookspec
def rmq_broker_after_response(remote_addr, request, response, connection):
    """Runs once per answer a broker sends, with its request.  A pull answer's body is a
    `rmq_core.remoting.command.ManyMessageTransfer` (views of the mapped commit log): len() is its
    size, bytes() its content; a local read's answer has no body, its extField localRecordRuns
    names where the records lie (rmq_core.broker.processors.pull)."""

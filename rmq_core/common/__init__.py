"""Types and helpers both sides speak (RocketMQ's `common/`): the broker, the store, the clients
and the plugins import them; this package imports nothing of theirs.

`rmq_core.message` and `rmq_core.config` hold the message model and the configs; this package
holds the rest both sides share: subscription data (subscription), the pull sys-flag bits
(sysflag), crash-safe file writes (files), fastjson's JSON dialect (fastjson), the clock in ms
(clock), a property shown from a part (delegate).
"""

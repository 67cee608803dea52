"""Built-in access validators (RocketMQ 4.x ACL): "plain", accounts from plain_acl.yml.

A broker with aclEnable=true asks the plugin manager for the validator named by accessValidator
(default "plain") and runs it as a broker-side request step on every request.
"""
from rmq_core.plugins import hookimpl


def _plain(broker_config):
    from .plain import create_plain_validator  # PyYAML is imported only when ACL is on

    return create_plain_validator(broker_config)


@hookimpl
def rmq_access_validators():
    return {"plain": _plain}

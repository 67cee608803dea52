"""The ACL admin requests of RocketMQ 4.9's AdminBrokerProcessor: UPDATE_AND_CREATE_ACL_CONFIG,
DELETE_ACL_CONFIG, UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, GET_BROKER_CLUSTER_ACL_INFO and
GET_BROKER_CLUSTER_ACL_CONFIG.  They change the file the broker's access validator watches (and
take the new rules at once); with aclEnable=false they are refused, naming the setting."""
from __future__ import annotations

import asyncio
import json
import logging

from rmq_core.broker.processors import Processor
from rmq_core.broker.processors.client import json_body
from rmq_core.errors import AclError
from rmq_core.remoting.codes import RequestCode, ResponseCode, code_name

log = logging.getLogger("rmq.broker")


def split_list(text: str | None) -> list[str] | None:
    """UtilAll.split: 'a,b' -> ['a', 'b'] (None stays None: the field was not sent)."""
    if text is None:
        return None
    return [t.strip() for t in text.split(",") if t.strip()]


def _acl_request(failed_code: int):
    """A handler of an ACL request: given the broker's validator, refused (naming aclEnable) on a
    broker without one; an AclError or file error becomes `failed_code` with its message."""
    def wrap(fn):
        async def handler(self, ctx, request):
            v = self.ctrl.access_validator
            if v is None:
                bc = self.ctrl.broker_config
                return request.make_response(
                    failed_code, f"ACL is not enabled on broker[{bc.broker_name}, {self.ctrl.broker_addr}] "
                                 "(aclEnable=false): there is no ACL config to read or change")
            try:
                return await fn(self, v, ctx, request)
            except (AclError, OSError) as e:
                log.warning("%s from %s refused: %s", code_name(request.code), ctx.remote_address, e)
                return request.make_response(failed_code, str(e))
        handler.__name__ = fn.__name__
        return handler
    return wrap


class AclProcessor(Processor):
    CODES = {
        RequestCode.UPDATE_AND_CREATE_ACL_CONFIG: "update_and_create_access_config",
        RequestCode.DELETE_ACL_CONFIG: "delete_access_config",
        RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: "update_global_white_addrs",
        RequestCode.GET_BROKER_CLUSTER_ACL_INFO: "get_broker_acl_config_version",
        RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG: "get_broker_cluster_acl_config",
    }

    @_acl_request(ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED)
    async def update_and_create_access_config(self, v, ctx, request):
        get = request.ext_fields.get
        config = {
            "accessKey": get("accessKey"), "secretKey": get("secretKey"),
            "whiteRemoteAddress": get("whiteRemoteAddress"),
            "defaultTopicPerm": get("defaultTopicPerm"), "defaultGroupPerm": get("defaultGroupPerm"),
            "topicPerms": split_list(get("topicPerms")), "groupPerms": split_list(get("groupPerms")),
            "admin": request.get_bool("admin") if get("admin") is not None else None,
        }
        await asyncio.to_thread(v.update_access_config, config)
        log.info("ACL: account accessKey=%s created or updated by %s", config["accessKey"], ctx.remote_address)
        return request.make_response(ResponseCode.SUCCESS, None)

    @_acl_request(ResponseCode.DELETE_ACL_CONFIG_FAILED)
    async def delete_access_config(self, v, ctx, request):
        access_key = request.get_str("accessKey")
        if not access_key or not await asyncio.to_thread(v.delete_access_config, access_key):
            return request.make_response(
                ResponseCode.DELETE_ACL_CONFIG_FAILED,
                f"The accesskey[{access_key}] corresponding to accessConfig has been deleted failed: "
                f"there is no account accessKey={access_key}")
        log.info("ACL: account accessKey=%s deleted by %s", access_key, ctx.remote_address)
        return request.make_response(ResponseCode.SUCCESS, None)

    @_acl_request(ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED)
    async def update_global_white_addrs(self, v, ctx, request):
        addrs = split_list(request.get_str("globalWhiteAddrs")) or []
        await asyncio.to_thread(v.update_global_white_addrs, addrs, request.get_str("aclFileFullPath"))
        log.info("ACL: globalWhiteRemoteAddresses set to %s by %s", addrs, ctx.remote_address)
        return request.make_response(ResponseCode.SUCCESS, None)

    @_acl_request(ResponseCode.SYSTEM_ERROR)
    async def get_broker_acl_config_version(self, v, ctx, request):
        version, per_file = v.version()
        bc = self.ctrl.broker_config
        return request.make_response(ResponseCode.SUCCESS, None, {
            "version": json.dumps(version.to_json(), separators=(",", ":")),
            "allAclFileVersion": json.dumps({p: dv.to_json() for p, dv in per_file.items()}, separators=(",", ":")),
            "brokerName": bc.broker_name, "brokerAddr": self.ctrl.broker_addr, "clusterName": bc.broker_cluster_name,
        })

    @_acl_request(ResponseCode.SYSTEM_ERROR)
    async def get_broker_cluster_acl_config(self, v, ctx, request):
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body(v.all_config()))

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
from rmq_core.remoting.codes import RequestCode, ResponseCode

log = logging.getLogger("rmq.broker")


def split_list(text: str | None) -> list[str] | None:
    """UtilAll.split: 'a,b' -> ['a', 'b'] (None stays None: the field was not sent)."""
    if text is None:
        return None
    return [t.strip() for t in text.split(",") if t.strip()]


class AclProcessor(Processor):
    CODES = {
        RequestCode.UPDATE_AND_CREATE_ACL_CONFIG: "update_and_create_access_config",
        RequestCode.DELETE_ACL_CONFIG: "delete_access_config",
        RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: "update_global_white_addrs",
        RequestCode.GET_BROKER_CLUSTER_ACL_INFO: "get_broker_acl_config_version",
        RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG: "get_broker_cluster_acl_config",
    }

    def _validator(self, request, failed_code):
        v = self.ctrl.access_validator
        if v is None:
            bc = self.ctrl.broker_config
            return None, request.make_response(
                failed_code, f"ACL is not enabled on broker[{bc.broker_name}, {self.ctrl.broker_addr}] "
                             "(aclEnable=false): there is no ACL config to read or change")
        return v, None

    async def update_and_create_access_config(self, ctx, request):
        v, refused = self._validator(request, ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED)
        if refused:
            return refused
        get = request.ext_fields.get
        config = {
            "accessKey": get("accessKey"), "secretKey": get("secretKey"),
            "whiteRemoteAddress": get("whiteRemoteAddress"),
            "defaultTopicPerm": get("defaultTopicPerm"), "defaultGroupPerm": get("defaultGroupPerm"),
            "topicPerms": split_list(get("topicPerms")), "groupPerms": split_list(get("groupPerms")),
            "admin": request.get_bool("admin") if get("admin") is not None else None,
        }
        try:
            await asyncio.to_thread(v.update_access_config, config)
        except (AclError, OSError) as e:
            log.warning("updateAclConfig of accessKey=%s refused: %s", config["accessKey"], e)
            return request.make_response(ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED, str(e))
        log.info("ACL: account accessKey=%s created or updated by %s", config["accessKey"], ctx.remote_address)
        return request.make_response(ResponseCode.SUCCESS, None)

    async def delete_access_config(self, ctx, request):
        v, refused = self._validator(request, ResponseCode.DELETE_ACL_CONFIG_FAILED)
        if refused:
            return refused
        access_key = request.get_str("accessKey")
        try:
            deleted = bool(access_key) and await asyncio.to_thread(v.delete_access_config, access_key)
        except (AclError, OSError) as e:
            return request.make_response(ResponseCode.DELETE_ACL_CONFIG_FAILED, str(e))
        if not deleted:
            return request.make_response(
                ResponseCode.DELETE_ACL_CONFIG_FAILED,
                f"The accesskey[{access_key}] corresponding to accessConfig has been deleted failed: "
                f"there is no account accessKey={access_key}")
        log.info("ACL: account accessKey=%s deleted by %s", access_key, ctx.remote_address)
        return request.make_response(ResponseCode.SUCCESS, None)

    async def update_global_white_addrs(self, ctx, request):
        v, refused = self._validator(request, ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED)
        if refused:
            return refused
        addrs = split_list(request.get_str("globalWhiteAddrs")) or []
        try:
            await asyncio.to_thread(v.update_global_white_addrs, addrs, request.get_str("aclFileFullPath"))
        except (AclError, OSError) as e:
            return request.make_response(ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED, str(e))
        log.info("ACL: globalWhiteRemoteAddresses set to %s by %s", addrs, ctx.remote_address)
        return request.make_response(ResponseCode.SUCCESS, None)

    async def get_broker_acl_config_version(self, ctx, request):
        v, refused = self._validator(request, ResponseCode.SYSTEM_ERROR)
        if refused:
            return refused
        version, per_file = v.version()
        bc = self.ctrl.broker_config
        return request.make_response(ResponseCode.SUCCESS, None, {
            "version": json.dumps(version.to_json(), separators=(",", ":")),
            "allAclFileVersion": json.dumps({p: dv.to_json() for p, dv in per_file.items()}, separators=(",", ":")),
            "brokerName": bc.broker_name, "brokerAddr": self.ctrl.broker_addr, "clusterName": bc.broker_cluster_name,
        })

    async def get_broker_cluster_acl_config(self, ctx, request):
        v, refused = self._validator(request, ResponseCode.SYSTEM_ERROR)
        if refused:
            return refused
        return request.make_response(ResponseCode.SUCCESS, None, None, json_body(v.all_config()))

"""DefaultRequestProcessor: the name server's request handlers (one method per request code)."""
from __future__ import annotations

import logging
import zlib

from rmq_core.errors import RemotingCommandError
from rmq_core.message import parse_address
from rmq_core.remoting.body import (
    REGISTER_ALL, DataVersion, RegisterBrokerBody, TopicRouteData, dumps, kv_table_encode, loads_lenient, topic_list_encode,
)
from rmq_core.remoting.codes import RequestCode, ResponseCode
from rmq_core.remoting.command import RemotingCommand
from rmq_core.remoting.context import ChannelContext

from .kv_config import NAMESPACE_ORDER_TOPIC_CONFIG

log = logging.getLogger("rmq.namesrv")


_required = RemotingCommand.required_str
_required_int = RemotingCommand.required_int


class DefaultRequestProcessor:
    def __init__(self, controller):
        self.controller = controller
        self.route_info = controller.route_info_manager
        self.kv_config = controller.kv_config_manager
        self._handlers = {
            RequestCode.PUT_KV_CONFIG: self.put_kv_config,
            RequestCode.GET_KV_CONFIG: self.get_kv_config,
            RequestCode.DELETE_KV_CONFIG: self.delete_kv_config,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self.get_kv_list_by_namespace,
            RequestCode.QUERY_DATA_VERSION: self.query_broker_topic_config,
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route_info_by_topic,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_broker_cluster_info,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self.wipe_write_perm_of_broker,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self.add_write_perm_of_broker,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic_in_namesrv,
            RequestCode.REGISTER_TOPIC_IN_NAMESRV: self.register_topic_in_namesrv,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS: self.get_system_topic_list,
            RequestCode.GET_NAMESRV_CONFIG: self.get_namesrv_config,
            RequestCode.UPDATE_NAMESRV_CONFIG: self.update_namesrv_config,
        }

    @property
    def codes(self) -> list[int]:
        return list(self._handlers)

    async def process_request(self, ctx: ChannelContext, request: RemotingCommand) -> RemotingCommand | None:
        handler = self._handlers.get(request.code)
        if handler is None:
            return request.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                         f"request code {request.code} not supported")
        try:
            return handler(ctx, request)
        except RemotingCommandError as e:
            # A malformed request is the caller's problem: answer it, no traceback in our log.
            log.warning("bad request code %d from %s: %s", request.code, ctx.remote_address, e)
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))

    def reject_request(self) -> bool:
        return False

    # --- KV config ----------------------------------------------------------------------------------
    def put_kv_config(self, ctx, request):
        self.kv_config.put(_required(request, "namespace"), _required(request, "key"),
                           request.get_str("value", ""))
        return request.make_response(ResponseCode.SUCCESS)

    def get_kv_config(self, ctx, request):
        namespace, key = _required(request, "namespace"), _required(request, "key")
        value = self.kv_config.get(namespace, key)
        if value is None:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND,
                                         f"No config item, Namespace: {namespace} Key: {key}")
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"value": value})

    def delete_kv_config(self, ctx, request):
        self.kv_config.delete(_required(request, "namespace"), _required(request, "key"))
        return request.make_response(ResponseCode.SUCCESS)

    def get_kv_list_by_namespace(self, ctx, request):
        namespace = _required(request, "namespace")
        table = self.kv_config.get_namespace(namespace)
        if table is None:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        return request.make_response(ResponseCode.SUCCESS, body=kv_table_encode(table))

    # --- brokers -----------------------------------------------------------------------------------
    def _check_crc(self, request: RemotingCommand) -> bool:
        expected = request.get_int("bodyCrc32", 0)
        if not expected:
            return True
        crc = zlib.crc32(request.body or b"")
        # Java sends crc & 0x7FFFFFFF (UtilAll.crc32); also accept the plain unsigned or signed int32 value.
        if expected not in (crc & 0x7FFFFFFF, crc, crc - (1 << 32)):
            log.warning("receive registerBroker request, crc32 not match: header %d, body %d, from %s",
                        expected, crc & 0x7FFFFFFF, request.get_str("brokerAddr"))
            return False
        return True

    def register_broker(self, ctx, request):
        cluster_name = _required(request, "clusterName")
        broker_addr = _required(request, "brokerAddr")
        broker_name = _required(request, "brokerName")
        broker_id = _required_int(request, "brokerId")
        parse_address_checked(broker_addr)
        if not self._check_crc(request):
            return request.make_response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        body = None
        if request.body:
            body = RegisterBrokerBody.decode(request.body, request.get_bool("compressed"))
        else:  # a body-less registration still counts as a heartbeat, with an empty topic table
            body = RegisterBrokerBody()
        result = self.route_info.register_broker(
            cluster_name, broker_addr, broker_name, broker_id, request.get_str("haServerAddr"), body, ctx,
            register_all=bool(request.get_bool(REGISTER_ALL)))
        order_conf = self.kv_config.get_namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return request.make_response(
            ResponseCode.SUCCESS,
            ext_fields={"haServerAddr": result.ha_server_addr, "masterAddr": result.master_addr},
            body=kv_table_encode(order_conf) if order_conf else None)

    def query_broker_topic_config(self, ctx, request):
        broker_addr = _required(request, "brokerAddr")
        data_version = DataVersion.from_json(loads_lenient(request.body)) if request.body else DataVersion(0, 0)
        changed = self.route_info.is_broker_topic_config_changed(broker_addr, data_version)
        if not changed:
            self.route_info.update_broker_info_update_timestamp(broker_addr)
        ours = self.route_info.query_broker_data_version(broker_addr)
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"changed": changed},
                                     body=dumps(ours.to_json()) if ours is not None else None)

    def unregister_broker(self, ctx, request):
        self.route_info.unregister_broker(
            _required(request, "clusterName"), _required(request, "brokerAddr"),
            _required(request, "brokerName"), _required_int(request, "brokerId"))
        return request.make_response(ResponseCode.SUCCESS)

    def wipe_write_perm_of_broker(self, ctx, request):
        broker_name = _required(request, "brokerName")
        count = self.route_info.wipe_write_perm_of_broker(broker_name)
        log.info("wipe write perm of broker[%s], client: %s, %d", broker_name, ctx.remote_address, count)
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"wipeTopicCount": count})

    def add_write_perm_of_broker(self, ctx, request):
        broker_name = _required(request, "brokerName")
        count = self.route_info.add_write_perm_of_broker(broker_name)
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"addTopicCount": count})

    # --- routes and topics ----------------------------------------------------------------------------
    def get_route_info_by_topic(self, ctx, request):
        topic = _required(request, "topic")
        route = self.route_info.pickup_topic_route_data(topic)
        if route is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST,
                                         f"No topic route info in name server for the topic: {topic}")
        if self.controller.config.order_message_enable:
            route.order_topic_conf = self.kv_config.get(NAMESPACE_ORDER_TOPIC_CONFIG, topic)
        # Always standard JSON (quoted brokerAddrs keys), whatever the request version: the C++
        # client reads both forms and Python's json cannot read fastjson's bare keys.
        return request.make_response(ResponseCode.SUCCESS, body=route.encode())

    def get_broker_cluster_info(self, ctx, request):
        return request.make_response(ResponseCode.SUCCESS, body=self.route_info.get_all_cluster_info().encode())

    def get_all_topic_list(self, ctx, request):
        return request.make_response(ResponseCode.SUCCESS, body=topic_list_encode(self.route_info.get_all_topic_list()))

    def delete_topic_in_namesrv(self, ctx, request):
        self.route_info.delete_topic(_required(request, "topic"), request.get_str("clusterName"))
        return request.make_response(ResponseCode.SUCCESS)

    def register_topic_in_namesrv(self, ctx, request):
        topic = _required(request, "topic")
        if request.body:
            route = TopicRouteData.decode(request.body)
            self.route_info.register_topic(topic, route.queue_datas)
        return request.make_response(ResponseCode.SUCCESS)

    def get_topics_by_cluster(self, ctx, request):
        topics = self.route_info.get_topics_by_cluster(_required(request, "cluster"))
        return request.make_response(ResponseCode.SUCCESS, body=topic_list_encode(topics))

    def get_system_topic_list(self, ctx, request):
        topics, broker_addr = self.route_info.get_system_topic_list()
        return request.make_response(ResponseCode.SUCCESS, body=topic_list_encode(topics, broker_addr))


    # --- configuration ---------------------------------------------------------------------------------
    # Settings that are safe to change on a running name server (the listen address is not).
    UPDATABLE_CONFIG = ("scanNotActiveBrokerInterval", "brokerChannelExpiredTime", "orderMessageEnable",
                        "kvConfigPath", "serverMaxFrameLength")

    def get_namesrv_config(self, ctx, request):
        """The config as Java's Configuration prints it: one `key=value` line per setting."""
        props = self.controller.config.to_properties()
        text = "".join(f"{k}={v}\n" for k, v in sorted(props.items()))
        return request.make_response(ResponseCode.SUCCESS, body=text.encode("utf-8"))

    def update_namesrv_config(self, ctx, request):
        from rmq_core.config import NamesrvConfig, parse_properties  # late: only admin tools call this

        try:
            updates = parse_properties((request.body or b"").decode("utf-8", "replace"), "config update")
        except ValueError as e:
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        for key in updates:
            if key not in self.UPDATABLE_CONFIG:
                return request.make_response(
                    ResponseCode.NO_PERMISSION,
                    f"config key {key!r} cannot be updated; updatable: {', '.join(self.UPDATABLE_CONFIG)}")
        config = self.controller.config
        try:
            merged = NamesrvConfig.from_properties({**config.to_properties(), **updates})
        except ValueError as e:  # ConfigError names the key and the value
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        for name in NamesrvConfig.keys().values():
            setattr(config, name, getattr(merged, name))
        self.kv_config.path = config.kv_config_path or None
        log.info("name server config updated: %s", updates)
        return request.make_response(ResponseCode.SUCCESS)


def parse_address_checked(addr: str) -> None:
    """A broker address must be host:port; a bad one is refused naming it."""
    try:
        parse_address(addr)
    except ValueError as e:
        raise RemotingCommandError(str(e)) from None

"""The name server: broker registration, topic routes, KV config (RocketMQ 4.x compatible)."""
from .controller import BOOT_SUCCESS_LINE, NamesrvController, run_namesrv
from .kv_config import NAMESPACE_ORDER_TOPIC_CONFIG, KVConfigManager
from .route_info import RouteInfoManager

__all__ = ["BOOT_SUCCESS_LINE", "NamesrvController", "run_namesrv", "NAMESPACE_ORDER_TOPIC_CONFIG",
           "KVConfigManager", "RouteInfoManager"]

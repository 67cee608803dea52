"""The name server: broker registration, topic routes, KV config (RocketMQ 4.x compatible)."""
from .controller import BOOT_SUCCESS_LINE, NamesrvController, run_namesrv  # noqa: F401
from .kv_config import NAMESPACE_ORDER_TOPIC_CONFIG, KVConfigManager  # noqa: F401
from .route_info import RouteInfoManager  # noqa: F401

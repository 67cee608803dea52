"""RocketMQ 5's gRPC protocol (apache.rocketmq.v2) served by the broker itself: the RocketMQ 5
proxy's "local" mode, beside the 4.x remoting protocol, over the same processors, store, topics,
groups, offsets and ACL accounts.

`BrokerController` starts it when `grpcServerPort` is set (`rmq standalone`: 8081 unless
`--grpc-listen` says otherwise).  protobuf is imported only then: `import rmq_core` and a broker
without gRPC never load it.  The HTTP/2 + gRPC server is rmq's own (grpcio is not used; it is only
the tests' client): the wire work in rmq_core/_native/h2, the calls in server.py.

    server.py   the HTTP/2 + gRPC server, an asyncio Protocol on the broker's event loop (GrpcServer)
    service.py  the MessagingService RPCs (MessagingService)
    convert.py  a 5.x message <-> the broker's properties and stored records
    clients.py  5.x clients as the broker's producer / consumer tables hold them (GrpcClientChannel)
    proto/      the .proto files (the one owner of the protocol) and their generated modules
                (*_pb2_grpc: grpcio stubs for the tests' clients; the broker does not import them)
"""
from __future__ import annotations


async def start_grpc_server(ctrl, host: str, port: int):
    """Serve MessagingService for broker `ctrl` on host:port (0: a free port); returns the
    started GrpcServer (`.port` is the bound port)."""
    from rmq_core.proxy.server import GrpcServer

    server = GrpcServer(ctrl, host, port)
    await server.start()
    return server

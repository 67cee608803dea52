"""`rmq` command line: namesrv, broker, standalone, admin (mqadmin's commands, rmq_core/admin/).

Each server command prints RocketMQ's boot line once it accepts connections, stops cleanly on
SIGTERM/SIGINT (flush, checkpoint, abort marker removed) and exits non-zero with one clear line on
a bad config (unknown key, bad value, port in use, unwritable store).
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import os
import signal
import sys
import time

from rmq_core import loops
from rmq_core.errors import ConfigError, RMQError, os_error_text


def _check_store_writable(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".rmq-write-probe")
        with open(probe, "wb") as f:
            f.write(b"x")
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"store directory {path!r} is not writable: {e.strerror}") from None


def _store_line(cfg) -> str:
    """The boot line saying where the store lives and the size of each file it makes."""
    mib = 1024 * 1024
    index = 40 + cfg.max_hash_slot_num * 4 + cfg.max_index_num * 20
    return (f"store {cfg.store_path_root_dir}: commit-log segments of {cfg.mapped_file_size_commit_log / mib:g} MiB, "
            f"index files of {index / mib:.1f} MiB, "
            f"{cfg.mapped_file_size_consume_queue / mib:.2f} MiB per consume queue")


# A server's tables (a name server's routes, a broker's topics, offsets and groups) are many
# long-lived objects, and each full collection of the garbage collector walks all of them: at 10,000
# topics a name server's route lookups had a p99 of 2.4 ms against 0.2 ms at 1,000.  rmq's own server
# processes move what survives a young collection to the collector's permanent generation
# (gc.freeze, a list splice) once booted and again every FREEZE_INTERVAL s (what registrations
# added meanwhile), and once per FULL_COLLECT_INTERVAL s thaw and collect everything, so that a
# frozen structure dropped later in a reference cycle is still freed (refcounting frees the rest at
# once, frozen or not).  A name server or broker embedded in a user's program leaves the
# interpreter's settings alone.
FREEZE_INTERVAL = 1.0
FULL_COLLECT_INTERVAL = 3600.0
log = logging.getLogger("rmq.server")


def _freeze_survivors() -> None:
    gc.collect(1)  # young garbage (cycles among this second's temporaries) is collected, not frozen
    gc.freeze()


async def _keep_tables_out_of_the_collector() -> None:
    _freeze_survivors()
    log.info("garbage collector: %d long-lived objects frozen (not walked by collections)", gc.get_freeze_count())
    last_full = time.monotonic()
    while True:
        await asyncio.sleep(FREEZE_INTERVAL)
        if time.monotonic() - last_full >= FULL_COLLECT_INTERVAL:
            gc.unfreeze()
            gc.collect()
            last_full = time.monotonic()
        _freeze_survivors()


async def _serve(start, stop, tables: bool = False) -> None:
    """Start, print boot lines, wait for SIGTERM/SIGINT, stop.  `tables`: a name server or broker
    (the collector kept off its tables)."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    lines = await start()
    for line in lines:
        print(line, flush=True)
    collector = loop.create_task(_keep_tables_out_of_the_collector(), name="rmq-gc-freeze") if tables else None
    try:
        await stopping.wait()
    finally:
        if collector is not None:
            collector.cancel()
        await stop()
        print("shutdown OK", flush=True)


def _cmd_namesrv(args) -> None:
    from rmq_core.config import load_namesrv_conf
    from rmq_core.message import parse_address
    from rmq_core.namesrv import NamesrvController

    host, port = parse_address(args.listen)
    cfg, controller_cfg = load_namesrv_conf(args.config, listen_port=port, listen_host=host)
    ctrl = NamesrvController(cfg, f"{host}:{port}", controller_config=controller_cfg)

    async def start():
        line = await ctrl.start()
        return [line] + ([ctrl.controller.boot_line()] if ctrl.controller is not None else [])

    loops.run(_serve(start, ctrl.stop, tables=True))


def _cmd_controller(args) -> None:
    from rmq_core.config import ControllerConfig
    from rmq_core.controller.service import run_controller
    from rmq_core.message import parse_address

    cfg = ControllerConfig.from_properties(args.config) if args.config else ControllerConfig()
    if args.etcd:
        cfg.controller_etcd_endpoints = args.etcd
    cfg.check(args.config or "rmq controller")
    listen = args.listen or f"0.0.0.0:{cfg.listen_port}"
    parse_address(listen)
    running = []

    async def start():
        service, server = await run_controller(cfg, listen)
        running.extend((service, server))
        return [service.boot_line() + f", listening on {server.listen_address}"]

    async def stop():
        if running:
            await running[0].stop()
            await running[1].stop()

    loops.run(_serve(start, stop))


def _cmd_broker(args) -> None:
    from rmq_core.broker.controller import BrokerController
    from rmq_core.config import load_broker_conf

    overrides = {}
    if args.namesrv:
        overrides["namesrv_addr"] = args.namesrv
    # as mqbroker: -n, else broker.conf's namesrvAddr, else the NAMESRV_ADDR environment variable
    env = os.environ.get("NAMESRV_ADDR")
    broker_cfg, store_cfg = load_broker_conf(args.config, defaults={"namesrvAddr": env} if env else None, **overrides)
    if not broker_cfg.namesrv_addr_list:
        raise ConfigError("no name server: pass -n HOST:PORT, set namesrvAddr in broker.conf or set NAMESRV_ADDR")
    _check_store_writable(store_cfg.store_path_root_dir)
    ctrl = BrokerController(broker_cfg, store_cfg, listen_host=args.listen_host)

    async def start():
        lines = [await ctrl.start()]
        grpc_line = ctrl.grpc_line()  # grpcServerPort
        return lines + ([grpc_line] if grpc_line else []) + [_store_line(store_cfg)]

    loops.run(_serve(start, ctrl.stop, tables=True))


def _cmd_standalone(args) -> None:
    from rmq_core.embedded import Cluster

    if args.users and not args.dashboard:
        raise ConfigError("--users asks for a login to the console: give --dashboard HOST:PORT too")
    slave = args.slave_of is not None
    store = args.store or os.path.join(os.path.expanduser("~"), *(("store", "slave") if slave else ("store",)))
    broker_listen = args.broker_listen or ("127.0.0.1:10921" if slave else "127.0.0.1:10911")
    grpc_listen = args.grpc_listen if args.grpc_listen is not None else (None if slave else "127.0.0.1:8081")
    cluster = Cluster(store, args.config, namesrv_listen=args.namesrv_listen, broker_listen=broker_listen,
                      name="standalone", slave_of=args.slave_of, grpc_listen=grpc_listen,
                      grpc_optional=args.grpc_listen is None)
    _check_store_writable(cluster.store_config.store_path_root_dir)

    async def start_cluster():
        return [*await cluster.start_async(), _store_line(cluster.store_config)]

    if not args.dashboard:
        loops.run(_serve(start_cluster, cluster.stop_async, tables=True))
        return
    from rmq_core.dashboard import serve
    from rmq_core.message import parse_address

    host, port = parse_address(args.dashboard)
    console: list = []

    async def start():
        lines = await start_cluster()
        # the console's admin calls are blocking: over TCP to this process's own name server
        console.append(serve(cluster.tcp_namesrv, host, port, users_file=args.users))
        return [*lines, f"rmq console on {console[0].url}"]

    async def stop():
        if console:
            console[0].stop()
        await cluster.stop_async()

    loops.run(_serve(start, stop, tables=True))


def _cmd_dashboard(args) -> None:
    from rmq_core.admin.commands import credentials
    from rmq_core.dashboard import serve
    from rmq_core.message import parse_address

    if args.dashboard_command == "adduser":
        return _cmd_dashboard_adduser(args)
    namesrv = args.namesrv or os.environ.get("NAMESRV_ADDR")
    if not namesrv:
        raise ConfigError("no name server: pass -n HOST:PORT or set NAMESRV_ADDR")
    host, port = parse_address(args.listen)
    access_key, secret_key = credentials(args)  # as `rmq admin`: flags, else RMQ_ACCESS_KEY / tools.yml

    async def start():
        server.append(serve(namesrv, host, port, users_file=args.users, access_key=access_key,
                            secret_key=secret_key, stats_interval=args.stats_interval))
        return [f"rmq console for name server {namesrv} on {server[0].url}"]

    async def stop():
        if server:
            server[0].stop()

    server: list = []
    loops.run(_serve(start, stop))


def _cmd_dashboard_adduser(args) -> int:
    """Add a console user (or change its password): the password from a prompt on a terminal,
    else the first line of stdin."""
    import getpass

    from rmq_core.dashboard.auth import add_user

    if sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            raise ConfigError("the passwords differ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    new = add_user(args.file, args.name, password)
    print(f"user {args.name} {'added to' if new else 'changed in'} {args.file}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from rmq_core import __version__
    from rmq_core.admin.commands import Parser

    p = Parser(prog="rmq", description="RocketMQ-4.x-compatible message broker for Python")
    p.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    p.add_argument("--version", action="version", version=f"rmq {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    ns = sub.add_parser(
        "namesrv", help="run a name server",
        description="A name server (mqnamesrv): brokers register their topics and addresses with it every "
                    "registerNameServerPeriod, clients ask it where a topic's queues are.  It keeps no store; "
                    "a broker not heard from for brokerChannelExpiredTime (120 s) is dropped from the routes.")
    ns.add_argument("--listen", default="0.0.0.0:9876", help="host:port to listen on (default 0.0.0.0:9876)")
    ns.add_argument("-c", "--config", help="namesrv .properties file")
    ns.set_defaults(fn=_cmd_namesrv)

    co = sub.add_parser("controller", help="run a controller (automatic failover, RocketMQ 5's controller mode)")
    co.add_argument("-c", "--config", help="controller.conf (controllerEtcdEndpoints, listenPort, ...)")
    co.add_argument("--listen", help="host:port to listen on (default 0.0.0.0:listenPort, 9878)")
    co.add_argument("--etcd", help="etcd endpoints 'host:port,host:port' (controllerEtcdEndpoints)")
    co.set_defaults(fn=_cmd_controller)

    br = sub.add_parser(
        "broker", help="run a broker that registers with name servers",
        description="A broker (mqbroker): stores messages in its store (storePathRootDir), serves producers and "
                    "consumers on listenPort and registers with the name servers of -n, else of broker.conf's "
                    "namesrvAddr, else of $NAMESRV_ADDR.  brokerId 0 is a group's master, any other a slave.")
    br.add_argument("-n", "--namesrv", help="name server address(es), 'host:port;host:port'")
    br.add_argument("-c", "--config", help="broker.conf (RocketMQ property names)")
    br.add_argument("--listen-host", default="0.0.0.0", help="interface to bind (default 0.0.0.0)")
    br.set_defaults(fn=_cmd_broker)

    sa = sub.add_parser(
        "standalone", help="name server + broker in one process (the embedded default)",
        description="A name server and a broker in one process.  With --slave-of NAMESRV (or -c broker.conf "
                    "with brokerRole=SLAVE and namesrvAddr) it is instead a slave of the broker group registered "
                    "at that name server, e.g. another standalone's: no name server of its own, brokerId 1 "
                    "unless broker.conf gives another, the same brokerName as its master (broker-a by default); "
                    "it learns its master from the name server and replicates its commit log and tables.")
    sa.add_argument("--store", help="store directory (default ~/store; ~/store/slave with --slave-of)")
    sa.add_argument("-c", "--config", help="broker.conf (RocketMQ property names)")
    sa.add_argument("--namesrv-listen", default="127.0.0.1:9876", help="name server host:port (default 127.0.0.1:9876)")
    sa.add_argument("--broker-listen", help="broker host:port (default 127.0.0.1:10911; 127.0.0.1:10921 with "
                                            "--slave-of)")
    sa.add_argument("--grpc-listen", metavar="HOST:PORT",
                    help="serve RocketMQ 5 clients (gRPC, the endpoint to give them) there (default 127.0.0.1:8081, "
                         "skipped with a warning when in use; none with --slave-of; port 0: off)")
    sa.add_argument("--slave-of", metavar="NAMESRV", help="run a slave (brokerRole=SLAVE) of the master registered "
                                                          "at the name server HOST:PORT instead of a name server "
                                                          "and a master")
    sa.add_argument("--dashboard", metavar="HOST:PORT", help="also serve the web console there (e.g. 127.0.0.1:8080)")
    sa.add_argument("--users", metavar="FILE", help="the console asks for a login of these users "
                                                    "(rmq dashboard adduser FILE NAME); needed off loopback")
    sa.set_defaults(fn=_cmd_standalone)

    db = sub.add_parser("dashboard", help="serve the web console for a cluster")
    db.add_argument("-n", "--namesrv", help="name server address(es), 'host:port;host:port' (else NAMESRV_ADDR)")
    db.add_argument("--listen", default="127.0.0.1:8080",
                    help="host:port to serve on (default 127.0.0.1:8080; any other than loopback needs --users)")
    db.add_argument("--users", metavar="FILE", help="ask for a login of these users (rmq dashboard adduser FILE NAME)")
    db.add_argument("--stats-interval", type=float, default=10.0, metavar="SECONDS",
                    help="seconds between the samples the dashboard's charts draw (default 10; 0: no charts)")
    from rmq_core.admin.commands import add_credential_flags, add_parsers  # (rich is imported only when a command prints)

    add_credential_flags(db)  # the ACL account the console's admin calls sign with
    db.set_defaults(fn=_cmd_dashboard)
    dbsub = db.add_subparsers(dest="dashboard_command", required=False, metavar="[adduser]")
    au = dbsub.add_parser("adduser", help="add a console user to a users file (password from the terminal or stdin)")
    au.add_argument("file", help="the users file (created 0600 if missing)")
    au.add_argument("name", help="the user's name")

    add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s - %(message)s", stream=sys.stderr)
    logging.getLogger("rmq.progress").setLevel(min(level, logging.INFO))  # long operations report progress
    try:
        rc = args.fn(args)
        sys.stdout.flush()  # a reader gone (`rmq admin ... | head`) shows here rather than at exit
    except BrokenPipeError:
        # as `mqadmin | head`: no error and exit 0; stdout goes to /dev/null so that the
        # interpreter's last flush does not complain either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ConfigError, RMQError) as e:
        print(f"rmq {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            print(f"rmq {args.command}: error: cannot listen: address already in use ({os_error_text(e)})",
                  file=sys.stderr)
        else:
            print(f"rmq {args.command}: error: {os_error_text(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())

"""The console's consumer-group pages for a pop group of a RocketMQ 5 client, in headless Chromium:
the member listed with its language and version, the messages received and not yet acked as the
group's in-flight count, per queue and in total."""
from rmq_core.proxy.proto.apache.rocketmq.v2 import definition_pb2 as pb
from tests.admin.test_admin_cli import ok, wait_for
from tests.dashboard.test_console_browser import browser, rows, running_console, shot, wait_css  # noqa: F401
from tests.proxy.conftest import Stub, make_topic
from tests.proxy.test_proxy import _telemetry
from tests.servers import free_port

TOPIC, GROUP = "ConsolePop", "GConsolePop"


def test_group_pages_show_a_5x_member_and_the_messages_in_flight(tmp_path, browser):  # noqa: F811
    port = free_port()
    with running_console(tmp_path, broker_props={"grpcServerPort": port}) as servers:
        make_topic(servers, TOPIC, queues=2)
        ok("updateSubGroup", "-b", servers.broker_addrs[0], "-g", GROUP, ns=servers.namesrv)
        stub = Stub(f"127.0.0.1:{port}")
        try:
            _telemetry(stub, pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
                group=pb.Resource(name=GROUP), subscriptions=[pb.SubscriptionEntry(
                    topic=pb.Resource(name=TOPIC), expression=pb.FilterExpression(type=pb.TAG, expression="*"))])))
            for i in range(5):
                assert stub.send(TOPIC, f"m{i}".encode()).status.code == pb.OK
            got = []

            def three_received():
                got.extend(stub.receive(GROUP, TOPIC, batch=3 - len(got), invisible=300)[1])
                return len(got) == 3

            wait_for(three_received, what="three messages received")
            d = browser
            d.get(servers.console_url + "#/groups")
            wait_css(d, "#groups td", GROUP)
            row = next(r for r in rows(d, "groups") if r[0] == GROUP)
            assert row[-1] == "3"  # Inflight: received, not acked
            d.get(servers.console_url + f"#/groups/{GROUP}")
            wait_css(d, "#group-members td", stub.client_id)
            assert [r[2:] for r in rows(d, "group-members")] == [["PYTHON", "V5_1_2"]]
            wait_css(d, "#group-progress td", TOPIC)
            progress = rows(d, "group-progress")
            assert sum(int(r[6]) for r in progress) == 3  # per queue Inflight
            assert sum(int(r[5]) for r in progress) == 2  # Diff: the two never handed out
            shot(d, tmp_path, "groups-pop")
            assert stub.ack(GROUP, TOPIC, *got).status.code == pb.OK
            d.get(servers.console_url + "#/cluster")
            d.get(servers.console_url + "#/groups")
            wait_css(d, "#groups td", GROUP)
            assert next(r for r in rows(d, "groups") if r[0] == GROUP)[-1] == "0"
        finally:
            stub.close()

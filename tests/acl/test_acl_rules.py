"""plain_acl.yml as RocketMQ writes it: address patterns, accounts, permissions, and a bad file's
error naming its line."""
import logging
import os
import threading

import pytest

from rmq_plugins.acl.address import host_of, parse_address_pattern
from rmq_plugins.acl.loader import build_rules
from rmq_plugins.acl.permissions import DENY, PUB, SUB, AclFileError
from rmq_plugins.acl.plain import PlainAccessValidator

# The plain_acl.yml RocketMQ 4.9 ships (distribution/conf/plain_acl.yml)
ROCKETMQ_SAMPLE = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"""


@pytest.mark.parametrize("pattern, yes, no", [
    ("*", ["1.2.3.4", "::1"], []),
    ("10.1.1.*", ["10.1.1.0", "10.1.1.255"], ["10.1.2.1", "::1"]),
    ("10.1.*.*", ["10.1.200.3"], ["10.2.0.1"]),
    ("10.1.1.1-100", ["10.1.1.1", "10.1.1.100"], ["10.1.1.101", "10.1.1.0"]),
    ("10.1.1.{1,2}", ["10.1.1.1", "10.1.1.2"], ["10.1.1.3"]),
    ("10.1.1.1,10.2.0.*,10.3.3.{7,8}", ["10.1.1.1", "10.2.0.9", "10.3.3.8"], ["10.1.1.2", "10.3.3.9"]),
    ("127.0.0.2", ["127.0.0.2", "::ffff:127.0.0.2"], ["127.0.0.1"]),
    ("::1", ["::1", "0:0:0:0:0:0:0:1"], ["127.0.0.1"]),
    ("", [], ["127.0.0.1"]),
])
def test_address_patterns(pattern, yes, no):
    p = parse_address_pattern(pattern)
    assert [ip for ip in yes if p.match(ip)] == yes
    assert [ip for ip in no if p.match(ip)] == []


@pytest.mark.parametrize("bad", ["10.1.1", "10.1.*.3", "10.1.1.300", "10.1.1.50-3", "10.1.1.x", "10.1.1.{}", "1.2.3.4,,5.6.7.8"])
def test_bad_address_pattern_is_named(bad):
    with pytest.raises(ValueError, match="bad address pattern"):
        parse_address_pattern(bad)


def test_host_of():
    assert host_of("10.0.0.5:51234") == "10.0.0.5"
    assert host_of("[::1]:5") == "::1"
    assert host_of("inproc://broker-a") == "127.0.0.1"


def test_rocketmq_sample_loads():
    rules = build_rules("plain_acl.yml", ROCKETMQ_SAMPLE, 1)
    assert rules.globally_white("10.10.103.7") and rules.globally_white("192.168.0.1")
    assert not rules.globally_white("192.168.1.1")
    mq = rules.accounts["RocketMQ"]
    assert (mq.secret_key, mq.admin, mq.default_topic_perm, mq.default_group_perm) == ("12345678", False, DENY, SUB)
    assert mq.perms == {"topicA": DENY, "topicB": PUB | SUB, "topicC": SUB,
                        "%RETRY%groupA": DENY, "%RETRY%groupB": PUB | SUB, "%RETRY%groupC": SUB}
    assert mq.refusal("topicB", PUB) is None and mq.refusal("topicC", SUB) is None
    assert mq.refusal("%RETRY%groupX", SUB) is None  # defaultGroupPerm SUB
    why = mq.refusal("topicC", PUB)
    assert why.startswith("No default permission for topic=topicC") and "accessKey=RocketMQ needs PUB" in why
    assert "is SUB" in why
    assert "defaultTopicPerm there is DENY" in mq.refusal("topicZ", SUB)
    assert "group=groupA" in mq.refusal("%RETRY%groupA", SUB)
    admin = rules.accounts["rocketmq2"]
    assert admin.admin and admin.refusal("anything", PUB) is None  # an admin with no listed resources
    assert admin.white.match("192.168.1.20") and not mq.white.match("192.168.1.20")


@pytest.mark.parametrize("text, line, words", [
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    topicPerms:\n      - topicA=PUBB\n", 5, "bad permission 'PUBB'"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 123\n", 2, "length should longer than 6"),
    ("globalWhiteRemoteAddresses:\n  - 10.1.1.*\n  - 10.300.1.1\n", 3, "bad address pattern"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    topicPerms:\n      - topicA\n", 5, "expected Res=Perm"),
    ("accounts:\n  - accessKey: RocketMQ\n   secretKey: [12345678\n", 3, "not valid YAML"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n  - accessKey: RocketMQ\n    secretKey: 87654321\n", 4, "defined twice"),
])
def test_a_bad_file_names_its_line(text, line, words):
    with pytest.raises(AclFileError) as e:
        build_rules("/etc/plain_acl.yml", text, 1)
    assert f"/etc/plain_acl.yml:{line}:" in str(e.value) and words in str(e.value)


def _wait(cond, what, timeout=20.0):
    ev = threading.Event()
    while not cond():
        if ev.wait(0.05) or timeout <= 0:
            raise AssertionError(f"not reached: {what}")
        timeout -= 0.05


def test_file_reloads_in_place_and_by_rename_and_keeps_good_rules_on_a_bad_file(tmp_path, caplog):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ROCKETMQ_SAMPLE)
    v = PlainAccessValidator(str(path), poll_interval=0.05)
    try:
        assert set(v.rules.accounts) == {"RocketMQ", "rocketmq2"}
        path.write_text(ROCKETMQ_SAMPLE.replace("rocketmq2", "rocketmq3"))  # rewritten in place
        _wait(lambda: "rocketmq3" in v.rules.accounts, "in-place rewrite seen")
        other = tmp_path / "new.yml"
        other.write_text(ROCKETMQ_SAMPLE.replace("rocketmq2", "rocketmq4"))
        os.replace(other, path)  # replaced by rename
        _wait(lambda: "rocketmq4" in v.rules.accounts, "replacement seen")
        good = v.rules
        with caplog.at_level(logging.ERROR, logger="rmq.acl"):
            path.write_text(ROCKETMQ_SAMPLE + "  - accessKey: short\n    secretKey: 12345678\n")
            _wait(lambda: any("keeping the last good rules" in r.message for r in caplog.records), "error logged")
        assert v.rules is good
        assert any(f"{path}:27:" in r.message and "accessKey=short" in r.message for r in caplog.records)
    finally:
        v.close()


def test_admin_updates_write_the_file_with_a_new_data_version(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ROCKETMQ_SAMPLE)
    v = PlainAccessValidator(str(path), poll_interval=30)
    try:
        v.update_access_config({"accessKey": "newuser1", "secretKey": "newsecret1", "defaultTopicPerm": "PUB",
                                "topicPerms": ["t1=SUB"]})
        assert v.rules.accounts["newuser1"].perms == {"t1": SUB}
        assert v.rules.data_version.counter == 1
        assert os.stat(path).st_mode & 0o777 == 0o600  # the rewritten file holds secret keys
        v.update_access_config({"accessKey": "newuser1", "secretKey": "newsecret2", "admin": True})
        a = v.rules.accounts["newuser1"]
        assert (a.secret_key, a.admin, a.perms) == ("newsecret2", True, {"t1": SUB})  # the rest kept
        v.update_global_white_addrs(["10.9.9.*"])
        assert v.rules.globally_white("10.9.9.9") and not v.rules.globally_white("10.10.103.1")
        assert v.delete_access_config("newuser1") and not v.delete_access_config("newuser1")
        assert "newuser1" not in v.rules.accounts and v.rules.data_version.counter == 4
        config = v.all_config()
        assert config["globalWhiteAddrs"] == ["10.9.9.*"]
        assert [a["accessKey"] for a in config["plainAccessConfigs"]] == ["RocketMQ", "rocketmq2"]
        from rmq_core.errors import AclError
        with pytest.raises(AclError, match="bad permission 'WRONG'"):
            v.update_access_config({"accessKey": "newuser2", "secretKey": "newsecret2", "defaultTopicPerm": "WRONG"})
        assert "newuser2" not in build_rules(str(path), path.read_text(), 0).accounts  # nothing written
    finally:
        v.close()


def test_the_validator_is_chosen_by_name_and_needs_a_file(monkeypatch):
    from rmq_core.config import BrokerConfig
    from rmq_core.errors import ConfigError, PluginNotFoundError
    from rmq_core.plugins import get_access_validator_factory

    with pytest.raises(PluginNotFoundError, match="unknown access validator 'nope'; available: plain"):
        get_access_validator_factory("nope")
    monkeypatch.delenv("ROCKETMQ_HOME", raising=False)
    with pytest.raises(ConfigError, match="aclEnable=true needs plainAclFile"):
        get_access_validator_factory("plain")(BrokerConfig(acl_enable=True))
    monkeypatch.setenv("ROCKETMQ_HOME", "/opt/rocketmq")
    assert BrokerConfig().plain_acl_file == "/opt/rocketmq/conf/plain_acl.yml"
    assert BrokerConfig.from_properties({"plainAclFile": "/etc/acl.yml"}).plain_acl_file == "/etc/acl.yml"


def _account(ak, sk="12345678", extra=""):
    return f"  - accessKey: {ak}\n    secretKey: {sk}\n    defaultTopicPerm: PUB\n{extra}"


def test_the_acl_dir_files_are_read_watched_and_written_where_the_account_lives(tmp_path, caplog):
    """As PlainPermissionManager 4.9: plainAclFile and every .yml/.yaml under $ROCKETMQ_HOME/conf/acl
    (sub-directories too); an account lives in one file, and its admin commands write that file."""
    conf = tmp_path / "conf"
    (conf / "acl" / "sub").mkdir(parents=True)
    main = conf / "plain_acl.yml"
    main.write_text("accounts:\n" + _account("main-app"))
    team = conf / "acl" / "team.yml"
    team.write_text("globalWhiteRemoteAddresses: [10.20.0.*]\naccounts:\n" + _account("team-app"))
    (conf / "acl" / "sub" / "other.yaml").write_text("accounts:\n" + _account("other-app"))
    (conf / "acl" / "notes.txt").write_text("not an ACL file")
    v = PlainAccessValidator(str(main), acl_dir=str(conf / "acl"), poll_interval=0.05)
    try:
        assert v.rules.file_of == {"main-app": str(main), "team-app": str(team),
                                   "other-app": str(conf / "acl" / "sub" / "other.yaml")}
        assert v.rules.globally_white("10.20.0.7")
        assert list(v.version()[1]) == [str(main), str(team), str(conf / "acl" / "sub" / "other.yaml")]
        assert [a["accessKey"] for a in v.all_config()["plainAccessConfigs"]] == ["main-app", "team-app", "other-app"]

        # the admin commands write the file the account lives in; a new account goes to plainAclFile
        v.update_access_config({"accessKey": "team-app", "secretKey": "87654321", "topicPerms": ["t1=SUB"]})
        assert "87654321" in team.read_text() and "87654321" not in main.read_text()
        assert v.rules.accounts["team-app"].perms == {"t1": SUB} and v.version()[1][str(team)].counter == 1
        v.update_access_config({"accessKey": "new-app", "secretKey": "12345678"})
        assert v.rules.file_of["new-app"] == str(main)
        v.update_global_white_addrs(["10.30.0.*"], str(team))
        assert "10.30.0.*" in team.read_text() and not v.rules.globally_white("10.20.0.7")
        from rmq_core.errors import AclError
        with pytest.raises(AclError, match=f"the ACL file {tmp_path}/elsewhere.yml is not one this broker reads"):
            v.update_global_white_addrs(["10.1.1.1"], str(tmp_path / "elsewhere.yml"))
        assert v.delete_access_config("team-app") and "team-app" not in team.read_text()

        # a new file is seen; an account defined in two files is an error naming both, the rules stay
        (conf / "acl" / "late.yml").write_text("accounts:\n" + _account("late-app"))
        _wait(lambda: "late-app" in v.rules.accounts, "a new file in the acl dir seen")
        good = v.rules
        with caplog.at_level(logging.ERROR, logger="rmq.acl"):
            (conf / "acl" / "dup.yml").write_text("accounts:\n" + _account("main-app") + _account("dup-app"))
            _wait(lambda: any("defined in both" in r.message for r in caplog.records), "the duplicate logged")
        assert v.rules is good and "dup-app" not in v.rules.accounts
        assert any(f"accessKey 'main-app' is defined in both {main} and {conf / 'acl' / 'dup.yml'}" in r.message
                   for r in caplog.records)
        (conf / "acl" / "dup.yml").unlink()  # a file gone: its accounts go
        (conf / "acl" / "late.yml").unlink()
        _wait(lambda: "late-app" not in v.rules.accounts, "a removed file's accounts gone")
    finally:
        v.close()
    # at start, an account in two files is a one-line error naming both
    (conf / "acl" / "dup.yml").write_text("accounts:\n" + _account("other-app"))
    with pytest.raises(AclFileError, match="accessKey 'other-app' is defined in both .*dup.yml and .*other.yaml"):
        PlainAccessValidator(str(main), acl_dir=str(conf / "acl"))

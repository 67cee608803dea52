"""The README runs, so it cannot go stale: every fenced block is checked here, by the kind named in
the `<!-- check: KIND -->` comment right before it, and every error text its refusal table quotes
is compared with what a real run prints.

Kinds of blocks (```python, ```properties and ```console blocks default to their own kind; any
other block needs its comment):
- `python`: run as a program (this interpreter, a fresh temporary directory as cwd); with
  `python, output` the ```text block after it lists lines the program must print, in order.
- `properties`: loaded as a broker.conf (rmq_core.config.load_broker_conf): every key known, every
  value valid.
- `console`: the `$ ` commands run in one bash (`set -e -o pipefail`, this venv's `rmq` on PATH)
  against a live `rmq standalone`; the lines under a command are patterns its output must contain
  (`...` matches anything).
- `servers`: each line starts a server, which must print its boot line and stop cleanly on SIGTERM.
- `boot`: the lines `rmq standalone` prints when it starts.
- `make`: each line's target exists in the Makefile (`make -n`).
- `plain_acl`: a plain_acl.yml that the broker's plain access validator loads, with accounts.
- `replicated`: the commands that start the replicated cluster of "Running a replicated cluster",
  run with its two broker.conf blocks by tests/test_readme_replicated.py.
- `namesrv_properties`: a name server's config (rmq_core.config.load_namesrv_conf): every key known,
  every value valid, an embedded controller's keys complete.
- `failover`, `failover_console`: "Automatic failover"'s etcd, name server and broker commands, and
  its admin commands with their output, run against etcd and a three-replica group by
  tests/test_readme_failover.py.
- `replicated_standalone`: the `rmq standalone` master and `--slave-of` slave of that section, run
  by tests/test_readme_replicated.py.
- `cluster`: the commands that start "Running a broker and a cluster"'s two brokers, run with its
  broker.conf blocks by tests/test_readme_cluster.py.
- `install`: the lines that install rmq into a project of one's own, run by tests/test_install.py.

Addresses: the README's 127.0.0.1:9876 (name server), 127.0.0.1:10911 (broker) and 127.0.0.1:8080
(console) become free ports of this run, and its /tmp/... store paths temporary directories.  Every
block runs with HOME set to its temporary directory: a `~/rmq-store` of the README, or a default
store, is never the host's.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rmq_core.config import load_broker_conf
from tests.servers import RmqProcess, free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
NS, BROKER, CONSOLE, GRPC = "127.0.0.1:9876", "127.0.0.1:10911", "127.0.0.1:8080", "127.0.0.1:8081"
KINDS = {"python", "python, output", "properties", "console", "servers", "boot", "make", "replicated",
         "replicated_standalone", "plain_acl", "namesrv_properties", "failover", "failover_console",
         "rmq5, output", "cluster", "install"}
# a block without a check comment is checked by its language where that says how (else it is an error)
DEFAULT_KINDS = {"python": "python", "properties": "properties", "console": "console"}


@dataclass
class Block:
    kind: str
    lang: str
    text: str
    line: int
    output: str | None = None  # a `python, output` (or `rmq5, output`) block's expected output

    def __repr__(self) -> str:  # the test id
        return f"README:{self.line}:{self.kind}"


def readme_blocks(text: str | None = None) -> list[Block]:
    """The fenced blocks, each with the kind its check comment names; a block with no check
    comment (other than a `python, output` block's output) is an error."""
    lines = (text if text is not None else README.read_text()).splitlines()
    blocks: list[Block] = []
    kind, i = None, 0
    while i < len(lines):
        line = lines[i].strip()
        m = re.fullmatch(r"<!-- check: (.+?) -->", line)
        if m:
            kind = m.group(1)
            assert kind in KINDS, f"README:{i + 1}: unknown check kind {kind!r} (known: {sorted(KINDS)})"
        elif line.startswith("```"):
            lang, start = line[3:].strip(), i + 1
            body = []
            i += 1
            while not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            text_ = "\n".join(body) + "\n"
            if kind is None and lang == "text" and blocks and blocks[-1].kind.endswith(", output") \
                    and blocks[-1].output is None:
                blocks[-1].output = text_
            else:
                kind = kind or DEFAULT_KINDS.get(lang)
                assert kind is not None, f"README:{start}: a ```{lang} block without a <!-- check: KIND --> comment"
                blocks.append(Block(kind, lang, text_, start))
            kind = None
        i += 1
    return blocks


BLOCKS = readme_blocks()


def test_every_block_is_checked_and_nothing_points_outside():
    text = README.read_text()
    fences = sum(1 for line in text.splitlines() if line.strip().startswith("```")) // 2
    claimed = len(BLOCKS) + sum(1 for b in BLOCKS if b.output is not None)
    assert claimed == fences, "every fenced block of the README is checked by this file"
    for link in re.findall(r"\]\(([^)]+)\)", text):
        if not link.startswith(("http://", "https://", "#")):
            assert (ROOT / link).resolve().is_relative_to(ROOT) and (ROOT / link).exists(), link
    assert "../shared" not in text and "DESIGN.md" not in text
    for doc in (ROOT / "docs").glob("*.md"):
        assert "../shared" not in doc.read_text(), doc


# --- a live standalone for the blocks that talk to a cluster ---------------------------------------------------
@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("readme-live")
    ns, broker, grpc = (f"127.0.0.1:{free_port()}" for _ in range(3))
    proc = RmqProcess(["standalone", "--store", str(tmp / "store"), "--namesrv-listen", ns, "--broker-listen", broker,
                       "--grpc-listen", grpc],
                      ("The Name Server boot success", "boot success. serializeType=JSON and name server"))
    try:
        proc.wait_boot(60)
        yield {"ns": ns, "broker": broker, "grpc": grpc, "tmp": tmp}
    finally:
        assert proc.terminate() == 0


def localize(text: str, live: dict | None, tmp: Path) -> str:
    """The README's default addresses and /tmp paths, as this run's."""
    if live is not None:
        text = text.replace(NS, live["ns"]).replace(BROKER, live["broker"]).replace(GRPC, live["grpc"])
    text = text.replace(CONSOLE, f"127.0.0.1:{free_port()}")
    return re.sub(r"/tmp/([\w.-]+)", lambda m: str(tmp / m.group(1)), text)


def run_python(code: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", "HOME": str(cwd)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)


def pattern(expected: str) -> re.Pattern:
    """A README line as a pattern: `...` matches anything, whitespace runs match whitespace runs."""
    parts = [r"\s+".join(re.escape(w) for w in chunk.split()) for chunk in expected.strip().split("...")]
    return re.compile(".*".join(parts))


def in_order(expected: str, actual: str) -> None:
    pos = 0
    for line in expected.strip().splitlines():
        m = pattern(line).search(actual, pos)
        assert m, f"{line!r} not printed (after position {pos}) in:\n{actual}"
        pos = m.end()


# --- the blocks -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind.startswith("python")], ids=repr)
def test_python_block(block, live, tmp_path):
    r = run_python(localize(block.text, live, tmp_path), tmp_path)
    assert r.returncode == 0, f"{block!r} failed:\n{r.stdout}\n{r.stderr}"
    if block.output is not None:
        in_order(block.output, r.stdout)
    if "rmq-quickstart" in block.text:
        # the quick start's store fits a laptop: allocated and apparent sizes, and what the README says
        store = tmp_path / "rmq-quickstart"
        allocated = int(subprocess.check_output(["du", "-sk", store]).split()[0]) * 1024
        apparent = int(subprocess.check_output(["du", "-sk", "--apparent-size", store]).split()[0]) * 1024
        print(f"quick start store: {allocated / 1e6:.1f} MB allocated, {apparent / 1e6:.1f} MB apparent")
        assert allocated < 200e6 and apparent < 200e6
        said = int(re.search(r"The store holds about (\d+) MB", README.read_text()).group(1))
        assert abs(allocated / 1e6 - said) <= 0.15 * said, (allocated, said)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "rmq5, output"], ids=repr)
def test_rmq5_block(block, live, tmp_path):
    """Apache's Python 5.x client (in .venv-rmq5, as `make test` installs it) runs the block against
    the live standalone's gRPC endpoint, after the `rmq admin` commands of the console block just
    before it (the topic it needs: a 5.x client never creates one)."""
    from tests.rmq5.conftest import RMQ5_PYTHON

    before = [b for b in BLOCKS if b.line < block.line][-1]
    assert before.kind == "console", f"{block!r}: the block before it makes its topic"
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    for line in localize(before.text, live, tmp_path).splitlines():
        if line.startswith("$ "):
            subprocess.run(["bash", "-c", line[2:]], check=True, capture_output=True, env=env, timeout=120)
    r = subprocess.run([RMQ5_PYTHON, "-c", localize(block.text, live, tmp_path)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, f"{block!r} failed:\n{r.stdout}\n{r.stderr}"
    in_order(block.output, r.stdout)


def load_properties_block(text: str, home: Path) -> dict[str, str]:
    """A properties block as `rmq broker -c` reads it, with `~` this test's home: the file alone,
    never what updateBrokerConfig persisted into a store the block names."""
    conf = home / "broker.conf"
    conf.write_text(text)
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        broker, store = load_broker_conf(str(conf), updated=False)
    finally:
        os.environ["HOME"] = saved if saved is not None else os.environ.pop("HOME")
    return {**broker.to_properties(), **store.to_properties()}


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "properties"], ids=repr)
def test_properties_block(block, tmp_path):
    got = load_properties_block(block.text, tmp_path)
    for line in block.text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            assert got[key.strip()] == value.strip().replace("~", str(tmp_path), 1), key


def test_a_properties_block_never_reads_a_store_outside_the_test(tmp_path):
    """What updateBrokerConfig persisted into the store a block names (README's `~/rmq-store/...`,
    after a user followed the guides) changes nothing here: HOME is the test's own, and the block is
    read alone."""
    block = next(b for b in BLOCKS if b.kind == "properties" and "storePathRootDir=~/" in b.text)
    store = re.search(r"storePathRootDir=~/(\S+)", block.text).group(1)
    persisted = tmp_path / store / "config" / "broker.properties"
    persisted.parent.mkdir(parents=True)
    persisted.write_text("fileReservedTime=48\nmaxMessageSize=1048576\n")
    got = load_properties_block(block.text, tmp_path)
    assert got["storePathRootDir"] == str(tmp_path / store)
    assert got["maxMessageSize"] == "4194304" and got["fileReservedTime"] == "72"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "namesrv_properties"], ids=repr)
def test_namesrv_properties_block(block, tmp_path):
    from rmq_core.config import load_namesrv_conf

    conf = tmp_path / "namesrv.conf"
    conf.write_text(block.text)
    namesrv, controller = load_namesrv_conf(str(conf))
    got = {**namesrv.to_properties(), **controller.to_properties()}
    for line in block.text.splitlines():
        key, _, value = line.partition("=")
        assert got[key.strip()] == value.strip(), key


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "console"], ids=repr)
def test_console_block(block, live, tmp_path):
    if ".venv/" in block.text:  # "the checkout's .venv": this run's environment
        (tmp_path / ".venv").symlink_to(sys.prefix)
    commands: list[tuple[str, list[str]]] = []
    for line in localize(block.text, live, tmp_path).splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif line.strip():
            commands[-1][1].append(line)
    script = ["set -e -o pipefail"]
    for i, (cmd, _) in enumerate(commands):
        script += [f"echo '@@ {i}'", cmd]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, f"{block!r}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Broken pipe" not in r.stderr
    outputs = re.split(r"^@@ \d+\n", r.stdout, flags=re.M)[1:]
    assert len(outputs) == len(commands)
    for (cmd, expected), out in zip(commands, outputs):
        for line in expected:
            assert pattern(line).search(out), f"{cmd}: {line!r} not in:\n{out}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "servers"], ids=repr)
def test_servers_block(block, tmp_path):
    for line in block.text.strip().splitlines():
        cmd = localize(line.split("#")[0].replace(NS, f"127.0.0.1:{free_port()}")
                       .replace(BROKER, f"127.0.0.1:{free_port()}"), None, tmp_path).split()
        assert cmd[0] == "rmq"
        marker = "rmq console on" if "--dashboard" in cmd else "boot success"
        proc = RmqProcess(cmd[1:], (marker,), env={"HOME": str(tmp_path)})
        try:
            proc.wait_boot(60)
        finally:
            assert proc.terminate() == 0, proc.lines
        assert "shutdown OK" in proc.lines


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "boot"], ids=repr)
def test_boot_block(block, tmp_path):
    ns, broker, grpc = (f"127.0.0.1:{free_port()}" for _ in range(3))
    proc = RmqProcess(["standalone", "--namesrv-listen", ns, "--broker-listen", broker, "--grpc-listen", grpc],
                      ("store ",), env={"HOME": str(tmp_path)})  # the default store: ~/store
    try:
        proc.wait_boot(60)
    finally:
        proc.terminate()
    printed = "\n".join(proc.lines).replace(ns, NS).replace(broker, BROKER).replace(grpc, GRPC)
    printed = printed.replace(str(tmp_path), "~")
    for line in block.text.strip().splitlines():
        assert line in printed.splitlines(), f"{line!r} not among the boot lines:\n{printed}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "make"], ids=repr)
def test_make_block(block):
    for line in block.text.strip().splitlines():
        target = line.split("#")[0].split()[1]
        r = subprocess.run(["make", "-n", "-C", str(ROOT), target], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "plain_acl"], ids=repr)
def test_plain_acl_block(block):
    from rmq_plugins.acl.loader import build_rules

    rules = build_rules("README plain_acl.yml", block.text, 1)
    assert rules.accounts and all(len(a.secret_key) > 6 for a in rules.accounts.values())


# --- the refusal table: every quoted text, from a real run ---------------------------------------------------
def refusal_rows() -> dict[str, list[str]]:
    text = README.read_text()
    table = text[text.index("## What rmq refuses, and how"):]
    table = table[:table.index("\n## ", 1)]
    rows: dict[str, list[str]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 3 and cells[0] not in ("Bad input", "---"):
            quoted = [q.replace("\\|", "|") for q in re.findall(r"`([^`]+)`", cells[2])]
            rows.setdefault(cells[0], []).extend(quoted)
    return rows


def refusal_pattern(quoted: str) -> re.Pattern:
    """`...` matches anything, N / M a number; the rest literally."""
    parts = []
    for chunk in re.split(r"(\.\.\.|\bN\b|\bM\b)", quoted):
        parts.append(".*" if chunk == "..." else r"\d+" if chunk in ("N", "M") else re.escape(chunk))
    return re.compile("".join(parts))


def test_refusal_table_texts(live, tmp_path):
    from tests.readme_refusals import real_texts

    rows = refusal_rows()
    assert len(rows) >= 15
    real = real_texts(live, tmp_path)
    assert set(real) == set(rows), f"rows without a real run: {set(rows) - set(real)}; stale: {set(real) - set(rows)}"
    for row, quoted in rows.items():
        for q in quoted:
            assert any(refusal_pattern(q).search(t) for t in real[row]), f"{row}: {q!r} is not what rmq prints: {real[row]}"


def test_readme_harness_rejects_an_unchecked_block():
    with pytest.raises(AssertionError, match="without a <!-- check"):
        readme_blocks("text\n\n```sh\nrmq namesrv\n```\n")
    assert [b.kind for b in readme_blocks("```properties\nlistenPort=1\n```\n")] == ["properties"]

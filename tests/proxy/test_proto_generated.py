"""The .proto files are the one owner of the protocol: the checked-in modules are what they compile
to; `import rmq_core` (a broker without grpcServerPort) never loads grpcio or protobuf, and the gRPC
server loads protobuf only."""
from __future__ import annotations

import filecmp
import os
import subprocess
import sys

from rmq_core.proxy.proto import generate


def test_checked_in_modules_are_what_the_protos_compile_to(tmp_path):
    written = generate.generate(str(tmp_path))
    here = os.path.dirname(generate.__file__)
    stale = [os.path.relpath(p, tmp_path) for p in written
             if not filecmp.cmp(p, os.path.join(here, os.path.relpath(p, tmp_path)), shallow=False)]
    assert stale == [], f"regenerate with `python -m rmq_core.proxy.proto.generate`: {stale} differ"


def test_importing_rmq_core_and_a_broker_leaves_grpc_and_protobuf_alone():
    code = ("import sys, rmq_core, rmq_core.cli, rmq_core.broker.controller, rmq_core.embedded; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_grpc_server_needs_protobuf_only_not_grpcio():
    # (grpcio is a test dependency: the tests' client; the broker serves HTTP/2 itself)
    code = ("import sys, rmq_core.proxy, rmq_core.proxy.server; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'grpc', 'google'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['google']", out.stdout

"""Compile the .proto files of this directory into the checked-in *_pb2.py / *_pb2_grpc.py.

The .proto files are the one owner of the protocol: after changing one, run
`python -m rmq_core.proxy.proto.generate` (needs grpcio-tools, a dev dependency) and commit the
result; tests/proxy/test_proto_generated.py regenerates into a temporary directory and compares.
The modules are checked in rather than built by setup.py so that installing rmq needs neither
grpcio-tools nor protoc.  protoc writes absolute imports (`from apache.rocketmq.v2 import ...`);
they are rewritten to this package's path, so no top-level `apache` package is needed."""
from __future__ import annotations

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ("apache/rocketmq/v2/definition.proto", "apache/rocketmq/v2/service.proto")
PACKAGE = "rmq_core.proxy.proto"


def generate(out_dir: str = HERE) -> list[str]:
    """Compile PROTOS into out_dir (its apache/rocketmq/v2/); returns the files written."""
    import grpc_tools
    from grpc_tools import protoc

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")  # google/protobuf/*.proto
    args = ["protoc", f"-I{HERE}", f"-I{include}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
            *(os.path.join(HERE, p) for p in PROTOS)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    written = []
    for proto in PROTOS:
        base = os.path.join(out_dir, proto[:-len(".proto")])
        for path in (base + "_pb2.py", base + "_pb2_grpc.py"):
            with open(path) as f:
                text = f.read()
            text = re.sub(r"^from apache\.rocketmq\.v2 import", f"from {PACKAGE}.apache.rocketmq.v2 import",
                          text, flags=re.M)
            with open(path, "w") as f:
                f.write(text)
            written.append(path)
    return written


if __name__ == "__main__":
    for p in generate(sys.argv[1] if len(sys.argv) > 1 else HERE):
        print(p)

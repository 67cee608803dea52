"""Build rmq-spark.jar (the JVM reader of format("rmq")) without Maven: `javac --release 17`
against the jars of the installed pyspark, classes and resources zipped beside this file.

    python -m spark_plugin.jvm.build          # (setup.py's build_py and the Makefile run it)

Skipped, with the reason printed, when there is no JDK (javac) or no pyspark: the package then
ships without the jar, spark_plugin.jar_path() is None, and format("rmq") is the Python source.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
JAR_NAME = "rmq-spark.jar"


def javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "javac")):
        return os.path.join(home, "bin", "javac")
    return shutil.which("javac")


def pyspark_jars() -> str | None:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    jars = os.path.join(list(spec.submodule_search_locations)[0], "jars")
    return jars if os.path.isdir(jars) else None


def system_property_names() -> list[str]:
    """The properties RocketMQ owns, which the properties column leaves out (both decoders)."""
    if os.path.dirname(os.path.dirname(HERE)) not in sys.path:
        sys.path.append(os.path.dirname(os.path.dirname(HERE)))
    from rmq_core.message import MessageConst
    return sorted(MessageConst.SYSTEM_KEYS | {MessageConst.CLUSTER})


def sources() -> list[str]:
    return sorted(glob.glob(os.path.join(HERE, "src", "**", "*.java"), recursive=True))


def up_to_date(out: str) -> bool:
    if not os.path.exists(out):
        return False
    inputs = sources() + glob.glob(os.path.join(HERE, "resources", "**", "*"), recursive=True) + [__file__]
    return os.path.getmtime(out) >= max(os.path.getmtime(p) for p in inputs)


def build(out_dir: str = HERE, force: bool = False, system_properties: list[str] | None = None) -> str | None:
    """The jar's path, or None (with the reason printed) when it cannot be built here.
    system_properties: the names MessageConst gives (read here when not given)."""
    out = os.path.join(out_dir, JAR_NAME)
    compiler, jars = javac(), pyspark_jars()
    if compiler is None:
        print(f"rmq: no JDK (javac): {JAR_NAME} not built; format('rmq') will be the Python source", file=sys.stderr)
        return None
    if jars is None:
        print(f"rmq: pyspark not installed: {JAR_NAME} not built; format('rmq') will be the Python source", file=sys.stderr)
        return None
    if not force and out_dir == HERE and up_to_date(out):
        return out
    with tempfile.TemporaryDirectory(prefix="rmq-jar-") as tmp:
        classes = os.path.join(tmp, "classes")
        cmd = [compiler, "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp", os.path.join(jars, "*"),
               "-d", classes] + sources()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"javac failed building {JAR_NAME}:\n{r.stdout}{r.stderr}")
        part = out + ".part"
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: rmq spark_plugin/jvm/build.py\n\n")
            for root in (classes, os.path.join(HERE, "resources")):
                for path in sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True)):
                    if os.path.isfile(path):
                        z.write(path, os.path.relpath(path, root).replace(os.sep, "/"))
            names = system_properties if system_properties is not None else system_property_names()
            z.writestr("rmq/spark/system-properties.txt", "\n".join(names) + "\n")
        os.replace(part, out)
    return out


if __name__ == "__main__":
    path = build(force="--force" in sys.argv)
    print(path or "not built")

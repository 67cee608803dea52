"""Build: setuptools + Cython extensions for the storage core (rmq_core/_native).

`plugins/` on disk is installed as the package `rmq_plugins`, so the product does not claim the
generic top-level name `plugins` in site-packages.
"""
import importlib.util
import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py

try:
    from Cython.Build import cythonize
except ImportError:  # pragma: no cover - pyproject's build-system always provides Cython
    sys.exit("Cython>=3 is required to build rmq (pip installs it from pyproject.toml)")

# Compiler flags live here and only here.  No -march=native: wheels must run on any x86-64;
# CPU-specific code paths (PCLMUL CRC32) are chosen at run time inside the C code.
EXTRA_COMPILE_ARGS = ["-O3", "-fno-strict-aliasing", "-Wno-unused-function", "-Wno-unreachable-code"]
EXTRA_LINK_ARGS = []
# Python's own CFLAGS carry -g: debug info is most of a built module's size and a good part of its
# compile time.  Modules are built without it and stripped, unless RMQ_NATIVE_DEBUG=1 (gdb, perf).
if os.environ.get("RMQ_NATIVE_DEBUG") != "1":
    EXTRA_COMPILE_ARGS.append("-g0")
    EXTRA_LINK_ARGS.append("-Wl,--strip-all")
NATIVE_DIR = os.path.join("rmq_core", "_native")
# the system libraries a module links (OpenSSL's libcrypto: the Makefile installs its headers,
# Debian's libssl-dev, on a machine without them)
NATIVE_LIBRARIES = {"hmac_sha1": ["crypto"]}


def native_extensions():
    exts = []
    for name in sorted(os.listdir(NATIVE_DIR)):
        if name.endswith(".pyx"):
            mod = name[:-4]
            exts.append(
                Extension(
                    f"rmq_core._native.{mod}",
                    [os.path.join(NATIVE_DIR, name)],
                    include_dirs=[NATIVE_DIR],
                    extra_compile_args=EXTRA_COMPILE_ARGS,
                    extra_link_args=EXTRA_LINK_ARGS,
                    libraries=NATIVE_LIBRARIES.get(mod, []),
                )
            )
    return exts


def packages():
    # _native (Cython sources and headers beside the built modules) and dashboard/static (the
    # console's files) hold no __init__.py but ship files: they are listed as packages so their
    # package-data is declared, not guessed by setuptools (which warns about each).
    core = find_packages(include=["rmq_core", "rmq_core.*", "spark_plugin", "spark_plugin.*"])
    core += ["rmq_core._native", "rmq_core.dashboard.static"]
    plug = ["rmq_plugins" + p[len("plugins"):] for p in find_packages(include=["plugins", "plugins.*"])]
    return core + plug


def ext_modules():
    # The Makefile builds the extensions in place first (once, two compilers at a time), then
    # installs editable with RMQ_SKIP_EXT_BUILD=1 so that pip does not compile them all again.
    if os.environ.get("RMQ_SKIP_EXT_BUILD") == "1":
        return []
    return cythonize(
        native_extensions(),
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
        annotate=False,
    )


class build_py_with_jar(build_py):
    """build_py, plus spark_plugin/jvm/rmq-spark.jar (the JVM reader of format("rmq")) compiled
    against the installed pyspark's jars when a JDK and pyspark are present (else skipped, said)."""

    def run(self):
        super().run()
        if os.environ.get("RMQ_SKIP_JAR_BUILD") == "1":
            return
        # the jar carries rmq_core.message's system property names: read them from the built
        # package (its extensions built first), else from the source tree's in-place build
        self.run_command("build_ext")
        here = os.path.dirname(os.path.abspath(__file__))
        code = "from rmq_core.message import MessageConst as M; print(*sorted(M.SYSTEM_KEYS | {M.CLUSTER}))"
        names = None
        for path in (self.build_lib, here):
            r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": path},
                               capture_output=True, text=True, cwd=path)
            if r.returncode == 0:
                names = r.stdout.split()
                break
        if names is None:
            print("rmq: rmq_core does not import here, so rmq-spark.jar is not built: format('rmq') will be the "
                  "Python source", file=sys.stderr)
            return
        # (build.py by its path: importing the spark_plugin package would import rmq_core, whose
        # native modules are in build_lib, not in the source tree)
        spec = importlib.util.spec_from_file_location(
            "rmq_jar_build", os.path.join(here, "spark_plugin", "jvm", "build.py"))
        jar_build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(jar_build)
        out_dir = os.path.join(self.build_lib, "spark_plugin", "jvm")
        os.makedirs(out_dir, exist_ok=True)
        jar_build.build(out_dir, system_properties=names)


setup(
    cmdclass={"build_py": build_py_with_jar},
    packages=packages(),
    package_dir={"rmq_plugins": "plugins"},
    ext_modules=ext_modules(),
    # Cython's generated .c files are build intermediates (megabytes each): never installed
    exclude_package_data={"rmq_core._native": ["*.c"]},
    # pip builds the modules one after the other unless told: as many at once as there are cores
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
    zip_safe=False,
)

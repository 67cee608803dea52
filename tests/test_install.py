"""rmq in a project of one's own, as the README's "Using rmq from your own project" says: its
`install` lines run here against a copy of this checkout (`/path/to/rmq`) and a fresh virtual
environment (`~/myproject/.venv`), offline: pip resolves rmq's dependencies from this test run's own
environment (a path file listing a folder of links to them, rmq itself left out) and builds without
isolation, so nothing is fetched.  The wheel and the installed package hold no generated C and no
debug info.  Building compiles the Cython core three times (checkout, editable, wheel): slow; the
default run checks the sdist and the Makefile target instead."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.test_readme import BLOCKS

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
# rmq's own distributions, which the copy replaces (and the editable install's finder)
OURS = re.compile(r"^(rmq[-_.]|rmq_core|rmq_plugins|spark_plugin|__editable__|_rmq)")


def install_lines() -> list[str]:
    (block,) = [b for b in BLOCKS if b.kind == "install"]
    return [line.split("#")[0].strip() for line in block.text.strip().splitlines()]


def copy_checkout(dest: Path, *, generated_c: bool = False) -> Path:
    """The sources a clone has (no environments, no build output); with `generated_c`, Cython's
    up-to-date .c files too, so that an sdist does not cythonize again."""
    def ignore(folder, names):
        skip = {n for n in names if n in (".git", ".venv", ".venv-rmq5", "build", "dist", "tests", "__pycache__",
                                          ".pytest_cache", ".hypothesis", ".benchmarks") or n.endswith(".egg-info")
                or n.endswith(".so") or n.endswith(".html")}
        if not generated_c:
            skip |= {n for n in names if n.endswith(".c")}
        return skip
    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def debug_sections(path: Path) -> list[str]:
    """The ELF sections of a built module that a stripped one has none of."""
    out = subprocess.run(["readelf", "-S", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    return sorted({s for s in re.findall(r"\]\s+(\.\S+)", out) if s.startswith((".debug", ".symtab"))})


def test_the_readme_install_lines_are_the_ones_run_here():
    lines = install_lines()
    assert lines[0] == "python3 -m venv ~/myproject/.venv"
    assert "~/myproject/.venv/bin/pip install /path/to/rmq" in lines
    assert "~/myproject/.venv/bin/pip install -e /path/to/rmq" in lines
    assert "cd /path/to/rmq && make dist" in lines
    assert "pip install 'rmq[spark]'" not in (ROOT / "README.md").read_text()  # (rmq is not on PyPI)
    r = subprocess.run(["make", "-n", "-C", str(ROOT), "dist"], capture_output=True, text=True)
    assert r.returncode == 0 and "-m build" in r.stdout, r.stdout + r.stderr


def test_the_sdist_ships_sources_and_no_generated_c(tmp_path):
    src = copy_checkout(tmp_path / "rmq", generated_c=True)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                        str(src)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("rmq-*.tar.gz")
    names = tarfile.open(sdist).getnames()
    native = [n for n in names if "/rmq_core/_native/" in n]
    assert any(n.endswith("/record.pyx") for n in native) and any(n.endswith(".h") for n in native)
    assert not [n for n in native if n.endswith((".c", ".so"))], native


def fresh_venv(home: Path) -> Path:
    """`python3 -m venv ~/myproject/.venv`'s python, seeing this run's dependencies but not rmq."""
    py = home / "myproject" / ".venv" / "bin" / "python"
    site = Path(subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    deps = home / "deps"
    deps.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        if not OURS.match(entry.name) and entry.name != "pip" \
                and not entry.name.startswith("pip-") and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    (site / "rmq-test-deps.pth").write_text(f"{deps}\n")
    # the setuptools a new venv may bundle is older than rmq's build requirement: without build
    # isolation (offline) the build uses this run's, from the folder above
    subprocess.run([py, "-m", "pip", "uninstall", "-y", "-q", "setuptools"], capture_output=True, timeout=120)
    return py


@pytest.mark.slow
@pytest.mark.timeout(1800)  # three builds of the native core
def test_the_readme_install_lines_install_rmq_into_a_project_of_ones_own(tmp_path):
    home, src = tmp_path / "home", copy_checkout(tmp_path / "rmq")
    home.mkdir()
    os.symlink(VENV, src / ".venv")  # `make dist` in the checkout: its .venv is this run's
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_CACHE_DIR": "1"}
    env.pop("VIRTUAL_ENV", None)
    py = None
    for line in install_lines():
        cmd = (line.replace("/path/to/rmq", str(src)).replace("python3 -m venv", f"{sys.executable} -m venv")
               .replace("/bin/pip install", "/bin/pip install --no-index --no-build-isolation"))
        r = subprocess.run(["bash", "-c", f"set -e; {cmd}"], cwd=tmp_path, capture_output=True, text=True, env=env,
                           timeout=900)
        assert r.returncode == 0, f"{line}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        if line.startswith("python3 -m venv"):
            py = fresh_venv(home)
        if "pip install" in line:
            # the package imported is the one just installed (or the copy, editable), with its native core
            where = subprocess.run([py, "-c", "import rmq_core, rmq_core._native.record as r; "
                                              "print(rmq_core.__file__); print(r.__file__)"],
                                   capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
            assert where.returncode == 0, where.stderr
            core, native = where.stdout.split()
            expected = src if " -e " in line else home / "myproject" / ".venv"
            assert Path(core).is_relative_to(expected) and Path(native).is_relative_to(expected), (line, core)
            if " -e " not in line:
                assert not debug_sections(Path(native)), debug_sections(Path(native))
                installed = Path(core).parent / "_native"
                assert not list(installed.glob("*.c")), sorted(installed.glob("*.c"))
        if line.endswith("rmq --help"):
            assert "usage: rmq" in r.stdout, r.stdout
    (wheel,) = (src / "dist").glob("rmq-0.1.0-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".c")], names
    assert any(n.endswith("record.pyx") for n in names) and any(n.endswith("record.pyi") for n in names)
    print(f"wheel {wheel.name}: {wheel.stat().st_size / 1e6:.1f} MB")

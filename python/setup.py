"""Puts libkvbm.so beside the package when building it (pip install ./python).

Where from, first found: $KVBM_LIBRARY; python/kvbmgo/libkvbm.so (copied there
by `make py-lib`); the checkout's build/libkvbm.so; else the checkout's
`make lib` (the same build flags: only the kvbm_* symbols exported) when
make and Go are on PATH.
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def find_or_build_library() -> Path:
    env = os.environ.get("KVBM_LIBRARY")
    if env:
        return Path(env)
    for p in (HERE / "kvbmgo" / "libkvbm.so", REPO / "build" / "libkvbm.so"):
        if p.is_file():
            return p
    go = shutil.which(os.environ.get("GO", "go"))
    if go and shutil.which("make") and (REPO / "capi").is_dir():
        subprocess.check_call(["make", "lib"], cwd=REPO)
        return REPO / "build" / "libkvbm.so"
    raise SystemExit("kvbmgo: libkvbm.so not found and Go is not available to build it; "
                     "set KVBM_LIBRARY or run `make lib` first")


class BuildPyWithLibrary(build_py):
    def run(self) -> None:
        super().run()
        lib = find_or_build_library()
        dest = Path(self.build_lib) / "kvbmgo" / "libkvbm.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        if lib.resolve() != dest.resolve():
            shutil.copy2(lib, dest)


class BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:  # a platform wheel: it carries libkvbm.so
        return True


try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools before 70.1
    from wheel.bdist_wheel import bdist_wheel


class BdistWheelAnyPython(bdist_wheel):
    """py3-none-<platform>: libkvbm.so is loaded with ctypes, so the wheel
    fits every Python 3 of the platform, not only the one that built it."""

    def get_tag(self):  # type: ignore[no-untyped-def]
        return ("py3", "none", super().get_tag()[2])


setup(cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": BdistWheelAnyPython},
      distclass=BinaryDistribution)

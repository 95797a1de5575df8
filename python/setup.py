"""Builds the kiln package from a built kiln tree (pyproject.toml holds the
metadata): the pure-Python modules plus the build's runtime library and
kilnc, copied into kiln/_native, where kiln.runtime and kiln.config look
first after their environment variables. The tree is KILN_BUILD, else the
checkout's build/ (`make build`)."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def built_tree():
    b = os.environ.get("KILN_BUILD") or os.path.join(HERE, os.pardir, "build")
    b = os.path.abspath(b)
    need = [os.path.join(b, "libkiln_rt.so.0"), os.path.join(b, "kilnc")]
    missing = [p for p in need if not os.path.isfile(p)]
    if missing:
        raise SystemExit("kiln: %s not found: build kiln first (`make build`), or set KILN_BUILD "
                         "to its build directory" % " and ".join(missing))
    return need


class BuildPy(build_py):
    def run(self):
        super().run()
        lib, kilnc = built_tree()
        dst = os.path.join(self.build_lib, "kiln", "_native")
        os.makedirs(dst, exist_ok=True)
        shutil.copyfile(os.path.realpath(lib), os.path.join(dst, "libkiln_rt.so.0"))
        shutil.copy2(os.path.realpath(kilnc), os.path.join(dst, "kilnc"))


class BinaryDistribution(Distribution):
    """Carries native files, so the wheel is tagged for this platform."""

    def has_ext_modules(self):
        return True


setup(distclass=BinaryDistribution, cmdclass={"build_py": BuildPy})

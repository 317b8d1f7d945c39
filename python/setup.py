"""pip install of this folder (``pip install node_modules/cuda-ipc/python``): the project itself is in
pyproject.toml; this only copies the native helper of the npm package around this folder, where there
is one (its local build, else its prebuilt one for this machine), into the installed package as
``cuda_ipc/cuda_ipc_py.so``, where native_helper() looks (cuda_ipc/native/addon.py). Without one the
package installs as it is and runs its pure-Python path."""
from __future__ import annotations

import os
import platform
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

_ARCHS = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
HERE = os.path.dirname(os.path.abspath(__file__))


def npm_helper() -> str | None:
    """The helper of the npm package this folder lies in (``<package>/python``), or None."""
    root = os.path.dirname(HERE)
    arch = _ARCHS.get(platform.machine().lower(), platform.machine().lower())
    for path in (os.path.join(root, "build", "Release", "cuda_ipc_py.so"), os.path.join(root, "prebuilds", f"linux-{arch}", "cuda_ipc_py.so")):
        if os.path.isfile(path):
            return path
    return None


class BuildWithHelper(build_py):
    def run(self) -> None:
        super().run()
        helper = npm_helper()
        if helper is not None and not self.dry_run:
            target = os.path.join(self.build_lib, "cuda_ipc", "cuda_ipc_py.so")
            shutil.copyfile(helper, target)
            os.chmod(target, 0o755)
            print(f"cuda_ipc: copied the native helper {helper}")


setup(cmdclass={"build_py": BuildWithHelper})

"""Where native_helper() finds cuda_ipc_py.so for a copy of the package installed with pip: the helper
python/setup.py copied in from the npm package around it, or an npm install of cuda-ipc in the working
directory or above; where there is none, the reason says what a pip user can do. Each case runs a
fresh interpreter on a copy of the package outside the repository (so the repository's own build is
not what is found)."""
from __future__ import annotations

import filecmp
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import unittest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(PYTHON_DIR)
BUILT = os.path.join(REPO, "build", "Release", "cuda_ipc_py.so")
ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower(), platform.machine().lower())
NO_HELPER = None if os.path.isfile(BUILT) else f"{BUILT} is not built here (npm run build:native)"
try:
    import setuptools
    NO_SETUPTOOLS = None if int(setuptools.__version__.split(".")[0]) >= 61 else f"setuptools {setuptools.__version__} is older than 61"
except ImportError:
    NO_SETUPTOOLS = "setuptools is not installed for this Python"

ASK = "import json, cuda_ipc; h = cuda_ipc.native_helper(); print(json.dumps({'active': h.active, 'path': h.path, 'reason': h.reason, 'file': cuda_ipc.__file__}))"


def copy_package(into: str) -> str:
    """A copy of python/ (pyproject.toml, setup.py, README.md, cuda_ipc/ without any helper) under ``into``."""
    dest = os.path.join(into, "python")
    shutil.copytree(PYTHON_DIR, dest, ignore=shutil.ignore_patterns("__pycache__", "*.so", "tests", "build", "*.egg-info"))
    return dest


def ask(pythonpath: str, cwd: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_IPC_PY_NATIVE")}
    env["PYTHONPATH"] = pythonpath
    r = subprocess.run([sys.executable, "-c", ASK], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return json.loads(r.stdout)


class NativeHelperLookupTests(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="native-helper-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_without_a_helper_anywhere_the_reason_says_what_a_pip_user_can_do(self) -> None:
        site = os.path.join(self.dir, "site")
        shutil.copytree(os.path.join(PYTHON_DIR, "cuda_ipc"), os.path.join(site, "cuda_ipc"), ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        got = ask(site, self.dir)
        self.assertTrue(got["file"].startswith(site), got)
        self.assertFalse(got["active"])
        self.assertIsNone(got["path"])
        self.assertIn("pip install node_modules/cuda-ipc/python", got["reason"])
        self.assertIn(f"CUDA_IPC_PY_NATIVE_LIB=node_modules/cuda-ipc/prebuilds/linux-{ARCH}/cuda_ipc_py.so", got["reason"])
        self.assertIn("pure-Python path runs", got["reason"])
        self.assertLess(got["reason"].find("pip install"), got["reason"].find("npm run build:native"), "the pip user's way first; the clone's last")

    @unittest.skipIf(NO_HELPER, NO_HELPER)
    def test_an_npm_install_in_the_working_directory_or_above_is_found(self) -> None:
        site = os.path.join(self.dir, "site")
        shutil.copytree(os.path.join(PYTHON_DIR, "cuda_ipc"), os.path.join(site, "cuda_ipc"), ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        prebuilt = os.path.join(self.dir, "project", "node_modules", "cuda-ipc", "prebuilds", f"linux-{ARCH}", "cuda_ipc_py.so")
        os.makedirs(os.path.dirname(prebuilt))
        shutil.copyfile(BUILT, prebuilt)
        below = os.path.join(self.dir, "project", "src", "deeper")
        os.makedirs(below)
        for cwd in (os.path.join(self.dir, "project"), below):
            got = ask(site, cwd)
            self.assertTrue(got["active"], got)
            self.assertEqual(got["path"], prebuilt)

    @unittest.skipIf(NO_HELPER or NO_SETUPTOOLS, NO_HELPER or NO_SETUPTOOLS)
    def test_setup_py_copies_the_helper_of_the_npm_package_around_it(self) -> None:
        npm_package = os.path.join(self.dir, "node_modules", "cuda-ipc")
        os.makedirs(npm_package)
        python = copy_package(npm_package)
        prebuilt = os.path.join(npm_package, "prebuilds", f"linux-{ARCH}", "cuda_ipc_py.so")
        os.makedirs(os.path.dirname(prebuilt))
        shutil.copyfile(BUILT, prebuilt)
        out = os.path.join(self.dir, "built")
        r = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", out], cwd=python, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        copied = os.path.join(out, "cuda_ipc", "cuda_ipc_py.so")
        self.assertTrue(filecmp.cmp(copied, prebuilt, shallow=False), "the prebuilt helper, copied into the package")
        # Installed elsewhere (no node_modules around it or the working directory): found beside it.
        os.remove(prebuilt)
        got = ask(out, out)
        self.assertTrue(got["active"], got)
        self.assertEqual(got["path"], copied)


if __name__ == "__main__":
    unittest.main()

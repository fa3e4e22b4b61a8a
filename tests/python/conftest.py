"""Fixtures for the end-to-end tests: the stoker binary and small demo data."""
import os
import pathlib
import subprocess
import sys

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("STOKER_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))


def fake_nvml_library():
    """The test double of NVML the build makes (tests/share/fake_nvml.cc); skips when it is not built."""
    path = os.environ.get("STOKER_FAKE_NVML") or str(
        SOURCE_DIR / "build" / "release" / "fake-gpu" / "nvml" / "libnvidia-ml.so.1")
    if not os.path.exists(path):
        pytest.skip("the fake NVML is not built (%s)" % path)
    return path


@pytest.fixture(scope="session")
def stoker_bin():
    path = os.environ.get("STOKER_BIN", str(SOURCE_DIR / "build" / "release" / "stoker"))
    if not os.path.exists(path):
        pytest.fail("stoker binary not found at %s (build first, or set STOKER_BIN)" % path)
    return path


@pytest.fixture(scope="session")
def demo_images(tmp_path_factory):
    """A small ImageFolder tree of real JPEGs: 6 classes x 8 images."""
    out = tmp_path_factory.mktemp("demo") / "images"
    subprocess.run([sys.executable, str(SOURCE_DIR / "scripts" / "make_demo_data.py"), str(out),
                    "--classes", "6", "--per-class", "8", "--jobs", "2"], check=True, capture_output=True)
    return out


class Stoker:
    def __init__(self, binary):
        self.binary = binary

    def __call__(self, *args, check=True, **kwargs):
        result = subprocess.run([self.binary, *map(str, args)], capture_output=True, text=True, **kwargs)
        if check and result.returncode != 0:
            raise AssertionError("stoker %s failed (%d):\n%s%s" % (" ".join(map(str, args)), result.returncode,
                                                                    result.stdout, result.stderr))
        return result


@pytest.fixture(scope="session")
def stoker(stoker_bin):
    return Stoker(stoker_bin)


@pytest.fixture(scope="session")
def cli(stoker_bin):
    """The stoker command line, for tests that also import the stoker package."""
    return Stoker(stoker_bin)

"""The package as users install it: the type stubs describe the native module
(every public name both ways), and the package ships them; it imports and
decodes beside another libjpeg.so.62 loaded first (PyPI torchvision's)."""
import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import stoker
import stoker._native as native

STUB = pathlib.Path(stoker.__file__).with_name("_native.pyi")


def stub_names():
    tree = ast.parse(STUB.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            names = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign):
                    names.add(item.target.id)
            members[node.name] = names
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
    return top, members


def test_the_stubs_name_exactly_what_the_native_module_has():
    top, members = stub_names()
    actual = {n for n in dir(native) if not n.startswith("__")}
    assert top == actual, (sorted(top - actual), sorted(actual - top))
    for cls, names in members.items():
        real = {n for n in vars(getattr(native, cls)) if not n.startswith("__") or n == "__init__"}
        real.discard("__init__")
        names = names - {"__init__"}
        if cls in ("DType", "Layout", "Order", "CorruptPolicy", "TransformKind", "FieldKind"):
            real -= {"__entries", "__members__"}
        assert names == real, (cls, sorted(names - real), sorted(real - names))


def test_the_package_ships_its_stubs_and_marker():
    here = pathlib.Path(stoker.__file__).parent
    assert (here / "py.typed").exists() and STUB.exists()


# An ABI-incompatible library under libjpeg-turbo's soname, as PyPI's torchvision bundles one (IJG
# libjpeg, without jpeg_crop_scanline): a library of that soname loaded first used to be taken for
# stoker's, and `import torchvision; import stoker` failed with an undefined symbol.
FOREIGN_LIBJPEG = r"""
void jpeg_std_error(void) {}
"""

# The child imports nothing else that links libjpeg (Debian's torch does, through its HDF and GDCM
# libraries: the decode's capsule is checked without it); the pixels are the decode tests' business.
IMPORT_AFTER_IT = r"""
import ctypes, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)  # as torchvision's extension loads its own
import stoker
capsule, stored, delivered = stoker._native.decode_image(open(sys.argv[2], "rb").read(), "RGB", 0)
print("decoded", type(capsule).__name__, stored, delivered)
"""


def test_imports_and_decodes_after_another_libjpeg_of_the_same_soname(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the foreign libjpeg")
    source = tmp_path / "foreign.c"
    source.write_text(FOREIGN_LIBJPEG)
    library = tmp_path / "libjpeg.so.62"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libjpeg.so.62", "-o", str(library), str(source)],
                   check=True)
    import numpy as np
    from PIL import Image
    jpeg = tmp_path / "photo.jpg"
    Image.fromarray((np.arange(40 * 56 * 3) % 251).astype("uint8").reshape(40, 56, 3)).save(jpeg, "JPEG")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pathlib.Path(stoker.__file__).parents[1])] +
                                                      sys.path))
    r = subprocess.run([sys.executable, "-c", IMPORT_AFTER_IT, str(library), str(jpeg)], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "decoded PyCapsule uint8" in r.stdout, r.stdout

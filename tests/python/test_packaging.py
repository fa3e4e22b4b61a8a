"""The package as users install it: the type stubs describe the native module
(every public name both ways), and the package ships them."""
import ast
import pathlib

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

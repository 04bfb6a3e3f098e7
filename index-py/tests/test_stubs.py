"""The type stubs (`_native.pyi`) match the compiled module: the same names, classes with the
same methods and properties, and the same signatures (parameter names, kinds, defaults)."""

import ast
import inspect
from pathlib import Path

import pytest

import qkindex
from qkindex import _native

STUB = Path(qkindex.__file__).with_name("_native.pyi")
KIND = {
    "posonly": inspect.Parameter.POSITIONAL_ONLY,
    "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
    "kwonly": inspect.Parameter.KEYWORD_ONLY,
}


def _stub_tree():
    return ast.parse(STUB.read_text())


def _public(names):
    return {n for n in names if not (n.startswith("__") and n.endswith("__")) or n == "__version__"}


def _stub_params(fn: ast.FunctionDef):
    a = fn.args
    positional = [(p, "posonly") for p in a.posonlyargs] + [(p, "args") for p in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = []
    for (p, kind), d in zip(positional, defaults):
        out.append((p.arg, KIND[kind], _literal(d)))
    if a.vararg:
        out.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.empty))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((p.arg, KIND["kwonly"], _literal(d)))
    if a.kwarg:
        out.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty))
    return [x for x in out if x[0] != "self"]


def _literal(node):
    return inspect.Parameter.empty if node is None else ast.literal_eval(node)


def _runtime_params(obj):
    sig = inspect.signature(obj)
    out = []
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        out.append((p.name, p.kind, p.default))
    return out


def _module_stubs():
    tree = _stub_tree()
    functions, classes, names = {}, {}, set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = node
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return functions, classes, names


def test_module_names_match():
    _, _, names = _module_stubs()
    stub_names = {n for n in names if n not in {"ArrayLike", "PathLike"}}
    assert stub_names == _public(dir(_native))


def test_package_exports_exist():
    for name in qkindex.__all__:
        assert hasattr(qkindex, name), name


@pytest.mark.parametrize("name", sorted(_module_stubs()[0]))
def test_function_signatures_match(name):
    stub = _module_stubs()[0][name]
    assert _stub_params(stub) == _runtime_params(getattr(_native, name))


@pytest.mark.parametrize("name", sorted(_module_stubs()[1]))
def test_class_members_match(name):
    stub = _module_stubs()[1][name]
    cls = getattr(_native, name)
    if name == "FormatError":
        assert issubclass(cls, ValueError)
        return
    members = {n.name: n for n in stub.body if isinstance(n, ast.FunctionDef)}
    runtime = {n for n in _public(vars(cls)) if not n.startswith("_")}
    runtime |= {n for n in ("__len__",) if n in vars(cls)}
    # A class Python code constructs (a pyo3 `#[new]`, which gives the class a text signature)
    # has `__init__` in the stub, with the signature of the class itself.
    if getattr(cls, "__text_signature__", None) is not None:
        runtime.add("__init__")
    assert set(members) == runtime
    for mname, node in members.items():
        if mname == "__init__":
            assert _stub_params(node) == _runtime_params(cls), mname
            continue
        decorators = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
        attr = inspect.getattr_static(cls, mname)
        if "property" in decorators:
            # a data descriptor (pyo3 getters are getset or member descriptors), not a method
            assert hasattr(attr, "__set__") and not callable(attr), mname
            continue
        if "staticmethod" in decorators:
            assert isinstance(attr, staticmethod), mname
        assert _stub_params(node) == _runtime_params(getattr(cls, mname)), mname

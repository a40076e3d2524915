"""Which build of the runtime a test run exercises: the mypyc-compiled request path, or the source.

`make test` runs every tier on the compiled build (`KILN_RUNTIME_BUILD=compiled`: what the image
ships) and the runtime's unit tests once more on the pure source (`=pure`). A module missing
from the build, or compiled from an older source, would test code that is not the code shipped:
these fail then, with what to run. Without the variable (a developer's own pytest run) the tree
is either wholly compiled and current, or not compiled at all.
"""

import dataclasses
import functools
import importlib
import importlib.util
import os
from pathlib import Path
from types import FunctionType, ModuleType

import kiln_runtime

PACKAGE_DIR = Path(kiln_runtime.__file__).parent
RUNTIME_DIR = PACKAGE_DIR.parent  # the tree under test (the pure run's is a copy)
BUILD = os.environ.get("KILN_RUNTIME_BUILD", "")


@functools.cache
def setup_script() -> ModuleType:
    """The working tree's runtime_image/setup.py (the pure copy carries none), read once."""
    setup_py = Path(__file__).parents[3] / "runtime_image" / "setup.py"
    spec = importlib.util.spec_from_file_location("kiln_runtime_setup", setup_py)
    assert spec is not None and spec.loader is not None
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    return setup


def compiled_module_names() -> list[str]:
    """setup.py's COMPILED, as module names."""
    return [path.removesuffix(".py").replace("/", ".") for path in setup_script().COMPILED]


def source_of(name: str) -> Path:
    return RUNTIME_DIR / (name.replace(".", "/") + ".py")


def is_compiled(name: str) -> bool:
    return not str(importlib.import_module(name).__file__).endswith(".py")


def test_setup_compiles_the_modules_a_request_runs_through() -> None:
    names = compiled_module_names()
    for name in ["kiln_runtime.protocol.http2.connection", "kiln_runtime.batcher"]:
        assert name in names
    for name in names:  # each one a module of the package
        assert source_of(name).exists(), name


def test_the_run_exercises_the_build_it_names() -> None:
    compiled = {name: is_compiled(name) for name in compiled_module_names()}
    if BUILD == "compiled":
        missing = sorted(name for name, yes in compiled.items() if not yes)
        assert not missing, f"not compiled (run `make native`): {missing}"
    elif BUILD == "pure":
        stray = sorted(name for name, yes in compiled.items() if yes)
        assert not stray, f"compiled modules in a pure run: {stray}"
    else:
        assert len(set(compiled.values())) == 1, f"a partly compiled tree: {compiled}"


def test_compiled_modules_are_not_older_than_their_source() -> None:
    """The group's shared library is remade whenever any compiled module's source changes."""
    library = setup_script().GROUP.rpartition(".")[2] + "__mypyc*.so"
    libraries = list(PACKAGE_DIR.glob(library))
    if BUILD == "pure" or not libraries:
        assert BUILD != "compiled", "no compiled request path (run `make native`)"
        return
    built = max(found.stat().st_mtime for found in libraries)
    newer = sorted(
        name for name in compiled_module_names() if source_of(name).stat().st_mtime > built
    )
    assert not newer, f"edited after the build (run `make native`): {newer}"


# The objects the request path makes per call (or per arrival, per batch). mypyc compiles an
# ``__init__`` written out to C; a dataclass's or a NamedTuple's constructor is generated at
# import and runs as interpreted Python: 8 of them per gRPC call cost about 11 µs of the
# runtime's ~124 (bench/replay.py, INT8), the NamedTuples of the batch policy 6 more.
PER_CALL_CLASSES = [
    ("kiln_runtime.protocol.types", "Tensor"),
    ("kiln_runtime.protocol.types", "RequestedOutput"),
    ("kiln_runtime.protocol.types", "InferRequest"),
    ("kiln_runtime.protocol.types", "InferResponse"),
    ("kiln_runtime.protocol.http2.messages", "Request"),
    ("kiln_runtime.protocol.http2.messages", "Response"),
    ("kiln_runtime.protocol.http2.state", "Stream"),
    ("kiln_runtime.protocol.rest", "HttpResponse"),
    ("kiln_runtime.protocol.httpserver", "_Request"),
    ("kiln_runtime.batch_policy", "TrafficStats"),
    ("kiln_runtime.batch_policy", "BatchPlan"),
    ("kiln_runtime.batcher", "_Item"),
]


def test_the_objects_made_per_call_are_built_by_compiled_code() -> None:
    for module_name, class_name in PER_CALL_CLASSES:
        cls = getattr(importlib.import_module(module_name), class_name)
        where = f"{module_name}.{class_name}"
        assert not dataclasses.is_dataclass(cls), f"{where}: a dataclass's __init__ is Python"
        assert not issubclass(cls, tuple), f"{where}: a NamedTuple's constructor is Python"
        assert module_name in compiled_module_names(), f"{where}: its module is not compiled"
        if BUILD == "compiled":
            constructor = cls.__init__
            assert not isinstance(constructor, FunctionType), f"{where}: __init__ is interpreted"

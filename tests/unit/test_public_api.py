"""The public API is a promise: every name `funke`, `funke.state`, `funke.client` and `funke.testing` export, and
every signature, as recorded in public_api.txt. A name that disappears or changes its signature
fails here; so does a new one, until it is recorded on purpose:

    FUNKE_RECORD_PUBLIC_API=1 .venv/bin/python -m pytest tests/unit/test_public_api.py

A removal or change needs a deprecation period (the old form working and warning for a minor
version) and a "Breaking changes" line in CHANGELOG.md.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORD = Path(__file__).with_name("public_api.txt")
PUBLIC_MODULES = ("funke", "funke.state", "funke.client", "funke.testing")


def _signature(obj: object) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _members(cls: type) -> list[str]:
    """The public attributes a class of funke's defines or inherits from funke's classes."""
    lines = []
    names = sorted({n for c in cls.__mro__ if c.__module__.startswith("funke") for n in vars(c)
                    if not n.startswith("_") or n in ("__init__", "__call__", "__iter__", "__enter__", "__exit__")})
    for name in names:
        owner = next(c for c in cls.__mro__ if name in vars(c))
        raw = vars(owner)[name]
        if isinstance(raw, property):
            lines.append(f"  {name}: property")
        elif isinstance(raw, (staticmethod, classmethod)):
            lines.append(f"  {name}{_signature(getattr(cls, name))} [{type(raw).__name__}]")
        elif inspect.isfunction(raw):
            lines.append(f"  {name}{_signature(raw)}")
        elif name != "__init__" and not name.startswith("_"):
            lines.append(f"  {name}: {type(raw).__name__}")
    return lines


def surface() -> list[str]:
    lines = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in sorted(module.__all__):
            obj = getattr(module, name)
            where = f"{module_name}.{name}"
            if inspect.isclass(obj):
                bases = ", ".join(b.__name__ for b in obj.__bases__)
                lines.append(f"class {where}({bases}){_signature(obj)}")
                lines.extend(_members(obj))
            elif callable(obj):
                lines.append(f"def {where}{_signature(obj)}")
            else:
                lines.append(f"{where}: {type(obj).__name__}" + (f" = {obj!r}" if name != "__version__" else ""))
    return lines


def test_every_public_name_and_signature_is_as_recorded() -> None:
    now = surface()
    if os.environ.get("FUNKE_RECORD_PUBLIC_API"):
        RECORD.write_text("\n".join(now) + "\n")
    recorded = RECORD.read_text().splitlines()
    gone = [line for line in recorded if line not in now]
    new = [line for line in now if line not in recorded]
    assert not gone and not new, (
        "the public API differs from tests/unit/public_api.txt\n"
        + "".join(f"- {line}\n" for line in gone) + "".join(f"+ {line}\n" for line in new)
        + "A name removed or changed breaks users: keep the old form working with a DeprecationWarning for a "
          "minor version and add a 'Breaking changes' line to CHANGELOG.md. Then record the new surface: "
          "FUNKE_RECORD_PUBLIC_API=1 pytest tests/unit/test_public_api.py")


def test_the_record_lists_the_names_users_import() -> None:
    """The names the README, the examples and the docs use are there (a record that lost them
    would let the test above pass on an empty API)."""
    recorded = RECORD.read_text()
    for name in ("class funke.ExecutionEnvironment(", "class funke.JobGraph(", "class funke.JobExecutionResult(",
                 "class funke.state.KeyedProcessFunction(", "class funke.state.ValueState(",
                 "class funke.client.JobManagerClient(", "def funke.client.load_job_file("):
        assert name in recorded, name


def test_public_names_are_the_objects_funke_runs_with() -> None:
    """The public names are the very classes funke's inside uses (not copies), so isinstance and
    pickling by value of a KeyedProcessFunction subclass work as before."""
    import funke
    import funke.state
    from funke.common.api import dsl, state
    from funke.deploy import client

    assert funke.ExecutionEnvironment is dsl.ExecutionEnvironment
    assert funke.state.KeyedProcessFunction is state.KeyedProcessFunction
    assert importlib.import_module("funke.client").JobManagerClient is client.JobManagerClient
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        funke.Nope  # noqa: B018


def test_importing_funke_common_does_not_load_the_client() -> None:
    """A TaskManager or a Spark worker imports funke.common's modules: the public package above
    them must not drag in the client, gRPC or the DSL."""
    code = ("import sys, funke.common.streaming.state; "
            "print(sorted(m for m in sys.modules if m.startswith(('funke.deploy', 'grpc', 'funke.common.api'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]", out.stdout


# The 0.2.0 module paths, moved in 0.3.0 (common/moved.py): each still imports, is the module at
# its new path, and warns naming where to import from instead.
OLD_PATHS = [
    ("funke.common.dsl", "funke.common.api.dsl", "from funke import ExecutionEnvironment"),
    ("funke.common.jobgraph", "funke.common.graph.jobgraph", "from funke import JobGraph"),
    ("funke.common.codec", "funke.common.wire.codec", "from funke.client import job_graph_to_proto"),
    ("funke.common.scheduler", "funke.common.scheduling.scheduler", "it is funke.common.scheduling.scheduler now"),
    ("funke.common.streamsources", "funke.common.streaming.sources", "it is funke.common.streaming.sources now"),
]


@pytest.mark.parametrize("old, new, instead", OLD_PATHS)
def test_a_0_2_0_module_path_still_imports_and_warns(old: str, new: str, instead: str) -> None:
    code = (f"import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            f"try:\n    import {old}\nexcept DeprecationWarning as w:\n    print(w)\n"
            f"import importlib, sys\nwarnings.simplefilter('ignore')\n"
            f"print(importlib.import_module({old!r}) is importlib.import_module({new!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    warned, same = out.stdout.strip().splitlines()
    assert warned.startswith(f"{old} moved in funke 0.3.0 and this path goes in 0.5.0") and instead in warned, warned
    assert same == "True"


# Every name funke.common.api.dsl had at module level in 0.4.0, when the DSL was one file: job files
# of 0.3.0 and the 0.2.0 alias funke.common.dsl import from that path, and funke's own tests do.
DSL_0_4_0 = ("UID_MAX_LENGTH _JOIN_TYPES _WRITE_MODES _OperatorHandle _SinkT DataStream KeyedStream WindowedStream "
             "WindowedDataStream DataStreamSink CollectSink ExecutionEnvironment StreamReader _positive_int _location "
             "_label _non_empty_str _column_name _millis _signed_millis _job_type _output_schema _sql _keys _port _db "
             "_pickled _option_text _spark_options _range_config _ddl_column_names _collection_row ids "
             "BATCH_SHUFFLE_MODE OPERATOR_CHAINING RECEIVERS_GROUP Chaining Exchange ExchangeKind Plan Transformation "
             "translate Artifact FailoverStrategyKind JobGraph JobType RestartStrategyConfig JOIN_TYPES SINK_MODES "
             "ALL_OUTPUT_MODES OUTPUT_MODE REDIS SOCKET STREAM_SOURCE_KINDS DELTA_MODES").split()


def test_the_dsl_module_path_keeps_every_name_it_had() -> None:
    """The DSL is split by what it builds (environment, streamreader, datastream, handles,
    arguments); funke.common.api.dsl still gives every name it gave, as the very objects the
    public package gives."""
    import funke
    from funke.common.api import dsl

    missing = [name for name in DSL_0_4_0 if not hasattr(dsl, name)]
    assert not missing, f"funke.common.api.dsl lost {missing}"
    for name in dsl.__all__:
        if name in funke.__all__:
            assert getattr(funke, name) is getattr(dsl, name), name


# funke.common's modules in 0.2.0 (`git ls-tree --name-only 41ee15f~1 common/`, the tree before
# 0.3.0 grouped them into floors).
COMMON_0_2_0 = ("backpressure batchflow checkpoint codec combine configuration conformance deployment "
                "deploymentfactory dsl durations executiongraph failover ids inputgates jobgraph jobviews layout "
                "leadership microbatch operators regions restart scheduler schedulingstrategy security slotmanager "
                "slotsharing states streamingjob streamsources taskexecutorstate validation").split()


def test_every_module_path_of_0_2_0_is_kept() -> None:
    """Every module of funke.common that 0.2.0 had imports today, at its path or as a moved one."""
    from funke.common import moved

    missing = []
    for name in (f"funke.common.{m}" for m in COMMON_0_2_0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                importlib.import_module(name)
            except ImportError:
                missing.append(name)
    assert not missing, f"0.2.0 paths that no longer import: {missing} (add them to common/moved.py)"
    assert {m.removeprefix("funke.common.") for m in moved.MOVED} <= set(COMMON_0_2_0)


def test_a_0_2_0_job_file_loads_and_funke_submit_shows_its_warning(tmp_path: Path) -> None:
    job = tmp_path / "old_job.py"
    job.write_text("from funke.common.dsl import ExecutionEnvironment\n\n"
                   "def build(args):\n"
                   "    env = ExecutionEnvironment('old', job_type='batch', parallelism=1)\n"
                   "    env.from_range(3).collect()\n"
                   "    return env.build()\n")
    code = f"from funke.client import load_job_file; print(load_job_file({str(job)!r}).name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "old"
    assert f"{job}:1: FunkeDeprecationWarning: funke.common.dsl moved in funke 0.3.0" in out.stderr, out.stderr


def test_examples_docs_and_the_notebook_import_only_the_public_api() -> None:
    """What users copy imports only funke, funke.state, funke.client and funke.testing. The demo runners
    (examples/*demo.py) also read funke's inside to check each batch, and say so."""
    public = set(PUBLIC_MODULES)
    found = []
    texts = {p: p.read_text() for p in [*ROOT.glob("examples/*.py"), *ROOT.glob("docs/**/*.md"), ROOT / "README.md"]}
    import json
    notebook = json.loads((ROOT / "examples" / "notebook.ipynb").read_text())
    texts[ROOT / "examples" / "notebook.ipynb"] = "\n".join("".join(c["source"]) for c in notebook["cells"]
                                                           if c["cell_type"] == "code")
    for path, text in texts.items():
        if path.name.endswith("demo.py"):
            continue
        blocks = [text] if path.suffix in (".py", ".ipynb") else _python_blocks(text)
        for block in blocks:
            for module in _imported_funke_modules(block):
                if module not in public:
                    found.append(f"{path.relative_to(ROOT)}: {module}")
    assert not found, "internal import paths in what users read:\n" + "\n".join(found)


def _python_blocks(markdown: str) -> list[str]:
    blocks, inside, current = [], False, []
    for line in markdown.splitlines():
        if line.strip().startswith("```"):
            if inside:
                blocks.append("\n".join(current))
                current = []
            inside = not inside and line.strip().removeprefix("```").strip() in ("python", "py", "")
            continue
        if inside:
            current.append(line)
    return blocks


def _imported_funke_modules(source: str) -> list[str]:
    try:
        trees = [ast.parse(source)]
    except SyntaxError:  # a shell block, a fragment or prose: its import lines that parse still count
        trees = []
        for line in source.splitlines():
            if line.lstrip().startswith(("import ", "from ")):
                try:
                    trees.append(ast.parse(line.strip()))
                except SyntaxError:  # "from another host, ..."
                    pass
    out = []
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names if a.name.split(".")[0] == "funke")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "funke":
            out.append(node.module)
    return out

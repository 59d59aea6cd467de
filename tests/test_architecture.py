"""The folders tell one call's path, and imports run one way down it (docs/architecture.md).

Every ``fluid_build`` import in ``src/`` (lazy ones inside functions too) is
checked against the layer order of docs/architecture.md: a module may import
its own layer and the layers below it, never one above.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

#: Top to bottom, as docs/architecture.md draws them; a package's first match wins.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("fluid_build.cli",),
    ("fluid_build.forge", "fluid_build.corpus", "fluid_build.aiconfig"),
    ("fluid_build.copilot.loop",),
    ("fluid_build.copilot.client", "fluid_build.copilot", "fluid_build.copilot.batch"),
    # Above the call: the call knows a trace only through call/trace.py's protocol.
    ("fluid_build.copilot.telemetry",),
    ("fluid_build.copilot.call",),
    ("fluid_build.copilot.health", "fluid_build.copilot.schema", "fluid_build.copilot.llm"),
    ("fluid_build.copilot.agents",),
    (
        "fluid_build.config",
        "fluid_build.errors",
        "fluid_build._files",
        "fluid_build._private",
        "fluid_build._version",
        "fluid_build._redact",
        "fluid_build._lazy",
    ),
)
#: Entry points that sit above everything by design.
ABOVE_ALL = {"fluid_build", "fluid_build.__main__", "fluid_build.fakeserver"}


def layer_of(module: str) -> int:
    for depth, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if prefix == "fluid_build.copilot":
                if module == prefix:
                    return depth
            elif module == prefix or module.startswith(prefix + "."):
                return depth
    raise AssertionError(f"{module} belongs to no layer of docs/architecture.md")


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        found.append((name, path))
    return found


def imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in out if name.split(".")[0] == "fluid_build"]


def test_every_module_sits_in_a_layer() -> None:
    for name, _ in modules():
        if name not in ABOVE_ALL:
            layer_of(name)


def test_imports_never_run_up_the_layers() -> None:
    upward = []
    for name, path in modules():
        if name in ABOVE_ALL:
            continue
        mine = layer_of(name)
        for line, target in imports(path):
            if target not in ABOVE_ALL and layer_of(target) < mine:
                upward.append(f"{path.relative_to(SRC)}:{line} {name} -> {target}")
    assert upward == []


def test_the_provider_adapters_import_no_other_part_of_the_call() -> None:
    """``copilot/llm`` is adapters only: health and schema are the call's business."""
    for name, path in modules():
        if name.startswith("fluid_build.copilot.llm"):
            for line, target in imports(path):
                assert not target.startswith(
                    ("fluid_build.copilot.health", "fluid_build.copilot.schema")
                ), f"{path.name}:{line} imports {target}"


PACKAGES = sorted(
    ".".join(init.parent.relative_to(SRC).parts)
    for init in SRC.rglob("__init__.py")
    if init.parent != SRC / "fluid_build"
)


@pytest.mark.parametrize("package", PACKAGES)
def test_docs_architecture_names_every_package(package: str) -> None:
    folder = "/".join(package.split(".")[1:]) + "/"
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert re.search(rf"(?<![\w/]){re.escape(folder)}", text), f"{folder} is not on the map"


def import_graph() -> dict[str, set[str]]:
    """Every fluid_build module and the fluid_build modules it imports (lazy ones too)."""
    names = {name for name, _ in modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules():
        targets = set()
        for _, target in imports(path):
            while target not in names and "." in target:  # `from pkg.mod import name`
                target = target.rsplit(".", 1)[0]
            if target in names and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import circles: each set of modules that import one another, round and round."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        order[node] = low[node] = len(order)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in order:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], order[target])
        if low[node] == order[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return found


#: Circles still to break: none (issue 22, item 15 broke the last three). A new one fails
#: test_no_new_import_circle; put the shared piece below both modules instead.
KNOWN_CIRCLES: tuple[frozenset[str], ...] = ()


def test_no_new_import_circle() -> None:
    new = [
        sorted(circle)
        for circle in circles(import_graph())
        if not any(circle <= known for known in KNOWN_CIRCLES)
    ]
    assert new == []


def test_the_exit_code_map_imports_no_command() -> None:
    """exit_codes sits below every command: a command imports it, never the other way."""
    commands = {"ai", "batch", "corpus", "doctor", "forge"}
    graph = import_graph()
    assert {f"fluid_build.cli.{c}" for c in commands} & graph["fluid_build.cli.exit_codes"] == set()


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [{"a", "b", "c"}]


#: The most lines a module under src/ may have (issue 36 item 6): past it, a module holds
#: more than one role; split it along a seam (docs/architecture.md names each module's role).
MAX_MODULE_LINES = 850
#: Modules allowed past MAX_MODULE_LINES, each with why.
LONG_MODULES = {
    # Data tables: one row per rule / per provider and model, read top to bottom.
    "fluid_build/copilot/agents/classification_rules.py",
    "fluid_build/copilot/call/capabilities.py",
    # Seven roles in one module: to be split into a package in issue 36 item 1.
    "fluid_build/copilot/call/transport.py",
}


def long_modules(root: Path, most: int) -> dict[str, int]:
    """Each module under ``root`` with more than ``most`` lines, and its count."""
    counts = {}
    for path in sorted(root.rglob("*.py")):
        with path.open(encoding="utf-8") as lines:
            counts[path.relative_to(root).as_posix()] = sum(1 for _ in lines)
    return {name: count for name, count in counts.items() if count > most}


def test_no_module_is_over_850_lines_but_the_named_ones() -> None:
    over = {n: c for n, c in long_modules(SRC, MAX_MODULE_LINES).items() if n not in LONG_MODULES}
    assert over == {}


def test_the_long_module_finder_counts_lines(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 4, encoding="utf-8")
    (tmp_path / "short.py").write_text("x = 1\n" * 3, encoding="utf-8")
    assert long_modules(tmp_path, 3) == {"pkg/long.py": 4}


SEAMS = SRC / "fluid_build" / "copilot" / "call" / "seams.py"
#: What looks a member up by a name given as a string: a ``fluid_*`` seam looked up so
#: is a contract mypy cannot see (call/seams.py declares them instead).
LOOKUPS = {"getattr", "hasattr", "setattr", "delattr", "attrgetter", "getattr_static"}


def named_lookups(tree: ast.AST) -> list[tuple[int, str]]:
    """Each ``getattr(x, "fluid_...")``-like call in ``tree``: its line and the name."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name not in LOOKUPS:
            continue
        for arg in node.args:
            text = arg.value if isinstance(arg, ast.Constant) else None
            if isinstance(arg, ast.JoinedStr) and arg.values:
                head = arg.values[0]
                text = head.value if isinstance(head, ast.Constant) else None
            if isinstance(text, str) and text.startswith("fluid_"):
                found.append((node.lineno, text))
    return found


def test_no_fluid_seam_is_looked_up_by_name() -> None:
    """The ``fluid_*`` hooks between prepare, drive, wire and the direct request are
    declared Protocols (call/seams.py), never found with getattr/hasattr."""
    found = [
        f"{path.relative_to(SRC)}:{line} {name}"
        for _, path in modules()
        for line, name in named_lookups(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        'getattr(pool, "fluid_send", None)',
        'hasattr(stream, "fluid_direct")',
        'operator.attrgetter("fluid_url")(request)',
        'getattr(request, f"fluid_{name}")',
    ],
)
def test_the_lookup_finder_finds_a_lookup(source: str) -> None:
    assert [line for line, _ in named_lookups(ast.parse(source))] == [1]


def declared_seams() -> set[str]:
    """The ``fluid_*`` members the Protocols of call/seams.py declare."""
    names = set()
    for node in ast.walk(ast.parse(SEAMS.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if name.startswith("fluid_")}


def test_every_fluid_member_is_a_declared_seam() -> None:
    """A ``fluid_*`` member used or defined anywhere in src/ is one call/seams.py declares:
    a new hook is written into the contract, not found by a name only its two ends know."""
    declared = declared_seams()
    undeclared = []
    for _, path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = None
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = node.name
            elif isinstance(node, ast.AnnAssign | ast.Assign):
                targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                name = next((n for n in names if n.startswith("fluid_")), None)
            if name and name.startswith("fluid_") and name not in declared:
                undeclared.append(f"{path.relative_to(SRC)}:{node.lineno} {name}")
    assert declared >= {"fluid_json_request", "fluid_send", "fluid_read", "fluid_fields"}
    assert undeclared == []


def test_the_seams_sit_below_every_module_that_meets_at_them() -> None:
    """call/seams.py imports no other fluid_build module, so prepare, drive, wire and the
    transport all import it and none of them has to import another for the contract."""
    assert imports(SEAMS) == []
    graph = import_graph()
    meeting = {
        f"fluid_build.copilot.call.{name}" for name in ("prepare", "drive", "wire", "transport")
    }
    assert {name for name in meeting if "fluid_build.copilot.call.seams" in graph[name]} == meeting
    assert layer_of("fluid_build.copilot.call.seams") == layer_of("fluid_build.copilot.call.wire")

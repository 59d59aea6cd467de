"""The folders tell one call's path, and imports run one way down it (docs/architecture.md).

Every ``fluid_build`` import in ``src/`` (lazy ones inside functions too) is
checked against the layer order of docs/architecture.md: a module may import
its own layer and the layers below it, never one above.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import cast

import pytest

from fluid_build.copilot.llm.openai import OpenAIAdapter
from fluid_build.copilot.llm.registry import ProviderEntry

SRC = Path(__file__).resolve().parents[1] / "src"
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

#: Top to bottom, as docs/architecture.md draws them; the longest matching prefix wins.
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
        # The provider table imports nothing of fluid_build: every layer reads it, the error
        # contract too (tests below check it stays a leaf).
        "fluid_build.copilot.llm.registry",
        "fluid_build.config",
        "fluid_build.errors",
        "fluid_build._files",
        "fluid_build._private",
        "fluid_build._version",
        "fluid_build._redact",
        "fluid_build._lazy",
        "fluid_build._threads",
    ),
)
#: Entry points that sit above everything by design.
ABOVE_ALL = {"fluid_build", "fluid_build.__main__", "fluid_build.fakeserver"}


def layer_of(module: str) -> int:
    found: tuple[int, int] | None = None  # (prefix length, depth)
    for depth, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if prefix == "fluid_build.copilot":
                matches = module == prefix
            else:
                matches = module == prefix or module.startswith(prefix + ".")
            if matches and (found is None or len(prefix) > found[0]):
                found = (len(prefix), depth)
    if found is None:
        raise AssertionError(f"{module} belongs to no layer of docs/architecture.md")
    return found[1]


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


# -- One registry entry per provider (issue 36 item 2) ---------------------------------------

REGISTRY = SRC / "fluid_build" / "copilot" / "llm" / "registry.py"
#: Lists of provider names still kept outside the registry, each with why: (module, the
#: top-level name holding the list). Any other list of two or more names fails.
KEPT_PROVIDER_LISTS = {
    # The capability matrix is a table of models by section, and its option rules name
    # the providers serving each model family (a new provider with models of its own
    # adds rows there; an entry's ``family`` picks the section).
    ("fluid_build/copilot/call/capabilities.py", "_MATRIX"),
    ("fluid_build/copilot/call/capabilities.py", "_OPENAI"),
    ("fluid_build/copilot/call/capabilities.py", "_OPENAI_CHAT"),
    ("fluid_build/copilot/call/capabilities.py", "_CLAUDE"),
    ("fluid_build/copilot/call/capabilities.py", "_GEMINI"),
}
#: Comparisons with a provider's name kept outside the registry, each with why: (module, the
#: top-level function or name holding it). Any other (``if provider == "azure"``: a table in
#: hiding) fails.
KEPT_PROVIDER_BRANCHES = {
    # Matrix sections, not providers: Bedrock's model ids and the Responses API's fallback
    # to OpenAI's rows.
    ("fluid_build/copilot/call/capabilities.py", "_lookup"),
    ("fluid_build/copilot/call/capabilities.py", "_rule_name"),
    # The vendor inside a Bedrock model id ("anthropic.claude-..."), not a provider.
    ("fluid_build/copilot/llm/bedrock.py", "BedrockAdapter"),
}


def _holder(top: ast.stmt) -> str:
    """The name a top-level statement defines: its function, class or assigned name."""
    if isinstance(top, ast.Assign | ast.AnnAssign):
        targets = top.targets if isinstance(top, ast.Assign) else [top.target]
        return next((t.id for t in targets if isinstance(t, ast.Name)), "")
    if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return top.name
    return ""


def provider_names() -> frozenset[str]:
    """The names the registry gives its entries."""
    from fluid_build.copilot.llm.registry import PROVIDERS

    return frozenset(PROVIDERS)


def _named(nodes: list[ast.expr | None], names: frozenset[str]) -> list[str]:
    """The provider names among ``nodes`` and the pairs/rows they hold (not calls)."""
    found = []
    for node in nodes:
        if isinstance(node, ast.Constant) and node.value in names:
            found.append(node.value)
        elif isinstance(node, ast.Tuple | ast.List):
            found.extend(
                e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names
            )
    return found


def provider_lists(tree: ast.AST, names: frozenset[str]) -> list[tuple[int, str, list[str]]]:
    """Each tuple, list, set or dict literal in ``tree`` naming two or more providers (as
    items, dict keys or values, or inside its pairs): its line, the top-level name (or
    function) it sits in, and the names."""
    found = []
    for top in tree.body if isinstance(tree, ast.Module) else []:
        where = _holder(top)
        seen: set[int] = set()
        for node in ast.walk(top):
            items: list[ast.expr | None]
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                items = list(node.elts)
            elif isinstance(node, ast.Dict):
                items = [*node.keys, *node.values]
            else:
                continue
            if id(node) in seen:
                continue
            # A pair or row inside is counted with its table, not again on its own.
            seen.update(id(e) for e in items if isinstance(e, ast.Tuple | ast.List))
            named = _named(items, names)
            if len(named) >= 2:
                found.append((node.lineno, where, named))
    return found


def provider_branches(tree: ast.AST, names: frozenset[str]) -> list[tuple[int, str, str]]:
    """Each comparison of a value with a provider's name in ``tree``: its line, the top-level
    name it sits in, and the provider's name."""
    found = []
    for top in tree.body if isinstance(tree, ast.Module) else []:
        for node in ast.walk(top):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    if isinstance(side, ast.Constant) and side.value in names:
                        found.append((node.lineno, _holder(top), side.value))
    return found


def test_every_list_of_providers_is_the_registry() -> None:
    """A provider is one adapter module and one entry in llm/registry.py: no other module
    keeps a list, a set or a table of provider names (the six that did read the entries)."""
    names = provider_names()
    assert {"openai", "azure", "bedrock", "vertex", "groq", "llamacpp"} <= names
    lists = []
    for _, path in modules():
        if path == REGISTRY:
            continue
        where = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, holder, named in provider_lists(tree, names):
            if (where, holder) not in KEPT_PROVIDER_LISTS:
                lists.append(f"{where}:{line} {holder} {named}")
    assert lists == []


def test_the_registry_is_a_leaf_every_layer_may_read() -> None:
    """llm/registry.py imports no other fluid_build module (adapters load by dotted path,
    when a client is made), so the error contract below llm/ reads it as well."""
    assert imports(REGISTRY) == []
    assert layer_of("fluid_build.copilot.llm.registry") == len(LAYERS) - 1
    assert layer_of("fluid_build.copilot.llm.settings") < layer_of("fluid_build.copilot.agents")


@pytest.mark.parametrize("name", sorted(provider_names()))
def test_each_entry_names_what_exists(name: str) -> None:
    """The registry names its adapters and steps as strings, which mypy cannot follow: each
    must load (an adapter renamed or moved fails here, not in a user's first call), and each
    id it gives another table must be one that table has."""
    from genai_prices import data_snapshot

    from fluid_build.copilot.call.capabilities import _MATRIX
    from fluid_build.copilot.llm.base import Adapter
    from fluid_build.copilot.llm.registry import PROVIDERS, load

    entry = PROVIDERS[name]
    adapter = load(entry.adapter_class)
    assert issubclass(adapter, Adapter)
    assert adapter.provider == entry.adapter
    assert entry.adapter_class.startswith(f"fluid_build.copilot.llm.{entry.adapter}:")
    if entry.endpoint_step is not None:
        assert callable(load(entry.endpoint_step))
    if entry.price_id is not None:
        providers = {p.id for p in data_snapshot.get_snapshot().providers}
        assert entry.price_id in providers
    if entry.family is not None:
        assert entry.family in _MATRIX
    if entry.dialect is not None:
        assert entry.adapter == "openai_compatible"


def test_the_kept_lists_are_still_there() -> None:
    """Each exception still names a list (one that is gone is dropped from the set)."""
    names = provider_names()
    present = {
        (path.relative_to(SRC).as_posix(), holder)
        for _, path in modules()
        for _, holder, _ in provider_lists(ast.parse(path.read_text(encoding="utf-8")), names)
    }
    assert present >= KEPT_PROVIDER_LISTS


def test_no_module_branches_on_a_providers_name() -> None:
    """What differs between providers is a field of their entries: a comparison with one
    provider's name (the per-provider branches resolve_provider_config had) fails."""
    names = provider_names()
    branches = []
    present = set()
    for _, path in modules():
        if path == REGISTRY:
            continue
        where = path.relative_to(SRC).as_posix()
        for line, holder, name in provider_branches(ast.parse(path.read_text("utf-8")), names):
            present.add((where, holder))
            if (where, holder) not in KEPT_PROVIDER_BRANCHES:
                branches.append(f"{where}:{line} {holder} {name}")
    assert branches == []
    assert present >= KEPT_PROVIDER_BRANCHES  # an exception that is gone leaves the set


NAMES = frozenset({"openai", "azure", "vllm", "llamacpp", "bedrock", "vertex"})


@pytest.mark.parametrize(
    "source",
    [
        'SEVENTH = {"openai": "x", "azure": "y"}',
        'LOCAL: Final = frozenset({"vllm", "llamacpp"})',
        'HOSTS = (("api.openai.com", "openai"), ("openai.azure.com", "azure"))',
        'def f(p):\n    return p in ("bedrock", "vertex")',
        'NAMES = {"v": "vertex", "b": "bedrock"}',
        'ORDER = ["openai", "azure"]',
        'NESTED = {"servers": {"vllm": 1, "llamacpp": 2}}',
    ],
)
def test_the_provider_list_finder_finds_a_list(source: str) -> None:
    assert len(provider_lists(ast.parse(source), NAMES)) == 1


@pytest.mark.parametrize(
    "source",
    ['ONE = {"openai": 1}', 'WORDS = ("open", "ai")', 'RULE = Rule("openai", x=("azure",))'],
)
def test_the_provider_list_finder_leaves_what_is_not_a_list_of_providers(source: str) -> None:
    assert provider_lists(ast.parse(source), NAMES) == []


def test_the_branch_finder_finds_a_branch() -> None:
    tree = ast.parse('def f(info):\n    if info.adapter == "vertex":\n        return name != "x"')
    assert provider_branches(tree, NAMES) == [(2, "f", "vertex")]


class EchoAdapter(OpenAIAdapter):
    """A provider fluid has never heard of, speaking OpenAI's chat completions at home."""

    provider = "echo"
    default_base_url = "https://echo.example.test/v1"


#: The one entry that adds it: nothing else in src/ is edited.
ECHO = ProviderEntry(
    "echo",
    "echo",
    f"{__name__}:EchoAdapter",
    ("ECHO_API_KEY",),
    True,
    "gpt-4o-mini",
    "ECHO_BASE_URL",
    price_id="openai",  # it resells OpenAI's models at OpenAI's prices
    strict_schema=True,
    family="openai",
)
ECHO_ANSWER = {
    "id": "x",
    "model": "gpt-4o-mini",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}
    ],
    "usage": {"prompt_tokens": 1_000, "completion_tokens": 100, "total_tokens": 1_100},
}


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> ProviderEntry:
    from fluid_build.copilot.llm import registry

    # The table is read where it is used, never copied at import: one entry is enough.
    monkeypatch.setitem(cast("dict[str, ProviderEntry]", registry.PROVIDERS), "echo", ECHO)
    return ECHO


def test_a_new_provider_is_one_entry_for_the_settings(echo: ProviderEntry) -> None:
    from fluid_build.copilot.agents.errors import ProviderAuthError, ProviderError
    from fluid_build.copilot.llm.settings import resolve_provider_config

    config = resolve_provider_config(env={"FLUID_LLM_PROVIDER": "echo", "ECHO_API_KEY": "k-1"})
    assert (config.provider, config.model, config.api_key) == ("echo", "gpt-4o-mini", "k-1")
    assert config.base_url is None  # the adapter's own default serves it
    url = resolve_provider_config("echo", env={"ECHO_API_KEY": "k", "ECHO_BASE_URL": "http://h:1"})
    assert url.base_url == "http://h:1"
    with pytest.raises(ProviderAuthError) as missing:
        resolve_provider_config("echo", env={})
    assert missing.value.details["variable"] == "ECHO_API_KEY"
    assert "ECHO_API_KEY" in str(missing.value)
    with pytest.raises(ProviderError) as bad:
        resolve_provider_config("echo", env={"ECHO_API_KEY": "k", "ECHO_BASE_URL": "ftp://h"})
    assert bad.value.code == "llm.bad_endpoint"
    assert bad.value.details["variable"] == "ECHO_BASE_URL"


def test_a_new_provider_is_one_entry_for_the_client_and_prices(echo: ProviderEntry) -> None:
    import httpx

    from fluid_build.copilot import LLMClient
    from fluid_build.copilot.call.prices import known_price, price_call
    from fluid_build.copilot.llm.types import Usage

    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=ECHO_ANSWER)

    http = httpx.Client(transport=httpx.MockTransport(answer))
    env = {"ECHO_API_KEY": "k-echo", "FLUID_OPENAI_STRICT_SCHEMA": "1"}
    with LLMClient("echo", env=env, http_client=http) as client:
        assert type(client.adapter) is EchoAdapter
        assert client.strict_schema is True  # its entry says its API has strict mode
        done = client.complete("hi")
    http.close()
    assert done.text == "hi"
    assert str(sent[0].url) == "https://echo.example.test/v1/chat/completions"
    assert sent[0].headers["authorization"] == "Bearer k-echo"
    usage = Usage(input_tokens=1_000, output_tokens=100)
    assert known_price("echo", "gpt-4o-mini")
    assert done.cost_usd == price_call("openai", "gpt-4o-mini", usage)
    assert done.cost_usd is not None
    assert done.cost_usd > 0


def test_a_new_provider_is_one_entry_for_doctor(
    echo: ProviderEntry, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import json

    from click.testing import CliRunner

    from fluid_build.cli import doctor

    monkeypatch.setenv("FLUID_HOME", str(tmp_path / "fluid-home"))
    monkeypatch.setenv("FLUID_COOLDOWN_URL", "memory://")
    monkeypatch.setenv("ECHO_API_KEY", "k-echo-secret")
    result = CliRunner().invoke(doctor.command, ["--json"])
    assert result.exit_code == 0, result.output
    assert "k-echo-secret" not in result.output
    row = next(p for p in json.loads(result.output)["providers"] if p["name"] == "echo")
    assert row["adapter"] == "echo"
    assert row["key"]["present"] is True
    assert row["key"]["source"] == "ECHO_API_KEY"
    assert row["base_url"] == "https://echo.example.test/v1"  # the adapter's own default
    assert (row["model"], row["model_source"]) == ("gpt-4o-mini", "default")


def test_a_new_provider_is_one_entry_for_ai_setup_check(
    echo: ProviderEntry, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`fluid ai setup --check` asks the adapter what lists its models (no branch per
    provider in the CLI): a new provider's list is asked at its own home, with its key."""
    import respx
    from click.testing import CliRunner

    from fluid_build.cli import ai

    monkeypatch.setenv("FLUID_HOME", str(tmp_path / "fluid-home"))
    monkeypatch.setenv("ECHO_API_KEY", "k-echo-secret")
    with respx.mock(assert_all_called=True) as mock:
        route = mock.get("https://echo.example.test/v1/models").respond(
            200, json={"data": [{"id": "gpt-4o-mini"}]}
        )
        result = CliRunner().invoke(ai.command, ["setup", "--check", "--provider", "echo"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "echo: key accepted (1 models visible)"
    assert route.calls.last.request.headers["authorization"] == "Bearer k-echo-secret"
    assert "k-echo-secret" not in result.output


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


TRANSPORT = "fluid_build.copilot.call.transport"
#: The transport package's modules, top to bottom (docs/architecture.md, "The transport
#: package"): one role a module, each importing only the roles below it.
TRANSPORT_LAYERS = ("clients", "direct", "proxies", "aio", "sync", "gate", "faults", "config")


def test_the_transport_modules_import_one_way_down_the_package() -> None:
    graph = import_graph()
    members = sorted(name for name in graph if name.startswith(TRANSPORT + "."))
    assert members == sorted(f"{TRANSPORT}.{name}" for name in TRANSPORT_LAYERS)
    upward = [
        f"{name} -> {target}"
        for name in members
        for target in sorted(graph[name])
        if target.startswith(TRANSPORT + ".")
        and TRANSPORT_LAYERS.index(target.rpartition(".")[2])
        <= TRANSPORT_LAYERS.index(name.rpartition(".")[2])
    ]
    assert upward == []


def test_no_transport_module_is_over_400_lines() -> None:
    """Each role of the transport package reads on its own (issue 36 item 1)."""
    package = SRC / "fluid_build" / "copilot" / "call" / "transport"
    assert package.is_dir()
    assert not package.with_suffix(".py").exists()
    assert long_modules(package, 400) == {}


TRANSPORTS_DOC = ARCHITECTURE.with_name("transports.md")


def test_each_clause_of_the_transport_contract_points_at_modules_that_exist() -> None:
    """The contract is written once, in the transport package's docstring; docs/transports.md
    names, for each of its numbered clauses, the modules that keep it."""
    init = SRC / "fluid_build" / "copilot" / "call" / "transport" / "__init__.py"
    contract = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    clauses = re.findall(r"^(\d+)\. \*\*", contract, re.MULTILINE)
    assert clauses == [str(n) for n in range(1, len(clauses) + 1)]
    assert len(clauses) >= 8
    text = TRANSPORTS_DOC.read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+)\. [^|]+\|[^|]+\| (.+) \|$", text, re.MULTILINE)
    assert [number for number, _ in rows] == clauses
    for number, kept in rows:
        paths = re.findall(r"`([\w/]+(?:\.py|/))`", kept)
        assert paths, f"clause {number} names no module"
        for path in paths:
            where = SRC / "fluid_build" / "copilot" / path
            assert where.exists() or (SRC.parent / path).exists(), f"clause {number}: {path}"


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
        f"fluid_build.copilot.call.{name}"
        for name in ("prepare", "drive", "wire", "transport.direct", "transport.aio")
    }
    assert {name for name in meeting if "fluid_build.copilot.call.seams" in graph[name]} == meeting
    assert layer_of("fluid_build.copilot.call.seams") == layer_of("fluid_build.copilot.call.wire")

"""``from fluid_build import ...``: the public face, the same objects as the seed's paths, cheap."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fluid_build

ROOT = Path(__file__).resolve().parents[1]
ERRORS = "fluid_build.copilot.agents.errors"
CLASSIFICATION = "fluid_build.copilot.agents.error_classification"

#: Each public name and where it lives (the seed's paths for the error contract).
HOMES = {
    "LLMClient": "fluid_build.copilot",
    "Completion": "fluid_build.copilot",
    "Fallback": "fluid_build.copilot",
    "Usage": "fluid_build.copilot",
    "FluidError": ERRORS,
    "FluidGenerationError": ERRORS,
    "AgentExecutionError": ERRORS,
    "ProviderError": ERRORS,
    "RateLimitError": ERRORS,
    "ProviderTimeoutError": ERRORS,
    "ContextOverflowError": ERRORS,
    "ProviderAuthError": ERRORS,
    "ProviderServerError": ERRORS,
    "SchemaValidationError": ERRORS,
    "ToolValidationError": ERRORS,
    "RetryPolicy": "fluid_build.copilot.call.envelope",
    "RetryEnvelope": "fluid_build.copilot.call.envelope",
    "classify_provider_error": CLASSIFICATION,
    "parse_retry_after": CLASSIFICATION,
}

#: What ``import fluid_build`` must not pull in: it is what a library user pays for.
HEAVY = (
    "httpx",
    "httpcore",
    "pydantic",
    "tenacity",
    "tiktoken",
    "yaml",
    "rich",
    "click",
    "keyring",
)


def _run(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_all_is_sorted_and_exactly_the_public_names() -> None:
    assert fluid_build.__all__ == sorted(fluid_build.__all__)
    assert set(fluid_build.__all__) == {*HOMES, "__version__"}
    assert set(fluid_build.__all__) <= set(dir(fluid_build))


def test_every_name_imports_in_a_fresh_interpreter() -> None:
    names = ", ".join(sorted(HOMES))
    code = (
        f"from fluid_build import {names}\n"
        "import json, fluid_build\n"
        "print(json.dumps({n: getattr(fluid_build, n).__module__ for n in fluid_build.__all__ "
        "if n != '__version__'}))"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout)
    assert set(modules) == set(HOMES)


@pytest.mark.parametrize(("name", "home"), sorted(HOMES.items()))
def test_each_name_is_the_object_at_its_seed_path(name: str, home: str) -> None:
    assert getattr(fluid_build, name) is getattr(importlib.import_module(home), name)


def test_the_seed_paths_and_the_face_agree_in_a_fresh_interpreter() -> None:
    # Imported the other way round: the seed's module first, then the face.
    code = (
        "from fluid_build.copilot.agents.errors import RateLimitError as A\n"
        "from fluid_build.copilot.agents.error_classification import classify_provider_error as c\n"
        "from fluid_build import RateLimitError, classify_provider_error\n"
        "import httpx\n"
        "r = httpx.Response(429, headers={'retry-after': '7'}, "
        "request=httpx.Request('POST', 'https://api.openai.com/v1/chat/completions'))\n"
        "e = classify_provider_error(httpx.HTTPStatusError('x', request=r.request, response=r), "
        "provider='openai')\n"
        "assert A is RateLimitError and c is classify_provider_error\n"
        "assert isinstance(e, RateLimitError) and e.retry_after == 7.0, e\n"
        "print('ok')"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        _ = fluid_build.NoSuchThing  # type: ignore[attr-defined]
    with pytest.raises(ImportError):
        exec("from fluid_build import NoSuchThing", {})  # noqa: S102


def test_import_fluid_build_loads_no_heavy_module() -> None:
    """Checked on the modules ``-X importtime`` lists, not on the time they took."""
    done = _run("import fluid_build", "-X", "importtime")
    assert done.returncode == 0, done.stderr
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "fluid_build" in imported
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY)
    assert heavy == []
    ours = sorted(m for m in imported if m.startswith("fluid_build"))
    assert ours == [
        "fluid_build",
        "fluid_build._lazy",
        "fluid_build._version",
        "fluid_build.errors",
    ]


def test_a_name_loads_only_what_it_needs() -> None:
    code = (
        "import sys, fluid_build\n"
        "fluid_build.FluidError\n"
        "assert 'httpx' not in sys.modules and 'pydantic' not in sys.modules\n"
        "fluid_build.RateLimitError\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'rich', 'click'}))"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_type_checkers_see_every_lazy_name() -> None:
    """The ``if TYPE_CHECKING:`` imports name exactly the lazy attributes, each from its home."""
    source = (ROOT / "src" / "fluid_build" / "__init__.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    checked: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for child in node.body:
                assert isinstance(child, ast.ImportFrom)
                for alias in child.names:
                    checked[alias.name] = str(child.module)
    assert set(checked) == set(HOMES) - {"FluidError"}
    for name, module in checked.items():
        assert getattr(importlib.import_module(module), name) is getattr(fluid_build, name)


def test_the_readme_documents_every_public_name() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Python") :]
    section = section[: section.find("\n## ", 1)]
    missing = [name for name in HOMES if not re.search(rf"\b{name}\b", section)]
    assert missing == []

"""The installed package: version, typing marker, console script."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata, resources

import pytest

import fluid_build
from fluid_build.cli import main


def test_version_matches_the_distribution() -> None:
    assert fluid_build.__version__ == metadata.version("fluid-build")


def test_package_is_typed() -> None:
    assert resources.files("fluid_build").joinpath("py.typed").is_file()


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_cli_prints_its_version(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    assert main([flag]) == 0
    assert capsys.readouterr().out.strip() == f"fluid {fluid_build.__version__}"


def test_console_script_entry_point_is_declared() -> None:
    scripts = metadata.entry_points(group="console_scripts")
    assert any(ep.name == "fluid" and ep.value == "fluid_build.cli:main" for ep in scripts)


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fluid_build", "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert fluid_build.__version__ in done.stdout


def test_importing_the_agent_layer_stays_light() -> None:
    # httpx itself imports click, rich and pygments when they are installed (its CLI);
    # what matters here is what fluid_build adds on top of httpx.
    code = (
        "import sys, httpx; before = set(sys.modules);"
        "import fluid_build.copilot.agents.error_classification, fluid_build.copilot;"
        "added = {m.split('.')[0] for m in set(sys.modules) - before};"
        "print(sorted(added & {'tiktoken', 'pydantic', 'tenacity', 'rich', 'yaml', 'click'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_the_quick_starts_output_is_ignored_by_git() -> None:
    """README's offline `fluid forge` writes forge-out/ in the checkout; git must not list it."""
    import shutil
    from pathlib import Path

    git = shutil.which("git")
    assert git is not None, "git is needed to check .gitignore"
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [git, "check-ignore", "--no-index", "-q", "forge-out/contract.fluid.yaml"],
        cwd=root,
        check=False,
    )
    assert done.returncode == 0, "forge-out/ is not in .gitignore"

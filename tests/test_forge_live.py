"""`fluid forge` against a scripted model on 127.0.0.1, from the console script in a fresh HOME.

The model answers OpenAI's chat-completions shapes from a script of turns and
keeps every request body, so a test can count the requests and read what was
sent (the correction message, the tool results). Covers the live agent loop
(a failed contract check corrected, or given up on), the unknown-model warning
shown once, and `--record` / `--replay`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from fluid_build.cli import _register, cli
from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.copilot.call.prices import price_call
from fluid_build.copilot.health.budget import usd_amount
from fluid_build.copilot.llm.types import Usage
from fluid_build.corpus.cassette import CassetteError
from fluid_build.corpus.record import Recorder
from tests.test_cli_conventions import _DEFAULT_SIGINT

_register()

KEY = "sk-proj-FORGELIVE0123456789abcdefghij"
PLAN = {"tables": ["fct_sessions"], "steps": ["stage the events", "sessionize"], "notes": ""}
INTENT = {
    "data_product": {
        "name": "web_sessions",
        "domain": "web",
        "description": "Sessions on the web site, one row per session.",
        "owner": "web-data@example.com",
    },
    "grain": "one row per session",
    "dimensions": ["device", "country"],
    "metrics": ["sessions", "pageviews"],
    "modeling_technique": "one_big_table",
}
CONTRACT = {
    "name": "web_sessions",
    "domain": "web",
    "owner": "web-data@example.com",
    "description": "Sessions on the web site, one row per session.",
    "grain": "one row per session",
    "schema": [
        {"name": "session_id", "type": "string"},
        {"name": "device", "type": "string"},
        {"name": "pageviews", "type": "integer"},
    ],
}


# -- the scripted model --------------------------------------------------------------------

Turn = Callable[[dict[str, Any]], dict[str, Any]]


def _completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "finish_reason": finish, "message": message}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140},
    }


def says(data: dict[str, Any]) -> Turn:
    """A turn answering ``data`` as JSON text."""
    return lambda body: _completion({"role": "assistant", "content": json.dumps(data)})


def calls(*tools: tuple[str, dict[str, Any]]) -> Turn:
    """A turn asking for tool calls, ids call_1, call_2 ..."""
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            for i, (name, arguments) in enumerate(tools, 1)
        ],
    }
    return lambda body: _completion(message, finish="tool_calls")


def output(**contract: Any) -> dict[str, Any]:
    return {"contract": {**CONTRACT, **contract}, "rationale": "one wide table at the grain"}


@dataclass
class Scripted:
    """A chat-completions model on loopback answering from ``turns``; keeps every body."""

    turns: list[Turn]
    bodies: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""
    hold: threading.Event | None = None  # when set: the request after the turns waits on it
    waiting: threading.Event = field(default_factory=threading.Event)

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.bodies.append(body)
        index = len(self.bodies) - 1
        if index < len(self.turns):
            return 200, self.turns[index](body)
        if self.hold is not None:
            self.waiting.set()
            self.hold.wait(120)
        return 500, {"error": {"message": "the script ran out of turns", "type": "server_error"}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        with self.server.lock:
            status, payload = self.server.model.answer(json.loads(raw))
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, model: Scripted) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.model = model
        self.lock = threading.Lock()


@pytest.fixture
def serve() -> Iterator[Callable[..., Scripted]]:
    servers: list[_Server] = []

    def start(*turns: Turn, hold: threading.Event | None = None) -> Scripted:
        model = Scripted(list(turns), hold=hold)
        server = _Server(model)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}).start()
        host, port = server.server_address[:2]
        model.base_url = f"http://{host!s}:{port}/v1"
        servers.append(server)
        return model

    yield start
    for server in servers:
        if server.model.hold is not None:
            server.model.hold.set()
        server.shutdown()
        server.server_close()


# -- a fresh machine ------------------------------------------------------------------------


@dataclass
class Machine:
    """A fresh HOME, no provider variable from the developer's shell, a project directory."""

    home: Path
    project: Path
    env: dict[str, str]

    def live(self, model: Scripted) -> dict[str, str]:
        return {**self.env, "OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": model.base_url}

    def fluid(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [FLUID, *args],
            cwd=self.project,
            env=self.env if env is None else env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


FLUID = shutil.which("fluid", path=sysconfig.get_path("scripts")) or shutil.which("fluid") or ""
_PROVIDER_PREFIXES = (
    "OPENAI_",
    "AZURE_OPENAI_",
    "ANTHROPIC_",
    "GEMINI_",
    "GOOGLE_",
    "GROQ_",
    "MISTRAL_",
    "OPENROUTER_",
    "OLLAMA_",
    "FLUID_",
)


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    assert FLUID, "the fluid console script is not installed"
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PROVIDER_PREFIXES)}
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy"):
        env.pop(name, None)
    env.update(
        HOME=str(home),
        FLUID_HOME=str(home / ".fluid"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        NO_PROXY="127.0.0.1,localhost",
    )
    (project / "intent.yaml").write_text(yaml.safe_dump(INTENT), encoding="utf-8")
    (project / "events.sql").write_text("create table raw.events (session_id varchar(36));\n")
    return Machine(home, project, env)


def receipt(where: Path) -> dict[str, Any]:
    return json.loads((where / ".fluid" / "forge-receipt.json").read_text(encoding="utf-8"))


def last_user(body: dict[str, Any]) -> str:
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


# -- the live agent loop ---------------------------------------------------------------------


def test_a_failed_contract_check_is_corrected_inside_the_agent_loop(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    model = serve(
        says(PLAN),
        calls(("discover_workspace", {})),
        says(output(name="fct_sessions")),  # fails the check: the intent's name
        says(output()),
    )
    done = machine.fluid(
        "forge", "intent.yaml", "--agent-loop", "--model", "gpt-4o-mini", env=machine.live(model)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(model.bodies) == 4
    assert "tools" not in model.bodies[0]
    assert "tools" in model.bodies[1]
    listing = next(m for m in model.bodies[2]["messages"] if m["role"] == "tool")["content"]
    assert "events.sql" in listing
    assert "intent.yaml" in listing
    correction = last_user(model.bodies[3])
    assert "failed validation against `ForgeOutput`" in correction
    assert "- contract.name: must be 'web_sessions', the intent's name" in correction
    assert "fix  generate: output failed validation at contract.name" in done.stderr
    sent = json.dumps(model.bodies)
    assert str(machine.project) not in sent
    assert str(machine.home) not in sent
    assert KEY not in sent
    stages = {s["name"]: s for s in receipt(machine.project / "forge-out")["stages"]}
    assert stages["generate"]["corrections"] == [
        [
            {
                "loc": "contract.name",
                "msg": "must be 'web_sessions', the intent's name",
                "type": "value_error",
            }
        ]
    ]
    assert stages["generate"]["tool_calls"] == [
        {"round": 1, "name": "discover_workspace", "arguments": {}, "result": "ok"}
    ]
    contract = yaml.safe_load((machine.project / "forge-out/contract.fluid.yaml").read_text())
    assert contract["name"] == "web_sessions"


def test_the_agent_loop_gives_up_after_three_answers_and_writes_nothing(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    wrong = says(output(name="fct_sessions"))
    model = serve(says(PLAN), wrong, wrong, wrong)
    done = machine.fluid("forge", "intent.yaml", "--agent-loop", env=machine.live(model))
    assert done.returncode == EXIT_CODES["schema"], done.stdout + done.stderr
    assert len(model.bodies) == 4
    assert "gave up after 3 attempts" in done.stderr
    assert done.stderr.count("fix  generate") == 2
    assert not (machine.project / "forge-out").exists()


def test_a_file_the_workspace_lacks_is_a_correction_not_a_traceback(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    """issue 35 item 6, live: a model that asks read_sample_schema for a file that is not
    there gets a ToolValidationError (its class only, as for every tool failure), and the
    warning names the file and no traceback reaches stderr."""
    model = serve(
        says(PLAN),
        calls(("read_sample_schema", {"path": "sources/missing.sql"})),
        says(output()),
    )
    done = machine.fluid("forge", "intent.yaml", "--agent-loop", env=machine.live(model))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    told = next(m for m in model.bodies[2]["messages"] if m["role"] == "tool")["content"]
    assert json.loads(told)["error"] == "ToolValidationError"
    assert (
        "warning: tool read_sample_schema (call call_1) failed [tool.invalid_input]: the "
        "workspace has no file sources/missing.sql: call discover_workspace to list its files"
    ) in done.stderr
    stages = {s["name"]: s for s in receipt(machine.project / "forge-out")["stages"]}
    assert [c["result"] for c in stages["generate"]["tool_calls"]] == ["ToolValidationError"]


def test_a_stage_that_gives_up_does_not_say_asking_again_last(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    """issue 35 item 15: without the agent loop too, only the failures that are followed by
    another attempt say "asking again"; the third is followed by the error, and no fourth
    request is sent."""
    wrong = says(output(name="fct_sessions"))
    model = serve(says(PLAN), wrong, wrong, wrong)
    done = machine.fluid("forge", "intent.yaml", env=machine.live(model))
    assert done.returncode == EXIT_CODES["schema"], done.stdout + done.stderr
    assert len(model.bodies) == 4
    assert done.stderr.count("asking again") == 2
    notes = [line for line in done.stderr.splitlines() if "asking again" in line]
    assert "gave up after 3 attempts" in done.stderr.split(notes[-1], 1)[1]
    fix_lines = [line for line in done.stderr.splitlines() if line.strip().startswith("fix")]
    assert len(fix_lines) == 2


def test_the_unknown_model_warning_prints_once_and_other_warnings_still_print(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    model = serve(says(PLAN), says(output()))
    env = {**machine.live(model), "FLUID_COMPACTION_STRATEGY": "sideways"}
    done = machine.fluid("forge", "intent.yaml", "--agent-loop", "--model", "mystery-1", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count("openai:mystery-1 is not in the capability matrix") == 1
    assert done.stderr.count("FLUID_COMPACTION_STRATEGY='sideways'") == 1


# -- what the run cost ---------------------------------------------------------------------

#: One scripted answer (100 tokens in, 40 out) from gpt-4o-mini: 0.15 / 0.60 USD per million.
ANSWER_USD = price_call("openai", "gpt-4o-mini", Usage(input_tokens=100, output_tokens=40))


def answered_by(model: str, turn: Turn) -> Turn:
    """``turn``, named as answered by ``model`` (whose price then applies, or none)."""
    return lambda body: {**turn(body), "model": model}


def shown(done: subprocess.CompletedProcess[str]) -> str:
    """stderr with the console's line wrapping undone."""
    return " ".join(done.stderr.split())


def _plain() -> list[Turn]:
    return [says(PLAN), says(output())]


def _looped() -> list[Turn]:
    return [says(PLAN), calls(("discover_workspace", {})), says(output(name="x")), says(output())]


@pytest.mark.parametrize(("flags", "turns"), [((), _plain), (("--agent-loop",), _looped)])
def test_the_summary_line_and_the_receipt_say_what_the_run_cost(
    machine: Machine,
    serve: Callable[..., Scripted],
    flags: tuple[str, ...],
    turns: Callable[[], list[Turn]],
) -> None:
    assert ANSWER_USD is not None
    assert round(ANSWER_USD, 9) == 0.000039
    answers = len(turns())
    cost = answers * ANSWER_USD
    done = machine.fluid("forge", "intent.yaml", *flags, env=machine.live(serve(*turns())))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"({answers} model calls, 0.0 s waited, {answers * 140} tokens, {usd_amount(cost)} USD)"
        in (shown(done))
    )
    assert receipt(machine.project / "forge-out")["cost_usd"] == round(cost, 9)
    env = machine.live(serve(*turns()))
    as_json = machine.fluid("forge", "intent.yaml", *flags, "--json", "--out", "again", env=env)
    assert json.loads(as_json.stdout)["receipt"]["cost_usd"] == round(cost, 9)


def test_a_model_with_no_price_is_a_cost_unknown_not_zero(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    model = serve(answered_by("mystery-1", says(PLAN)), answered_by("mystery-1", says(output())))
    done = machine.fluid("forge", "intent.yaml", "--model", "mystery-1", env=machine.live(model))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "280 tokens, cost unknown: no price for openai:mystery-1, see docs/budgets.md)" in shown(
        done
    )
    assert "USD" not in done.stderr
    assert receipt(machine.project / "forge-out")["cost_usd"] is None


def test_a_partly_priced_run_shows_its_cost_as_a_floor(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    model = serve(says(PLAN), answered_by("mystery-1", says(output())))
    done = machine.fluid("forge", "intent.yaml", "--model", "mystery-1", env=machine.live(model))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"280 tokens, at least {usd_amount(ANSWER_USD or 0)} USD: no price for openai:mystery-1, "
        "see docs/budgets.md)" in shown(done)
    )
    assert receipt(machine.project / "forge-out")["cost_usd"] == round(ANSWER_USD or 0, 9)


def test_the_offline_example_spends_nothing_and_says_so(machine: Machine) -> None:
    done = machine.fluid("forge")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tokens, replayed: nothing spent)" in shown(done)
    assert "USD" not in done.stderr


# -- record and replay ----------------------------------------------------------------------


def _corrected_run(serve: Callable[..., Scripted]) -> Scripted:
    return serve(
        says(PLAN),
        says({"contract": {k: v for k, v in CONTRACT.items() if k != "grain"}, "rationale": "r"}),
        says(output()),
    )


def test_a_recorded_run_replays_offline_with_its_intent(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    model = _corrected_run(serve)
    done = machine.fluid("forge", "intent.yaml", "--record", "run.json", env=machine.live(model))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recorded run.json (3 exchanges)" in done.stderr
    text = (machine.project / "run.json").read_text(encoding="utf-8")
    assert KEY not in text
    cassette = json.loads(text)
    assert [e["response"]["status"] for e in cassette["exchanges"]] == [200, 200, 200]
    assert all(e["request"]["body"]["messages"] for e in cassette["exchanges"])
    assert cassette["expect"]["outcome"] == "success"
    assert cassette["expect"]["output"]["contract"]["name"] == "web_sessions"
    assert list((machine.project).glob(".run.json.*")) == []

    replayed = machine.fluid("forge", "intent.yaml", "--replay", "run.json", "--out", "again")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert len(model.bodies) == 3  # nothing was asked again
    first = (machine.project / "forge-out/contract.fluid.yaml").read_text()
    assert (machine.project / "again/contract.fluid.yaml").read_text() == first
    stages = {s["name"]: s for s in receipt(machine.project / "again")["stages"]}
    assert stages["generate"]["corrections"][0][0]["loc"] == "contract.grain"


def test_an_agent_loop_recording_replays_though_the_workspace_changed(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    model = serve(
        says(PLAN),
        calls(("discover_workspace", {}), ("read_sample_schema", {"path": "events.sql"})),
        says(output(name="fct_sessions")),
        says(output()),
    )
    done = machine.fluid(
        "forge", "intent.yaml", "--agent-loop", "--record", "loop.json", env=machine.live(model)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The workspace now holds forge-out/ and loop.json: discover_workspace answers otherwise,
    # and tool results are not compared.
    replayed = machine.fluid("forge", "intent.yaml", "--agent-loop", "--replay", "loop.json")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert len(model.bodies) == 4
    assert "fix  generate: output failed validation at contract.name" in replayed.stderr


def test_replaying_with_another_intent_names_the_first_request_that_differs(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    model = _corrected_run(serve)
    recorded = machine.fluid(
        "forge", "intent.yaml", "--record", "run.json", env=machine.live(model)
    )
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    other = {**INTENT, "grain": "one row per session and page"}
    (machine.project / "other.yaml").write_text(yaml.safe_dump(other), encoding="utf-8")

    done = machine.fluid("forge", "other.yaml", "--replay", "run.json", "--out", "o")
    assert done.returncode == EXIT_CODES["corpus_mismatch"] == 30, done.stdout + done.stderr
    assert "fluid: ReplayMismatch" in done.stderr
    assert "request 1: the request differs at body.messages[1].content" in done.stderr
    assert "unexpected" not in done.stderr
    assert "bug" not in done.stderr
    assert not (machine.project / "o").exists()

    as_json = machine.fluid("forge", "other.yaml", "--replay", "run.json", "--json")
    assert as_json.returncode == 30
    error = json.loads(as_json.stdout.strip().splitlines()[-1])["error"]
    assert error["error"] == "ReplayMismatch"
    assert error["request"] == 1
    assert error["field"] == "body.messages[1].content"
    # Both cut short around the first character that differs, newlines shown as spaces.
    assert error["expected"].startswith("…n. Grain: one row per session Dimensions: device")
    assert error["got"].startswith("…n. Grain: one row per session and page Dimensions: dev")
    assert len(error["expected"]) <= 100
    assert len(error["got"]) <= 100


def test_a_failed_run_is_recorded_with_its_error_and_replays_to_it(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    broken = says({"contract": {"name": "web_sessions"}, "rationale": "r"})
    model = serve(says(PLAN), broken, broken, broken)
    done = machine.fluid("forge", "intent.yaml", "--record", "failed.json", env=machine.live(model))
    assert done.returncode == EXIT_CODES["schema"], done.stdout + done.stderr
    assert "recorded the failed run in failed.json" in done.stderr
    expect = json.loads((machine.project / "failed.json").read_text())["expect"]
    assert expect["outcome"] == "error"
    assert expect["error_class"] == "SchemaValidationError"
    assert expect["attempts"] == 4
    replayed = machine.fluid("forge", "intent.yaml", "--replay", "failed.json")
    assert replayed.returncode == EXIT_CODES["schema"], replayed.stdout + replayed.stderr
    assert not (machine.project / "forge-out").exists()


def test_no_bodies_keeps_no_prompt_and_cannot_be_replayed_by_forge(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    model = _corrected_run(serve)
    done = machine.fluid(
        "forge", "intent.yaml", "--record", "flow.json", "--no-bodies", env=machine.live(model)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = (machine.project / "flow.json").read_text()
    assert "Sessions on the web site" not in text
    assert "web_sessions" not in text
    cassette = json.loads(text)
    assert cassette["bodies"] is False
    assert all("body" not in e["request"] for e in cassette["exchanges"])
    replayed = machine.fluid("forge", "intent.yaml", "--replay", "flow.json")
    assert replayed.returncode == EXIT_CODES["intent"], replayed.stdout + replayed.stderr
    assert "recorded without bodies" in replayed.stderr


def test_a_replay_that_stops_short_of_the_cassette_is_a_mismatch(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    model = _corrected_run(serve)
    recorded = machine.fluid(
        "forge", "intent.yaml", "--record", "run.json", env=machine.live(model)
    )
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    cassette = json.loads((machine.project / "run.json").read_text())
    cassette["exchanges"].append(cassette["exchanges"][-1])
    (machine.project / "longer.json").write_text(json.dumps(cassette))
    done = machine.fluid("forge", "intent.yaml", "--replay", "longer.json", "--out", "short")
    assert done.returncode == 30, done.stdout + done.stderr
    assert "request 4 (POST /v1/chat/completions) was never sent" in done.stderr
    assert not (machine.project / "short").exists()


def _interrupted_forge(
    machine: Machine,
    serve: Callable[..., Scripted],
    args: list[str],
    interrupt: Callable[[subprocess.Popen[str]], None],
) -> tuple[int | None, str]:
    """``fluid forge intent.yaml *args``, ``interrupt``ed while the model holds its second
    answer (up to 120 s): its exit code and stderr. Only a forge that stops mid-call, and
    whose exit no abandoned request holds, ends within the 15 s it is given."""
    hold = threading.Event()
    model = serve(says(PLAN), hold=hold)
    # SIGINT at its default disposition whatever the runner's (a background job inherits
    # it ignored, and fluid then leaves it ignored: docs/cli.md).
    process = subprocess.Popen(
        [sys.executable, "-c", _DEFAULT_SIGINT, FLUID, "forge", "intent.yaml", *args],
        cwd=machine.project,
        env=machine.live(model),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert model.waiting.wait(60), "the forge never reached its second request"
        interrupt(process)
        _, err = process.communicate(timeout=15)
    finally:
        hold.set()
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, err


def test_ctrl_c_while_recording_leaves_no_cassette(
    machine: Machine, serve: Callable[..., Scripted]
) -> None:
    code, err = _interrupted_forge(
        machine, serve, ["--record", "run.json"], lambda p: p.send_signal(signal.SIGINT)
    )
    assert code == EXIT_CODES["interrupted"], err
    assert err.endswith("fluid: interrupted\n"), err
    assert "Traceback" not in err
    assert sorted(p.name for p in machine.project.iterdir()) == ["events.sql", "intent.yaml"]


def _threads_taking_sigint(pid: int) -> list[int]:
    """The threads of ``pid`` other than its main one that do not block SIGINT (Linux)."""
    taking = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        tid = int(task.name)
        status = (task / "status").read_text()
        blocked = int(
            next(line for line in status.splitlines() if line.startswith("SigBlk:"))[7:], 16
        )
        if tid != pid and not blocked & (1 << (signal.SIGINT - 1)):
            taking.append(tid)
    return taking


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, sends tgkill")
@pytest.mark.parametrize("record", [True, False], ids=["own-sync-pool", "direct-pool"])
def test_ctrl_c_reaches_the_forge_whichever_thread_the_kernel_gives_it_to(
    machine: Machine, serve: Callable[..., Scripted], record: bool
) -> None:
    # The kernel hands a process's SIGINT to any thread that does not block it; under load
    # that is at times not the main thread (CI once saw the forge sit out its whole wait).
    # Here every such thread gets one, so a wait in the main thread that does not wake for
    # it, or a thread of fluid's that takes it from a main thread blocked in a socket read,
    # fails every time.
    import ctypes

    others: list[int] = []

    def interrupt(process: subprocess.Popen[str]) -> None:
        others.extend(_threads_taking_sigint(process.pid))
        tgkill = ctypes.CDLL(None, use_errno=True).tgkill
        for tid in others:
            assert tgkill(process.pid, tid, signal.SIGINT) == 0, ctypes.get_errno()
        if not others:
            process.send_signal(signal.SIGINT)  # only the main thread can take it

    args = ["--record", "run.json"] if record else []
    code, err = _interrupted_forge(machine, serve, args, interrupt)
    # On a caller's own pool the head is awaited on a worker (which takes SIGINT: it may
    # run the caller's code); on fluid's own pool the main thread reads the socket, and no
    # other thread (rich's status line's included) may take the signal from it.
    assert bool(others) is record
    assert code == EXIT_CODES["interrupted"], err
    assert err.endswith("fluid: interrupted\n"), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "says_what"),
    [
        (["--record", "r.json", "--replay", "c.json"], "give one of them"),
        (["--no-bodies"], "--no-bodies only goes with --record"),
    ],
)
def test_flags_that_do_not_go_together_are_usage_errors(
    machine: Machine, args: list[str], says_what: str
) -> None:
    done = machine.fluid("forge", "intent.yaml", *args)
    assert done.returncode == EXIT_CODES["usage"], done.stdout + done.stderr
    assert says_what in done.stderr


def test_record_without_a_key_says_what_to_set(machine: Machine) -> None:
    done = machine.fluid("forge", "--record", "r.json")
    assert done.returncode == EXIT_CODES["usage"], done.stdout + done.stderr
    assert "OPENAI_API_KEY" in done.stderr
    assert not (machine.project / "r.json").exists()


# -- when a cassette cannot be made (in process, to make it so) ---------------------------------


@pytest.fixture
def in_process(machine: Machine, monkeypatch: pytest.MonkeyPatch) -> Machine:
    for name, value in machine.env.items():
        monkeypatch.setenv(name, value)
    for name in list(os.environ):
        if name.startswith(_PROVIDER_PREFIXES) and name not in machine.env:
            monkeypatch.delenv(name)
    monkeypatch.chdir(machine.project)
    return machine


def _unanswered(self: Recorder) -> None:
    raise CassetteError("a request got no answer, and only answers can be replayed: POST /x")


def test_a_run_that_succeeded_but_cannot_be_recorded_is_exit_3(
    in_process: Machine, serve: Callable[..., Scripted], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _corrected_run(serve)
    monkeypatch.setattr(Recorder, "check_answered", _unanswered)
    result = CliRunner().invoke(
        cli, ["forge", "intent.yaml", "--record", "run.json"], env=in_process.live(model)
    )
    assert result.exit_code == EXIT_CODES["intent"], result.output
    assert "CassetteError" in result.output
    assert "only answers can be replayed" in result.output
    assert not (in_process.project / "run.json").exists()
    assert (in_process.project / "forge-out" / "contract.fluid.yaml").is_file()


def test_a_failed_run_that_cannot_be_recorded_reports_its_own_error(
    in_process: Machine, serve: Callable[..., Scripted], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = says({"contract": {"name": "web_sessions"}, "rationale": "r"})
    model = serve(says(PLAN), broken, broken, broken)
    monkeypatch.setattr(Recorder, "check_answered", _unanswered)
    result = CliRunner().invoke(
        cli, ["forge", "intent.yaml", "--record", "run.json"], env=in_process.live(model)
    )
    assert result.exit_code == EXIT_CODES["schema"], result.output
    assert "fluid: no cassette written:" in result.output
    assert "SchemaValidationError" in result.output
    assert not (in_process.project / "run.json").exists()


def test_a_cassette_that_cannot_be_written_at_the_end_is_exit_3(
    in_process: Machine, serve: Callable[..., Scripted], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FILE passed the check before the run, then the disk filled up: a CassetteError."""
    import errno

    from fluid_build import _files

    model = _corrected_run(serve)

    def full(path: object, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_files, "write_atomic", full)
    result = CliRunner().invoke(
        cli, ["forge", "intent.yaml", "--record", "run.json"], env=in_process.live(model)
    )
    assert result.exit_code == EXIT_CODES["intent"], result.output
    assert "run.json: cannot be written (No space left on device)" in result.output


if sys.platform == "win32":  # pragma: no cover - signals and the console script differ
    pytestmark = pytest.mark.skip("POSIX only")

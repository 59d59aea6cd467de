"""`fluid forge` through click's runner, and once for real in a subprocess, offline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from fluid_build.cli import _register, cli
from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.cli.forge import (
    EXAMPLE_AGENT_CASSETTE,
    EXAMPLE_CASSETTE,
    EXAMPLE_INTENT,
    EXAMPLE_WORKSPACE,
)
from tests.docs_model import model_server
from tests.test_docs_commands import Place, _environment, run

_register()


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLUID_HOME", str(tmp_path / "home"))
    return CliRunner()


def test_offline_default_forges_the_example(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["forge"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "forge-out"
    contract = yaml.safe_load((out / "contract.fluid.yaml").read_text())
    assert contract["name"] == "sales_orders"
    assert contract["grain"] == "one row per order line"
    assert (out / "models/fct_order_lines.sql").read_text().startswith("select")
    receipt = json.loads((out / ".fluid/forge-receipt.json").read_text())
    assert receipt["provider"] == "openai"
    assert receipt["attempts"] == 4
    assert [w["seconds"] for w in receipt["waits"]] == [2.0]
    assert receipt["waits"][0]["code"] == "llm.rate_limited"
    stages = {s["name"]: s for s in receipt["stages"]}
    assert stages["generate"]["attempts"] == 2
    assert stages["generate"]["corrections"][0][0]["loc"] == "contract.grain"
    assert receipt["tokens"]["total"] > 0
    assert sorted(receipt["files"]) == [
        "contract.fluid.yaml",
        "docs/sales_orders.md",
        "models/fct_order_lines.sql",
    ]
    assert "No API key found" in result.output
    assert "wait 2.0 s" in result.output


def test_json_output(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["forge", "--json", "--out", "o"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert payload["ok"] is True
    assert payload["receipt"]["attempts"] == 4


def test_explicit_replay_of_an_intent(runner: CliRunner, tmp_path: Path) -> None:
    intent = tmp_path / "intent.yaml"
    shutil.copy(EXAMPLE_INTENT, intent)
    result = runner.invoke(
        cli, ["forge", str(intent), "--replay", str(EXAMPLE_CASSETTE), "--out", "x"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x" / "contract.fluid.yaml").exists()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("data_product: [1, 2", "not valid YAML at line"),
        ("- a\n- b\n", "must be a mapping"),
        ("data_product:\n  name: Bad Name\n", "data_product.name"),
        (
            "data_product: {name: ok_name, domain: d, description: short, owner: me}\n"
            "grain: g\ndimensions: []\nmetrics: [m]\nmodeling_technique: dimensional\n",
            "grain",
        ),
    ],
)
def test_a_bad_intent_says_which_field(
    runner: CliRunner, tmp_path: Path, content: str, fragment: str
) -> None:
    intent = tmp_path / "bad.yaml"
    intent.write_text(content)
    result = runner.invoke(cli, ["forge", str(intent), "--replay", str(EXAMPLE_CASSETTE)])
    assert result.exit_code == EXIT_CODES["intent"], result.output
    assert fragment in result.output
    assert not (tmp_path / "forge-out").exists()


def test_an_intent_without_a_key_is_an_auth_error(runner: CliRunner, tmp_path: Path) -> None:
    intent = tmp_path / "intent.yaml"
    shutil.copy(EXAMPLE_INTENT, intent)
    result = runner.invoke(cli, ["forge", str(intent)])
    assert result.exit_code == EXIT_CODES["auth"], result.output
    assert "OPENAI_API_KEY" in result.output


def _without_request_bodies(path: Path) -> dict[str, Any]:
    """The cassette's answers, to doctor: its requests hold no body, so replay checks the order."""
    cassette: dict[str, Any] = json.loads(path.read_text())
    for exchange in cassette["exchanges"]:
        exchange["request"].pop("body", None)
    return cassette


def test_a_failed_run_writes_nothing(runner: CliRunner, tmp_path: Path) -> None:
    cassette = _without_request_bodies(EXAMPLE_CASSETTE)
    bad = cassette["exchanges"][2]
    cassette["exchanges"] = [*cassette["exchanges"][:3], bad, bad]  # never corrected
    path = tmp_path / "never.json"
    path.write_text(json.dumps(cassette))
    result = runner.invoke(cli, ["forge", "--replay", str(path), "--out", "never"])
    assert result.exit_code == EXIT_CODES["schema"], result.output
    assert "contract.grain" in result.output or "failed 1 check" in result.output
    leftovers = (
        [p for p in (tmp_path / "never").rglob("*") if p.is_file()]
        if (tmp_path / "never").exists()
        else []
    )
    assert leftovers == []


def test_the_console_script_runs_offline(tmp_path: Path) -> None:
    fluid = shutil.which("fluid", path=os.path.dirname(sys.executable)) or shutil.which("fluid")
    assert fluid is not None, "the fluid console script is not installed"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_API", "FLUID_", "AZURE_OPENAI_")
        )
    }
    env["FLUID_HOME"] = str(tmp_path / "home")
    done = subprocess.run(
        [fluid, "forge"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "forge-out" / "contract.fluid.yaml").exists()
    assert (tmp_path / "forge-out" / ".fluid" / "forge-receipt.json").exists()


def _console_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``fluid ARGS`` from the console script, in a fresh HOME, no provider variable set."""
    fluid = shutil.which("fluid", path=os.path.dirname(sys.executable)) or shutil.which("fluid")
    assert fluid is not None, "the fluid console script is not installed"
    home = tmp_path / "home"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_", "FLUID_", "AZURE_OPENAI_", "GROQ_")
        )
    }
    env.update(
        HOME=str(home),
        FLUID_HOME=str(home / ".fluid"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
    )
    return subprocess.run(
        [fluid, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_missing_replay_cassette_is_exit_3_naming_it(tmp_path: Path) -> None:
    done = _console_script(tmp_path, "forge", "--replay", "no-such.json")
    assert done.returncode == EXIT_CODES["intent"] == 3, done.stdout + done.stderr
    assert "CassetteError" in done.stderr
    assert "no-such.json: cannot be read" in done.stderr
    assert not (tmp_path / "forge-out").exists()


def test_a_directory_as_the_replay_cassette_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "cassettes").mkdir()
    done = _console_script(tmp_path, "forge", "--replay", "cassettes")
    assert done.returncode == EXIT_CODES["usage"], done.stdout + done.stderr


@pytest.mark.parametrize(
    "text",
    [
        "data_product: " + "[" * 5000 + "]" * 5000,
        "data_product:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(100)),
        "a: &a [*a]\n",
    ],
    ids=["flow", "block", "self-alias"],
)
def test_a_deeply_nested_intent_is_exit_3(tmp_path: Path, text: str) -> None:
    (tmp_path / "deep.yaml").write_text(text, encoding="utf-8")
    done = _console_script(tmp_path, "forge", "deep.yaml", "--replay", str(EXAMPLE_CASSETTE))
    assert done.returncode == EXIT_CODES["intent"] == 3, done.stdout + done.stderr
    assert "IntentError" in done.stderr
    assert "Traceback" not in done.stderr
    assert "bug" not in done.stderr


def test_the_exit_code_table_in_the_docs_is_exit_codes() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")
    table = page.split("## Exit codes", 1)[1].split("\n\n", 2)[1]
    documented = sorted(
        int(line.split("|")[1])
        for line in table.splitlines()
        if line.startswith("| ") and line.split("|")[1].strip().isdigit()
    )
    assert documented == sorted(set(EXIT_CODES.values()))


def test_agent_loop_uses_workspace_tools(runner: CliRunner, tmp_path: Path) -> None:
    cassette = _without_request_bodies(EXAMPLE_CASSETTE)
    plan, _, _, final = cassette["exchanges"]
    tool_call = json.loads(json.dumps(final))
    tool_call["response"]["body"]["choices"][0]["message"] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "read_sample_schema",
                    "arguments": json.dumps({"path": "orders.sql"}),
                },
            }
        ],
    }
    escape = json.loads(json.dumps(tool_call))
    escape["response"]["body"]["choices"][0]["message"]["tool_calls"][0]["function"][
        "arguments"
    ] = json.dumps({"path": "../../etc/passwd"})
    cassette["exchanges"] = [plan, escape, tool_call, final]
    replay = tmp_path / "loop.json"
    replay.write_text(json.dumps(cassette))
    (tmp_path / "orders.sql").write_text("select * from raw.orders")
    intent = tmp_path / "intent.yaml"
    shutil.copy(EXAMPLE_INTENT, intent)
    result = runner.invoke(
        cli, ["forge", str(intent), "--agent-loop", "--replay", str(replay), "--out", "o"]
    )
    assert result.exit_code == 0, result.output
    receipt = json.loads((tmp_path / "o/.fluid/forge-receipt.json").read_text())
    generate = next(s for s in receipt["stages"] if s["name"] == "generate")
    assert generate["llm_calls"] == 3
    assert [(c["name"], c["result"]) for c in generate["tool_calls"]] == [
        ("read_sample_schema", "ToolValidationError"),  # ../../etc/passwd: outside
        ("read_sample_schema", "ok"),
    ]
    assert (tmp_path / "o/contract.fluid.yaml").exists()


# -- the output tree: atomic writes, never through a symlink ---------------------------


def forge_into(runner: CliRunner, out: Path) -> Any:
    return runner.invoke(cli, ["forge", "--out", str(out), "--json"])


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if not p.is_dir())


@pytest.mark.parametrize("inner", ["models", ".fluid", "docs"])
def test_a_symlinked_directory_in_the_output_is_refused(
    runner: CliRunner, tmp_path: Path, inner: str
) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / inner).symlink_to(elsewhere, target_is_directory=True)
    result = forge_into(runner, out)
    assert result.exit_code == EXIT_CODES["output"] == 4, result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert payload["error"]["error"] == "OutputTreeError"
    message = payload["error"]["message"]
    assert f"{inner} in {out} is a symbolic link" in message
    assert "remove it or choose another --out" in message
    assert files_under(elsewhere) == []  # nothing written through it
    assert files_under(out) == []  # and nothing else either: checked before any write


def test_a_symlinked_target_file_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "models").mkdir(parents=True)
    victim = tmp_path / "victim.sql"
    victim.write_text("keep me")
    (out / "models" / "fct_order_lines.sql").symlink_to(victim)
    result = forge_into(runner, out)
    assert result.exit_code == EXIT_CODES["output"], result.output
    assert "models/fct_order_lines.sql in" in result.stdout
    assert victim.read_text() == "keep me"
    assert not (out / "contract.fluid.yaml").exists()


def test_the_output_directory_itself_may_not_be_a_symlink(
    runner: CliRunner, tmp_path: Path
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "real")
    result = forge_into(runner, tmp_path / "out")
    assert result.exit_code == EXIT_CODES["output"], result.output
    assert f"{tmp_path / 'out'} is a symbolic link" in result.stdout
    assert files_under(tmp_path / "real") == []
    # The directories leading to --out may be symlinks: only the tree below it is checked.
    result = forge_into(runner, tmp_path / "out" / "inner")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "real" / "inner" / "contract.fluid.yaml").exists()


def test_an_output_that_is_a_file_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "models").write_text("a file, not a directory")
    result = forge_into(runner, tmp_path / "out")
    assert result.exit_code == EXIT_CODES["output"], result.output
    assert "models in" in result.stdout
    assert "is not a directory" in result.stdout


def test_files_are_replaced_atomically_by_rename(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "contract.fluid.yaml").write_text("old contract")
    os.link(out / "contract.fluid.yaml", tmp_path / "old-inode.yaml")
    result = forge_into(runner, out)
    assert result.exit_code == 0, result.output
    # A rename puts a new file in place; writing in place would have changed the old inode.
    assert (tmp_path / "old-inode.yaml").read_text() == "old contract"
    assert yaml.safe_load((out / "contract.fluid.yaml").read_text())["name"] == "sales_orders"
    assert files_under(out) == [
        ".fluid/forge-receipt.json",
        "contract.fluid.yaml",
        "docs/sales_orders.md",
        "models/fct_order_lines.sql",
    ]  # no temporary file left behind


@pytest.mark.parametrize("existed", [False, True])
def test_a_symlink_swapped_in_after_the_check_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existed: bool
) -> None:
    from fluid_build.forge import app

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    (out / "models" if existed else out).mkdir(parents=True)
    elsewhere.mkdir()
    real_stage = app._OutputTree.stage

    def swap_then_stage(tree: Any, parts: tuple[str, ...], text: str) -> Any:
        if parts[0] == "models" and not (out / "models").is_symlink():
            if existed:
                (out / "models").rename(tmp_path / "moved")
            (out / "models").symlink_to(elsewhere, target_is_directory=True)
        return real_stage(tree, parts, text)

    monkeypatch.setattr(app._OutputTree, "stage", swap_then_stage)
    output = app.ForgeOutput(
        contract={"name": "x"},
        additional_files=[app.GeneratedFile(path="models/a.sql", content="select 1")],
        rationale="r",
    )
    run = app.ForgeRun("p", "m", out)
    if existed:
        # Opened (without following) at the check: the writes stay in the real directory,
        # wherever it was moved, and never pass through the symlink.
        app._write_all(run, output)
        assert (tmp_path / "moved" / "a.sql").read_text() == "select 1"
    else:
        with pytest.raises(app.OutputTreeError, match=r"models in .* is a symbolic link"):
            app._write_all(run, output)
        assert files_under(out) == []  # the staged contract was removed, nothing renamed in
    assert files_under(elsewhere) == []


# -- --replay without an INTENT_FILE ------------------------------------------------------


def test_the_bundled_cassette_holds_the_example_intent() -> None:
    from fluid_build.corpus.cassette import load_cassette
    from fluid_build.forge.cassette import recorded_intent
    from fluid_build.forge.intent import load_intent

    assert recorded_intent(load_cassette(EXAMPLE_CASSETTE)) == load_intent(EXAMPLE_INTENT)


def test_replay_without_an_intent_takes_the_one_it_was_recorded_with(tmp_path: Path) -> None:
    """Recorded from an intent that is not the bundled example: replayed with no
    INTENT_FILE, it is the recorded intent that is sent again, so the replay matches."""
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    intent = yaml.safe_load(EXAMPLE_INTENT.read_text(encoding="utf-8"))
    intent["data_product"]["description"] = "Order lines, with revenue, for the weekly review."
    (tmp_path / "work" / "mine.yaml").write_text(yaml.safe_dump(intent), encoding="utf-8")
    with model_server() as (base, model):
        place = Place(tmp_path / "work", tmp_path / "home", base, model, _environment(tmp_path))
        place.openai()
        recorded = run(place, "fluid forge mine.yaml --record run.json --out first")
        assert recorded.returncode == 0, recorded.stderr
        sent = len(model.requests)
        done = run(place, "fluid forge --replay run.json --out again")
        assert len(model.requests) == sent  # offline
    assert done.returncode == 0, done.stderr
    assert "intent: the one recorded in run.json (sales_orders)" in done.stderr
    assert "bundled example" not in done.stderr
    first = (tmp_path / "work" / "first" / "contract.fluid.yaml").read_text(encoding="utf-8")
    again = (tmp_path / "work" / "again" / "contract.fluid.yaml").read_text(encoding="utf-8")
    assert again == first


def test_replay_of_a_cassette_without_its_intent_says_it_uses_the_example(
    tmp_path: Path,
) -> None:
    cassette = json.loads(EXAMPLE_CASSETTE.read_text(encoding="utf-8"))
    cassette["call"]["messages"][0]["content"] = "Forge the sales orders."
    (tmp_path / "edited.json").write_text(json.dumps(cassette), encoding="utf-8")
    done = _console_script(tmp_path, "forge", "--replay", "edited.json", "--out", "o")
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "bundled example intent" in line]
    assert said == [
        "fluid: edited.json does not hold the intent it was recorded with: replaying it with "
        "the bundled example intent (sales_orders.intent.yaml); give the intent file first "
        "to replay it with another"
    ]


# -- replaying the agent-loop cassette from anywhere (issue 35 items 6 and 7) -------------


def test_the_bundled_agent_cassette_replays_from_any_folder(tmp_path: Path) -> None:
    """Replayed with no INTENT_FILE from a folder that is not the example workspace, the
    bundled agent cassette's tools read the bundled workspace it was recorded on."""
    done = _console_script(
        tmp_path, "forge", "--agent-loop", "--replay", str(EXAMPLE_AGENT_CASSETTE)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "forge-out" / "contract.fluid.yaml").exists()


def test_a_workspace_without_the_recorded_file_is_one_line_naming_it(tmp_path: Path) -> None:
    """A copy of the agent cassette, replayed where the file its model read is missing:
    one line naming the file and the workspace, exit 3 (a cassette that cannot be used
    here), no traceback, nothing sent or written."""
    shutil.copy(EXAMPLE_AGENT_CASSETTE, tmp_path / "agent.json")
    done = _console_script(tmp_path, "forge", "--agent-loop", "--replay", "agent.json")
    assert done.returncode == EXIT_CODES["intent"] == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines.pop(0) == "intent: the one recorded in agent.json (sales_orders)"
    assert lines[0] == (
        f"fluid: CassetteError: agent.json: its recorded read_sample_schema call reads "
        f"sources/raw_order_lines.sql, which the workspace {tmp_path} does not hold"
    )
    assert lines[1].startswith("hint: replay it from the workspace it was recorded in")
    assert len(lines) == 2
    assert not (tmp_path / "forge-out").exists()
    # In that workspace, the same copy replays.
    shutil.copytree(EXAMPLE_WORKSPACE, tmp_path / "ws")
    again = _console_script(
        tmp_path / "ws", "forge", "--agent-loop", "--replay", str(tmp_path / "agent.json")
    )
    assert again.returncode == 0, again.stdout + again.stderr


def test_an_agent_cassette_without_agent_loop_says_to_add_it(tmp_path: Path) -> None:
    done = _console_script(tmp_path, "forge", "--replay", str(EXAMPLE_AGENT_CASSETTE))
    assert done.returncode == EXIT_CODES["intent"], done.stdout + done.stderr
    assert "was recorded with --agent-loop" in done.stderr
    assert "hint: replay it with --agent-loop" in done.stderr
    assert not (tmp_path / "forge-out").exists()


# -- --provider and --model with the offline example or a replay (issue 35 item 8) --------


@pytest.mark.parametrize(
    ("flags", "given"),
    [
        (["--provider", "bedrock"], "--provider bedrock"),
        (["--provider", "openai"], "--provider openai"),
        (["--model", "claude-sonnet-4-5"], "--model claude-sonnet-4-5"),
    ],
)
def test_a_provider_with_no_intent_is_refused_not_the_openai_example(
    runner: CliRunner, tmp_path: Path, flags: list[str], given: str
) -> None:
    """No key and no INTENT_FILE: the offline example is a recorded OpenAI session, so a
    --provider (or --model) is refused rather than ignored behind a run that exits 0."""
    result = runner.invoke(cli, ["forge", *flags])
    assert result.exit_code == EXIT_CODES["usage"], result.output
    assert f"{given} chooses who forges your own intent: give an INTENT_FILE" in result.output
    assert f"`fluid forge my-intent.yaml {given}`" in result.output
    assert "No API key found" not in result.output
    assert not (tmp_path / "forge-out").exists()


def test_a_provider_with_replay_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(
        cli, ["forge", "--replay", str(EXAMPLE_CASSETTE), "--provider", "anthropic"]
    )
    assert result.exit_code == EXIT_CODES["usage"], result.output
    assert "--provider anthropic does not apply to --replay" in result.output
    assert not (tmp_path / "forge-out").exists()


def test_provider_bedrock_with_no_key_from_the_console_script(tmp_path: Path) -> None:
    """The issue's own command, as a new user types it: no key, no intent file."""
    done = _console_script(tmp_path, "forge", "--provider", "bedrock")
    assert done.returncode == EXIT_CODES["usage"], done.stdout + done.stderr
    assert "--provider bedrock chooses who forges your own intent" in done.stderr
    assert "No API key found" not in done.stderr + done.stdout
    assert not (tmp_path / "forge-out").exists()

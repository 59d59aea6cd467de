"""``fluid forge``: an intent file in, a validated contract and its files out."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fluid_build.cli._console import status as status_line
from fluid_build.cli._messages import report_error
from fluid_build.cli._options import (
    call_options,
    call_options_given,
    model_option,
    provider_option,
)

if TYPE_CHECKING:
    import httpx
    from rich.console import Console

    from fluid_build.copilot.call.envelope import RetryEvent
    from fluid_build.copilot.client import LLMClient
    from fluid_build.corpus.cassette import Cassette
    from fluid_build.corpus.record import Recorder
    from fluid_build.corpus.replay import ReplayTransport
    from fluid_build.forge.app import ForgeOutput, ForgeRun
    from fluid_build.forge.intent import Intent

__all__ = [
    "EXAMPLES",
    "EXAMPLE_AGENT_CASSETTE",
    "EXAMPLE_CASSETTE",
    "EXAMPLE_INTENT",
    "EXAMPLE_WORKSPACE",
    "command",
    "quiet",
    "workspace_for",
]

EXAMPLES = Path(__file__).resolve().parent.parent / "forge" / "examples"
EXAMPLE_INTENT = EXAMPLES / "sales_orders.intent.yaml"
EXAMPLE_CASSETTE = EXAMPLES / "sales_orders.cassette.json"
#: The offline default with --agent-loop: tool calls, a failed contract check, its correction.
EXAMPLE_AGENT_CASSETTE = EXAMPLES / "sales_orders.agent.cassette.json"
#: The workspace the bundled agent-loop run looks at (sample schemas of the sources).
EXAMPLE_WORKSPACE = EXAMPLES / "workspace"

_REASONS = {
    "retry_after": "as the server asked",
    "backoff": "backing off",
    "cooldown": "key cooling down",
    "rate_limit": "the provider's announced budget is spent until its reset",
}


def _console() -> Console:
    from fluid_build.cli._console import make_console

    return make_console(stderr=True)


def _has_provider(env: Mapping[str, str]) -> bool:
    from fluid_build.copilot.agents.errors import ProviderAuthError
    from fluid_build.copilot.llm.settings import resolve_provider_config

    try:
        resolve_provider_config(env=env)
    except ProviderAuthError:
        return False
    except Exception:  # noqa: BLE001 - misconfigured, not absent: let the real run say why
        return True
    return True


def _countdown_sleep(console: Console) -> Any:
    """A sleep that shows a live countdown while the envelope waits."""

    def sleep(seconds: float) -> None:
        if seconds <= 0:
            return
        end = time.monotonic() + seconds
        with status_line(console, "") as status:
            while (left := end - time.monotonic()) > 0:
                status.update(f"waiting {left:4.1f} s before retrying ...")
                time.sleep(min(left, 0.1))

    return sleep


def _wait_printer(console: Console) -> Any:
    def hook(event: RetryEvent) -> None:
        if round(event.wait, 1) <= 0:
            return  # shown as "wait 0.0 s": a wait too short to tell anyone about
        why = _REASONS.get(event.reason, event.reason)
        if event.error is None and event.reason == "rate_limit":
            console.print(f"  [yellow]wait[/] {event.wait:.1f} s ({why})")
            return
        what = event.error.code if event.error else "cooldown"
        console.print(f"  [yellow]wait[/] {event.wait:.1f} s after \\[{what}] ({why})")

    return hook


def _load_replay(cassette_path: Path) -> Cassette:
    """The cassette to replay; ``CassetteError`` when it holds no model output."""
    from fluid_build.corpus.cassette import CassetteError, load_cassette

    cassette = load_cassette(cassette_path)
    if not cassette.bodies:
        raise CassetteError(
            "was recorded without bodies (--no-bodies): it holds no model output for "
            "`fluid forge` to replay; record the run again without --no-bodies",
            path=str(cassette_path),
        )
    return cassette


def _replay_intent(cassette: Cassette, cassette_path: Path, console: Console) -> Intent:
    """With --replay and no INTENT_FILE: the intent the cassette was recorded with, or
    (said in one line) the bundled example's when the cassette does not hold it whole."""
    from fluid_build.forge.cassette import recorded_intent
    from fluid_build.forge.intent import load_intent

    intent = recorded_intent(cassette)
    if intent is not None:
        console.print(f"intent: the one recorded in {cassette_path} ({intent.data_product.name})")
        return intent
    click.echo(
        f"fluid: {cassette_path} does not hold the intent it was recorded with: replaying it "
        f"with the bundled example intent ({EXAMPLE_INTENT.name}); give the intent file "
        "first to replay it with another",
        err=True,
    )
    return load_intent(EXAMPLE_INTENT)


def _replay_client(cassette: Cassette, console: Console) -> tuple[LLMClient, ReplayTransport]:
    """A client answered by the cassette (virtual clock, no jitter) and its transport."""
    import httpx

    from fluid_build.copilot.call.envelope import RetryEnvelope
    from fluid_build.copilot.client import LLMClient
    from fluid_build.copilot.health.store import MemoryCooldownStore
    from fluid_build.corpus.replay import ReplayTransport, VirtualClock

    clock = VirtualClock()
    envelope = RetryEnvelope(
        cooldown=MemoryCooldownStore(),
        hook=_wait_printer(console),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
    )
    transport = ReplayTransport(cassette.exchanges)
    client = LLMClient(
        cassette.provider,
        cassette.model,
        api_key="replay-key",
        envelope=envelope,
        http_client=httpx.Client(transport=transport),
        env=dict(cassette.call.env),
        strict_schema=cassette.call.strict_schema,
        capability_matrix=cassette.call.capability_matrix,
    )
    return client, transport


def _live_client(
    provider: str | None,
    model: str | None,
    console: Console,
    env: Mapping[str, str],
    recording: _Recording | None = None,
) -> LLMClient:
    from fluid_build.copilot.call.envelope import RetryEnvelope
    from fluid_build.copilot.client import LLMClient

    if recording is None:
        envelope = RetryEnvelope.from_env(
            env, hook=_wait_printer(console), sleep=_countdown_sleep(console)
        )
        return LLMClient(provider, model, envelope=envelope, env=env)
    from fluid_build.copilot.llm.settings import resolve_provider_config

    countdown = _countdown_sleep(console)

    def sleep(seconds: float) -> None:
        recording.waits.append(seconds)
        countdown(seconds)

    # No jitter: a replay of the cassette then waits exactly what this run waited.
    envelope = RetryEnvelope.from_env(
        env, hook=_wait_printer(console), sleep=sleep, random=lambda: 0.0
    )
    config = resolve_provider_config(provider, model, env=env)
    recording.recorder.add_secrets(config.api_key)
    recording.http = recording.recorder.client(timeout=config.timeout)
    return LLMClient(provider, model, envelope=envelope, env=env, http_client=recording.http)


class _Recording:
    """What ``--record`` keeps while the run goes: the recorder, its HTTP client, the waits."""

    def __init__(self, path: Path, *, bodies: bool) -> None:
        from fluid_build.forge.cassette import forge_recorder

        self.path = path
        self.recorder: Recorder = forge_recorder(bodies=bodies)
        self.http: httpx.Client | None = None
        self.waits: list[float] = []
        self.tried = False
        self.exchanges = 0

    def save(
        self,
        client: LLMClient,
        intent: Intent,
        env: Mapping[str, str],
        *,
        error: BaseException | None,
        output: ForgeOutput | None,
        agent_loop: bool,
    ) -> Path:
        """Write the cassette atomically; ``CassetteError`` when a request got no answer or
        the file cannot be written."""
        from fluid_build.corpus.cassette import CassetteError, write_cassette
        from fluid_build.forge.cassette import forge_cassette

        self.tried = True
        cassette = forge_cassette(
            self.recorder,
            client=client,
            intent=intent,
            env=env,
            error=error,
            output=output,
            waits=self.waits,
            agent_loop=agent_loop,
        )
        try:
            written = write_cassette(cassette, self.path)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise CassetteError(f"cannot be written ({reason})", path=str(self.path)) from None
        self.exchanges = len(cassette.exchanges)
        return written

    def close(self) -> None:
        if self.http is not None:
            self.http.close()


def _check_out_dir(out_dir: Path) -> None:
    """Refuse, before any model call, an --out forge could not write into."""
    from fluid_build._files import check_output_dir
    from fluid_build.forge.app import OutputTreeError

    if out_dir.is_symlink():  # forge would refuse it at the write step, after the calls
        raise OutputTreeError(out_dir, ".", "is a symbolic link")
    check_output_dir(
        out_dir,
        name=str(out_dir),
        hint="choose an --out in a directory you can write and run again; no model was called",
    )


def _write_failed(out_dir: Path, exc: OSError) -> Exception:
    """The typed error for a write step that failed (the directory changed during the run)."""
    from fluid_build._files import OutputPathError

    reason = exc.strerror or type(exc).__name__
    return OutputPathError(
        str(out_dir),
        f"could not be written at the end of the run ({reason})",
        "make the directory writable again (or choose another --out) and run again",
    )


def _intent_needed(provider: str | None, model: str | None, env: Mapping[str, str]) -> str:
    """No INTENT_FILE while a provider is configured: name it, and the example's replay, which
    works whatever is configured (a Vertex or Bedrock user has no key to remove)."""
    from fluid_build.copilot.llm.settings import resolve_provider_config

    try:
        config = resolve_provider_config(provider, model, env=env)
        route = f" with {config.provider}:{config.model}, as configured"
    except Exception:  # noqa: BLE001 - a broken setting is the live run's to report
        route = ""
    return (
        f"give an INTENT_FILE to forge{route} (`fluid forge my-intent.yaml`); to see the "
        f"bundled example instead, replay it offline: `fluid forge --replay {EXAMPLE_CASSETTE}`"
    )


def _refuse_route_flags_on_a_replay(
    provider: str | None, model: str | None, intent_file: Path | None, cassette: Path | None
) -> None:
    """--provider and --model choose who answers a live run; a replay is answered by its
    cassette, and the offline example by a recorded OpenAI session: refused, so that no
    one believes the provider they named answered."""
    given = " ".join(
        f"{flag} {value}" for flag, value in (("--provider", provider), ("--model", model)) if value
    )
    if not given:
        return
    if cassette is not None:
        raise click.UsageError(
            f"{given} does not apply to --replay: the cassette answers as it was recorded "
            "(its provider and model); leave it out, or run the intent live without --replay"
        )
    if intent_file is None:
        raise click.UsageError(
            f"{given} chooses who forges your own intent: give an INTENT_FILE "
            f"(`fluid forge my-intent.yaml {given}`); the bundled example is a recorded "
            "OpenAI session, replayed offline whatever --provider or --model says"
        )


def workspace_for(intent_file: Path | None, cassette: Path | None) -> Path:
    """What the agent loop's tools see: the intent file's folder, or the working directory;
    the bundled agent cassette replayed with no intent file is given the bundled workspace,
    since it was recorded there and holds nothing of it."""
    if intent_file is not None:
        return intent_file.resolve().parent
    if cassette is not None and cassette.resolve() == EXAMPLE_AGENT_CASSETTE.resolve():
        return EXAMPLE_WORKSPACE
    return Path.cwd()


def _check_replayable(recorded: Cassette, path: Path, workspace: Path, *, agent_loop: bool) -> None:
    """Refuse, before any request, a replay that must differ: the recording's tool calls
    without --agent-loop, or a file they read that this workspace does not hold."""
    from fluid_build.corpus.cassette import CassetteError
    from fluid_build.forge.cassette import missing_workspace_file, recorded_tool_calls

    if not agent_loop:
        if recorded_tool_calls(recorded):
            raise CassetteError(
                "was recorded with --agent-loop (its model calls workspace tools)",
                path=str(path),
                hint="replay it with --agent-loop; nothing was sent",
            )
        return
    missing = missing_workspace_file(recorded, workspace)
    if missing is not None:
        tool, name = missing
        raise CassetteError(
            f"its recorded {tool} call reads {name}, which the workspace {workspace} does not hold",
            path=str(path),
            hint="replay it from the workspace it was recorded in: the workspace is the "
            "INTENT_FILE's folder, or with no INTENT_FILE the working directory; nothing was sent",
        )


def quiet(env: Mapping[str, str]) -> bool:
    """``FLUID_QUIET`` or ``FLUID_NONINTERACTIVE`` is yes: the run-start banner is hidden
    (docs/capability-warnings.md), and so is what the pre-flight would say in its place."""
    from fluid_build.config import yes_no

    return any(yes_no(env.get(name)) for name in ("FLUID_QUIET", "FLUID_NONINTERACTIVE"))


def _stored_env() -> dict[str, str]:
    try:
        from fluid_build.aiconfig import apply_stored_config
    except ImportError:  # pragma: no cover - the module ships with the package
        return dict(os.environ)
    return dict(apply_stored_config(os.environ))


@click.command("forge")
@click.argument("intent_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@provider_option
@model_option
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("forge-out"),
    show_default=True,
    help="Where to write the files.",
)
@click.option("--agent-loop", is_flag=True, help="Let the generate stage use workspace tools.")
@click.option(
    "--replay",
    "cassette",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Replay a recorded cassette instead of calling a provider.",
)
@click.option(
    "--record",
    "record_to",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a cassette of the run to this file when it ends (success or a typed error).",
)
@click.option(
    "--no-bodies",
    is_flag=True,
    help="With --record: keep no prompt, request body or model output (flow only).",
)
@call_options
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable result on stdout.")
def command(
    intent_file: Path | None,
    provider: str | None,
    model: str | None,
    out_dir: Path,
    agent_loop: bool,
    cassette: Path | None,
    record_to: Path | None,
    no_bodies: bool,
    max_output_tokens: int | None,
    temperature: float | None,
    seed: int | None,
    as_json: bool,
) -> None:
    """Forge a data product from INTENT_FILE.

    With no INTENT_FILE and no API key configured, forges the bundled example
    offline by replaying a recorded session (a rate-limit wait and a schema
    correction included; with --agent-loop, workspace tool calls and a failed
    contract check corrected), so you can see a whole run without any key.
    """
    from rich.markup import escape

    from fluid_build.errors import FluidError
    from fluid_build.forge.app import run_forge
    from fluid_build.forge.intent import load_intent

    console = _console()
    client: LLMClient | None = None
    transport: ReplayTransport | None = None
    recording: _Recording | None = None
    workspace: Path | None = None
    stages: list[str] = []
    try:
        env = _stored_env()
        if no_bodies and record_to is None:
            raise click.UsageError("--no-bodies only goes with --record FILE")
        if record_to is not None and cassette is not None:
            raise click.UsageError(
                "--record records a run against a provider and --replay replays one: "
                "give one of them"
            )
        _refuse_route_flags_on_a_replay(provider, model, intent_file, cassette)
        if cassette is None and intent_file is None and not _has_provider(env):
            if record_to is not None:
                raise click.UsageError(
                    "--record needs a provider, and no API key is configured: set "
                    "OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY (or run `fluid ai "
                    "setup`) and give an INTENT_FILE"
                )
            console.print(
                "[bold]No API key found:[/] forging the bundled example offline, replaying a "
                "recorded session. Set OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY "
                "(or run `fluid ai setup`) to forge your own intent."
            )
            cassette, intent_file = EXAMPLE_CASSETTE, EXAMPLE_INTENT
            if agent_loop:
                cassette, workspace = EXAMPLE_AGENT_CASSETTE, EXAMPLE_WORKSPACE
        recorded = _load_replay(cassette) if cassette is not None else None
        if intent_file is not None:
            intent = load_intent(intent_file)
        elif recorded is not None and cassette is not None:
            intent = _replay_intent(recorded, cassette, console)
        else:
            raise click.UsageError(_intent_needed(provider, model, env))
        if workspace is None:
            workspace = workspace_for(intent_file, cassette)
        if recorded is not None and cassette is not None:
            _check_replayable(recorded, cassette, workspace, agent_loop=agent_loop)
        # Before any model call: an output nobody can write would be paid for and lost.
        _check_out_dir(out_dir)
        if record_to is not None:  # and a cassette nobody can write would lose the run
            from fluid_build.corpus.cassette import check_writable

            check_writable(record_to)
        if recorded is not None:
            client, transport = _replay_client(recorded, console)
        else:
            if record_to is not None:
                recording = _Recording(record_to, bodies=not no_bodies)
            client = _live_client(provider, model, console, env, recording)
        label = f"{client.provider}:{client.model}" + (" (replay)" if cassette else "")
        console.print(f"forging [bold]{intent.data_product.name}[/] with {label}")
        if not as_json or quiet(env):
            client.run_start_warnings(uses_tools=agent_loop)
        with status_line(console, "starting") as status:

            def on_stage(stage: str) -> None:
                stages.append(stage)
                status.update(f"{stage} ...")
                console.print(f"  [cyan]stage[/] {stage}")

            def on_note(note: str) -> None:
                console.print(f"  [yellow]fix[/]  {escape(note)}")

            run = run_forge(
                client,
                intent,
                out_dir,
                on_stage=on_stage,
                on_note=on_note,
                replay=str(cassette) if cassette else None,
                agent_loop=agent_loop,
                workspace=workspace,
                # A replay that stopped short of the cassette differs: say so, write nothing.
                before_write=transport.finish if transport is not None else None,
                options=call_options_given(max_output_tokens, temperature, seed),
            )
        if recording is not None:
            recording.save(
                client, intent, env, error=None, output=run.output, agent_loop=agent_loop
            )
    except click.UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure leaves through one exit-code map
        failure: BaseException = exc
        if isinstance(exc, OSError) and stages[-1:] == ["write"]:
            failure = _write_failed(out_dir, exc)
        if transport is not None and transport.first_mismatch is not None:
            # The client reports a refused replay as an unexpected error; the transport
            # knows which request differed, and how.
            failure = transport.first_mismatch
        if (
            recording is not None
            and not recording.tried
            and client is not None
            and isinstance(exc, FluidError)
        ):
            _save_failed_run(recording, client, intent, env, exc, agent_loop)
        sys.exit(report_error(failure, as_json=as_json))
    finally:
        if client is not None:
            client.close()
        if recording is not None:
            recording.close()
    receipt = run.receipt()
    if as_json:
        payload: dict[str, Any] = {"ok": True, "out": str(out_dir), "receipt": receipt}
        if recording is not None:
            payload["cassette"] = str(recording.path)
        click.echo(json.dumps(payload))
        return
    tokens = receipt["tokens"]["total"]
    waited = sum(w["seconds"] for w in receipt["waits"])
    console.print(
        f"[green]done[/]: wrote {len(run.files)} file(s) to {out_dir}/ "
        f"({receipt['attempts']} model calls, {waited:.1f} s waited, {tokens} tokens, "
        f"{escape(_cost_shown(run))})"
    )
    for name in run.files:
        console.print(f"  {out_dir / name}")
    if recording is not None:
        console.print(f"recorded {recording.path} ({recording.exchanges} exchanges)")


def _cost_shown(run: ForgeRun) -> str:
    """The summary line's cost: never a guess, and never a replay's recorded price as spent."""
    from fluid_build.copilot.health.budget import usd_amount

    if run.replay is not None:
        return "replayed: nothing spent"
    unpriced = ", ".join(sorted(run.unpriced)) or f"{run.provider}:{run.model}"
    if run.cost_usd is None:
        return f"cost unknown: no price for {unpriced}, see docs/budgets.md"
    if run.unpriced:
        return (
            f"at least {usd_amount(run.cost_usd)} USD: no price for {unpriced}, see docs/budgets.md"
        )
    return f"{usd_amount(run.cost_usd)} USD"


def _save_failed_run(
    recording: _Recording,
    client: LLMClient,
    intent: Intent,
    env: Mapping[str, str],
    error: BaseException,
    agent_loop: bool,
) -> None:
    """Record a run that ended in a typed error; the run's error is reported either way."""
    from fluid_build.corpus.cassette import CassetteError

    try:
        path = recording.save(client, intent, env, error=error, output=None, agent_loop=agent_loop)
    except CassetteError as exc:
        click.echo(f"fluid: no cassette written: {exc}", err=True)
    else:
        click.echo(f"fluid: recorded the failed run in {path}", err=True)

"""The forge pipeline: plan, generate, validate, then write everything at once.

A stage whose output fails validation (its schema, then the contract checks
of :func:`validate_output`) gets up to 3 attempts, each told the previous
errors (field paths and what was expected); with the agent loop, the checks
run inside the loop, between tool rounds. Files are written only
when every stage succeeded, each to a temporary file next to its target and
renamed over it (``os.replace``), so a failed run leaves no half-written file;
a symbolic link anywhere in the output tree is refused (:class:`OutputTreeError`)
and nothing is written through it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import yaml
from pydantic import BaseModel, ConfigDict, Field

from fluid_build._version import __version__
from fluid_build.copilot.agents.errors import AgentExecutionError, SchemaValidationError
from fluid_build.copilot.call.envelope import RetryEvent
from fluid_build.copilot.client import LLMClient
from fluid_build.copilot.health.budget import usd_json
from fluid_build.errors import FluidError
from fluid_build.forge.intent import Intent

if TYPE_CHECKING:
    from fluid_build.copilot.call.core import CallOptions
    from fluid_build.copilot.call.prepare import Messages
    from fluid_build.copilot.llm.types import Completion

__all__ = [
    "MAX_STAGE_ATTEMPTS",
    "ForgeOutput",
    "ForgeRun",
    "GeneratedFile",
    "OutputTreeError",
    "Plan",
    "run_forge",
    "tool_calls_of",
    "validate_output",
]

MAX_STAGE_ATTEMPTS: Final = 3
SAFE_EXTENSIONS: Final = frozenset({".sql", ".yaml", ".yml", ".md", ".json", ".txt", ".csv"})
RECEIPT_PATH: Final = Path(".fluid") / "forge-receipt.json"
CONTRACT_PATH: Final = Path("contract.fluid.yaml")

PLAN_SYSTEM = (
    "You are a data engineer planning a data product. Reply with JSON only: the tables to "
    "build, the steps to build them, and notes on risks."
)
GENERATE_SYSTEM = (
    "You are a data engineer writing a FLUID data-product contract. Reply with JSON only: "
    "`contract` (an object with at least name, domain, owner, description, grain and "
    "`schema`, a list of columns each with name and type), `additional_files` (relative "
    "paths with .sql, .yaml, .yml, .md, .json, .txt or .csv extensions, and their "
    "content) and `rationale`."
)


class Plan(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tables: list[str] = Field(min_length=1)
    steps: list[str] = Field(min_length=1)
    notes: str = ""


class GeneratedFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    content: str


class ForgeOutput(BaseModel):
    """What the generate stage must return."""

    model_config = ConfigDict(extra="forbid")

    contract: dict[str, Any]
    additional_files: list[GeneratedFile] = Field(default_factory=list)
    rationale: str


def _safe_relative(path: str) -> str | None:
    """Why ``path`` may not be written, or None when it is a safe relative path."""
    if not path or "\x00" in path or "\\" in path:
        return "must be a non-empty relative path with forward slashes"
    pure = PurePosixPath(path)
    if pure.is_absolute() or re.match(r"^[A-Za-z]:", path):
        return "must be relative to the output directory"
    if any(part in {"..", "~"} for part in pure.parts) or path.startswith("~"):
        return "must stay inside the output directory"
    if pure.suffix.lower() not in SAFE_EXTENSIONS:
        return f"must end in one of {', '.join(sorted(SAFE_EXTENSIONS))}"
    if pure.parts and pure.parts[0] == ".fluid":
        return "must not write into .fluid/"
    if str(pure) == str(CONTRACT_PATH):
        return "must not overwrite contract.fluid.yaml"
    return None


def validate_output(output: ForgeOutput, intent: Intent) -> list[dict[str, str]]:
    """The contract and file checks a generated output must pass, as validation errors."""
    errors: list[dict[str, str]] = []
    contract = output.contract

    def add(loc: str, msg: str, kind: str = "value_error") -> None:
        errors.append({"loc": loc, "msg": msg, "type": kind})

    for key in ("name", "domain", "owner", "description", "grain", "schema"):
        if key not in contract:
            add(f"contract.{key}", "Field required", "missing")
    if "name" in contract and contract["name"] != intent.data_product.name:
        add("contract.name", f"must be {intent.data_product.name!r}, the intent's name")
    schema = contract.get("schema")
    if "schema" in contract:
        if not isinstance(schema, list) or not schema:
            add("contract.schema", "must be a non-empty list of columns")
        else:
            for i, column in enumerate(schema):
                if not isinstance(column, dict) or not column.get("name") or not column.get("type"):
                    add(f"contract.schema.{i}", "each column needs a name and a type")
    seen: set[str] = set()
    for i, file in enumerate(output.additional_files):
        problem = _safe_relative(file.path)
        if problem:
            add(f"additional_files.{i}.path", problem)
        elif file.path in seen:
            add(f"additional_files.{i}.path", "duplicate path")
        seen.add(file.path)
    return errors


@dataclass
class StageRecord:
    name: str
    attempts: int = 0
    #: Requests sent to the model, retried ones included (what the provider bills).
    llm_calls: int = 0
    corrections: list[list[dict[str, str]]] = field(default_factory=list)
    #: The workspace tools the model called (agent loop): name, arguments, result.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ForgeRun:
    """Everything a forge run produced and spent; written as the receipt."""

    provider: str
    model: str
    out_dir: Path
    files: list[str] = field(default_factory=list)
    stages: list[StageRecord] = field(default_factory=list)
    waits: list[dict[str, Any]] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    #: What the answers cost in USD: the known prices added up; None when none was known.
    cost_usd: float | None = None
    #: ``provider:model`` of the answers that had no price (not counted in ``cost_usd``).
    unpriced: set[str] = field(default_factory=set)
    replay: str | None = None
    intent_sha: str = ""
    started_at: str = ""
    seconds: float = 0.0
    output: ForgeOutput | None = None

    def receipt(self) -> dict[str, Any]:
        return {
            "fluid_build": __version__,
            "provider": self.provider,
            "model": self.model,
            "replay": self.replay,
            "intent_sha256": self.intent_sha,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 3),
            "stages": [
                {
                    "name": s.name,
                    "attempts": s.attempts,
                    "llm_calls": s.llm_calls,
                    "corrections": s.corrections,
                    "tool_calls": s.tool_calls,
                }
                for s in self.stages
            ],
            "attempts": sum(s.llm_calls for s in self.stages),
            "waits": self.waits,
            "tokens": {
                "input": self.input_tokens,
                "output": self.output_tokens,
                "total": self.input_tokens + self.output_tokens,
            },
            "cost_usd": usd_json(self.cost_usd),
            "files": self.files,
        }


def _sent_by(error: AgentExecutionError) -> int:
    """The requests a failed call sent: the envelope's count (none when refused before)."""
    sent = error.details.get("attempts")
    return sent if isinstance(sent, int) and not isinstance(sent, bool) and sent > 0 else 0


class _Counted:
    """The client, adding to a stage's ``llm_calls`` every request each call sent.

    One call can send several requests (a 429 or a 5xx retried by the envelope):
    its completion's ``attempts``, or a failed call's ``details["attempts"]``.
    Both forge paths count through this, so the plain stages and the agent loop
    (whose own ``usage.llm_calls`` counts calls, one per answer) report alike.
    It also notes the answers that had no price, so the run's cost is not
    shown as the whole cost when it is only part of it, and gives every call
    the run's options (the CLI's ``--temperature`` ...) that the call leaves unset.
    """

    def __init__(
        self,
        client: LLMClient,
        stage: StageRecord,
        run: ForgeRun | None = None,
        options: CallOptions | None = None,
    ) -> None:
        self._client = client
        self._stage = stage
        self._run = run
        self._options = options or {}

    def _with_run_options(self, options: dict[str, Any]) -> CallOptions:
        """The call's options, each the run's (``fluid forge --temperature`` ...) where the
        stage left it unset; an option still None is left out, so that the client's own
        default (FLUID_LLM_MAX_OUTPUT_TOKENS ...) applies rather than a None over it."""
        merged = {**self._options, **{k: v for k, v in options.items() if v is not None}}
        return cast("CallOptions", merged)

    def _answered(self, completion: Completion) -> Completion:
        self._stage.llm_calls += completion.attempts
        if completion.cost_usd is None and self._run is not None:
            self._run.unpriced.add(f"{completion.provider}:{completion.model}")
        return completion

    def complete(self, messages: Messages, **options: Any) -> Completion:
        try:
            completion = self._client.complete(messages, **self._with_run_options(options))
        except AgentExecutionError as error:
            self._stage.llm_calls += _sent_by(error)
            raise
        return self._answered(completion)

    async def acomplete(self, messages: Messages, **options: Any) -> Completion:
        try:
            completion = await self._client.acomplete(messages, **self._with_run_options(options))
        except AgentExecutionError as error:
            self._stage.llm_calls += _sent_by(error)
            raise
        return self._answered(completion)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _describe(stage: str, errors: list[dict[str, str]]) -> str:
    first = errors[0] if errors else {"loc": "<root>", "msg": "invalid"}
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return (
        f"{stage}: output failed validation at {first['loc']}: {first['msg']}{more}; asking again"
    )


def _feedback(errors: list[dict[str, str]]) -> str:
    lines = "\n".join(f"- {e['loc']}: {e['msg']} ({e['type']})" for e in errors[:20])
    return (
        "Your previous answer failed validation with these errors:\n"
        f"{lines}\nReply again with the whole corrected JSON."
    )


def _errors_of(error: SchemaValidationError) -> list[dict[str, str]]:
    return [
        {
            "loc": str(e.get("loc", "<root>")),
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in error.validation_errors
    ]


#: What a stage asks the model for.
_Answer = TypeVar("_Answer", bound=BaseModel)


class _Pipeline:
    def __init__(
        self,
        client: LLMClient,
        intent: Intent,
        run: ForgeRun,
        on_stage: Callable[[str], None],
        on_note: Callable[[str], None] = lambda note: None,
        options: CallOptions | None = None,
    ) -> None:
        self.on_note = on_note
        self.options = options
        self.client = client
        self.intent = intent
        self.run = run
        self.on_stage = on_stage

    def _account(self, completion: Completion) -> None:
        self.run.input_tokens += completion.usage.input_tokens
        self.run.output_tokens += completion.usage.output_tokens
        # Priced by the client (genai-prices, FLUID_PRICES); None stays None: unknown.
        if completion.cost_usd is not None:
            self.run.cost_usd = (self.run.cost_usd or 0.0) + completion.cost_usd

    def plan(self) -> Plan:
        messages: list[dict[str, Any]] = [{"role": "user", "content": self.intent.summary()}]
        return self._stage("plan", PLAN_SYSTEM, Plan, messages)

    def generate(self, plan: Plan) -> ForgeOutput:
        messages: list[dict[str, Any]] = [
            {
                "role": "user",
                "content": f"{self.intent.summary()}\n\nPlan:\n"
                + json.dumps(plan.model_dump(), indent=2),
            }
        ]
        return self._stage(
            "generate",
            GENERATE_SYSTEM,
            ForgeOutput,
            messages,
            check=lambda output: validate_output(output, self.intent),
        )

    def _stage(
        self,
        name: str,
        system: str,
        response_model: type[_Answer],
        messages: list[dict[str, Any]],
        check: Callable[[_Answer], list[dict[str, str]]] = lambda answer: [],
    ) -> _Answer:
        """One stage: ask, validate and ``check`` the answer, feeding its errors back.

        Up to :data:`MAX_STAGE_ATTEMPTS` answers; after that the last error is raised.
        """
        self.on_stage(name)
        stage = StageRecord(name)
        self.run.stages.append(stage)
        last: SchemaValidationError | None = None
        client = _Counted(self.client, stage, self.run, self.options)
        for attempt in range(1, MAX_STAGE_ATTEMPTS + 1):
            stage.attempts += 1
            completion = client.complete(
                messages, system=system, response_model=response_model, validate=False
            )
            self._account(completion)
            try:
                answer: _Answer = self.client.validate(completion.text, response_model)
                errors = check(answer)
            except SchemaValidationError as error:
                errors, last = _errors_of(error), error
            else:
                if not errors:
                    return answer
                last = SchemaValidationError(
                    f"the generated contract failed {len(errors)} check(s)",
                    schema_name=response_model.__name__,
                    validation_errors=errors,
                    raw_output=completion.text,
                    secrets=[key] if (key := self.client.config.api_key) else (),
                )
            if attempt == MAX_STAGE_ATTEMPTS:
                break  # nobody is asked again: the error raised below says what failed
            stage.corrections.append(errors)
            self.on_note(_describe(name, errors))
            messages += [
                {"role": "assistant", "content": completion.text},
                {"role": "user", "content": _feedback(errors)},
            ]
        assert last is not None
        raise last.with_details(note=f"gave up after {MAX_STAGE_ATTEMPTS} attempts")


class OutputTreeError(FluidError):
    """The output directory cannot be written safely; nothing was written.

    Raised when ``--out`` itself, a directory inside it, or a file about to
    be replaced is a symbolic link (or is not the directory or regular file
    it must be). ``path`` is relative to the output directory.
    """

    def __init__(self, out_dir: Path, path: str, problem: str) -> None:
        self.out_dir = out_dir
        self.path = path
        where = f"{out_dir}" if path == "." else f"{path} in {out_dir}"
        super().__init__(
            f"cannot write the output: {where} {problem}; forge never writes through a "
            "symbolic link in its output directory: remove it or choose another --out"
        )


_O_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS: Final = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
_NEW_FILE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC


class _OutputTree:
    """The output directory, opened once and walked by descriptor without following symlinks.

    Every directory below ``out`` is opened with ``O_NOFOLLOW`` relative to
    its parent's descriptor, so a symlink placed anywhere in the tree (even
    between the check and the write) is refused, never written through.
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self._dirs: dict[tuple[str, ...], int] = {}

    def __enter__(self) -> _OutputTree:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()

    def _refuse(self, parts: tuple[str, ...], problem: str) -> OutputTreeError:
        return OutputTreeError(self.out, "/".join(parts) or ".", problem)

    @staticmethod
    def _kind(dir_fd: int | None, name: str) -> str | None:
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(mode):
            return "link"
        return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"

    def _open_root(self, create: bool) -> int | None:
        if () in self._dirs:
            return self._dirs[()]
        kind = self._kind(None, str(self.out))
        if kind == "link":
            raise self._refuse((), "is a symbolic link")
        if kind is None:
            if not create:
                return None
            self.out.mkdir(parents=True, exist_ok=True)
        elif kind != "dir":
            raise self._refuse((), "is not a directory")
        try:
            fd = os.open(self.out, _DIR_FLAGS)
        except OSError as exc:
            raise self._refuse((), f"cannot be opened ({exc.strerror or exc})") from None
        self._dirs[()] = fd
        return fd

    def directory(self, parts: tuple[str, ...], *, create: bool) -> int | None:
        """A descriptor on the directory ``parts`` below ``out``; None when it does not exist
        yet and ``create`` is false. A symlink or a non-directory on the way is refused."""
        if parts in self._dirs:
            return self._dirs[parts]
        if not parts:
            return self._open_root(create)
        parent = self.directory(parts[:-1], create=create)
        if parent is None:
            return None
        name = parts[-1]
        kind = self._kind(parent, name)
        if kind is None:
            if not create:
                return None
            with contextlib.suppress(FileExistsError):  # made meanwhile: opened below, no-follow
                os.mkdir(name, 0o777, dir_fd=parent)
        elif kind == "link":
            raise self._refuse(parts, "is a symbolic link")
        elif kind != "dir":
            raise self._refuse(parts, "is not a directory")
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if self._kind(parent, name) == "link":
                raise self._refuse(parts, "is a symbolic link") from None
            raise self._refuse(parts, f"cannot be opened ({exc.strerror or exc})") from None
        self._dirs[parts] = fd
        return fd

    def check(self, parts: tuple[str, ...]) -> None:
        """Refuse now what would stop writing the file ``parts``: nothing is created here."""
        parent = self.directory(parts[:-1], create=False)
        if parent is None:
            return
        kind = self._kind(parent, parts[-1])
        if kind == "link":
            raise self._refuse(parts, "is a symbolic link")
        if kind not in (None, "file"):
            raise self._refuse(parts, "exists and is not a regular file")

    def stage(self, parts: tuple[str, ...], text: str) -> tuple[int, str, str]:
        """Write ``text`` to a new temporary file next to ``parts``: (dir fd, temp name, name)."""
        parent = self.directory(parts[:-1], create=True)
        assert parent is not None
        temp = f".{parts[-1]}.{secrets.token_hex(6)}.tmp"
        fd = os.open(temp, _NEW_FILE, 0o666, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(text.encode("utf-8"))
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            self.discard(parent, temp)
            raise
        return parent, temp, parts[-1]

    def commit(self, staged: tuple[int, str, str], parts: tuple[str, ...]) -> None:
        parent, temp, name = staged
        if self._kind(parent, name) == "link":
            raise self._refuse(parts, "is a symbolic link")
        os.replace(temp, name, src_dir_fd=parent, dst_dir_fd=parent)

    @staticmethod
    def discard(parent: int, temp: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=parent)


def _write_all(run: ForgeRun, output: ForgeOutput) -> None:
    """Check the whole output tree, stage every file next to its target, then rename them in.

    Each file is written to a temporary file in its own directory and moved
    over its target with ``os.replace`` (atomic: a reader sees the old file or
    the new one, never half of either). Nothing is written when any target,
    or any directory on the way to it, is a symbolic link.
    """
    files: list[tuple[tuple[str, ...], str]] = [
        (CONTRACT_PATH.parts, yaml.safe_dump(output.contract, sort_keys=False, allow_unicode=True))
    ]
    files += [(PurePosixPath(f.path).parts, f.content) for f in output.additional_files]
    run.files = ["/".join(parts) for parts, _ in files]
    files.append((RECEIPT_PATH.parts, json.dumps(run.receipt(), indent=2) + "\n"))
    with _OutputTree(run.out_dir) as tree:
        for parts, _ in files:
            tree.check(parts)
        staged: list[tuple[int, str, str]] = []
        try:
            for parts, text in files:
                staged.append(tree.stage(parts, text))
            for (parts, _), item in zip(files, staged, strict=True):
                tree.commit(item, parts)
        finally:
            for parent, temp, _ in staged:
                tree.discard(parent, temp)


def run_forge(
    client: LLMClient,
    intent: Intent,
    out_dir: str | Path,
    *,
    on_stage: Callable[[str], None] = lambda stage: None,
    on_note: Callable[[str], None] = lambda note: None,
    replay: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    agent_loop: bool = False,
    workspace: Path | None = None,
    before_write: Callable[[], None] | None = None,
    options: CallOptions | None = None,
) -> ForgeRun:
    """Plan, generate and validate, then write the contract, the files and the receipt.

    ``options`` go with every model call of the run, the agent loop's included,
    where the stage sets none itself (``fluid forge --temperature`` ...).

    ``before_write`` runs once every stage succeeded, before anything is
    written: what it raises ends the run with nothing written (a replay
    checks there that it used the whole cassette).
    """
    run = ForgeRun(
        client.provider,
        client.model,
        Path(out_dir),
        replay=replay,
        intent_sha=intent_digest(intent),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    started = clock()
    record_wait = client.envelope.hook

    def hook(event: RetryEvent) -> None:
        run.waits.append(
            {
                "seconds": round(event.wait, 3),
                "reason": event.reason,
                "code": event.error.code if event.error else None,
            }
        )
        record_wait(event)

    client.envelope.hook = hook
    try:
        pipeline = _Pipeline(client, intent, run, on_stage, on_note, options)
        plan = pipeline.plan()
        if agent_loop:
            output = _generate_with_tools(
                client, intent, plan, run, on_stage, on_note, workspace, options
            )
        else:
            output = pipeline.generate(plan)
        on_stage("validate")
        problems = validate_output(output, intent)
        if problems:  # unreachable: both paths ran these checks before returning
            raise SchemaValidationError(
                f"the generated contract failed {len(problems)} check(s)",
                schema_name="ForgeOutput",
                validation_errors=problems,
            )
        run.output = output
        if before_write is not None:
            before_write()
        run.seconds = clock() - started
        on_stage("write")
        _write_all(run, output)
        return run
    finally:
        client.envelope.hook = record_wait


def _generate_with_tools(
    client: LLMClient,
    intent: Intent,
    plan: Plan,
    run: ForgeRun,
    on_stage: Callable[[str], None],
    on_note: Callable[[str], None],
    workspace: Path | None,
    options: CallOptions | None = None,
) -> ForgeOutput:
    """The generate stage as an agent loop: workspace tools, then a final answer that must
    validate against :class:`ForgeOutput` and pass :func:`validate_output`; each failure
    is fed back (up to 3 answers in all), as in the stage without tools."""
    from fluid_build.copilot.loop.agent import AgentLoop, Budget
    from fluid_build.forge.workspace_tools import workspace_tools

    on_stage("generate")
    stage = StageRecord("generate")
    run.stages.append(stage)
    root = workspace or Path.cwd()

    def check(output: Any) -> list[dict[str, str]]:
        assert isinstance(output, ForgeOutput)
        return validate_output(output, intent)

    def corrected(error: SchemaValidationError) -> None:
        errors = _errors_of(error)
        stage.corrections.append(errors)
        on_note(_describe("generate", errors))

    loop = AgentLoop(
        # The loop sees the client through the counter: its requests, not its calls.
        cast("LLMClient", _Counted(client, stage, run, options)),
        tools=workspace_tools(),
        workspace=root,
        response_model=ForgeOutput,
        system=GENERATE_SYSTEM,
        budget=Budget(max_llm_calls=20),
        # Also the loop's own worst-case cost check, not only what is sent.
        max_output_tokens=(options or {}).get("max_output_tokens"),
        check=check,
        max_corrections=MAX_STAGE_ATTEMPTS - 1,
        on_correction=corrected,
    )
    try:
        result = loop.run(
            f"{intent.summary()}\n\nPlan:\n{json.dumps(plan.model_dump(), indent=2)}\n\n"
            "Use the workspace tools to look at existing schemas and templates first."
        )
    except AgentExecutionError:
        stage.attempts = loop.result.usage.rounds
        stage.tool_calls = tool_calls_of(loop.result.transcript)
        raise
    stage.attempts = result.usage.rounds
    stage.tool_calls = tool_calls_of(result.transcript)
    run.input_tokens += result.usage.input_tokens
    run.output_tokens += result.usage.output_tokens
    if result.usage.cost_usd is not None:
        run.cost_usd = (run.cost_usd or 0.0) + result.usage.cost_usd
    output = result.output
    assert isinstance(output, ForgeOutput)
    return output


def tool_calls_of(transcript: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool calls of an agent loop's transcript, for the receipt.

    Each: the round (the model call that asked for it, 1-based), the tool's
    name, its arguments (redacted, cut short) and ``result``: ``"ok"``, or
    the class the model was shown for a failure (``ToolValidationError``).
    A result is matched to its call within the round (ids may repeat across
    rounds).
    """
    from fluid_build._redact import redact, redact_json, truncate

    calls: list[dict[str, Any]] = []
    pending: dict[str, dict[str, Any]] = {}
    round_number = 0
    for message in transcript:
        role = message.get("role")
        if role == "tool":
            entry = pending.pop(str(message.get("tool_call_id")), None)
            if entry is not None:
                entry["result"] = _tool_result(message.get("content"))
            continue
        if role != "assistant":
            continue
        round_number += 1
        pending = {}
        for call in message.get("tool_calls") or ():
            arguments = redact_json(call.get("arguments") or {})
            shown = json.dumps(arguments, ensure_ascii=False, default=str)
            entry = {
                "round": round_number,
                "name": truncate(redact(str(call.get("name"))), 100),
                "arguments": arguments if len(shown) <= 500 else truncate(shown, 500),
                "result": "not run",
            }
            calls.append(entry)
            pending[str(call.get("id"))] = entry
    return calls


def _tool_result(content: object) -> str:
    """``"ok"``, or the error class of the scrubbed result the loop sends for a failed call."""
    if isinstance(content, str) and content.startswith('{"error": '):
        try:
            data = json.loads(content)
        except ValueError:
            return "ok"
        message = data.get("message") if isinstance(data, dict) else None
        if (
            isinstance(data, dict)
            and set(data) == {"error", "message"}
            and isinstance(message, str)
            and message.endswith(" - see server logs")
        ):
            return str(data["error"])
    return "ok"


def intent_digest(intent: Intent) -> str:
    """A short fingerprint of the intent, so a receipt says what it was made from."""
    return hashlib.sha256(intent.model_dump_json().encode()).hexdigest()[:16]

"""The forge pipeline: plan, generate, validate, then write everything at once.

A stage whose output fails validation gets up to 3 attempts, each told the
previous errors (field paths and what was expected). Files are staged in a
temporary directory and moved into place only when every stage succeeded,
so a failed run leaves no half-written file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Final

import yaml
from pydantic import BaseModel, ConfigDict, Field

from fluid_build import __version__
from fluid_build.copilot.agents.errors import AgentExecutionError, SchemaValidationError
from fluid_build.copilot.agents.retry import RetryEvent
from fluid_build.copilot.client import LLMClient
from fluid_build.forge.intent import Intent

__all__ = [
    "MAX_STAGE_ATTEMPTS",
    "ForgeOutput",
    "ForgeRun",
    "GeneratedFile",
    "Plan",
    "run_forge",
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
    llm_calls: int = 0
    corrections: list[list[dict[str, str]]] = field(default_factory=list)


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
    cost_usd: float | None = None
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
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6),
            "files": self.files,
        }


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


class _Pipeline:
    def __init__(
        self,
        client: LLMClient,
        intent: Intent,
        run: ForgeRun,
        on_stage: Callable[[str], None],
        prices: dict[str, tuple[float, float]],
        on_note: Callable[[str], None] = lambda note: None,
    ) -> None:
        self.on_note = on_note
        self.client = client
        self.intent = intent
        self.run = run
        self.on_stage = on_stage
        self.prices = prices

    def _account(self, stage: StageRecord, completion: Any) -> None:
        stage.llm_calls += completion.attempts
        self.run.input_tokens += completion.usage.input_tokens
        self.run.output_tokens += completion.usage.output_tokens
        price = self.prices.get(self.client.model)
        if price is not None:
            spent = (
                completion.usage.input_tokens * price[0] + completion.usage.output_tokens * price[1]
            ) / 1_000_000
            self.run.cost_usd = (self.run.cost_usd or 0.0) + spent

    def plan(self) -> Plan:
        self.on_stage("plan")
        stage = StageRecord("plan")
        self.run.stages.append(stage)
        messages: list[dict[str, Any]] = [{"role": "user", "content": self.intent.summary()}]
        last: SchemaValidationError | None = None
        for _ in range(MAX_STAGE_ATTEMPTS):
            stage.attempts += 1
            completion = self.client.complete(
                messages, system=PLAN_SYSTEM, response_model=Plan, validate=False
            )
            self._account(stage, completion)
            try:
                plan: Plan = self.client.validate(completion.text, Plan)
                return plan
            except SchemaValidationError as error:
                errors = _errors_of(error)
                stage.corrections.append(errors)
                self.on_note(_describe("plan", errors))
                last = error
                messages += [
                    {"role": "assistant", "content": completion.text},
                    {"role": "user", "content": _feedback(errors)},
                ]
        assert last is not None
        raise last.with_details(note=f"gave up after {MAX_STAGE_ATTEMPTS} attempts")

    def generate(self, plan: Plan) -> ForgeOutput:
        self.on_stage("generate")
        stage = StageRecord("generate")
        self.run.stages.append(stage)
        messages: list[dict[str, Any]] = [
            {
                "role": "user",
                "content": f"{self.intent.summary()}\n\nPlan:\n"
                + json.dumps(plan.model_dump(), indent=2),
            }
        ]
        last: SchemaValidationError | None = None
        for _ in range(MAX_STAGE_ATTEMPTS):
            stage.attempts += 1
            completion = self.client.complete(
                messages, system=GENERATE_SYSTEM, response_model=ForgeOutput, validate=False
            )
            self._account(stage, completion)
            try:
                output: ForgeOutput = self.client.validate(completion.text, ForgeOutput)
                errors = validate_output(output, self.intent)
            except SchemaValidationError as error:
                errors, last = _errors_of(error), error
            else:
                if not errors:
                    return output
                last = SchemaValidationError(
                    f"the generated contract failed {len(errors)} check(s)",
                    schema_name="ForgeOutput",
                    validation_errors=errors,
                    raw_output=completion.text,
                )
            stage.corrections.append(errors)
            self.on_note(_describe("generate", errors))
            messages += [
                {"role": "assistant", "content": completion.text},
                {"role": "user", "content": _feedback(errors)},
            ]
        assert last is not None
        raise last.with_details(note=f"gave up after {MAX_STAGE_ATTEMPTS} attempts")


def _write_all(run: ForgeRun, output: ForgeOutput) -> None:
    """Stage every file, then move them into place: all or nothing."""
    out = run.out_dir
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fluid-forge-", dir=out))
    try:
        planned: list[tuple[Path, Path]] = []

        def stage(relative: Path, text: str) -> None:
            temp = staging / relative
            temp.parent.mkdir(parents=True, exist_ok=True)
            temp.write_text(text, encoding="utf-8")
            planned.append((temp, out / relative))

        stage(CONTRACT_PATH, yaml.safe_dump(output.contract, sort_keys=False, allow_unicode=True))
        for file in output.additional_files:
            stage(Path(*PurePosixPath(file.path).parts), file.content)
        run.files = [str(target.relative_to(out)) for _, target in planned]
        stage(RECEIPT_PATH, json.dumps(run.receipt(), indent=2) + "\n")
        for temp, target in planned:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(temp, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
) -> ForgeRun:
    """Plan, generate and validate, then write the contract, the files and the receipt."""
    from fluid_build.copilot.agents.loop import DEFAULT_PRICES

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
        pipeline = _Pipeline(client, intent, run, on_stage, dict(DEFAULT_PRICES), on_note)
        plan = pipeline.plan()
        if agent_loop:
            output = _generate_with_tools(client, intent, plan, run, on_stage, workspace)
        else:
            output = pipeline.generate(plan)
        on_stage("validate")
        problems = validate_output(output, intent)
        if problems:  # only reachable from the agent loop, which validated the shape only
            raise SchemaValidationError(
                f"the generated contract failed {len(problems)} check(s)",
                schema_name="ForgeOutput",
                validation_errors=problems,
            )
        run.output = output
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
    workspace: Path | None,
) -> ForgeOutput:
    from fluid_build.copilot.agents.loop import AgentLoop, Budget
    from fluid_build.forge.workspace_tools import workspace_tools

    on_stage("generate")
    stage = StageRecord("generate")
    run.stages.append(stage)
    root = workspace or Path.cwd()
    loop = AgentLoop(
        client,
        tools=workspace_tools(),
        workspace=root,
        response_model=ForgeOutput,
        system=GENERATE_SYSTEM,
        budget=Budget(max_llm_calls=20),
    )
    try:
        result = loop.run(
            f"{intent.summary()}\n\nPlan:\n{json.dumps(plan.model_dump(), indent=2)}\n\n"
            "Use the workspace tools to look at existing schemas and templates first."
        )
    except AgentExecutionError:
        stage.attempts = loop.result.usage.rounds
        stage.llm_calls = loop.result.usage.llm_calls
        raise
    stage.attempts = result.usage.rounds
    stage.llm_calls = result.usage.llm_calls
    run.input_tokens += result.usage.input_tokens
    run.output_tokens += result.usage.output_tokens
    output = result.output
    assert isinstance(output, ForgeOutput)
    return output


def intent_digest(intent: Intent) -> str:
    """A short fingerprint of the intent, so a receipt says what it was made from."""
    return hashlib.sha256(intent.model_dump_json().encode()).hexdigest()[:16]

"""AWS Bedrock's Converse API, with tool use; structured output through a forced tool.

Requests are signed with SigV4 (botocore's signer, credentials from the
standard AWS chain: environment, shared config and credentials files and
profiles, SSO, container and instance roles), or carry a Bedrock API key
(``AWS_BEARER_TOKEN_BEDROCK``) as a bearer token. Streams arrive as AWS
event-stream frames (``stream_format = "eventstream"``, decoded in
:mod:`fluid_build.copilot.llm.base`). botocore is the ``bedrock`` extra: it
loads with the first Bedrock client, never with ``import fluid_build``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import quote, urlsplit

from fluid_build._redact import install_log_redaction, one_line, redact, truncate
from fluid_build.copilot.agents.errors import ProviderAuthError, ProviderError
from fluid_build.copilot.llm.answer_shape import COUNT, NULL, TEXT, text_of
from fluid_build.copilot.llm.anthropic import (
    choose_tool,
    takes_thinking,
    thinking_fields,
    thinking_refusals,
)
from fluid_build.copilot.llm.base import (
    Adapter,
    Parsed,
    ProviderConfig,
    Request,
    StreamState,
    merge_body,
    set_headers,
)
from fluid_build.copilot.llm.checks import not_configured, url_problem
from fluid_build.copilot.llm.credentials import UNBOUNDED_WAIT, Lookup, Pending, wait
from fluid_build.copilot.llm.types import CallSpec, StreamEvent, ToolCall, Usage

if TYPE_CHECKING:
    import httpx

__all__ = ["BedrockAdapter", "bedrock_messages", "endpoint_for"]

PIP_LINE: Final = "pip install 'fluid-build[bedrock]'"
#: The step that fixes most rejected or missing AWS credentials, for a message.
AWS_NEXT_STEP: Final = (
    "check AWS_PROFILE (and run `aws sso login --profile <name>` if it uses SSO), or set "
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a Bedrock API key in "
    "AWS_BEARER_TOKEN_BEDROCK"
)
#: What botocore's credential chain reads from the process environment. It reads them
#: from ``os.environ``, not from ``LLMClient(env=)``: the region, the endpoint and
#: AWS_BEARER_TOKEN_BEDROCK come from ``env``, the signing credentials from the process.
AWS_CHAIN_VARIABLES: Final = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_EC2_METADATA_DISABLED",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
)
#: The finish reason of an answer a guardrail stopped.
GUARDRAIL: Final = "guardrail_intervened"


def endpoint_for(region: str) -> str:
    return f"https://bedrock-runtime.{region}.amazonaws.com"


def _region_of(url: str) -> str | None:
    """The region a standard endpoint names (``bedrock-runtime.<region>.amazonaws.com``)."""
    host = urlsplit(url).hostname or ""
    parts = host.split(".")
    if len(parts) >= 4 and parts[0].startswith("bedrock-runtime") and "amazonaws" in parts:
        return parts[1]
    return None


def _profile_region(env: Mapping[str, str]) -> str | None:
    """The shared config profile's region (``AWS_PROFILE``), read by botocore."""
    try:
        import botocore.session
    except ImportError:
        return None  # the adapter says what to install
    from botocore.exceptions import BotoCoreError

    try:
        # No builtin handlers: they serve a client's requests, and registering them costs
        # 35 ms a session (inspect on each); reading the config files needs none.
        session = botocore.session.Session(
            profile=env.get("AWS_PROFILE") or None, include_builtin_handlers=False
        )
        # The profile's own setting only: botocore's full region chain would ask the
        # instance metadata service, a network call at configuration time.
        region = session.get_scoped_config().get("region")
    except BotoCoreError:
        return None
    return str(region).strip() or None if region else None


#: What a URL path may hold unquoted and yarl unquotes: sent as is, so signed as sent.
_PATH_SAFE: Final = ":@!$&'()*+,;="


def resolve_endpoint(
    url: str | None, key: str | None, env: Mapping[str, str]
) -> tuple[str, str | None, str | None]:
    """The endpoint, the signing region and the bearer token.

    The endpoint: ``base_url=`` or AWS_ENDPOINT_URL_BEDROCK_RUNTIME (already in
    ``url``), then AWS_ENDPOINT_URL, then the region's own endpoint; the region
    from AWS_REGION, AWS_DEFAULT_REGION, the profile, or the endpoint's host
    name. The token: ``api_key=`` (or FLUID_LLM_API_KEY, in ``key``), then
    AWS_BEARER_TOKEN_BEDROCK; without one, requests are signed with SigV4.
    """
    if key is None:
        key = (env.get("AWS_BEARER_TOKEN_BEDROCK") or "").strip() or None
        if key is not None and not key.isprintable():
            raise ProviderAuthError(
                "AWS_BEARER_TOKEN_BEDROCK holds a key that contains control characters (a "
                "pasted newline?): set the key alone, on one line",
                provider="bedrock",
                details={"variable": "AWS_BEARER_TOKEN_BEDROCK"},
                secrets=(key,),
            )

    if url is None:
        general = (env.get("AWS_ENDPOINT_URL") or "").strip()
        if general:
            problem = url_problem(general)
            if problem is not None:
                raise ProviderError(
                    f"bedrock endpoint from AWS_ENDPOINT_URL is not an http(s) URL fluid can "
                    f"use: {problem}; set it like AWS_ENDPOINT_URL={endpoint_for('us-east-1')}",
                    provider="bedrock",
                    code="llm.bad_endpoint",
                    retryable=False,
                    details={"variable": "AWS_ENDPOINT_URL", "example": endpoint_for("us-east-1")},
                )
            url = general
    region = None
    for variable in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        region = (env.get(variable) or "").strip() or None
        if region is not None:
            break
    if region is None:
        region = _profile_region(env) or (_region_of(url) if url else None)
    if region is not None and not all(ch.isalnum() or ch == "-" for ch in region):
        raise not_configured(
            f"the AWS region {region[:40]!r} is not a region name: set it like "
            "AWS_REGION=us-east-1",
            "bedrock",
            variable="AWS_REGION",
            example="us-east-1",
        )
    if region is None and (url is None or key is None):
        raise not_configured(
            "bedrock needs an AWS region: set AWS_REGION (e.g. AWS_REGION=us-east-1), or a "
            "region in your AWS profile",
            "bedrock",
            variable="AWS_REGION",
            example="us-east-1",
        )
    return url or endpoint_for(str(region)), region, key


def not_installed() -> ProviderError:
    return ProviderError(
        f"the bedrock provider needs botocore, which is not installed: run {PIP_LINE}",
        provider="bedrock",
        code="llm.not_configured",
        retryable=False,
        details={"install": PIP_LINE},
    )


def _respond_tool(spec: CallSpec) -> str:
    return f"respond_{spec.schema_name}"[:64]


#: Cross-region inference profiles put a geography before the model id.
_GEOGRAPHIES: Final = frozenset({"us", "us-gov", "eu", "apac", "jp", "au", "ca", "in", "global"})
#: The options every Converse model takes: inferenceConfig and toolConfig.toolChoice.
CONVERSE_OPTIONS: Final = frozenset(
    {"temperature", "top_p", "stop", "max_output_tokens", "tool_choice"}
)


def model_family(model: str) -> str:
    """The family (``anthropic``, ``amazon``, ``meta`` ...) of a Bedrock model id, an
    inference profile's id or its ARN; "" when the id does not say (an application
    inference profile's ARN, an imported model)."""
    name = model.rpartition("/")[2]
    geography, _, rest = name.partition(".")
    name = rest if rest and geography in _GEOGRAPHIES else name
    family, dot, _ = name.partition(".")
    return family if dot else ""


def bedrock_messages(spec: CallSpec) -> list[dict[str, Any]]:
    """Neutral messages as Converse turns of content blocks."""
    out: list[dict[str, Any]] = []
    for message in spec.messages:
        role = message.get("role", "user")
        content = message.get("content") or ""
        if role == "tool":
            text = content if isinstance(content, str) else json.dumps(content)
            block = {
                "toolResult": {
                    "toolUseId": message.get("tool_call_id", ""),
                    "content": [{"text": text}],
                }
            }
            if out and out[-1]["role"] == "user" and "toolResult" in out[-1]["content"][-1]:
                out[-1]["content"].append(block)  # results of one round go in one user turn
            else:
                out.append({"role": "user", "content": [block]})
            continue
        if role == "assistant":
            blocks: list[dict[str, Any]] = [{"text": content}] if content else []
            blocks += [
                {
                    "toolUse": {
                        "toolUseId": c["id"],
                        "name": c["name"],
                        "input": c.get("arguments", {}),
                    }
                }
                for c in message.get("tool_calls") or []
            ]
            out.append({"role": "assistant", "content": blocks or [{"text": " "}]})
            continue
        out.append({"role": "user", "content": [{"text": content}]})
    return out


def _count(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _usage(usage: Any) -> Usage:
    """Converse counts cache reads and writes apart from inputTokens: all are input.

    ``cacheReadInputTokenCount`` / ``cacheWriteInputTokenCount`` repeat the
    ``...Tokens`` fields in some answers: each is counted once.
    """
    if not isinstance(usage, dict):
        return Usage()
    read = _count(usage, "cacheReadInputTokens") or _count(usage, "cacheReadInputTokenCount")
    written = _count(usage, "cacheWriteInputTokens") or _count(usage, "cacheWriteInputTokenCount")
    return Usage(
        input_tokens=_count(usage, "inputTokens") + read + written,
        output_tokens=_count(usage, "outputTokens"),
        cache_read_tokens=read,
        cache_write_tokens=written,
    )


#: How far into a guardrail assessment its policies' findings are looked for, and how many
#: are kept: an assessment nests policy -> list -> finding.
_TRACE_DEPTH: Final = 6
_MOST_ACTIONS: Final = 100


def _findings(node: Any, policy: str, where: str, depth: int, out: list[dict[str, str]]) -> None:
    """Each finding under ``node`` that names an ``action``: its policy, type and action.

    What a finding matched (the PII itself, a custom word) is never kept.
    """
    if depth > _TRACE_DEPTH or len(out) >= _MOST_ACTIONS:
        return
    if isinstance(node, dict):
        action = node.get("action")
        if isinstance(action, str) and action:
            kind = node.get("type") if isinstance(node.get("type"), str) else node.get("name")
            finding = {"where": where, "policy": policy, "action": action}
            if isinstance(kind, str) and kind:
                finding["type"] = kind
            out.append(finding)
        for key, value in node.items():
            if isinstance(value, dict | list) and key != "invocationMetrics":
                _findings(value, policy, where, depth + 1, out)
    elif isinstance(node, list):
        for item in node[:_MOST_ACTIONS]:
            _findings(item, policy, where, depth + 1, out)


def guardrail_actions(trace: Any) -> list[dict[str, str]] | None:
    """What the guardrail did, read from a Converse ``trace`` (``trace.guardrail``, a
    GuardrailTraceAssessment): one entry per finding with an action (``BLOCKED``,
    ``ANONYMIZED``, ``NONE``), naming where (``input``/``output``), the policy and the type.
    None when the answer carries no guardrail trace (tracing is off)."""
    guardrail = trace.get("guardrail") if isinstance(trace, dict) else None
    if not isinstance(guardrail, dict):
        return None
    out: list[dict[str, str]] = []
    assessed: list[tuple[str, Any]] = []
    inputs = guardrail.get("inputAssessment")
    if isinstance(inputs, dict):
        assessed += [("input", a) for a in inputs.values()]
    outputs = guardrail.get("outputAssessments")
    if isinstance(outputs, dict):
        for each in outputs.values():
            assessed += [("output", a) for a in (each if isinstance(each, list) else [each])]
    for where, assessment in assessed:
        if isinstance(assessment, dict):
            for policy, findings in assessment.items():
                if policy != "invocationMetrics":
                    _findings(findings, str(policy), where, 1, out)
    return out


def _masked(actions: list[dict[str, str]] | None) -> bool:
    """Whether a guardrail that intervened only changed the answer (masked it): its trace
    shows an action that is neither BLOCKED nor NONE, and none BLOCKED. Without a trace
    a block and a mask look alike, and the answer is taken for blocked."""
    if not actions:
        return False
    done = {a["action"] for a in actions}
    return "BLOCKED" not in done and bool(done - {"NONE"})


def _guardrail(trace: Any, spec: CallSpec) -> dict[str, Any]:
    """``Completion.details["guardrail"]`` for an answer a guardrail masked; the
    ``llm.content_filtered`` error for one it blocked (or whose trace does not say)."""
    actions = guardrail_actions(trace)
    if not _masked(actions):
        raise _filtered(spec, actions)
    return {"masked": True, "actions": actions}


def _filtered(spec: CallSpec, actions: list[dict[str, str]] | None = None) -> ProviderError:
    if actions is None:
        why = (
            "a guardrail intervened; the answer has no guardrail trace to tell a block from "
            'masking (send guardrailConfig with "trace": "enabled")'
        )
    else:
        blocked = sorted({a["policy"] for a in actions if a["action"] == "BLOCKED"})
        why = f"a guardrail blocked it ({', '.join(blocked) or 'no policy named'})"
    return ProviderError(
        f"bedrock ({spec.model}) refused the request: {why} (stopReason {GUARDRAIL})",
        provider="bedrock",
        model=spec.model,
        status_code=200,
        provider_error_type=GUARDRAIL,
        code="llm.content_filtered",
        retryable=False,
        details={"guardrail_actions": actions} if actions is not None else None,
    )


def _citations(block: Any) -> tuple[str, list[Any]]:
    """A ``citationsContent`` block's text (its generated content) and its citations."""
    if not isinstance(block, dict):
        return "", []
    content = block.get("content")
    text = "".join(text_of(part.get("text")) for part in content or [] if isinstance(part, dict))
    cited = block.get("citations")
    return text, [c for c in cited if isinstance(c, dict)] if isinstance(cited, list) else []


_USAGE = {
    "inputTokens": COUNT,
    "outputTokens": COUNT,
    "cacheReadInputTokens": COUNT,
    "cacheWriteInputTokens": COUNT,
}


#: Refreshable credentials this close to their expiry are looked up again before the next
#: request, in the call's credential step: sooner than botocore's own advisory refresh
#: (15 minutes before), so that signing never refreshes them itself.
REFRESH_AHEAD: Final = 16 * 60
#: Signing uses the credentials in hand unless they are this close to expiry (botocore's
#: mandatory refresh window) and their snapshot is older than :data:`SNAPSHOT_FRESH`
#: seconds: then it looks them up itself (outside a call's step only).
MUST_REFRESH: Final = 10 * 60
SNAPSHOT_FRESH: Final = 60.0


def _refresh_due(credentials: Any, within: float) -> bool:
    """Whether botocore's credentials expire within ``within`` seconds (never, for static
    keys; always, for deferred ones not yet fetched: SSO, assumed roles)."""
    if credentials is None:
        return True
    check = getattr(credentials, "refresh_needed", None)
    if not callable(check):
        return False
    try:
        return bool(check(within))
    except Exception:  # noqa: BLE001 - an unreadable expiry: look them up again
        return True


#: Header fields a transport or a proxy may set or change on the way: never signed. The
#: host is signed from the URL; user-agent and connection botocore would leave out itself
#: (its SIGNED_HEADERS_BLACKLIST), so they are not handed to it.
_UNSIGNED: Final = frozenset(
    {"accept-encoding", "content-length", "host", "user-agent", "connection", "transfer-encoding"}
)
#: What signing adds to a request (botocore's ``add_auth``).
_SIGNING_FIELDS: Final = ("authorization", "x-amz-date", "x-amz-security-token")


class _Signer:
    """SigV4 with botocore, as a credential step (llm/credentials.py ``RequestAuth``): the
    credential chain resolved once, refreshed as it expires.

    The chain (environment, shared files, SSO, ``credential_process``, the
    container endpoint, the instance metadata service) and each refresh of
    refreshable credentials can wait on the network or on a program: they run
    as the call's credential step (:meth:`pending`: in a thread of their own,
    one lookup at a time, awaited within the call's deadline; see
    :mod:`fluid_build.copilot.llm.credentials`). Signing itself uses the
    snapshot the last lookup took and never waits, on the request as built
    (:meth:`auth`): its method, its URL as it is sent (the path escaped once,
    by httpx), its header fields and its body's bytes as encoded for the wire.
    """

    def __init__(self, region: str) -> None:
        try:
            import botocore.auth
            import botocore.session
        except ImportError:
            raise not_installed() from None
        install_log_redaction()  # botocore.auth logs the canonical request at DEBUG
        self.region = region
        self.session = botocore.session.Session()
        self.credentials: Any = None  # botocore's credentials (refreshable or not)
        self.frozen: Any = None  # what signs: the last lookup's snapshot of them
        self.frozen_at = 0.0  # when it was taken (time.monotonic)
        self.lookup = Lookup("aws-credentials")

    def pending(self) -> Pending | None:
        """The lookup the next request needs first, or None while the credentials in hand
        are good for longer than :data:`REFRESH_AHEAD`."""
        if self.frozen is not None and not _refresh_due(self.credentials, REFRESH_AHEAD):
            return None
        return Pending("AWS credentials", self._start)

    def _start(self) -> Any:
        return self.lookup.start(self._resolve)

    def _resolve(self) -> Any:
        """The chain, then a snapshot of what it found (refreshed first when due); in the
        lookup's thread."""
        from botocore.exceptions import BotoCoreError, SSOError, TokenRetrievalError

        if self.credentials is None:
            try:
                credentials = self.session.get_credentials()
            except BotoCoreError as exc:
                raise _no_credentials(f"the AWS credential chain failed: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - a provider's own fault, typed here
                raise _chain_failed(exc) from None
            if credentials is None:
                raise _no_credentials("no AWS credentials were found")
            self.credentials = credentials
        try:
            frozen = self.credentials.get_frozen_credentials()
        # An SSO profile's cached login expired or is missing (TokenRetrievalError: the
        # sso-session token provider, botocore's only token provider, could not refresh).
        except (SSOError, TokenRetrievalError):
            raise _sso_login_needed(self.session.profile) from None
        except BotoCoreError as exc:
            raise _no_credentials(f"the AWS credentials could not be refreshed: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - "refreshed, but still expired" is a RuntimeError
            raise _no_credentials(
                f"the AWS credentials could not be refreshed ({type(exc).__name__})"
            ) from None
        self.frozen, self.frozen_at = frozen, time.monotonic()
        return frozen

    def _signing(self) -> Any:
        frozen = self.frozen
        if frozen is not None and (
            time.monotonic() - self.frozen_at < SNAPSHOT_FRESH
            or not _refresh_due(self.credentials, MUST_REFRESH)
        ):
            return frozen
        # Only outside a call's step (``adapter.request()`` alone): the lookup, waited for.
        done, frozen = wait(self._start(), UNBOUNDED_WAIT)
        if not done:
            raise _no_credentials(
                f"the AWS credential lookup did not end within {UNBOUNDED_WAIT:g} s"
            )
        return frozen

    def auth(self, request: httpx.Request) -> httpx.Request:
        """``request`` signed: the signature covers the bytes and the path it sends, and
        every header field but the ones a transport sets (:data:`_UNSIGNED`)."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        fields = {name: value for name, value in request.headers.items() if name not in _UNSIGNED}
        signing = AWSRequest(
            method=request.method, url=str(request.url), data=request.content, headers=fields
        )
        SigV4Auth(self._signing(), "bedrock", self.region).add_auth(signing)
        for name in _SIGNING_FIELDS:
            value = signing.headers.get(name)
            if value is not None:
                request.headers[name] = str(value)
        return request


def _chain_failed(exc: Exception) -> ProviderError:
    """A fault of botocore's chain that is not a BotoCoreError: a container endpoint's URL
    botocore refuses (a ValueError naming the host) is configuration, the rest auth."""
    import os

    reason = truncate(one_line(redact(str(exc))), 200) or type(exc).__name__
    if isinstance(exc, ValueError) and os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        return not_configured(
            f"bedrock cannot use AWS_CONTAINER_CREDENTIALS_FULL_URI: {reason}; set it to the "
            "container credentials endpoint your platform gives (a loopback address, or "
            "ECS's and EKS's own), or unset it",
            "bedrock",
            variable="AWS_CONTAINER_CREDENTIALS_FULL_URI",
            example="http://169.254.170.2/v2/credentials/<id>",
        )
    return _no_credentials(f"the AWS credential chain failed ({type(exc).__name__}: {reason})")


def _no_credentials(what: str) -> ProviderAuthError:
    import os

    # The names of what the chain could have read, never a value: the usual cause is a
    # variable set in another shell, or a profile that is not the one selected.
    seen = [name for name in AWS_CHAIN_VARIABLES if os.environ.get(name)]
    return ProviderAuthError(
        f"bedrock: {what} (AWS variables set for this process: {', '.join(seen) or 'none'}); "
        f"{AWS_NEXT_STEP}",
        provider="bedrock",
        details={"variable": "AWS_PROFILE", "example": "my-profile", "aws_variables": seen},
    )


def _sso_login_needed(profile: str | None) -> ProviderAuthError:
    """The SSO login behind the profile expired or never happened: botocore's own message
    says "the corresponding profile"; the operator needs the command for this one."""
    name = profile or "default"
    return ProviderAuthError(
        f"bedrock: the AWS SSO login of profile {name!r} has expired or was never made: "
        f"run `aws sso login --profile {name}`, then retry",
        provider="bedrock",
        details={"variable": "AWS_PROFILE", "profile": name, "aws_sso": True},
    )


class BedrockAdapter(Adapter):
    provider = "bedrock"
    stream_format = "eventstream"
    default_base_url = None
    #: messageStop carries the stopReason; only the metadata event (usage) follows it.
    stream_end: ClassVar[str] = "messageStop"
    shape: ClassVar[Any] = {
        "output": {
            "message": {
                "content": [
                    {
                        "text": TEXT,
                        "toolUse": {"toolUseId": TEXT, "name": TEXT, "input": (dict, NULL)},
                        "citationsContent": {"content": [{"text": TEXT}], "citations": list},
                    }
                ]
            }
        },
        "stopReason": TEXT,
        "usage": _USAGE,
        "trace": {"guardrail": dict},
    }
    chunk_shape: ClassVar[Any] = {
        "contentBlockIndex": COUNT,
        "start": {"toolUse": {"toolUseId": TEXT, "name": TEXT}},
        "delta": {"text": TEXT, "toolUse": {"input": TEXT}, "citation": dict},
        "stopReason": TEXT,
        "usage": _USAGE,
        "trace": {"guardrail": dict},
    }

    options: ClassVar[frozenset[str]] = CONVERSE_OPTIONS
    sampling_names: ClassVar[Mapping[str, str]] = {
        "temperature": "temperature",
        "top_p": "topP",
        "stop": "stopSequences",
    }

    def supported_options(self, model: str) -> frozenset[str]:
        """Converse's own fields for every model; ``reasoning_effort`` only where the
        family documents a field for it in additionalModelRequestFields (Anthropic's
        Claude with extended thinking)."""
        if model_family(model) == "anthropic" and takes_thinking(model):
            return CONVERSE_OPTIONS | {"reasoning_effort"}
        return CONVERSE_OPTIONS

    def refusals(self, spec: CallSpec) -> dict[str, str]:
        respond = _respond_tool(spec) if spec.response_schema is not None else None
        refused = thinking_refusals(spec, respond)
        choice, _ = choose_tool(spec, respond)
        if choice == "none" and any(
            m.get("role") == "tool" or m.get("tool_calls") for m in spec.messages
        ):
            refused["tool_choice"] = (
                "Converse's toolChoice has no 'none', and its tools may not be left out once "
                "a turn of the conversation used one"
            )
        return refused

    def __init__(self, config: ProviderConfig) -> None:
        super().__init__(config)
        region = config.region or "us-east-1"
        # Without a bearer token every request is signed: the extra must be there now,
        # not at the first call. With one, botocore is needed for streams only.
        self.signer: _Signer | None = None if config.api_key else _Signer(region)
        self.credential = self.signer
        if config.api_key:
            try:
                import botocore.eventstream  # noqa: F401
            except ImportError:
                raise not_installed() from None

    def request(self, spec: CallSpec, *, stream: bool) -> Request:
        base = (self.config.base_url or endpoint_for(self.config.region or "us-east-1")).rstrip("/")
        action = "converse-stream" if stream else "converse"
        # The bytes sent are the bytes signed on every transport: aiohttp (yarl) sends a
        # ":" for "%3A", and AWS signs the path as it arrives, so the characters yarl would
        # unquote stay unquoted here (a model id's ":", an ARN's); "/" and the rest are quoted.
        url = f"{base}/model/{quote(spec.model, safe=_PATH_SAFE)}/{action}"
        # An API key is a bearer token (key_header); without one, the request is signed once
        # built (the signer's ``auth``): the caller's headers and the merged body, as the
        # transport encodes it, are what is signed.
        headers = self.key_headers(
            {
                "content-type": "application/json",
                "accept": "application/vnd.amazon.eventstream" if stream else "application/json",
            }
        )
        set_headers(headers, spec.extra_headers)
        return Request("POST", url, headers, self.body(spec), self.credential)

    def body(self, spec: CallSpec) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": bedrock_messages(spec)}
        if spec.system:
            body["system"] = [{"text": spec.system}]
        max_tokens = spec.max_output_tokens
        more: dict[str, Any] = {}
        self.refuse(spec)  # what the call's checks let through: never sent as is
        if spec.reasoning_effort is not None:
            more, max_tokens = thinking_fields(spec.reasoning_effort, max_tokens, spec.model)
        inference: dict[str, Any] = {}
        if max_tokens is not None:
            inference["maxTokens"] = max_tokens
        inference.update(self.sampling(spec))
        if inference:
            body["inferenceConfig"] = inference
        tools = [
            {
                "toolSpec": {
                    "name": t.name,
                    "description": t.description or t.name,
                    "inputSchema": {"json": dict(t.parameters)},
                }
            }
            for t in spec.tools
        ]
        respond = _respond_tool(spec) if spec.response_schema is not None else None
        choice, offer_respond = choose_tool(spec, respond)
        if respond is not None and offer_respond:
            # Converse's portable structured output: a tool the model must call.
            tools.append(
                {
                    "toolSpec": {
                        "name": respond,
                        "description": "Return the final answer in exactly this shape.",
                        "inputSchema": {"json": dict(spec.response_schema or {})},
                    }
                }
            )
        if choice == "none":
            # No "none" in Converse: the tools are left out, which Bedrock allows only
            # while no turn of the conversation used one (refusals() says so before).
            tools, choice = [], None
        config: dict[str, Any] = {}
        if choice is not None:
            kinds: dict[str, dict[str, Any]] = {"auto": {"auto": {}}, "any": {"any": {}}}
            config["toolChoice"] = kinds.get(choice) or {"tool": {"name": choice}}
        if tools:
            body["toolConfig"] = {"tools": tools, **config}
        if more:
            body["additionalModelRequestFields"] = more
        merge_body(body, spec.extra)
        return body

    def parse(self, data: Any, spec: CallSpec) -> Parsed:
        details: dict[str, Any] = {}
        if data.get("stopReason") == GUARDRAIL:
            details["guardrail"] = _guardrail(data.get("trace"), spec)
        respond = _respond_tool(spec) if spec.response_schema is not None else None
        texts: list[str] = []
        calls: list[ToolCall] = []
        message = (data.get("output") or {}).get("message") or {}
        for block in message.get("content") or []:
            if "text" in block:
                texts.append(text_of(block.get("text")))
            elif "citationsContent" in block:
                # Answer text with the documents it cites: the text is the answer's.
                text, cited = _citations(block["citationsContent"])
                texts.append(text)
                if cited:
                    details.setdefault("citations", []).extend(cited)
            elif "toolUse" in block:
                use = block["toolUse"] or {}
                if use.get("type") == "server_tool_use":
                    continue  # Bedrock ran it (code interpreter ...): not the caller's call
                raw = use.get("input")
                arguments: dict[str, Any] = raw if isinstance(raw, dict) else {}
                if use.get("name") == respond:
                    texts = [json.dumps(arguments)]  # the structured answer is the text
                    respond = None
                    continue
                calls.append(
                    ToolCall(
                        id=str(use.get("toolUseId") or f"call_{len(calls)}"),
                        name=str(use.get("name") or ""),
                        arguments=arguments,
                    )
                )
            # reasoningContent is thinking, toolResult a server tool's result,
            # image/document are not answer text either.
        return Parsed(
            "".join(texts),
            calls,
            _usage(data.get("usage")),
            data.get("stopReason"),
            None,
            details,
        )

    def chunk_events(
        self, data: dict[str, Any], event: str, state: StreamState, spec: CallSpec
    ) -> list[StreamEvent]:
        blocks = state.block_kinds
        events: list[StreamEvent] = []
        if event == "contentBlockStart":
            index = int(data.get("contentBlockIndex") or 0)
            use = (data.get("start") or {}).get("toolUse")
            if isinstance(use, dict):
                if use.get("type") == "server_tool_use":
                    blocks[index] = "provider"
                elif spec.response_schema is not None and use.get("name") == _respond_tool(spec):
                    blocks[index] = "respond"
                else:
                    blocks[index] = "tool"
                    events.append(
                        state.add_call(index, id=use.get("toolUseId"), name=use.get("name"))
                    )
            else:
                blocks[index] = "provider"  # a server tool's result, an image ...
        elif event == "contentBlockDelta":
            index = int(data.get("contentBlockIndex") or 0)
            delta = data.get("delta") or {}
            owner = blocks.get(index, "text")
            if "text" in delta and owner == "text":
                added = state.add_text(text_of(delta.get("text")))
                if added:
                    events.append(added)
            elif isinstance(delta.get("toolUse"), dict):
                fragment = text_of(delta["toolUse"].get("input"))
                if owner == "respond":
                    added = state.add_text(fragment)
                    if added:
                        events.append(added)
                elif owner == "tool":
                    events.append(state.add_call(index, arguments_delta=fragment))
            elif isinstance(delta.get("citation"), dict):
                state.details.setdefault("citations", []).append(delta["citation"])
            # reasoningContent deltas are thinking: never answer text.
        elif event == "messageStop":
            state.finish_reason = data.get("stopReason") or state.finish_reason
            # A guardrail's stop is read with its trace, in the metadata event after it:
            # until then the stream is not over.
            state.done = state.finish_reason != GUARDRAIL
        elif event == "metadata":
            state.usage = _usage(data.get("usage"))
            if state.finish_reason == GUARDRAIL:
                state.details["guardrail"] = _guardrail(data.get("trace"), spec)
                state.done = True
        return events

    def parse_chunk(
        self, data: Any, event: str, state: StreamState, spec: CallSpec
    ) -> list[StreamEvent]:
        if event == "exception":
            raise _stream_exception(data, spec)
        return super().parse_chunk(data, event, state, spec)


#: The HTTP status each ConverseStream exception stands for (the API reference's errors).
_STREAM_STATUS: Final = {
    "ThrottlingException": 429,
    "ServiceUnavailableException": 503,
    "InternalServerException": 500,
    "ModelStreamErrorException": 424,
    "ValidationException": 400,
    "ModelTimeoutException": 408,
}
# What an exception frame's error names as its URL: the stream's endpoint, without the
# region or model (the frame does not carry the request).
_STREAM_URL: Final = "https://bedrock-runtime.amazonaws.com/converse-stream"


def _stream_exception(data: Any, spec: CallSpec) -> ProviderError:
    """An exception frame, classified as the error answer its type stands for."""
    from fluid_build.copilot.agents.error_classification import ErrorAnswer, classify_answer

    kind = str(data.get("__type") or "") if isinstance(data, dict) else ""
    answer = ErrorAnswer.of_json(
        _STREAM_STATUS.get(kind, 500),
        data,
        {"x-amzn-errortype": kind},
        provider="bedrock",
        model=spec.model,
        url=_STREAM_URL,
    )
    return classify_answer(answer)

"""Each library's faults are named as httpx names them at one boundary (call/transport/faults.py).

httpx's own transport maps httpcore's exceptions in one context manager
(``map_httpcore_exceptions``); fluid's pools do the same for httpcore and for
aiohttp, and no other module of the transport package catches a library's
exception to rename it. The end-to-end proof, the same typed error on every
transport, is tests/test_conformance.py; here each boundary's table.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import aiohttp
import httpcore
import httpx
import pytest

from fluid_build.copilot.call.transport.faults import (
    map_aiohttp_exceptions,
    map_httpcore_exceptions,
)

PACKAGE = Path(__file__).resolve().parents[1] / "src/fluid_build/copilot/call/transport"
REQUEST = httpx.Request("POST", "https://api.example.test/v1/chat", headers={"x-api-key": "k"})


def _key() -> aiohttp.client_reqrep.ConnectionKey:
    return aiohttp.client_reqrep.ConnectionKey("h", 443, True, True, None, None, None)


@pytest.mark.parametrize(
    ("raised", "named"),
    [
        (httpcore.ConnectTimeout("c"), httpx.ConnectTimeout),
        (httpcore.ReadTimeout("r"), httpx.ReadTimeout),
        (httpcore.WriteTimeout("w"), httpx.WriteTimeout),
        (httpcore.PoolTimeout("p"), httpx.PoolTimeout),
        (httpcore.ConnectError("c"), httpx.ConnectError),
        (httpcore.ReadError("r"), httpx.ReadError),
        (httpcore.WriteError("w"), httpx.WriteError),
        (httpcore.ProxyError("p"), httpx.ProxyError),
        (httpcore.UnsupportedProtocol("u"), httpx.UnsupportedProtocol),
        (httpcore.LocalProtocolError("l"), httpx.LocalProtocolError),
        (httpcore.RemoteProtocolError("r"), httpx.RemoteProtocolError),
    ],
)
def test_httpcore_faults_are_named_as_httpx_and_chained(
    raised: Exception, named: type[httpx.TransportError]
) -> None:
    with pytest.raises(httpx.TransportError) as caught, map_httpcore_exceptions():
        raise raised
    assert type(caught.value) is named
    assert str(caught.value) == str(raised)
    assert caught.value.__cause__ is raised


@pytest.mark.parametrize(
    ("raised", "named"),
    [
        (aiohttp.ClientConnectorError(_key(), OSError(111, "refused")), httpx.ConnectError),
        (aiohttp.ClientProxyConnectionError(_key(), OSError(111, "refused")), httpx.ProxyError),
        (aiohttp.ConnectionTimeoutError(), httpx.ConnectTimeout),
        (aiohttp.SocketTimeoutError(), httpx.ReadTimeout),
        (aiohttp.ServerTimeoutError(), httpx.ReadTimeout),
        (aiohttp.InvalidURL("gopher://x"), httpx.UnsupportedProtocol),
        (aiohttp.ServerDisconnectedError(), httpx.RemoteProtocolError),
        (aiohttp.ClientPayloadError("cut"), httpx.RemoteProtocolError),
        (aiohttp.ClientOSError(104, "reset"), httpx.ReadError),
    ],
)
def test_aiohttp_faults_are_named_as_httpx_naming_the_request_never_chained(
    raised: Exception, named: type[httpx.TransportError]
) -> None:
    with pytest.raises(httpx.TransportError) as caught, map_aiohttp_exceptions(REQUEST):
        raise raised
    error = caught.value
    assert type(error) is named
    assert str(error).startswith(f"{type(raised).__name__}: ")
    assert error.request is REQUEST
    # aiohttp's error (its request_info holds the headers) is left behind, not chained
    assert error.__cause__ is None
    assert error.__suppress_context__


@pytest.mark.parametrize(
    "boundary", [map_httpcore_exceptions, lambda: map_aiohttp_exceptions(REQUEST)]
)
@pytest.mark.parametrize(
    "raised", [ValueError("not the library's"), asyncio.CancelledError(), GeneratorExit()]
)
def test_what_is_not_the_librarys_goes_through_as_it_was(
    boundary: object, raised: BaseException
) -> None:
    with pytest.raises(type(raised)) as caught, boundary():  # type: ignore[operator]
        raise raised
    assert caught.value is raised


def test_a_boundary_without_a_fault_changes_nothing() -> None:
    with map_httpcore_exceptions():
        pass
    with map_aiohttp_exceptions(REQUEST) as entered:
        assert entered is None


#: The libraries whose exceptions only faults.py may name.
LIBRARIES = ("httpcore", "aiohttp")
#: A broad handler outside faults.py that does not re-raise what it caught, and why.
OTHER_BOUNDARIES = {
    # a pool the environment cannot make: httpx's ValueError/ImportError/OSError, typed
    ("config.py", "made_from_env"),
}


def _names_a_library(node: ast.expr | None) -> bool:
    return node is not None and any(
        isinstance(inner, ast.Attribute)
        and isinstance(inner.value, ast.Name)
        and inner.value.id in LIBRARIES
        for inner in ast.walk(node)
    )


def _renamings(tree: ast.AST) -> list[tuple[str, int]]:
    """Each place that catches a library's fault to rename it: an ``except`` or an
    ``isinstance`` naming an httpcore or aiohttp exception, or a handler of every
    ``Exception`` that does not end by raising what it caught. Each with the function
    it is in (``""`` at module level) and its line."""
    found = []
    functions = [
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler):
            broad = node.type is None or (
                isinstance(node.type, ast.Name) and node.type.id in {"Exception", "BaseException"}
            )
            last = node.body[-1]
            passed_on = isinstance(last, ast.Raise) and last.exc is None
            renames = _names_a_library(node.type) or (broad and not passed_on)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            renames = node.func.id == "isinstance" and _names_a_library(node.args[-1])
        else:
            continue
        if renames:
            inside = [f for f in functions if f.lineno <= node.lineno <= (f.end_lineno or 0)]
            name = max(inside, key=lambda f: f.lineno).name if inside else ""
            found.append((name, node.lineno))
    return found


def test_faults_are_renamed_at_the_faults_modules_boundaries_only() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert {path.name for path in modules} >= {"faults.py", "sync.py", "aio.py"}
    elsewhere = [
        f"{path.name}:{line} in {name}()"
        for path in modules
        if path.name != "faults.py"
        for name, line in _renamings(ast.parse(path.read_text(encoding="utf-8")))
        if (path.name, name) not in OTHER_BOUNDARIES
    ]
    assert elsewhere == []


def test_the_renaming_finder_finds_each_kind() -> None:
    source = """
def mapped():
    try:
        pass
    except httpcore.ReadError:
        pass
    if isinstance(exc, aiohttp.ClientError | OSError):
        pass
    try:
        pass
    except Exception as exc:
        raise_named(exc)


def passed_on():
    if isinstance(exc, ValueError):
        pass
    try:
        pass
    except BaseException:
        release()
        raise
"""
    assert _renamings(ast.parse(source)) == [("mapped", 5), ("mapped", 7), ("mapped", 11)]

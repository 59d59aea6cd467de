"""The transport conformance suite: one scenario list, run on every transport (issue 21).

Each scenario (tests/hostile.py ``SCENARIOS``) is one way a server, a proxy, a
certificate or the caller's own code can behave; every transport must give
the same outcome for it: the same code and retryable flag, the same number
of requests sent, within the deadline plus 1.5 s, with RSS growth under
256 MB, and with the API key nowhere in the error, anything chained to it,
or the log records written at DEBUG.

The transports: ``sync-direct`` (fluid's own sync pool), ``async-httpx`` and
``async-aiohttp`` (``FLUID_LLM_TRANSPORT``), ``caller-sync`` and
``caller-async`` (a caller's own ``httpx.Client`` / ``httpx.AsyncClient``),
and for the redirect scenarios the caller's pools with
``follow_redirects=True``. One transport: ``pytest tests/test_conformance.py
-k async-aiohttp``; one scenario on all: ``-k drip-head``.
``python benchmarks/conformance_table.py`` prints the whole matrix.
"""

from __future__ import annotations

import gc
import logging

import pytest

from tests import hostile

CASES = [
    pytest.param(scenario, transport, id=f"{scenario.name}-{transport}")
    for scenario, transport in hostile.cases()
]


@pytest.mark.parametrize(("scenario", "transport"), CASES)
def test_every_transport_keeps_the_contract(
    scenario: hostile.Scenario, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="fluid_build")
    result: hostile.Outcome | None = None
    try:
        result = hostile.run(scenario, transport)
        logs = [caplog.text, *(repr(record.args) for record in caplog.records)]
        found = hostile.problems(scenario, result, logs)
        summary = (
            f"{scenario.name} ({scenario.about}) on {transport}: "
            f"{result.code}, retryable={result.retryable}, requests={result.requests}, "
            f"{result.elapsed:.2f} s, RSS +{result.rss_mb:.0f} MB\n  - " + "\n  - ".join(found)
        )
    finally:
        # Nothing of the call outlives the test (pytest keeps a failed test's traceback),
        # so a pool left open warns when collected here, in the scenario that left it.
        result = None
        caplog.clear()
        gc.collect()
    if found:
        pytest.fail(summary, pytrace=False)


# -- the scan itself: it must find what it is for ----------------------------------------


def test_the_secret_scan_finds_a_key_in_a_chained_requests_headers() -> None:
    import httpx

    request = httpx.Request("POST", "http://x.invalid/", headers={"x-api-key": hostile.KEY})
    try:
        try:
            raise httpx.ReadError("cut", request=request)
        except httpx.ReadError as exc:
            raise RuntimeError("a wrapper that says nothing") from exc
    except RuntimeError as error:
        leaks = hostile.secret_leaks(error)
    assert any(".request" in where or "._request" in where for where in leaks), leaks
    assert hostile.secret_leaks(RuntimeError("nothing here")) == []
    assert hostile.secret_leaks(None, [f"DEBUG sent Bearer {hostile.KEY}"])


def test_the_secret_scan_finds_a_key_in_aiohttps_request_info() -> None:
    import aiohttp
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    headers = CIMultiDictProxy(CIMultiDict({"Authorization": f"Bearer {hostile.KEY}"}))
    info = aiohttp.RequestInfo(URL("http://x.invalid/"), "POST", headers, URL("http://x.invalid/"))
    error = aiohttp.ClientResponseError(info, (), status=400, message="bad status line")
    outer = ValueError("wrapped")
    outer.__cause__ = error
    assert hostile.secret_leaks(outer)

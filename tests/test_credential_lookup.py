"""One credential lookup at a time, shared by every call waiting for it (issue 32 items 9, 10).

The lookups themselves (botocore's chain, google-auth's refresh) are exercised against
loopback servers in tests/test_bedrock.py and tests/test_vertex.py; here, what the
waiting is: shared, never cancelled by a waiter that gives up, each waiter raising its
own copy of the error, a finished lookup never reused.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from fluid_build.copilot.agents.errors import ProviderAuthError
from fluid_build.copilot.llm.credentials import Lookup, await_, wait


def _gated(calls: list[int], gate: threading.Event, result: object = "token") -> object:
    def fn() -> object:
        calls.append(1)
        assert gate.wait(10), "the test never opened the gate"
        if isinstance(result, BaseException):
            raise result
        return result

    return fn


def test_waiters_share_one_lookup_and_a_finished_one_is_never_reused() -> None:
    calls: list[int] = []
    gate = threading.Event()
    lookup = Lookup("test")
    fn = _gated(calls, gate)
    first = lookup.start(fn)
    assert lookup.start(fn) is first  # in flight: joined, not started again
    gate.set()
    assert wait(first, 10) == (True, "token")
    assert calls == [1]
    again = lookup.start(fn)
    assert again is not first
    assert wait(again, 10) == (True, "token")
    assert calls == [1, 1]


def test_a_waiter_past_its_deadline_gets_false_and_the_lookup_runs_on() -> None:
    calls: list[int] = []
    gate = threading.Event()
    lookup = Lookup("test")
    future = lookup.start(_gated(calls, gate))
    assert wait(future, 0.0) == (False, None)

    async def give_up() -> tuple[bool, object]:
        return await await_(future, 0.0)

    assert asyncio.run(give_up()) == (False, None)
    assert not future.cancelled()  # the async waiter's giving up cancelled nothing shared
    gate.set()
    assert wait(future, 10) == (True, "token")


def test_each_waiter_raises_its_own_copy_of_the_lookups_error() -> None:
    gate = threading.Event()
    gate.set()
    error = ProviderAuthError("no credentials", provider="bedrock")
    future = Lookup("test").start(_gated([], gate, error))
    raised = []
    for _ in range(2):
        with pytest.raises(ProviderAuthError) as caught:
            wait(future, 10)
        raised.append(caught.value)

    async def one() -> None:
        await await_(future, 10)

    with pytest.raises(ProviderAuthError) as caught:
        asyncio.run(one())
    raised.append(caught.value)
    assert len({id(e) for e in raised}) == 3
    assert all(e is not error for e in raised)
    assert all(e.code == error.code and str(e) == str(error) for e in raised)

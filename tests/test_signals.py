"""Ctrl-C reaches the main thread, whichever thread the kernel hands SIGINT to.

The kernel gives a process's SIGINT to any of its threads that does not block
it. Python runs the handler in the main thread, but only when that thread runs
again: one blocked in a single long wait for another thread would sit out the
whole wait. Each scenario runs in a fresh interpreter (its main thread and its
handlers are its own) and sends SIGINT to a bystander thread with
``signal.pthread_kill``, which is what the kernel may do on its own under load.
A control checks the scenario can fail: the plain library wait sleeps through it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# The bystander: a thread of the process, blocked, that does not block SIGINT (rich's
# refresh thread, a worker in a socket read). The kicker sends it SIGINT once everything
# waits. The script prints how the main thread's wait ended and after how long.
# Each script first puts Python's own handler back: a runner started as a background job
# hands its children SIGINT ignored.
PRELUDE = """
import concurrent.futures, json, signal, sys, threading, time
from fluid_build import _threads
signal.signal(signal.SIGINT, signal.default_int_handler)

bystander_ready = threading.Event()
never = threading.Event()

def bystander():
    bystander_ready.set()
    never.wait()

victim = threading.Thread(target=bystander, daemon=True)
victim.start()
bystander_ready.wait()

def kick():
    time.sleep(0.3)  # noqa: real-sleep - till the main thread waits (a wait of 60 s)
    signal.pthread_kill(victim.ident, signal.SIGINT)

threading.Thread(target=kick, daemon=True).start()

def later(seconds, fn):  # a daemon timer: the process never waits for it at exit
    timer = threading.Timer(seconds, fn)
    timer.daemon = True
    timer.start()

started = time.monotonic()
try:
    {wait}
    how = "returned"
except KeyboardInterrupt:
    how = "interrupted"
print(json.dumps({{"how": how, "seconds": time.monotonic() - started}}))
"""

WAITS = {
    "wait_done": "_threads.wait_done(concurrent.futures.Future(), {seconds})",
    "hold": (
        "lock = threading.Lock(); lock.acquire(); "
        "later({seconds}, lock.release); _threads.hold(lock)"
    ),
    "as_completed": (
        "f = concurrent.futures.Future(); "
        "later({seconds}, lambda: f.set_result(1)); "
        "list(_threads.as_completed([f]))"
    ),
    # The control: what fluid waited with before, and what it must not go back to.
    "plain": "concurrent.futures.wait([concurrent.futures.Future()], timeout={seconds})",
}


def _run(wait: str, seconds: float) -> dict[str, object]:
    script = PRELUDE.format(wait=WAITS[wait].format(seconds=seconds))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("wait", ["wait_done", "hold", "as_completed"])
def test_a_wait_in_the_main_thread_takes_a_sigint_another_thread_was_given(wait: str) -> None:
    result = _run(wait, seconds=60)
    assert result["how"] == "interrupted"
    # Raised within a wake-up (0.1 s) of the kick, not at the end of the 60 s wait.
    assert float(str(result["seconds"])) < 30


def test_the_control_a_plain_wait_sleeps_through_it() -> None:
    # Without the wake-ups the same scenario waits the whole wait, then takes the
    # signal: so the scenarios above would catch a plain wait coming back.
    result = _run("plain", seconds=1.5)
    assert result["how"] == "interrupted"
    assert float(str(result["seconds"])) >= 1.5


MASK = """
import json, signal, threading
from fluid_build._threads import signals_stay_with_main
signal.signal(signal.SIGINT, signal.default_int_handler)

seen = {}
def look():
    seen["blocked"] = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))

with signals_stay_with_main():
    thread = threading.Thread(target=look)
    thread.start()
thread.join()
after = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
try:
    with signals_stay_with_main():
        signal.raise_signal(signal.SIGINT)  # held while blocked, not lost
        held = True
    late = False
except KeyboardInterrupt:
    late = held
print(json.dumps({"thread": seen["blocked"], "main_after": after, "delivered_at_exit": late}))
"""


@pytest.mark.skipif(not hasattr(__import__("signal"), "pthread_sigmask"), reason="POSIX only")
def test_threads_started_inside_block_sigint_for_life_and_main_gets_it_back() -> None:
    import signal

    done = subprocess.run([sys.executable, "-c", MASK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {int(signal.SIGINT), int(signal.SIGTERM)} <= set(result["thread"])
    assert int(signal.SIGINT) not in result["main_after"]
    assert result["delivered_at_exit"] is True


MAP = """
import json, os, signal, socket, threading, time
from fluid_build.copilot import LLMClient
signal.signal(signal.SIGINT, signal.default_int_handler)

# A model that takes the connection and never answers: the calls wait out their deadline.
server = socket.create_server(("127.0.0.1", 0))
held, arrived = [], threading.Semaphore(0)
def accept():
    while True:
        held.append(server.accept()[0])
        arrived.release()
threading.Thread(target=accept, daemon=True).start()
url = f"http://127.0.0.1:{server.getsockname()[1]}/v1"
client = LLMClient("openai", "gpt-4o-mini", api_key="sk-test-0123456789", base_url=url, env={},
                   timeout=60)

def kick():
    arrived.acquire()
    arrived.acquire()  # both calls are in flight
    worker = next(t for t in threading.enumerate() if t.name.startswith("fluid-map"))
    signal.pthread_kill(worker.ident, signal.SIGINT)

threading.Thread(target=kick, daemon=True).start()
started = time.monotonic()
try:
    client.map([[{"role": "user", "content": "hi"}]] * 2, concurrency=2)
    how = "returned"
except KeyboardInterrupt:
    how = "interrupted"
print(json.dumps({"how": how, "seconds": time.monotonic() - started}), flush=True)
os._exit(0)  # map's calls in flight end at their deadline (docs/batch.md): not waited for
"""


def test_map_takes_a_sigint_one_of_its_workers_was_given() -> None:
    done = subprocess.run(
        [sys.executable, "-c", MAP],
        capture_output=True,
        text=True,
        timeout=40,
        env={**os.environ, "NO_PROXY": "127.0.0.1"},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["how"] == "interrupted"
    assert result["seconds"] < 30  # the calls' deadline is 60 s

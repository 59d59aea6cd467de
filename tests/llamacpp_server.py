"""A real llama.cpp server for the tests, and a tiny model made on the spot.

* :func:`write_tiny_model` writes a random-weight llama GGUF with ``gguf``
  and ``numpy``: 2 layers, 64 wide, a 260-token byte-level BPE vocabulary
  (every byte is a token, so any text tokenizes), about 470 KB. Its output is gibberish;
  everything around it (HTTP, chat template, grammar, context checks, keys)
  is the real server's.
* :func:`llamacpp_server` starts xllamacpp's prebuilt llama.cpp server in a
  subprocess on 127.0.0.1 and a free port, waits for it (bounded), yields a
  :class:`LlamaServer` and stops it. A subprocess, not in-process: the native
  server has no stop call, and a crash in it must not take pytest down.
* :class:`CountingProxy` sits in front of a server on another loopback port:
  it records every request and can answer some itself (llama.cpp's "Loading
  model" 503, or a 404 that hides ``/props`` and ``/v1/models``).

Run as a script (what :func:`llamacpp_server` does), it serves until its
standard input closes, so it never outlives the test run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

#: The API-key variable the script reads (never a command-line argument).
KEY_VARIABLE = "LLAMACPP_TEST_API_KEY"
#: llama.cpp's answer while a model loads (tools/server/server.cpp, verbatim).
LOADING_BODY = b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte (its ``bytes_to_unicode``), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in symbols)
    for n, b in enumerate(extra):
        symbols[b] = chr(256 + n)
    return [symbols[b] for b in range(256)]


def write_tiny_model(path: Path, *, seed: int = 0, n_ctx_train: int = 4096) -> Path:
    """A random-weight llama model in GGUF, under 1 MB, that llama.cpp loads."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    n_embd, n_head, n_ff, n_layer = 64, 4, 128, 2
    # A byte-level BPE vocabulary (GPT-2's scheme): every byte is a token, so any
    # text tokenizes and the JSON-schema grammar (llguidance) can spell anything;
    # one merge, because llama.cpp wants merges; ChatML's markers as control tokens.
    tokens = [*_byte_symbols(), "\u0120\u0120", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [gguf.TokenType.NORMAL] * 257 + [gguf.TokenType.CONTROL] * 3
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("fluid-tiny-random")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["\u0120 \u0120"])
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)

    def weights(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    # Every embedding leans along one direction, and the output layer turns that
    # direction into +10 for printable ASCII and -10 for everything else: the
    # gibberish is printable text (valid UTF-8 wherever an answer is cut), and
    # EOS is never chosen, so answers run to their token limit.
    lean = rng.standard_normal(n_embd).astype(np.float32)
    lean /= np.linalg.norm(lean)
    embeddings = 0.02 * rng.standard_normal((len(tokens), n_embd)).astype(np.float32)
    embeddings += lean
    printable = np.array([0x20 <= b < 0x7F for b in range(256)] + [False] * 4)
    side = np.where(printable, 1.0, -1.0).astype(np.float32)[:, None]
    output = 0.02 * rng.standard_normal((len(tokens), n_embd)).astype(np.float32)
    output += side * lean * (10.0 / np.sqrt(n_embd))
    ones = np.ones(n_embd, dtype=np.float32)
    writer.add_tensor("token_embd.weight", embeddings)
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", output)
    for block in range(n_layer):
        writer.add_tensor(f"blk.{block}.attn_norm.weight", ones)
        for part in ("q", "k", "v", "output"):
            weights(f"blk.{block}.attn_{part}.weight", n_embd, n_embd)
        writer.add_tensor(f"blk.{block}.ffn_norm.weight", ones)
        weights(f"blk.{block}.ffn_gate.weight", n_ff, n_embd)
        weights(f"blk.{block}.ffn_up.weight", n_ff, n_embd)
        weights(f"blk.{block}.ffn_down.weight", n_embd, n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# -- the server ---------------------------------------------------------------------------


@dataclass
class LlamaServer:
    """A running server: its address (``url`` + ``/v1`` is the OpenAI base URL)."""

    url: str
    n_ctx: int
    log: Path
    api_key: str | None = None
    started_in: float = 0.0  # seconds from spawning the process to a healthy server

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


def _read_line(process: subprocess.Popen[bytes], deadline: float) -> bytes:
    """The child's first line on stdout, waiting at most until ``deadline``."""
    assert process.stdout is not None
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or process.poll() is not None:
            break
        ready, _, _ = select.select([process.stdout], [], [], left)
        if not ready:
            break
        chunk = os.read(process.stdout.fileno(), 4096)
        if not chunk:
            break
        line += chunk
    return line


@contextmanager
def llamacpp_server(
    model: Path,
    workdir: Path,
    *,
    n_ctx: int = 256,
    api_key: str | None = None,
    n_predict: int = -1,
    startup_timeout: float = 60.0,
) -> Iterator[LlamaServer]:
    """Start llama.cpp's server on ``model`` in a subprocess; yield it; stop it."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "llamacpp-server.log"
    env = {k: v for k, v in os.environ.items() if k != KEY_VARIABLE}
    if api_key is not None:
        env[KEY_VARIABLE] = api_key
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        str(model),
        "--n-ctx",
        str(n_ctx),
        "--n-predict",
        str(n_predict),
    ]
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sink, env=env
        )
    try:
        deadline = started + startup_timeout
        line = _read_line(process, deadline).decode(errors="replace").strip()
        if not line.startswith("listening "):
            raise RuntimeError(
                f"llama.cpp server did not start (exit {process.poll()}, said {line!r}); "
                f"its log: {log.read_text(errors='replace')[-2000:]}"
            )
        url = line.split(" ", 1)[1]
        _wait_healthy(url, deadline)
        yield LlamaServer(url, n_ctx, log, api_key, time.monotonic() - started)
    finally:
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()  # the script's signal to stop
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def _wait_healthy(url: str, deadline: float) -> None:
    """Poll ``/health`` (public even with a key) until it says ok, or fail at ``deadline``."""
    with httpx.Client(timeout=2.0) as client:
        while True:
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama.cpp server at {url} never became healthy")
            time.sleep(0.02)  # noqa: real-sleep - waiting for a real server to start


def main(argv: list[str] | None = None) -> int:
    """Serve ``model`` with llama.cpp on 127.0.0.1 until standard input closes."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model")
    parser.add_argument("--n-ctx", type=int, default=256)
    parser.add_argument("--n-predict", type=int, default=-1)
    args = parser.parse_args(argv)

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = ["127.0.0.1"]
    params.port = 0  # the server picks a free port and says which
    params.n_ctx = args.n_ctx
    params.n_predict = args.n_predict
    params.n_parallel = 1
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    params.sampling.seed = 1234  # the same gibberish every run
    params.warmup = False
    key = os.environ.get(KEY_VARIABLE)
    if key:
        params.api_keys = [key]
    server = xllamacpp.Server(params)
    print(f"listening {server.listening_address}", flush=True)
    sys.stdin.buffer.read()  # until the parent closes it (or dies)
    # The native server has no stop call: leave without running its destructors.
    sys.stdout.flush()
    os._exit(0)


# -- a counting proxy -----------------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    status: int
    authorization: str | None
    body: bytes = b""


@dataclass
class Script:
    """What the proxy answers itself instead of forwarding."""

    loading: int = 0  # this many POSTs get llama.cpp's "Loading model" 503
    hidden: frozenset[str] = frozenset()  # paths answered 404
    seen: list[Seen] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        script = self.server.script
        path = self.path.split("?", 1)[0]
        with self.server.lock:
            loading = self.command == "POST" and script.loading > 0
            if loading:
                script.loading -= 1
        if loading:
            status, headers, content = 503, {"content-type": "application/json"}, LOADING_BODY
        elif path in script.hidden:
            status, headers, content = 404, {"content-type": "text/plain"}, b"File Not Found"
        else:
            status, headers, content = self.server.forward(self.command, self.path, self, body)
        with self.server.lock:
            authorization = self.headers.get("authorization")
            script.seen.append(Seen(self.command, path, status, authorization, body))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, script: Script) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script
        self.lock = threading.Lock()
        self.client = httpx.Client(base_url=upstream, timeout=60.0)

    def forward(
        self, method: str, path: str, handler: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        keep = ("authorization", "content-type", "accept")
        headers = {k: v for k, v in handler.headers.items() if k.lower() in keep}
        answer = self.client.request(method, path, headers=headers, content=body)
        kept = {"content-type": answer.headers.get("content-type", "application/json")}
        return answer.status_code, kept, answer.content


class CountingProxy:
    """A loopback HTTP proxy in front of ``upstream`` that records what it is asked."""

    def __init__(self, upstream: str, script: Script) -> None:
        self._server = _ProxyServer(upstream, script)
        self.script = script
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def requests(self, method: str | None = None) -> list[str]:
        """``"POST /v1/chat/completions -> 200"`` for each request seen, oldest first."""
        return [
            f"{s.method} {s.path} -> {s.status}"
            for s in self.script.seen
            if method is None or s.method == method
        ]

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._server.client.close()
        self._thread.join(timeout=5)


@contextmanager
def counting_proxy(
    upstream: str, *, loading: int = 0, hidden: frozenset[str] = frozenset()
) -> Iterator[CountingProxy]:
    with CountingProxy(upstream, Script(loading=loading, hidden=hidden)) as proxy:
        yield proxy


if __name__ == "__main__":
    sys.exit(main())

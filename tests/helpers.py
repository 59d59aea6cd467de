"""Small builders shared by the tests."""

from __future__ import annotations

import json
from typing import Any

import httpx

SECRET_KEY = "sk-proj-Zq8vT3xW9kLmN4pR7sY2aB6cD1eF5gH0"
OPENAI_URL = "https://api.openai.com/v1/chat/completions"


def request(url: str = OPENAI_URL, *, key: str = SECRET_KEY) -> httpx.Request:
    return httpx.Request("POST", url, headers={"Authorization": f"Bearer {key}"}, json={"x": 1})


def status_error(
    status: int,
    body: Any = None,
    *,
    body_text: str | bytes | None = None,
    headers: dict[str, str] | None = None,
    req: httpx.Request | None = None,
) -> httpx.HTTPStatusError:
    req = req or request()
    if body_text is not None:
        content = body_text.encode() if isinstance(body_text, str) else body_text
    elif body is not None:
        content = json.dumps(body).encode()
    else:
        content = b""
    response = httpx.Response(status, content=content, headers=headers or {}, request=req)
    return httpx.HTTPStatusError(f"HTTP {status}", request=req, response=response)

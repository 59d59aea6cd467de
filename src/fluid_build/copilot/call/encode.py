"""The one JSON encoder of a request's body, for every transport.

Every request a call sends is encoded here, once, whichever pool carries
it: a pool of ours (call/transport/direct.py, ``fluid_json_request``) and a
caller's own ``httpx`` pool (call/prepare.py ``http_request``, which hands
the bytes over as ``content=``). A credential step that covers the body
(Bedrock's SigV4, llm/bedrock.py) then reads the bytes from the built
request: what it signs is what is sent, whatever this encoder makes, so a
change here can never turn calls into 403s. The bytes are the ones httpx
0.28 makes for ``json=``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ENCODER", "json_body"]

#: httpx 0.28's ``json=`` encoding. One encoder kept: ``json.dumps`` with arguments makes a
#: new one each call. Read at each call, so a test may swap it.
ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def json_body(payload: Any) -> bytes:
    """``payload`` as the request body sent."""
    return ENCODER.encode(payload).encode()

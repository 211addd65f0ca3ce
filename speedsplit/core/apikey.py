"""An API key for the servers a session launches (benchmark.api_key).

Servers listen on loopback only, but any user of the host can reach a loopback port: with a
key, a request that does not carry it is refused (HTTP 401) by every engine that has a key
option, and the load of another user cannot land in a measurement. The key is drawn per
session, handed to the server through its environment (never its command line, which `ps`
shows), kept in the session's launch file (mode 0600) and sent by every client of the
session; no log, state file or result holds it, only whether the server asked for it.
"""

from __future__ import annotations

import secrets


def new() -> str:
    return "sk-speedsplit-" + secrets.token_urlsafe(24)


def headers(key: str | None) -> dict[str, str]:
    """What a request carries to a server that asks for `key` (nothing where none is set)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


# The variable through which speedsplit's own servers (the reference server, hf_generate) get
# their key, as vLLM's get it through VLLM_API_KEY and llama.cpp's through LLAMA_API_KEY.
ENV = "SPEEDSPLIT_API_KEY"


def middlewares(key: str | None) -> list:
    """aiohttp middlewares that refuse every /v1/ request without `key` (HTTP 401), as vLLM
    does: /health and /metrics stay open. None: no key, nothing refused."""
    if not key:
        return []
    from aiohttp import web

    expected = headers(key)["Authorization"]

    @web.middleware
    async def require_key(request, handler):
        if request.path.startswith("/v1/") and request.headers.get("Authorization") != expected:
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return [require_key]

"""core/apikey.py: a session's key is fresh and fits a header and an environment variable; a
client sends it as a bearer token; speedsplit's own servers refuse /v1/ without it."""

import asyncio
import re

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from speedsplit.core import apikey


def test_a_key_is_drawn_fresh_each_time_and_fits_a_header_and_an_environment_variable():
    keys = [apikey.new() for _ in range(200)]
    assert len(set(keys)) == len(keys)
    # 24 random bytes in URL-safe base64: 32 characters, no padding, no space, no quote
    assert all(re.fullmatch(r"sk-speedsplit-[A-Za-z0-9_-]{32}", key) for key in keys)


def test_a_request_carries_the_key_as_a_bearer_token_and_nothing_without_one():
    assert apikey.headers("sk-speedsplit-abc") == {"Authorization": "Bearer sk-speedsplit-abc"}
    assert apikey.headers(None) == {}
    assert apikey.headers("") == {}


def test_without_a_key_a_server_gets_no_middleware_and_refuses_nothing():
    assert apikey.middlewares(None) == []
    assert apikey.middlewares("") == []


def test_with_a_key_only_a_v1_request_that_carries_it_is_served_and_health_and_metrics_stay_open():
    """The middleware on a real aiohttp server on loopback, as the reference server and
    hf_generate mount it."""
    key = apikey.new()

    async def ok(request):
        return web.json_response({"path": request.path})

    app = web.Application(middlewares=apikey.middlewares(key))
    for path in ("/v1/models", "/health", "/metrics"):
        app.router.add_get(path, ok)

    async def status(client, server, path, headers):
        async with client.get(server.make_url(path), headers=headers) as resp:
            return resp.status, await resp.json()

    async def main():
        async with TestServer(app, host="127.0.0.1") as server, ClientSession() as client:
            refused = (401, {"error": "Unauthorized"})
            assert await status(client, server, "/v1/models", {}) == refused
            assert await status(client, server, "/v1/models", apikey.headers(apikey.new())) == refused  # another key
            assert await status(client, server, "/v1/models", {"Authorization": key}) == refused  # not as a bearer
            assert await status(client, server, "/v1/models", apikey.headers(key)) == (200, {"path": "/v1/models"})
            for path in ("/health", "/metrics"):
                assert await status(client, server, path, {}) == (200, {"path": path})

    asyncio.run(main())

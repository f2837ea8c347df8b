"""An APNs-style ASGI app for hypercorn (tests/it/h2_goaway.rs): POST /3/device/<token>
answers 200, or 410 Unregistered for tokens ending in "gone"; GET /stats reports how
many requests arrived, how many repeated a token already seen (and which tokens), and
how many repeated a token already answered 410. Run with hypercorn's default
keep_alive_max_requests (1,000): it closes each connection after that many requests.

A request counts once its whole body arrived (the app then acts on it, as a provider
would); one whose client went away before that is not processed and not counted."""

import json

seen = {}
duplicated = []
stats = {"requests": 0, "duplicates": 0, "repeats_after_410": 0}


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        if not message.get("more_body"):
            break
    path = scope["path"]
    if path == "/stats":
        body = dict(stats, duplicated=duplicated)
        await answer(send, 200, json.dumps(body).encode())
        return
    token = path.rsplit("/", 1)[-1]
    stats["requests"] += 1
    if token in seen:
        stats["duplicates"] += 1
        duplicated.append(token)
        if seen[token] == 410:
            stats["repeats_after_410"] += 1
    status = 410 if token.endswith("gone") else 200
    seen[token] = status
    body = b'{"reason":"Unregistered"}' if status == 410 else b""
    await answer(send, status, body)


async def answer(send, status, body):
    headers = [(b"apns-id", b"00000000-0000-0000-0000-000000000000")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

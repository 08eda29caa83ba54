"""Protocol fuzzing of a real embedded server subprocess, at the byte level and the JSON level.

Raw sockets send broken HTTP framing (random bytes, truncated requests and bodies, huge and
countless headers, bad Content-Length / chunked encodings, odd methods and versions); an
aiohttp client sends thousands of seeded random ``/generate`` bodies (wrong types, huge and
negative numbers, unknown token ids, subnormal temperatures, mixed batches, ...). Every
request must get a valid reply or a 4xx JSON error (a framing error may also just close the
connection); no 5xx. Meanwhile a canary keeps sending one greedy request whose output must
never change, and afterwards ``/health`` is 200 and greedy output is what it was before.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from reliability_support import make_model, record, start_servers

from areal_agents.inference.protocol import parse_generate_reply

CANARY = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
          "return_logprob": True}  # fmt: skip
N_JSON = 2400
N_RAW = 400


def raw_cases(rng: random.Random, port: int) -> list[tuple[str, list[bytes]]]:
    """``(kind, chunks)``: byte strings sent in order on one connection (a half-close follows
    only if the server neither answers nor closes within 3 s)."""
    host = f"Host: 127.0.0.1:{port}\r\nConnection: close\r\n".encode()
    body = json.dumps(CANARY).encode()
    good = b"POST /generate HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: " + \
        str(len(body)).encode() + b"\r\n\r\n" + body  # fmt: skip
    makers = {
        "random_bytes": lambda: [rng.randbytes(rng.randint(1, 400))],
        "random_after_request_line": lambda: [b"POST /generate HTTP/1.1\r\n" + rng.randbytes(rng.randint(1, 300))],
        "truncated_request": lambda: [good[: rng.randint(1, len(good) - 1)]],
        "truncated_body": lambda: [good[: len(good) - rng.randint(1, len(body) - 1)]],
        "huge_header": lambda: [b"GET /health HTTP/1.1\r\n" + host + b"X-Big: " + b"a" * rng.choice([9000, 70000, 2**20])
                                + b"\r\n\r\n"],
        "many_headers": lambda: [b"GET /health HTTP/1.1\r\n" + host +
                                 b"".join(b"X-%d: v\r\n" % i for i in range(rng.choice([200, 5000, 20000]))) + b"\r\n"],
        "bad_content_length": lambda: [b"POST /generate HTTP/1.1\r\n" + host + b"Content-Length: " +
                                       rng.choice([b"-5", b"abc", b"99999999999999999999999", b"1, 2", b""]) +
                                       b"\r\n\r\n{}"],
        "bad_chunked": lambda: [b"POST /generate HTTP/1.1\r\n" + host + b"Transfer-Encoding: chunked\r\n\r\n" +
                                rng.choice([b"zz\r\n{}\r\n0\r\n\r\n", b"ffffffffffffffffff\r\n", b"5\r\n{}\r\n0\r\n\r\n",
                                            b"2\r\n{}", b"-1\r\n\r\n"])],
        "cl_and_te": lambda: [b"POST /generate HTTP/1.1\r\n" + host + b"Content-Length: 2\r\nTransfer-Encoding: chunked"
                              b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n"],
        "odd_request_line": lambda: [rng.choice([b"GET / HTTP/9.9\r\n\r\n", b"get /health HTTP/1.1\r\n\r\n",
                                                 b"BREW /generate HTTP/1.1\r\n\r\n", b"GET /\x00x HTTP/1.1\r\n\r\n",
                                                 b"GET " + b"/a" * 20000 + b" HTTP/1.1\r\n\r\n",
                                                 b"GET /health\r\n\r\n", b"\r\n\r\n\r\n", b"POST  HTTP/1.1\r\n\r\n",
                                                 b"GET http://evil.example/health HTTP/1.1\r\n" + host + b"\r\n"])],
        "byte_by_byte_valid": lambda: [good[i : i + 1] for i in range(len(good))],
        "pipelined_valid_then_garbage": lambda: [good + rng.randbytes(rng.randint(1, 100))],
    }
    kinds = sorted(makers)
    return [(kind, makers[kind]()) for kind in (kinds + [rng.choice(kinds) for _ in range(N_RAW - len(kinds))])]


async def send_raw(port: int, chunks: list[bytes]) -> bytes | None:
    """The server's reply bytes (``b""`` when it just closed), or None if it never answered/closed."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None
    try:
        for chunk in chunks:
            writer.write(chunk)
            if len(chunks) > 1:
                await writer.drain()
        await writer.drain()
        try:  # a complete request is answered; a framing error is answered (or closed) at once
            return await asyncio.wait_for(reader.read(), timeout=3)
        except asyncio.TimeoutError:  # an incomplete request: the server waits for more bytes
            pass
        writer.write_eof()  # ... until the client gives up
        return await asyncio.wait_for(reader.read(), timeout=30)
    except (ConnectionError, OSError):
        return b""  # reset by the server: a close
    except asyncio.TimeoutError:
        return None
    finally:
        writer.close()


def _value(rng: random.Random, kind: str) -> Any:
    pools = {
        "int": [0, 1, 2, 3, -1, -(2**31), 2**31, 2**63, 2**64 + 7, 10**30, 10**400],
        "num": [0, 1, 0.5, 1e-320, 5e-324, 1e-45, 1e308, -1.0, -0.0, 2.0, 1e-7, 3],
        "junk": [None, True, False, "", "5", "abc", "\udcff" if False else "\u00ff", [], {}, [1, [2]], {"a": 1}, 1.5],
    }
    if kind == "ids":
        choice = rng.random()
        if choice < 0.5:
            return [rng.randrange(3, 250) for _ in range(rng.randint(1, 8))]
        return rng.choice([[], [-1], [10**6], [2**63], [1.5], [True], ["a"], [[1], 2], [[1, 2], [3]], [[]], [None],
                           [1] * 5000, [[1, 2], "x"], [[5, 6], [7, 10**9]], "1 2 3", None, 7])
    if kind == "text":
        return rng.choice(["What is 1 + 2?", "", "\x00", "é\u2028\ud7ff", ["a", "b"], ["a", 3], [], [[]], 5, "x" * 9000])
    pool = pools[kind] + pools["junk"]
    return rng.choice(pool) if rng.random() < 0.6 else rng.choice(pools[kind])


def json_body(rng: random.Random) -> tuple[bytes, bool]:
    """A random ``/generate`` body and whether it asked for logprobs."""
    body: dict[str, Any] = {}
    if rng.random() < 0.85:
        body["input_ids"] = _value(rng, "ids")
    if rng.random() < 0.2:
        body["text"] = _value(rng, "text")
    sp: dict[str, Any] = {"max_new_tokens": rng.choice([1, 2, 4]), "ignore_eos": True}
    for key, kind in (("max_new_tokens", "int"), ("min_new_tokens", "int"), ("temperature", "num"), ("top_p", "num"),
                      ("top_k", "int"), ("n", "int"), ("stop_token_ids", "ids"), ("stop", "text"),
                      ("ignore_eos", "junk"), ("repetition_penalty", "num"), ("bogus", "junk")):
        if rng.random() < 0.15:
            sp[key] = _value(rng, kind)
    if isinstance(sp.get("max_new_tokens"), int) and sp["max_new_tokens"] > 8 and rng.random() < 0.9:
        sp["max_new_tokens"] = 8  # keep most generations short; some still run to the context length
    if isinstance(sp.get("n"), int) and sp["n"] > 4 and rng.random() < 0.9:
        sp["n"] = 4
    body["sampling_params"] = sp if rng.random() < 0.9 else _value(rng, "junk")
    if rng.random() < 0.5:
        body["return_logprob"] = rng.choice([True, True, False, "yes", 1, None])
    if rng.random() < 0.1:
        body["rid"] = _value(rng, "junk")
    if rng.random() < 0.05:
        body[rng.choice(["stream", "lora_path", "unknown", "logprob_start_len"])] = _value(rng, "junk")
    text = json.dumps(body, allow_nan=True)
    if rng.random() < 0.03:
        text = text.replace("0.5", "NaN", 1).replace("1e-45", "Infinity", 1)
    if rng.random() < 0.03:
        text = text[: rng.randint(0, len(text))]
    return text.encode(), body.get("return_logprob") is True


def check_reply(status: int, raw: bytes, logprob: bool) -> str:
    """'' if the reply is acceptable, else what is wrong with it (a stream: its final event)."""
    if status == 200 and raw.startswith(b"data: "):
        events = [e for e in raw.split(b"\n\n") if e]
        if len(events) < 2 or events[-1] != b"data: [DONE]" or not all(e.startswith(b"data: ") for e in events):
            return f"a malformed event stream: {raw[-200:]!r}"
        raw = events[-2][len(b"data: "):]
    try:
        body = json.loads(raw)
    except ValueError:
        return f"HTTP {status}: not JSON: {raw[:200]!r}"
    if status == 200:
        replies = body if isinstance(body, list) else [body]
        for r in replies:
            if not isinstance(r, dict) or not isinstance(r.get("output_ids"), list):
                return f"200 without output_ids: {str(body)[:200]}"
            if logprob:
                try:
                    parse_generate_reply(r)
                except Exception as exc:  # noqa: BLE001
                    return f"200 with a malformed reply: {exc}"
        return ""
    if 400 <= status < 500:
        ok = isinstance(body, dict) and isinstance(body.get("error"), dict) and body["error"].get("message")
        return "" if ok else f"HTTP {status} without an error message: {str(body)[:200]}"
    return f"HTTP {status}: {str(body)[:300]}"


async def fuzz(url: str, port: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    statuses: Counter[int] = Counter()
    problems: list[tuple[bytes, str]] = []
    canary_outputs: list[list[int]] = []
    stop = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=32)) as session:
        async def canary() -> None:
            while not stop.is_set():
                async with session.post(url + "/generate", json=CANARY) as resp:
                    body = await resp.json()
                    canary_outputs.append(body.get("output_ids") if resp.status == 200 else [resp.status, body])
                await asyncio.sleep(0.02)

        async def one(content: bytes, logprob: bool) -> None:
            async with session.post(url + "/generate", data=content,
                                    headers={"Content-Type": "application/json"}) as resp:
                raw = await resp.read()
                statuses[resp.status] += 1
                why = check_reply(resp.status, raw, logprob)
                if why:
                    problems.append((content[:300], why))

        canary_task = asyncio.ensure_future(canary())
        cases = [json_body(rng) for _ in range(N_JSON)]
        sem = asyncio.Semaphore(32)

        async def bounded(content: bytes, logprob: bool) -> None:
            async with sem:
                await one(content, logprob)

        raw_sem = asyncio.Semaphore(32)
        raw_results: list[tuple[str, bytes | None]] = []

        async def raw_one(kind: str, chunks: list[bytes]) -> None:
            async with raw_sem:
                raw_results.append((kind, await send_raw(port, chunks)))

        await asyncio.gather(*(bounded(c, lp) for c, lp in cases),
                             *(raw_one(k, ch) for k, ch in raw_cases(rng, port)))
        stop.set()
        await canary_task
    return {"statuses": statuses, "problems": problems, "canary": canary_outputs, "raw": raw_results}


async def extremes(url: str) -> list[tuple[int, Any]]:
    """Found by this fuzzer: a huge ``top_k`` or a subnormal temperature used to fail the whole
    batch it joined (int64 overflow / inf logits). Sent together with two normal requests."""
    bodies = [CANARY,
              {**CANARY, "sampling_params": {"max_new_tokens": 12, "ignore_eos": True, "top_k": 2**63}},
              {**CANARY, "sampling_params": {"max_new_tokens": 12, "ignore_eos": True, "temperature": 1e-45}},
              {**CANARY, "sampling_params": {"max_new_tokens": 12, "ignore_eos": True, "temperature": 1e-300,
                                             "top_k": 10**30, "top_p": 5e-324}},
              CANARY]  # fmt: skip
    async with aiohttp.ClientSession() as session:
        async def post(body: dict[str, Any]) -> tuple[int, Any]:
            async with session.post(url + "/generate", json=body) as resp:
                return resp.status, (await resp.json()).get("output_ids")

        return await asyncio.gather(*(post(b) for b in bodies))


CONTROL = ["/update_weights_from_disk", "/pause_generation", "/continue_generation", "/abort_request",
           "/flush_cache", "/init_weights_update_group", "/update_weights_from_distributed"]


async def control_fuzz(url: str, seed: int, n: int = 300) -> tuple[Counter[int], list[tuple[str, str]]]:
    """Random bodies to the control endpoints (never a real model path): 2xx, or a 4xx JSON reply."""
    rng = random.Random(seed)
    junk: list[Any] = [None, True, 0, -1, 10**30, 1.5, "", "x", "/", "/etc", "/dev/zero", "../../..", "/proc/self/mem",
                       "abort", "retract", "in_place", "sideways", [], {}, ["a"], {"a": 1}]
    keys = ["model_path", "weight_version", "abort_all_requests", "flush_cache", "keep_pause", "load_format", "mode",
            "rid", "abort_all", "names", "dtypes", "shapes", "master_address", "world_size", "bogus"]
    statuses: Counter[int] = Counter()
    problems: list[tuple[str, str]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for _ in range(n):
            path = rng.choice(CONTROL)
            body = {k: rng.choice(junk) for k in rng.sample(keys, rng.randint(0, 4))}
            data = json.dumps(body).encode() if rng.random() < 0.9 else rng.randbytes(rng.randint(0, 30))
            async with session.post(url + path, data=data) as resp:
                raw = await resp.read()
                statuses[resp.status] += 1
                if resp.status >= 500 or (resp.status >= 400 and not raw.startswith(b"{")):
                    problems.append((f"{path} {data[:120]!r}", f"HTTP {resp.status}: {raw[:200]!r}"))
        async with session.post(url + "/continue_generation", json={}) as resp:  # undo a random pause
            assert resp.status == 200
    return statuses, problems


def raw_verdict(reply: bytes | None) -> str:
    if reply is None:
        return "hung"
    if reply == b"":
        return "closed"
    head = reply.split(b"\r\n", 1)[0]
    parts = head.split()
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():  # 0.9 answers "GET /health"
        code = int(parts[1])
        return "2xx" if code < 300 else "4xx" if 400 <= code < 500 else f"bad:{code}"
    return f"bad:{head[:60]!r}"


@pytest.mark.timeout(300)
def test_random_and_malformed_requests_never_break_the_server(tmp_path: Path) -> None:
    import httpx

    model = make_model(tmp_path)
    with start_servers(model, 1, tmp_path / "logs", max_batch_size=32) as group:
        server = group[0]
        port = int(server.address.rsplit(":", 1)[1])
        before = httpx.post(server.url + "/generate", json=CANARY, timeout=60).json()["output_ids"]
        t0 = time.monotonic()
        result = asyncio.run(fuzz(server.url, port, seed=1234))
        seconds = time.monotonic() - t0
        extreme = asyncio.run(extremes(server.url))
        control_statuses, control_problems = asyncio.run(control_fuzz(server.url, seed=99))
        health = httpx.get(server.url + "/health", timeout=10).status_code
        after = httpx.post(server.url + "/generate", json=CANARY, timeout=60).json()["output_ids"]
        info = httpx.get(server.url + "/server_info", timeout=10).json()["batching"]
        alive = server.alive
    statuses, problems = result["statuses"], result["problems"]
    verdicts = Counter(raw_verdict(r) for _, r in result["raw"])
    bad_raw = [(k, r[:200] if r else r) for k, r in result["raw"] if raw_verdict(r) not in ("4xx", "closed", "2xx")]
    assert problems == [], problems[:10]
    assert control_problems == [], control_problems[:10]
    assert bad_raw == [], bad_raw[:10]
    assert sum(statuses.values()) == N_JSON and len(result["raw"]) == N_RAW
    assert statuses[200] > 100 and statuses[400] > 100  # both valid and invalid requests were exercised
    assert alive and health == 200 and after == before and len(before) == 12
    assert [status for status, _ in extreme] == [200] * 5
    assert [extreme[i][1] for i in (0, 2, 3, 4)] == [before] * 4  # near-zero temperature is greedy
    assert len(extreme[1][1]) == 12
    spoiled = [out for out in result["canary"] if out != before]
    assert result["canary"] and spoiled == [], spoiled[:5]  # no request poisoned the batch it shared
    assert info["step_errors"] == 0
    record("server_protocol_fuzz", requests=N_JSON + N_RAW, json_requests=N_JSON, raw_http_requests=N_RAW,
           statuses={str(k): v for k, v in sorted(statuses.items())}, raw_outcomes=dict(verdicts),
           canary_requests=len(result["canary"]), seconds=round(seconds, 1), server_5xx=0,
           control_requests=sum(control_statuses.values()),
           control_statuses={str(k): v for k, v in sorted(control_statuses.items())},
           greedy_output_unchanged=True)

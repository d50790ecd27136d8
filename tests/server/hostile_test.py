#!/usr/bin/env python3
"""A hostile test battery for `pagoda serve`: what a client facing the internet may send.

    python3 tests/server/hostile_test.py build/pagoda            # the size `make test` runs
    python3 tests/server/hostile_test.py build/pagoda --long --out bench/results/<device>/server_hostile.json

Starts a real `pagoda serve` (the default model) on a free 127.0.0.1 port, with --api-key and
--metrics-key and a small --max-connections, then:

1. Reference: a set of prompts, greedy, one request at a time.
2. Load: concurrent requests (completion or chat, streaming or not); a fraction of the clients
   disconnect at a random point. Every completed answer must equal its reference exactly.
   Meanwhile, from other threads: the hostile catalogue (malformed JSON, every field with every
   wrong type, out-of-range values, huge bodies and headers, invalid UTF-8, bad token ids, auth
   variants, pipelining, chunked bodies, half-close, Expect), slow clients that dribble their
   request or never read their stream, and idle sockets up to the connection limit.
3. Long words: requests whose prompt is one new word of hundreds of thousands of letters (each
   refused as too long for the context); the server's resident memory (VmRSS from
   /proc/<pid>/status) must stay within a bound of where it was after a warm-up.
4. The end: /metrics shows no KV block held, nothing running or queued; SIGTERM exits 0.

Only loopback addresses; every loop is bounded. Exits 1 when any check fails; --out writes the
figures as JSON (and a markdown table next to it).
"""

import argparse
import collections
import concurrent.futures
import json
import os
import platform
import random
import socket
import string
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

API_KEY = "hostile-api-key"
METRICS_KEY = "hostile-metrics-key"
MAX_CONNECTIONS = 48  # --long: 96, so its load and side cases together stay below it
HOST = "127.0.0.1"

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three primary colours:",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three laws of thermodynamics are",
    "Translate to French: good morning",
    "What is 12 times 12?",
    "A pagoda is a tiered tower with",
    "The quick brown fox",
    "Explain photosynthesis in one sentence.",
    "Name a planet in the solar system:",
]


class Failures:
    """Collects failed checks (thread-safe); the battery goes on and reports them all."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items = []

    def add(self, what):
        with self.lock:
            self.items.append(what)
            if len(self.items) <= 40:
                print(f"FAIL: {what}", file=sys.stderr)

    def check(self, ok, what):
        if not ok:
            self.add(what)
        return ok


FAIL = Failures()


# -- raw HTTP over a socket: statuses and bytes exactly as sent, and control over closing --

def connect(server, timeout=60):
    sock = socket.create_connection((server.host, server.port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request_bytes(method, path, body=b"", headers=None, chunked=False, auth=True):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    hdrs = {"Host": HOST}
    if auth:
        hdrs["Authorization"] = "Bearer " + API_KEY
    if body or method == "POST":
        hdrs["Content-Type"] = "application/json"
        if chunked:
            hdrs["Transfer-Encoding"] = "chunked"
        else:
            hdrs["Content-Length"] = str(len(body))
    hdrs.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    if chunked:
        pieces, pos = [], 0
        while pos < len(body):
            n = min(random.randint(1, 97), len(body) - pos)
            pieces.append(f"{n:x}\r\n".encode() + body[pos:pos + n] + b"\r\n")
            pos += n
        body = b"".join(pieces) + b"0\r\n\r\n"
    return head.encode() + body


class Reader:
    """Reads responses off one socket (pipelining: several in a row). Skips 1xx responses."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exactly(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, head_only=False):
        while True:
            status_line = self._line()
            parts = status_line.split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                raise ValueError(f"bad status line {status_line[:80]!r}")
            status = int(parts[1])
            headers = {}
            while True:
                line = self._line()
                if not line:
                    break
                name, _, value = line.partition(b":")
                headers[name.decode().strip().lower()] = value.decode().strip()
            if 100 <= status < 200:
                continue
            break
        if head_only:
            body = b""
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(self._line().split(b";")[0], 16)
                data = self._exactly(size + 2)
                if size == 0:
                    break
                body += data[:-2]
        elif "content-length" in headers:
            body = self._exactly(int(headers["content-length"]))
        else:
            body = self.buf
            self.buf = b""
            while True:
                try:
                    data = self.sock.recv(65536)
                except OSError:
                    break
                if not data:
                    break
                body += data
        return status, headers, body


def exchange(server, raw, timeout=120):
    """Sends raw bytes on a fresh connection; returns (status, headers, body), or (None, error)."""
    sock = connect(server, timeout)
    try:
        sock.sendall(raw)
        return Reader(sock).response(head_only=raw.startswith(b"HEAD "))
    except (OSError, EOFError, ValueError) as e:
        return None, {}, repr(e).encode()
    finally:
        sock.close()


def sse_text(body):
    """Completion text and finish reason of a streamed body (chat or completion)."""
    text, finish = "", None
    for event in h.read_sse(body):
        if event == "[DONE]":
            continue
        data = json.loads(event)
        for choice in data.get("choices", []):
            text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            finish = choice.get("finish_reason") or finish
    return text, finish


def whole_text(body):
    choice = json.loads(body)["choices"][0]
    return (choice.get("text") if "text" in choice else choice["message"]["content"]), choice["finish_reason"]


# -- the jobs of the load --

def job_payload(server, kind, prompt, max_tokens, stream):
    payload = {"model": server.model, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if kind == "chat":
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    return payload


def job_path(kind):
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def run_job(server, job, reference):
    """One request of the load; returns its outcome (completed | disconnected | error)."""
    kind, prompt_index, stream = job["kind"], job["prompt"], job["stream"]
    raw = request_bytes("POST", job_path(kind),
                        job_payload(server, kind, PROMPTS[prompt_index], job["max_tokens"], stream),
                        chunked=job["chunked"])
    sock = connect(server)
    try:
        sock.sendall(raw)
        if job["half_close"]:
            sock.shutdown(socket.SHUT_WR)
        if job["disconnect"] is not None:
            if stream:
                # Read some of the stream, then go.
                got = b""
                deadline = time.monotonic() + 30
                while len(got) < job["disconnect"] and time.monotonic() < deadline:
                    data = sock.recv(4096)
                    if not data:
                        break
                    got += data
            else:
                time.sleep(job["disconnect"] / 1000.0)
            return "disconnected"
        status, _, body = Reader(sock).response()
        if status != 200:
            FAIL.add(f"load: {kind} stream={stream} got HTTP {status}: {body[:200]!r}")
            return "error"
        got = sse_text(body) if stream else whole_text(body)
        if got != reference[(kind, prompt_index, job["max_tokens"])]:
            FAIL.add(f"load: {kind} prompt {prompt_index} stream={stream} differs from its one-at-a-time "
                     f"reference: {got!r} vs {reference[(kind, prompt_index, job['max_tokens'])]!r}")
            return "mismatch"
        return "completed"
    except (OSError, EOFError, ValueError) as e:
        FAIL.add(f"load: {kind} stream={stream} failed: {e!r}")
        return "error"
    finally:
        sock.close()


# -- the hostile catalogue: (name, callable returning None when fine or a failure text) --

def expect(server, name, raw, statuses, json_error=True):
    status, _, body = exchange(server, raw)
    if status not in statuses:
        return f"{name}: HTTP {status} (expected {sorted(statuses)}): {body[:200]!r}"
    if json_error and status >= 400:
        try:
            message = json.loads(body)["error"]["message"]
            if not isinstance(message, str) or not message:
                return f"{name}: error without a message: {body[:200]!r}"
        except (ValueError, KeyError, TypeError):
            return f"{name}: error body is not OpenAI's JSON shape: {body[:200]!r}"
    return None


WRONG_VALUES = [None, True, 0, -1, 1.5, 1e308, "text", "", [], [1], {}, {"a": 1}]
# Each field, with values of a kind it can never take (400 expected); other values of the wrong
# type may be accepted by a lenient reading, so for them only "never 5xx" is checked.
NEVER_VALID = {
    "model": [[], {}, 5],
    "prompt": [None, True, 1.5, {}, [[]], [{}], [1.5], ["a", 1]],
    "messages": [None, True, 5, "hi", {}, [1], ["hi"], [{}], [{"role": "user"}], [{"role": 5, "content": "x"}],
                 [{"role": "wizard", "content": "x"}]],
    "max_tokens": ["ten", [], {}, True, 1.5, -1],
    "temperature": ["hot", [], {}, -1, 1e308],
    "top_p": ["x", [], {}, -0.5, 2],
    "n": ["two", [], {}, 0, -3, 1.5],
    "stream": ["yes", [], {}, 2],
    "stop": [5, {}, [1], [None]],
    "seed": ["s", [], {}, 1.5],
    "logprobs": ["x", [], {}],
    "top_logprobs": ["x", [], {}, -1, 1000],  # chat only: completions ignore it
    "presence_penalty": ["x", [], {}, 3, -3],
    "frequency_penalty": ["x", [], {}, 3, -3],
    "logit_bias": ["x", [], 5, {"a": 1}, {"1": "x"}, {"99999999": 1}],
    "stream_options": ["x", [], 5],
    "top_k": ["x", [], {}, 1.5],
    "min_p": ["x", [], {}, -1, 2],
    "ignore_eos": ["x", [], {}],
    "user": [[], {}, 5],
}


def hostile_catalogue(server, vocab_size):
    cases = []
    base = {"model": server.model, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    chat = {"model": server.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}

    def add(name, raw, statuses, json_error=True):
        cases.append((name, lambda: expect(server, name, raw, set(statuses), json_error)))

    # Malformed JSON.
    for i, body in enumerate([b"{", b"[1,2", b"nul", b"", b"{\"prompt\": }", b"{}", b"[]", b"\"text\"", b"42",
                              b"{\"prompt\": \"a\", \"prompt\": 5}", b"\xef\xbb\xbf{}", b"{\"a\":1}garbage",
                              b"[" * 200000 + b"]" * 200000, b"{\"a\":" * 100000 + b"1" + b"}" * 100000]):
        for path in ("/v1/completions", "/v1/chat/completions"):
            add(f"malformed JSON #{i} on {path}", request_bytes("POST", path, body), {400})
    # Every field, with values of every JSON type.
    for field in sorted(NEVER_VALID):
        for template, path in ((base, "/v1/completions"), (chat, "/v1/chat/completions")):
            if field in ("prompt", "messages") and (field == "prompt") != (path == "/v1/completions"):
                continue
            if field == "top_logprobs" and path == "/v1/completions":
                continue
            for value in WRONG_VALUES + NEVER_VALID[field]:
                if value is None and field == "max_tokens":
                    continue  # null is the default length: up to the context, minutes under load
                payload = dict(template, **{field: value})
                statuses = {400} if any(value == v and type(value) is type(v) for v in NEVER_VALID[field]) \
                    else {200, 400}
                if field == "model" and isinstance(value, str):
                    statuses = {404}  # a model this server does not serve
                add(f"{field}={json.dumps(value)[:40]} on {path}", request_bytes("POST", path, payload), statuses)
    # Out-of-range sizes.
    for payload in (dict(base, max_tokens=10**9), dict(base, n=10**6), dict(base, max_tokens=2**63),
                    dict(base, prompt=[1] * 9000), dict(base, prompt="word " * 9000)):
        add(f"out of range {json.dumps(payload)[:60]}", request_bytes("POST", "/v1/completions", payload), {400})
    # Token ids and invalid UTF-8.
    for ids in ([-1], [vocab_size], [2**31], [2**70], [0.5]):
        add(f"token ids {ids}", request_bytes("POST", "/v1/completions", dict(base, prompt=ids)), {400})
    add("token ids valid", request_bytes("POST", "/v1/completions", dict(base, prompt=[1, 2, 3])), {200})
    for raw_prompt in (b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"a\x00b"):
        body = b'{"model":"m","max_tokens":2,"prompt":"' + raw_prompt + b'"}'
        add(f"invalid UTF-8 {raw_prompt!r}", request_bytes("POST", "/v1/completions", body), {400})
    for escape in ("\\ud800", "\\udfff", "\\ud800\\u0041"):
        body = '{"model":"m","max_tokens":2,"prompt":"' + escape + '"}'
        add(f"lone surrogate {escape}", request_bytes("POST", "/v1/completions", body), {200, 400})
    add("a NUL escape in the prompt", request_bytes("POST", "/v1/completions", dict(base, prompt="a\u0000b")), {200})
    # Huge bodies and heads.
    add("Content-Length over the limit", request_bytes("POST", "/v1/completions", b"x" * (1 << 20) + b"x"), {413})
    add("chunked body over the limit",
        request_bytes("POST", "/v1/completions", b" " * ((1 << 20) + 10), chunked=True), {413})
    add("a 20 KB header", request_bytes("GET", "/v1/models", headers={"X-Big": "a" * 20000}), {431})
    add("200 headers", request_bytes("GET", "/v1/models", headers={f"X-{i}": "1" for i in range(200)}), {431})
    add("a 20 KB request target", f"GET /{'a' * 20000} HTTP/1.1\r\n\r\n".encode(), {431})
    # Malformed framing.
    for name, raw in (("bare LF", b"GET /health HTTP/1.1\nHost: a\n\n"),
                      ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
                      ("binary garbage", bytes(range(256)) * 4),
                      ("two lengths", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"),
                      ("length and chunked",
                       b"POST /v1/completions HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                      ("bad chunk size", b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
                      ("chunk longer than its size",
                       b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n0\r\n\r\n"),
                      ("gzip coding", b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"),
                      ("negative length", b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n")):
        add(name, raw, {400, 501, 505})
    # Methods and paths.
    add("DELETE on completions", request_bytes("DELETE", "/v1/completions"), {405})
    add("unknown path", request_bytes("GET", "/v1/nothing"), {404})
    add("path traversal", request_bytes("GET", "/../../etc/passwd"), {404})
    add("HEAD /health", request_bytes("HEAD", "/health"), {200}, json_error=False)
    # Authorization.
    add("no key", request_bytes("GET", "/v1/models", auth=False), {401})
    for value, status in (("Bearer wrong", 401), ("bearer " + API_KEY, 200), ("BEARER " + API_KEY, 200),
                          ("Bearer  " + API_KEY, 200), ("Basic " + API_KEY, 401), ("Bearer" + API_KEY, 401),
                          ("Bearer " + API_KEY[:-1], 401), ("Bearer " + API_KEY + "x", 401), ("Bearer", 401),
                          ("Bearer " + METRICS_KEY, 401)):
        add(f"Authorization: {value[:30]}",
            request_bytes("GET", "/v1/models", headers={"Authorization": value}, auth=False), {status})
    add("/metrics without its key", request_bytes("GET", "/metrics", auth=False), {401})
    add("/metrics with the API key", request_bytes("GET", "/metrics"), {401})
    add("/metrics with its key", request_bytes("GET", "/metrics", headers={"Authorization": "bearer " + METRICS_KEY},
                                               auth=False), {200}, json_error=False)
    add("/health needs no key", request_bytes("GET", "/health", auth=False), {200})
    add("cross-origin POST", request_bytes("POST", "/v1/completions", base, headers={"Origin": "http://evil.example"}),
        {403})
    return cases


# -- connection-level cases, each a function of the server --

def pipelining(server, reference):
    """Three requests in one write; the answers come back in order."""
    sock = connect(server)
    try:
        payloads = [job_payload(server, "completion", PROMPTS[i], 8, False) for i in (0, 1, 2)]
        sock.sendall(b"".join(request_bytes("POST", "/v1/completions", p) for p in payloads)
                     + request_bytes("GET", "/health", auth=False))
        reader = Reader(sock)
        for i in (0, 1, 2):
            status, _, body = reader.response()
            if status != 200 or whole_text(body) != reference[("completion", i, 8)]:
                return f"pipelining: answer {i}: HTTP {status} {body[:200]!r}"
        status, _, body = reader.response()
        return None if status == 200 and b"ok" in body else f"pipelining: /health after them: {status} {body!r}"
    finally:
        sock.close()


def half_close_and_chunked(server, reference):
    for chunked in (False, True):
        for stream in (False, True):
            sock = connect(server)
            try:
                sock.sendall(request_bytes("POST", "/v1/completions",
                                           job_payload(server, "completion", PROMPTS[3], 8, stream), chunked=chunked))
                sock.shutdown(socket.SHUT_WR)
                status, _, body = Reader(sock).response()
                got = (sse_text(body) if stream else whole_text(body)) if status == 200 else None
                if got != reference[("completion", 3, 8)]:
                    return f"half-close (chunked={chunked}, stream={stream}): HTTP {status}: {body[:200]!r}"
            finally:
                sock.close()
    return None


def expect_continue(server, reference):
    sock = connect(server)
    try:
        payload = json.dumps(job_payload(server, "completion", PROMPTS[4], 8, False)).encode()
        head = request_bytes("POST", "/v1/completions", payload, headers={"Expect": "100-continue"})
        sock.sendall(head[:len(head) - len(payload)])
        first = sock.recv(100)
        if not first.startswith(b"HTTP/1.1 100 "):
            return f"Expect: 100-continue: got {first!r}"
        sock.sendall(payload)
        status, _, body = Reader(sock).response()
        return None if status == 200 and whole_text(body) == reference[("completion", 4, 8)] \
            else f"Expect: 100-continue: HTTP {status} {body[:200]!r}"
    finally:
        sock.close()


def slow_client(server, seconds):
    """Dribbles a valid request a few bytes at a time; the server waits (within its read timeout)
    and answers it."""
    raw = request_bytes("POST", "/v1/completions", job_payload(server, "completion", PROMPTS[5], 4, False))
    sock = connect(server)
    try:
        step = max(1, len(raw) // 20)
        for i in range(0, len(raw), step):
            sock.sendall(raw[i:i + step])
            time.sleep(seconds / 20)
        status, _, body = Reader(sock).response()
        return None if status == 200 else f"slow client: HTTP {status} {body[:200]!r}"
    finally:
        sock.close()


def stalled_reader(server, seconds):
    """A streaming request whose client reads nothing for a while, then closes: the request must
    not stay running after it (checked at the end with the KV blocks)."""
    sock = connect(server)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        payload = job_payload(server, "completion", PROMPTS[6], 64, True)
        sock.sendall(request_bytes("POST", "/v1/completions", payload))
        time.sleep(seconds)
        return None
    finally:
        sock.close()


def idle_sockets_do_not_lock_out(server, reference):
    """Fill every connection slot with idle sockets; a new client is still served."""
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS + 8):
            idle.append(connect(server))
        time.sleep(0.2)
        for attempt in range(3):
            status, _, body = exchange(server, request_bytes(
                "POST", "/v1/completions", job_payload(server, "completion", PROMPTS[7], 8, False)))
            if status == 200:
                return None if whole_text(body) == reference[("completion", 7, 8)] else f"idle: wrong text {body!r}"
        return f"with {len(idle)} idle sockets open, a new client got HTTP {status}: {body[:200]!r}"
    finally:
        for sock in idle:
            sock.close()


# -- long words and resident memory --

def vm_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def long_words(server, count, length, concurrency, rng):
    """`count` requests, each one new word of `length` letters: 400 (too long for the context)."""
    seeds = [rng.getrandbits(64) for _ in range(count)]

    def request(seed):
        r = random.Random(seed)
        word = "".join(r.choices(string.ascii_letters, k=length))
        payload = {"model": server.model, "prompt": word, "max_tokens": 1}
        status, _, body = exchange(server, request_bytes("POST", "/v1/completions", payload))
        return status

    statuses = collections.Counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for status in pool.map(request, seeds):
            statuses[status] += 1
    return statuses


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pagoda", help="the pagoda binary")
    parser.add_argument("--long", action="store_true", help="thousands of requests (minutes to tens of minutes)")
    parser.add_argument("--sanitized", action="store_true",
                        help="a server built with ASan/UBSan: a smaller load, and resident memory reported, not "
                             "bounded (ASan's quarantine holds freed memory by design)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", help="write the figures as JSON here (and a .md table beside it)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    random.seed(args.seed)
    global MAX_CONNECTIONS
    if args.long:
        MAX_CONNECTIONS = 96
    size = dict(requests=1500, concurrency=24, catalogue_rounds=2, long_words=2000, word_letters=100_000,
                slow_clients=8) if args.long else \
        dict(requests=96, concurrency=8, catalogue_rounds=1, long_words=100, word_letters=200_000, slow_clients=2)
    if args.sanitized:
        size.update(requests=24, concurrency=4, long_words=20, catalogue_sample=250)
    rss_bound_mb = 64

    started = time.monotonic()
    server = h.PagodaServer(os.path.abspath(args.pagoda), "--api-key", API_KEY, "--metrics-key", METRICS_KEY,
                            "--max-connections", MAX_CONNECTIONS).start()
    pid = server.proc.pid
    figures = {"config": dict(size, max_connections=MAX_CONNECTIONS), "rss_bound_mb": rss_bound_mb}
    try:
        status, _, body = exchange(server, request_bytes("GET", "/v1/models"))
        server.model = json.loads(body)["data"][0]["id"]
        vocab_size = 49152
        rss_start = vm_rss_kb(pid)

        # 1. Reference, one at a time.
        reference = {}
        for kind in ("completion", "chat"):
            for i in range(len(PROMPTS)):
                for max_tokens in (8, 16):
                    status, _, body = exchange(server, request_bytes(
                        "POST", job_path(kind), job_payload(server, kind, PROMPTS[i], max_tokens, False)))
                    if status != 200:
                        raise SystemExit(f"hostile_test: reference {kind} {i}: HTTP {status} {body[:300]!r}")
                    reference[(kind, i, max_tokens)] = whole_text(body)

        # 2. Load, with the hostile catalogue and the connection-level cases beside it.
        jobs = []
        for _ in range(size["requests"]):
            disconnect = None
            stream = rng.random() < 0.5
            if rng.random() < 0.15:
                disconnect = rng.randint(1, 2000) if stream else rng.randint(0, 400)  # bytes read / ms waited
            jobs.append(dict(kind=rng.choice(("completion", "chat")), prompt=rng.randrange(len(PROMPTS)),
                             max_tokens=rng.choice((8, 16)), stream=stream, disconnect=disconnect,
                             chunked=rng.random() < 0.1, half_close=disconnect is None and rng.random() < 0.1))
        catalogue = hostile_catalogue(server, vocab_size) * size["catalogue_rounds"]
        rng.shuffle(catalogue)
        catalogue = catalogue[:size.get("catalogue_sample", len(catalogue))]
        side_cases = [("pipelining", lambda: pipelining(server, reference)),
                      ("half-close and chunked", lambda: half_close_and_chunked(server, reference)),
                      ("expect continue", lambda: expect_continue(server, reference)),
                      ("idle sockets", lambda: idle_sockets_do_not_lock_out(server, reference))]
        side_cases += [(f"slow client {i}", lambda: slow_client(server, 4)) for i in range(size["slow_clients"])]
        side_cases += [(f"stalled reader {i}", lambda: stalled_reader(server, 3)) for i in range(size["slow_clients"])]
        outcomes = collections.Counter()
        hostile_outcomes = collections.Counter()

        def run_side(case):
            name, fn = case
            try:
                failure = fn()
            except Exception as e:  # a hostile case must not take the battery down
                failure = f"{name}: {e!r}"
            if failure:
                FAIL.add(failure)
            return failure is None

        load_started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(size["concurrency"]) as load_pool, \
                concurrent.futures.ThreadPoolExecutor(4) as side_pool:
            side = side_pool.map(run_side, catalogue + side_cases)
            for outcome in load_pool.map(lambda job: run_job(server, job, reference), jobs):
                outcomes[outcome] += 1
            for ok in side:
                hostile_outcomes["as expected" if ok else "unexpected"] += 1
        load_seconds = time.monotonic() - load_started
        alive = exchange(server, request_bytes("GET", "/health", auth=False))[0] == 200
        FAIL.check(alive, "the server does not answer /health after the load")

        # 3. Long words and resident memory.
        long_words(server, 10, size["word_letters"], 2, rng)  # warm-up: the allocator's arenas
        rss_before = vm_rss_kb(pid)
        word_statuses = long_words(server, size["long_words"], size["word_letters"], 2, rng)
        rss_after = vm_rss_kb(pid)
        FAIL.check(set(word_statuses) == {400}, f"long words: statuses {dict(word_statuses)} (expected 400 each)")
        FAIL.check(args.sanitized or rss_after - rss_before <= rss_bound_mb * 1024,
                   f"long words: VmRSS grew from {rss_before // 1024} MB to {rss_after // 1024} MB "
                   f"(bound {rss_bound_mb} MB)")

        # 4. The end: nothing held, nothing running, a clean exit.
        samples, idle = h.wait_for_metrics(server, lambda s: s.get("pagoda_kv_blocks_used") == 0 and
                                           s.get("pagoda_running_requests") == 0 and
                                           s.get("pagoda_queue_length") == 0, timeout=60)
        FAIL.check(idle, "at the end /metrics shows " + ", ".join(
            f"{k}={samples.get(k)}" for k in ("pagoda_kv_blocks_used", "pagoda_running_requests", "pagoda_queue_length")))
        server.terminate()
        code = server.wait(60)
        FAIL.check(code == 0, f"SIGTERM: exit code {code}\n{server.log_tail()}")
    finally:
        server.kill()

    figures.update({
        "machine": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count(),
        "git_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                     cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip(),
        "command": " ".join(sys.argv),
        "load_requests": size["requests"], "load_outcomes": dict(outcomes), "load_seconds": round(load_seconds, 1),
        "mismatches": outcomes.get("mismatch", 0),
        "hostile_requests": sum(hostile_outcomes.values()), "hostile_outcomes": dict(hostile_outcomes),
        "long_word_requests": sum(word_statuses.values()), "long_word_letters": size["word_letters"],
        "long_word_statuses": {str(k): v for k, v in word_statuses.items()},
        "vm_rss_mb": {"start": round(rss_start / 1024, 1), "before_long_words": round(rss_before / 1024, 1),
                      "after_long_words": round(rss_after / 1024, 1)},
        "end_metrics": {k: samples.get(k) for k in ("pagoda_kv_blocks_used", "pagoda_running_requests",
                                                    "pagoda_queue_length", "pagoda_client_disconnects_total")},
        "sigterm_exit_code": code, "failures": len(FAIL.items), "seconds": round(time.monotonic() - started, 1),
    })
    rows = [("load requests", figures["load_requests"]),
            ("load outcomes", ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))),
            ("mismatches with the one-at-a-time reference", figures["mismatches"]),
            ("hostile requests (catalogue and connection cases)", figures["hostile_requests"]),
            ("hostile outcomes", ", ".join(f"{k} {v}" for k, v in sorted(hostile_outcomes.items()))),
            (f"long-word requests ({size['word_letters']:,} letters each)", figures["long_word_requests"]),
            ("long-word statuses", ", ".join(f"{k}: {v}" for k, v in sorted(word_statuses.items()))),
            ("VmRSS at start / before / after the long words (MB)",
             f"{figures['vm_rss_mb']['start']} / {figures['vm_rss_mb']['before_long_words']} / "
             f"{figures['vm_rss_mb']['after_long_words']} (bound: +{rss_bound_mb})"),
            ("end: KV blocks used, running, queued", f"{samples.get('pagoda_kv_blocks_used')}, "
             f"{samples.get('pagoda_running_requests')}, {samples.get('pagoda_queue_length')}"),
            ("SIGTERM exit code", code),
            ("failed checks", len(FAIL.items)),
            ("wall time (s)", figures["seconds"])]
    table = "| figure | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=2)
            f.write("\n")
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(f"# pagoda serve under the hostile battery\n\n`{figures['command']}` at {figures['git_commit']}\n\n"
                    + table)
    if FAIL.items:
        print(f"hostile_test: {len(FAIL.items)} checks failed", file=sys.stderr)
        sys.exit(1)
    print("hostile_test: all checks passed")


if __name__ == "__main__":
    main()

"""`pagoda serve` end to end, through the official `openai` client and raw HTTP.

    python3 tests/server/openai_client_test.py build/pagoda [unittest args, e.g. -v or a test name]

Starts servers on free ports (one shared by most tests; others for --api-key, a tiny queue and
SIGTERM), compares same-seed output with `pagoda generate`, checks the OpenAI shapes the client
parses, the error statuses and bodies, cancellation on disconnect (KV blocks freed), and drain on
SIGTERM. Runs in about a minute on 2 cores.
"""

import concurrent.futures
import json
import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

try:
    import openai
except ImportError:
    sys.exit("openai_client_test: the `openai` package is missing; bash scripts/setup.sh installs it")

BINARY = None
SERVER = None  # the shared server
CLIENT = None

MAX_BODY_BYTES = 262144
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
COMPLETION_PROMPT = "The capital of France is"
CHAT_MESSAGE = "What is a pagoda? Answer in one sentence."


def chatml(user, system=DEFAULT_SYSTEM):
    """SmolLM2's template (src/pagoda/tokenizer/chat_template.cpp, render_chatml), default system turn."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def make_client(server, api_key="unused"):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=api_key, max_retries=0, timeout=120)


def setUpModule():
    global SERVER, CLIENT
    SERVER = h.PagodaServer(BINARY, "--max-body-bytes", MAX_BODY_BYTES).start()
    CLIENT = make_client(SERVER)


def tearDownModule():
    if SERVER:
        code = SERVER.stop()
        if code != 0:
            raise AssertionError(f"the shared server exited with {code} after SIGTERM\n{SERVER.log_tail()}")


def sampling(temperature, seed, top_k=40, top_p=0.95, min_p=0.05):
    """OpenAI parameters + vLLM's top_k/min_p, matching cli_generate's flags."""
    return dict(temperature=temperature, top_p=top_p, seed=seed, extra_body={"top_k": top_k, "min_p": min_p})


class OpenAIClientTest(h.ServerTestCase):
    """Through the official client: the shapes it parses, and the text it gets."""

    def setUp(self):
        self.server = SERVER
        self.model = SERVER.model

    def assert_usage(self, usage, max_tokens, prompt_tokens=None):
        self.assertIsNotNone(usage, "response without usage")
        self.assertGreater(usage.prompt_tokens, 0)
        if prompt_tokens is not None:
            self.assertEqual(usage.prompt_tokens, prompt_tokens, "prompt_tokens differs from pagoda generate's")
        self.assertGreaterEqual(usage.completion_tokens, 1)
        self.assertLessEqual(usage.completion_tokens, max_tokens)
        self.assertEqual(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens)

    def test_models_lists_one_model(self):
        models = CLIENT.models.list()
        ids = [m.id for m in models.data]
        self.assertEqual(len(ids), 1, ids)
        self.assertTrue(ids[0])

    # -- same seed, same text as `pagoda generate` --

    def check_completion_matches_cli(self, max_tokens, temperature, seed):
        expected, prompt_tokens = h.cli_generate(BINARY, COMPLETION_PROMPT, max_tokens, temperature, seed)
        response = CLIENT.completions.create(model=self.model, prompt=COMPLETION_PROMPT, max_tokens=max_tokens,
                                             **sampling(temperature, seed))
        self.assertEqual(response.object, "text_completion")
        self.assertEqual(len(response.choices), 1)
        self.assertEqual(response.choices[0].text, expected)
        self.assertIn(response.choices[0].finish_reason, ("stop", "length"))
        self.assert_usage(response.usage, max_tokens, prompt_tokens)
        if response.choices[0].finish_reason == "length":
            self.assertEqual(response.usage.completion_tokens, max_tokens)

    def test_completion_greedy_matches_cli(self):
        self.check_completion_matches_cli(max_tokens=16, temperature=0.0, seed=0)

    def test_completion_seeded_matches_cli(self):
        self.check_completion_matches_cli(max_tokens=16, temperature=0.8, seed=1234)

    def check_chat_matches_cli(self, max_tokens, temperature, seed):
        expected, prompt_tokens = h.cli_generate(BINARY, chatml(CHAT_MESSAGE), max_tokens, temperature, seed)
        response = CLIENT.chat.completions.create(model=self.model, messages=[{"role": "user", "content": CHAT_MESSAGE}],
                                                  max_tokens=max_tokens, **sampling(temperature, seed))
        self.assertEqual(response.object, "chat.completion")
        self.assertEqual(response.model, self.model)
        self.assertEqual(len(response.choices), 1)
        message = response.choices[0].message
        self.assertEqual(message.role, "assistant")
        self.assertEqual(message.content, expected)
        self.assert_usage(response.usage, max_tokens, prompt_tokens)

    def test_chat_greedy_matches_cli(self):
        self.check_chat_matches_cli(max_tokens=24, temperature=0.0, seed=0)

    def test_chat_seeded_matches_cli(self):
        self.check_chat_matches_cli(max_tokens=24, temperature=0.8, seed=77)

    # -- streaming --

    def test_completion_stream_equals_non_stream(self):
        args = dict(model=self.model, prompt="Once upon a time", max_tokens=20, **sampling(0.8, 5))
        whole = CLIENT.completions.create(**args)
        chunks = list(CLIENT.completions.create(stream=True, stream_options={"include_usage": True}, **args))
        self.assertGreater(len(chunks), 2, "the text came in one chunk")
        usage_chunks = [c for c in chunks if c.usage is not None]
        self.assertEqual(len(usage_chunks), 1)
        self.assertIs(chunks[-1], usage_chunks[0], "the usage chunk is not the last")
        self.assertEqual(chunks[-1].choices, [])
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        self.assertEqual(text, whole.choices[0].text)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finishes, [whole.choices[0].finish_reason])
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)
        self.assertEqual(chunks[-1].usage.total_tokens, whole.usage.total_tokens)

    def test_chat_stream_equals_non_stream(self):
        args = dict(model=self.model, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=20,
                    **sampling(0.0, 0))
        whole = CLIENT.chat.completions.create(**args)
        chunks = list(CLIENT.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
        self.assertEqual(chunks[0].object, "chat.completion.chunk")
        self.assertEqual(len({c.id for c in chunks}), 1, "chunks of one response carry different ids")
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        self.assertGreater(len(pieces), 1, "the text came in one chunk")
        self.assertEqual("".join(pieces), whole.choices[0].message.content)
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finishes, [whole.choices[0].finish_reason])

    def test_stream_without_usage_ends_with_done(self):
        status, headers, body = h.post_json(SERVER, "/v1/completions", {
            "model": self.model, "prompt": "Hello", "max_tokens": 8, "temperature": 0, "stream": True})
        self.assertEqual(status, 200)
        self.assertTrue(headers.get("content-type", "").startswith("text/event-stream"), headers)
        events = h.read_sse(body)
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events.count("[DONE]"), 1)
        for event in events[:-1]:
            chunk = json.loads(event)
            self.assertTrue(chunk["choices"], "a chunk with no choices though include_usage was not asked")
            self.assertIsNone(chunk.get("usage"))

    # -- n, stop, logprobs, finish_reason --

    def test_n2_with_seed_gives_two_choices(self):
        args = dict(model=self.model, prompt="My favourite food is", max_tokens=10, n=2, **sampling(1.0, 42))
        first = CLIENT.completions.create(**args)
        self.assertEqual(sorted(c.index for c in first.choices), [0, 1])
        # Each choice samples with a seed of its own (the same seed twice would give twins).
        self.assertNotEqual(first.choices[0].text, first.choices[1].text)
        again = CLIENT.completions.create(**args)
        self.assertEqual([c.text for c in sorted(first.choices, key=lambda c: c.index)],
                         [c.text for c in sorted(again.choices, key=lambda c: c.index)],
                         "the same seed gave different choices")
        self.assertLessEqual(first.usage.completion_tokens, 2 * 10)
        self.assertEqual(first.usage.total_tokens, first.usage.prompt_tokens + first.usage.completion_tokens)

        chat = CLIENT.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "Say hi."}],
                                              max_tokens=8, n=2, **sampling(1.0, 42))
        self.assertEqual(sorted(c.index for c in chat.choices), [0, 1])
        for choice in chat.choices:
            self.assertEqual(choice.message.role, "assistant")

    def test_beam_search(self):
        """vLLM's extension: the n best of best_of beams, each with its cumulative log-probability."""
        response = CLIENT.completions.create(model=self.model, prompt="The capital of France is", max_tokens=8, n=2,
                                             extra_body={"use_beam_search": True, "best_of": 4})
        choices = sorted(response.choices, key=lambda c: c.index)
        self.assertEqual([c.index for c in choices], [0, 1])
        self.assertIn("Paris", choices[0].text)
        self.assertNotEqual(choices[0].text, choices[1].text)
        extra = [c.model_extra for c in choices]
        self.assertGreaterEqual(extra[0]["beam_score"], extra[1]["beam_score"])
        self.assertLess(extra[0]["cumulative_logprob"], 0)
        # Every beam's tokens: at least the best hypothesis', at most 4 beams x 8 steps.
        self.assertGreaterEqual(response.usage.completion_tokens, 8)
        self.assertLessEqual(response.usage.completion_tokens, 4 * 8)
        chat = CLIENT.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "Say hi."}],
                                              max_tokens=8, extra_body={"use_beam_search": True, "beam_width": 2})
        self.assertEqual(len(chat.choices), 1)
        self.assertIn("cumulative_logprob", chat.choices[0].model_extra)
        with self.assertRaises(openai.BadRequestError) as refused:
            CLIENT.completions.create(model=self.model, prompt="Hi", max_tokens=4, stream=True,
                                      extra_body={"use_beam_search": True, "best_of": 2})
        self.assertIn("streaming is not supported with use_beam_search", str(refused.exception))

    def test_stop_string_cuts_the_text(self):
        args = dict(model=self.model, prompt="1, 2, 3, 4, 5,", max_tokens=24, **sampling(0.0, 0))
        full = CLIENT.completions.create(**args).choices[0].text
        # A stop string from the middle of the text; the reply ends just before its first occurrence.
        cut = next((i for i in range(len(full) // 3, len(full) - 2) if full[i:i + 2].strip()), None)
        self.assertIsNotNone(cut, f"no stop string to pick in {full!r}")
        stop = full[cut:cut + 2]
        expected = full[:full.index(stop)]
        response = CLIENT.completions.create(stop=[stop], **args)
        self.assertEqual(response.choices[0].text, expected, f"stop={stop!r} in {full!r}")
        self.assertEqual(response.choices[0].finish_reason, "stop")
        streamed = "".join(c.choices[0].text for c in CLIENT.completions.create(stop=stop, stream=True, **args)
                           if c.choices)
        self.assertEqual(streamed, expected, "streaming with a stop string")

    def test_completion_logprobs(self):
        response = CLIENT.completions.create(model=self.model, prompt=COMPLETION_PROMPT, max_tokens=8, logprobs=2,
                                             **sampling(0.0, 0))
        logprobs = response.choices[0].logprobs
        self.assertIsNotNone(logprobs)
        self.assertEqual(len(logprobs.tokens), response.usage.completion_tokens)
        self.assertEqual(len(logprobs.token_logprobs), len(logprobs.tokens))
        for value in logprobs.token_logprobs:
            self.assertLessEqual(value, 0.0)
        self.assertEqual(len(logprobs.top_logprobs), len(logprobs.tokens))
        for top, chosen in zip(logprobs.top_logprobs, logprobs.token_logprobs):
            self.assertTrue(1 <= len(top) <= 2, top)
            self.assertTrue(all(v <= 0.0 for v in top.values()))
            self.assertGreaterEqual(chosen, max(top.values()) - 1e-4, "greedy did not pick the most likely token")
        # Streamed, each chunk's text_offset continues where the text already sent ends.
        streamed = [c.choices[0].logprobs for c in CLIENT.completions.create(
            model=self.model, prompt=COMPLETION_PROMPT, max_tokens=8, logprobs=2, stream=True, **sampling(0.0, 0))
            if c.choices and c.choices[0].logprobs]
        self.assertEqual([t for lp in streamed for t in lp.tokens], logprobs.tokens)
        self.assertEqual([o for lp in streamed for o in lp.text_offset], logprobs.text_offset)

    def test_chat_logprobs(self):
        response = CLIENT.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "Hi!"}],
                                                  max_tokens=8, logprobs=True, top_logprobs=3, **sampling(0.0, 0))
        content = response.choices[0].logprobs.content
        self.assertEqual(len(content), response.usage.completion_tokens)
        for entry in content:
            self.assertLessEqual(entry.logprob, 0.0)
            self.assertEqual(len(entry.top_logprobs), 3)
            self.assertEqual([t.logprob for t in entry.top_logprobs],
                             sorted((t.logprob for t in entry.top_logprobs), reverse=True))
            self.assertGreaterEqual(entry.logprob, entry.top_logprobs[0].logprob - 1e-4)
        streamed = [e for c in CLIENT.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "Hi!"}], max_tokens=8, logprobs=True,
            top_logprobs=3, stream=True, **sampling(0.0, 0))
            if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
        self.assertEqual([e.token for e in streamed], [e.token for e in content])

    def test_finish_reason_length(self):
        response = CLIENT.completions.create(model=self.model, prompt="Count: 1 2 3", max_tokens=8,
                                             extra_body={"ignore_eos": True}, temperature=0)
        self.assertEqual(response.choices[0].finish_reason, "length")
        self.assertEqual(response.usage.completion_tokens, 8)
        chat = CLIENT.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "Count to 50."}],
                                              max_tokens=6, extra_body={"ignore_eos": True}, temperature=0)
        self.assertEqual(chat.choices[0].finish_reason, "length")
        self.assertEqual(chat.usage.completion_tokens, 6)

    def test_penalties_and_extras_are_accepted(self):
        response = CLIENT.completions.create(model=self.model, prompt="the the the", max_tokens=8, temperature=0.7,
                                             seed=3, presence_penalty=0.5, frequency_penalty=0.5,
                                             extra_body={"repetition_penalty": 1.1, "top_k": 20, "min_p": 0.1})
        self.assertEqual(len(response.choices), 1)
        self.assertLessEqual(response.usage.completion_tokens, 8)

    def test_metrics(self):
        before = h.metrics(SERVER)
        response = CLIENT.completions.create(model=self.model, prompt="Hi there", max_tokens=5, temperature=0,
                                             extra_body={"ignore_eos": True})
        status, headers, body = h.request(SERVER, "GET", "/metrics")
        self.assertEqual(status, 200)
        self.assertTrue(headers.get("content-type", "").startswith("text/plain"), headers)
        samples = h.parse_metrics(body.decode())

        def delta(name):
            return samples.get(name, 0) - before.get(name, 0)

        # The tests share the server one at a time, so one request moves the counters by exactly its own.
        self.assertEqual(delta('pagoda_requests_total{status="200"}'), 1)
        self.assertEqual(delta("pagoda_prompt_tokens_total"), response.usage.prompt_tokens)
        self.assertEqual(delta("pagoda_generation_tokens_total"), response.usage.completion_tokens)
        self.assertEqual(delta("pagoda_time_to_first_token_seconds_count"), 1)
        self.assertEqual(delta("pagoda_time_per_output_token_seconds_count"), 1)
        self.assertGreaterEqual(samples.get('pagoda_requests_total{status="200"}', 0), 1, body.decode()[:400])
        for name in ("pagoda_prompt_tokens_total", "pagoda_generation_tokens_total"):
            self.assertGreater(samples.get(name, 0), 0, name)
        for name in ("pagoda_queue_length", "pagoda_running_requests", "pagoda_kv_blocks_used",
                     "pagoda_client_disconnects_total"):
            self.assertIn(name, samples)
        self.assertGreater(samples.get("pagoda_kv_blocks_total", 0), 0)
        for histogram in ("pagoda_time_to_first_token_seconds", "pagoda_time_per_output_token_seconds"):
            self.assertGreater(samples.get(histogram + "_count", 0), 0, histogram)
            self.assertIn(histogram + "_sum", samples)
            self.assertEqual(samples.get(histogram + '_bucket{le="+Inf"}'), samples[histogram + "_count"])

    def test_health_and_chat_page(self):
        status, _, body = h.request(SERVER, "GET", "/health")
        self.assertEqual((status, json.loads(body)), (200, {"status": "ok"}))
        status, headers, body = h.request(SERVER, "GET", "/")
        self.assertEqual(status, 200)
        self.assertTrue(headers.get("content-type", "").startswith("text/html"))
        for marker in (b'id="prompt"', b'id="send"', b'id="messages"'):
            self.assertIn(marker, body)


class ErrorTest(h.ServerTestCase):
    """Bad requests, through raw HTTP: the status, OpenAI's error body, and a server that still works."""

    def setUp(self):
        self.server = SERVER
        self.model = SERVER.model

    def assert_error(self, status, body, expected_status, what):
        self.assertEqual(status, expected_status, f"{what}: body {body[:300]!r}")
        try:
            error = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            self.fail(f"{what}: not an OpenAI error body: {body[:300]!r}")
        self.assertIsInstance(error.get("message"), str, what)
        self.assertTrue(error["message"], what)
        self.assertIsInstance(error.get("type"), str, what)
        self.assertIn("param", error, what)
        self.assertIn("code", error, what)
        self.assert_still_serves(what)

    def assert_still_serves(self, what):
        status, _, body = h.post_json(SERVER, "/v1/completions",
                                      {"model": self.model, "prompt": "Hi", "max_tokens": 4, "temperature": 0})
        self.assertEqual(status, 200, f"a normal request after {what}: {body[:300]!r}")
        self.assertEqual(len(json.loads(body)["choices"]), 1)

    def test_malformed_json(self):
        for path in ("/v1/completions", "/v1/chat/completions"):
            for body in (b'{"model": "x", "prompt": ', b"not json", b""):
                status, _, data = h.request(SERVER, "POST", path, body, {"Content-Type": "application/json"})
                self.assert_error(status, data, 400, f"POST {path} {body!r}")

    def test_wrong_types(self):
        cases = [
            ("/v1/completions", {"model": self.model, "prompt": "Hi", "max_tokens": "ten"}),
            ("/v1/completions", {"model": self.model, "prompt": 12.5}),
            ("/v1/completions", {"model": self.model, "prompt": "Hi", "temperature": "hot"}),
            ("/v1/completions", {"model": self.model, "prompt": "Hi", "stream": "yes"}),
            ("/v1/completions", {"model": self.model, "prompt": "Hi", "stop": 5}),
            ("/v1/chat/completions", {"model": self.model, "messages": "hello"}),
            ("/v1/chat/completions", {"model": self.model, "messages": [{"role": "user", "content": 3}]}),
            ("/v1/chat/completions", {"model": self.model}),
            ("/v1/chat/completions", [1, 2, 3]),
        ]
        for path, payload in cases:
            status, _, body = h.post_json(SERVER, path, payload)
            self.assert_error(status, body, 400, f"POST {path} {payload}")

    def test_unknown_model(self):
        for path, payload in (("/v1/completions", {"prompt": "Hi"}),
                              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
            status, _, body = h.post_json(SERVER, path, {"model": "no-such-model", "max_tokens": 4, **payload})
            self.assert_error(status, body, 404, f"POST {path} with an unknown model")

    def context_length(self):
        _, _, body = h.request(SERVER, "GET", "/v1/models")
        entry = json.loads(body)["data"][0]
        for key in ("max_model_len", "context_length", "max_context"):
            if isinstance(entry.get(key), int):
                return entry[key]
        return 8192  # SmolLM2-135M

    def test_prompt_longer_than_context(self):
        context = self.context_length()
        prompt = " pagoda" * (context + 64)  # at least one token each
        status, _, body = h.post_json(SERVER, "/v1/completions", {"model": self.model, "prompt": prompt, "max_tokens": 4})
        self.assert_error(status, body, 400, f"a prompt of > {context} tokens")
        status, _, body = h.post_json(SERVER, "/v1/chat/completions", {
            "model": self.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4})
        self.assert_error(status, body, 400, f"a chat message of > {context} tokens")

    def test_prompt_plus_max_tokens_over_context(self):
        context = self.context_length()
        status, _, body = h.post_json(SERVER, "/v1/completions",
                                      {"model": self.model, "prompt": "Hi", "max_tokens": context})
        self.assert_error(status, body, 400, f"max_tokens {context} on a 1-token prompt")

    def test_negative_max_tokens(self):
        for value in (-1, -100):
            status, _, body = h.post_json(SERVER, "/v1/completions",
                                          {"model": self.model, "prompt": "Hi", "max_tokens": value})
            self.assert_error(status, body, 400, f"max_tokens {value}")
        status, _, body = h.post_json(SERVER, "/v1/chat/completions", {
            "model": self.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": -5})
        self.assert_error(status, body, 400, "chat max_tokens -5")

    def test_oversized_body(self):
        size = MAX_BODY_BYTES + 4096
        prefix = json.dumps({"model": self.model, "max_tokens": 4, "prompt": ""})[:-2]  # ends in '"prompt": '
        body = (prefix + '"' + "a" * (size - len(prefix) - 3) + '"}').encode()
        self.assertEqual(len(body), size)
        status, data = send_large_body(SERVER, "/v1/completions", body)
        self.assert_error(status, data, 413, f"a {size}-byte body over --max-body-bytes {MAX_BODY_BYTES}")

    def test_unknown_path(self):
        for method, path in (("GET", "/v1/nothing"), ("POST", "/v1/engines/x/completions"), ("GET", "/nothing")):
            status, _, body = h.request(SERVER, method, path, b"{}" if method == "POST" else None)
            self.assert_error(status, body, 404, f"{method} {path}")

    def test_cross_origin_post(self):
        payload = {"model": self.model, "prompt": "Hi", "max_tokens": 2}
        status, _, body = h.post_json(SERVER, "/v1/completions", payload, {"Origin": "http://evil.example"})
        self.assert_error(status, body, 403, "a POST from another site's page")
        origin = f"http://{SERVER.host}:{SERVER.port}"  # the chat page's own requests
        status, _, body = h.post_json(SERVER, "/v1/completions", payload, {"Origin": origin})
        self.assertEqual(status, 200, body[:300])

    def test_head(self):
        status, headers, body = h.request(SERVER, "HEAD", "/health")
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(headers.get("content-length"), str(len(b'{"status":"ok"}')))


def send_large_body(server, path, body):
    """POST a body the server may refuse from its headers alone: send the headers, give the server a
    moment to answer (and close) before the body is sent, so its answer is not lost to a reset."""
    sock = socket.create_connection((server.host, server.port), timeout=30)
    try:
        head = (f"POST {path} HTTP/1.1\r\nHost: {server.host}:{server.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        sock.sendall(head)
        sock.settimeout(1.0)
        received = b""
        try:
            received = sock.recv(65536)
        except socket.timeout:
            pass
        sock.settimeout(30)
        if not received:
            try:
                sock.sendall(body)
            except (BrokenPipeError, ConnectionResetError):
                pass
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            received += data
    finally:
        sock.close()
    return parse_raw_response(received)


def parse_raw_response(raw):
    """(status, body) of one HTTP/1.1 response read off a socket (Content-Length or chunked)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/1."):
        raise AssertionError(f"no HTTP response: {raw[:200]!r}")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            body += rest[:size]
            rest = rest[size + 2:]
        return status, body
    if "content-length" in headers:
        return status, rest[:int(headers["content-length"])]
    return status, rest


class DisconnectTest(h.ServerTestCase):
    """A client that goes away cancels its request, and its KV blocks come back."""

    def setUp(self):
        self.server = SERVER
        self.model = SERVER.model

    def open_request(self, payload):
        body = json.dumps(payload).encode()
        sock = socket.create_connection((SERVER.host, SERVER.port), timeout=30)
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: {SERVER.host}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
        return sock

    def wait_idle_after_disconnect(self, before, what):
        samples, ok = h.wait_for_metrics(SERVER, lambda s: s.get("pagoda_kv_blocks_used") == 0 and
                                         s.get("pagoda_client_disconnects_total", 0) > before, timeout=20)
        self.assertTrue(ok, f"{what}: 20 s after the disconnect, kv_blocks_used="
                            f"{samples.get('pagoda_kv_blocks_used')}, client_disconnects_total="
                            f"{samples.get('pagoda_client_disconnects_total')} (was {before})")
        self.assertEqual(samples.get("pagoda_running_requests"), 0, what)
        # Cancelled, not run to the end: far fewer tokens than asked for were generated.
        generated = samples["pagoda_generation_tokens_total"] - self.generated_before
        self.assertLess(generated, self.MAX_TOKENS // 4, f"{what}: {generated} tokens generated after all")

    MAX_TOKENS = 4000

    def long_request(self, stream):
        # Far longer than the test waits: only a cancel can end it in time.
        self.generated_before = h.metrics(SERVER)["pagoda_generation_tokens_total"]
        return {"model": self.model, "prompt": "Tell me a long story about a pagoda.", "max_tokens": self.MAX_TOKENS,
                "temperature": 0, "ignore_eos": True, "stream": stream}

    def test_streaming_client_disconnects(self):
        before = h.metrics(SERVER)["pagoda_client_disconnects_total"]
        sock = self.open_request(self.long_request(stream=True))
        received = b""
        while received.count(b"data: ") < 2:
            data = sock.recv(4096)
            self.assertTrue(data, f"the server closed the stream early: {received!r}")
            received += data
        self.assertTrue(received.startswith(b"HTTP/1.1 200"), received[:100])
        sock.close()
        self.wait_idle_after_disconnect(before, "streaming client closed after 2 chunks")

    def test_non_streaming_client_disconnects(self):
        before = h.metrics(SERVER)["pagoda_client_disconnects_total"]
        sock = self.open_request(self.long_request(stream=False))
        samples, ok = h.wait_for_metrics(SERVER, lambda s: s.get("pagoda_running_requests", 0) >= 1, timeout=10,
                                         interval=0.05)
        time.sleep(0.5)
        sock.close()
        self.wait_idle_after_disconnect(before, "non-streaming client closed after 0.5 s")


class ApiKeyTest(h.ServerTestCase):
    """--api-key: /v1/* need `Authorization: Bearer <key>` (the scheme in any case); /health stays
    open; --metrics-key guards /metrics with a key of its own."""

    @classmethod
    def setUpClass(cls):
        cls.server = h.PagodaServer(BINARY, "--api-key", "sekret", "--metrics-key", "scrape").start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_keys(self):
        server = self.server
        for headers, what in (({}, "no key"), ({"Authorization": "Bearer wrong"}, "wrong key"),
                              ({"Authorization": "Bearer sekre"}, "a prefix of the key"),
                              ({"Authorization": "Bearer sekret2"}, "the key and more"),
                              ({"Authorization": "sekret"}, "the key without Bearer")):
            status, _, body = h.request(server, "GET", "/v1/models", headers=headers)
            self.assertEqual(status, 401, f"GET /v1/models with {what}: {body[:200]!r}")
            self.assertIn("message", json.loads(body)["error"])
            status, _, body = h.request(server, "POST", "/v1/completions",
                                        {"model": "x", "prompt": "Hi", "max_tokens": 4}, headers)
            self.assertEqual(status, 401, f"POST /v1/completions with {what}: {body[:200]!r}")
        status, _, body = h.request(server, "GET", "/health")
        self.assertEqual((status, json.loads(body)), (200, {"status": "ok"}))
        # The scheme is case-insensitive (RFC 9110 11.1), and one or more spaces may follow it.
        for value in ("Bearer sekret", "bearer sekret", "BEARER sekret", "Bearer   sekret"):
            status, _, body = h.request(server, "GET", "/v1/models", headers={"Authorization": value})
            self.assertEqual(status, 200, f"{value!r}: {body[:200]!r}")
        model = json.loads(body)["data"][0]["id"]
        for value in ("Basic sekret", "Bearersekret", "Bearer sekretx", "Bearer"):
            status, _, _ = h.request(server, "GET", "/v1/models", headers={"Authorization": value})
            self.assertEqual(status, 401, value)
        # /metrics takes the metrics key, not the API key.
        for headers, expected in (({}, 401), ({"Authorization": "Bearer sekret"}, 401),
                                  ({"Authorization": "bearer scrape"}, 200)):
            status, _, body = h.request(server, "GET", "/metrics", headers=headers)
            self.assertEqual(status, expected, f"/metrics with {headers}: {body[:200]!r}")
        self.assertIn(b"pagoda_kv_blocks_used", body)

        with self.assertRaises(openai.AuthenticationError):
            make_client(server, "wrong").completions.create(model=model, prompt="Hi", max_tokens=4)
        response = make_client(server, "sekret").chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
        self.assertEqual(len(response.choices), 1)


class QueueLimitTest(h.ServerTestCase):
    """--max-batch 1 --max-queue 1: past one running and one waiting request, 429."""

    @classmethod
    def setUpClass(cls):
        cls.server = h.PagodaServer(BINARY, "--max-batch", 1, "--max-queue", 1).start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_full_queue_gives_429(self):
        server = self.server
        payload = {"model": server.model, "prompt": "Write a list of fruits:", "max_tokens": 32, "temperature": 0,
                   "ignore_eos": True}
        count = 6
        barrier = threading.Barrier(count)

        def one(_):
            barrier.wait()
            return h.post_json(server, "/v1/completions", payload)

        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            results = list(pool.map(one, range(count)))
        statuses = sorted(status for status, _, _ in results)
        self.assertIn(429, statuses, statuses)
        self.assertIn(200, statuses, statuses)
        self.assertEqual(set(statuses), {200, 429}, statuses)
        for status, headers, body in results:
            data = json.loads(body)
            if status == 429:
                error = data["error"]
                self.assertIsInstance(error["message"], str)
                self.assertEqual(error["type"], "rate_limit_error")
                self.assertIn("param", error)
                self.assertIn("code", error)
            else:
                self.assertEqual(data["choices"][0]["finish_reason"], "length")
                self.assertEqual(data["usage"]["completion_tokens"], 32)
        samples, ok = h.wait_for_metrics(server, lambda s: s.get("pagoda_queue_length") == 0 and
                                         s.get("pagoda_running_requests") == 0 and s.get("pagoda_kv_blocks_used") == 0)
        self.assertTrue(ok, samples)
        self.assertEqual(samples.get('pagoda_requests_total{status="429"}'), statuses.count(429))
        status, _, _ = h.post_json(server, "/v1/completions", dict(payload, max_tokens=4))
        self.assertEqual(status, 200, "a request once the queue has emptied")

        # The official client maps the 429 body to its RateLimitError.
        client = make_client(server)
        barrier = threading.Barrier(count)

        def via_client(_):
            barrier.wait()
            try:
                return client.completions.create(model=server.model, prompt=payload["prompt"], max_tokens=32,
                                                 temperature=0, extra_body={"ignore_eos": True})
            except openai.RateLimitError as e:
                return e

        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            outcomes = list(pool.map(via_client, range(count)))
        self.assertTrue(any(isinstance(o, openai.RateLimitError) for o in outcomes), outcomes)
        self.assertTrue(any(not isinstance(o, Exception) for o in outcomes), outcomes)


class SigtermTest(h.ServerTestCase):
    """SIGTERM: no new connections, requests in flight finish, exit 0."""

    def test_drain(self):
        self.server = h.PagodaServer(BINARY)
        server = self.server.start()
        try:
            payload = {"model": server.model, "prompt": "The history of pagodas", "max_tokens": 24,
                       "temperature": 0, "ignore_eos": True}
            results = {}

            def run(name, stream):
                try:
                    results[name] = h.post_json(server, "/v1/completions", dict(payload, stream=stream), timeout=60)
                except Exception as e:  # noqa: BLE001 (reported below)
                    results[name] = e

            threads = [threading.Thread(target=run, args=(name, name == "stream")) for name in ("whole", "stream")]
            for t in threads:
                t.start()
            _, started = h.wait_for_metrics(server, lambda s: s.get("pagoda_running_requests", 0) >= 2,
                                            timeout=20, interval=0.02)
            if not started and not any(t.is_alive() for t in threads):
                self.skipTest("both requests finished before they were seen running: nothing to drain")
            self.assertTrue(started, "the two requests did not start")
            server.terminate()
            sent_at = time.monotonic()
            # While the requests drain, the listening socket is closed: a new client is refused at
            # once rather than left waiting in the backlog.
            refused = False
            while not refused and any(t.is_alive() for t in threads) and time.monotonic() < sent_at + 1:
                refused = h.port_is_closed(server.host, server.port)
                time.sleep(0.05)
            self.assertTrue(refused or not any(t.is_alive() for t in threads),
                            "a new connection was accepted 1 s after SIGTERM, while requests were draining")
            for t in threads:
                t.join(60)
            code = server.wait(30)
            self.assertEqual(code, 0, f"exit code after SIGTERM\n{server.log_tail()}")

            status, _, body = self.result(results, "whole")
            data = json.loads(body)
            self.assertEqual(data["choices"][0]["finish_reason"], "length")
            self.assertEqual(data["usage"]["completion_tokens"], 24)

            status, _, body = self.result(results, "stream")
            events = h.read_sse(body)
            self.assertEqual(events[-1], "[DONE]")
            chunks = [json.loads(e) for e in events[:-1]]
            self.assertEqual([c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0].get("finish_reason")],
                             ["length"])
            self.assertTrue(h.port_is_closed(server.host, server.port), "a connection after exit was accepted")
            print(f"\nSIGTERM drain: exited {time.monotonic() - sent_at:.2f} s after the signal", file=sys.stderr)
        finally:
            server.stop()

    def result(self, results, name):
        result = results.get(name)
        if isinstance(result, Exception) or result is None:
            self.fail(f"the {name} request in flight at SIGTERM failed: {result!r}")
        status, headers, body = result
        self.assertEqual(status, 200, f"{name}: {body[:300]!r}")
        return result


if __name__ == "__main__":
    BINARY = h.binary_from_argv(__doc__)
    unittest.main()

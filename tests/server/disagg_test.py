"""Disaggregated serving end to end: a `pagoda serve --role prefill` and a `--role decode`
process on 127.0.0.1 (the host path: KV pages over TCP), and hostile peers.

    python3 tests/server/disagg_test.py build/pagoda [unittest args]

Checks, on the default model (SmolLM2, greedy):
  - the decode server's outputs equal the colocated server's (the prefill process serves the
    OpenAI API itself from its own engine: today's colocated path), and the KV bytes on the wire
    are exactly the prompt's whole pages (blocks x layers x K,V x page bytes); a repeated prompt
    hits the decode server's prefix cache and sends fewer bytes;
  - with --kv-cache-dtype f16, fp8 or int2 on both sides, the outputs equal the colocated
    server's on the same storage and the bytes on the wire are the pool's pages as stored, int2's
    (with its unsealed V partition in f16) 16.4% of f16's for the same 128 tokens; a decode server
    whose KV storage differs is refused at connect;
  - peers sending random bytes, truncated frames, oversized lengths, another protocol version or
    the wrong key are disconnected with a logged reason, and the servers keep serving;
  - a prefill server that lies about its KV sizes, stalls, or is killed mid-request: the request
    still completes (prefilled locally) with the same output; a restarted prefill server is
    reconnected and used again.
"""
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

BINARY = None
KEY = "disagg-test-key-0123456789"
PEER_LINE = re.compile(r"decode servers connect to 127\.0\.0\.1:(\d+)")
MAGIC, VERSION = b"PGKV", 2
HELLO, CHALLENGE, AUTH, ACCEPT, REFUSE, PREFILL, CANCEL, KV, DONE, FAILED = range(1, 11)
# SmolLM2-135M: 30 layers, 3 KV heads of 64, blocks of 16 tokens; f32 KV on the CPU backend,
# f16 or bf16 on a GPU.
PAGE_BYTES = 16 * 3 * 64 * 4
BLOCK_BYTES_BY_DTYPE = {30 * 2 * PAGE_BYTES: "f32", 30 * 2 * PAGE_BYTES // 2: "f16/bf16"}
LONG_PROMPT = " ".join(f"Item {i} of the inventory is a box of {i * 7 % 13} apples." for i in range(120))


def frame(msg_type, payload, version=VERSION):
    return MAGIC + struct.pack("<HHQ", version, msg_type, len(payload)) + payload


def read_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def read_frame(sock):
    header = read_exact(sock, 16)
    magic, version, msg_type, length = struct.unpack("<4sHHQ", header)
    assert magic == MAGIC and version == VERSION, header
    return msg_type, read_exact(sock, length)


def prove(key, role, decode_nonce, prefill_nonce):
    return hmac.new(key.encode(), role.encode() + b"\0" + decode_nonce + prefill_nonce, hashlib.sha256).digest()


def prefill_server(*args):
    server = h.PagodaServer(BINARY, "--role", "prefill", "--peer-key", KEY, *args).start()
    server.peer_port = int(PEER_LINE.search(server.log_tail(400)).group(1))
    return server


def complete(server, prompt, max_tokens=12):
    status, _, body = h.post_json(server, "/v1/completions",
                                  {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert status == 200, body[:300]
    answer = json.loads(body)
    return answer["choices"][0]["text"], answer["usage"]["prompt_tokens"]


def wait_for_log(server, pattern, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, server.log_tail(400)):
            return True
        time.sleep(0.1)
    return False


class Disaggregated(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.prefill = prefill_server()
        cls.decode = h.PagodaServer(BINARY, "--role", "decode", "--peer-key", KEY, "--prefill-timeout", 20,
                                    "--prefill", f"127.0.0.1:{cls.prefill.peer_port}").start()
        ok = h.wait_for_metrics(cls.decode, lambda m: m.get('pagoda_disagg_peers_connected{role="decode"}') == 1)[1]
        assert ok, cls.decode.log_tail()

    @classmethod
    def tearDownClass(cls):
        cls.decode.stop()
        cls.prefill.stop()

    def sample(self, name, role="decode", server=None):
        return h.metrics(server or self.decode).get(f'{name}{{role="{role}"}}', 0.0)

    def test_a_greedy_outputs_equal_colocated_and_bytes_are_whole_pages(self):
        prompts = ["The capital of France is", "def fibonacci(n):", LONG_PROMPT[:400]]
        block_bytes = None
        for prompt in prompts:
            before = self.sample("pagoda_kv_transfer_bytes_total")
            text, prompt_tokens = complete(self.decode, prompt)
            sent = self.sample("pagoda_kv_transfer_bytes_total") - before
            self.assertEqual(text, complete(self.prefill, prompt)[0], prompt)
            blocks = -(-prompt_tokens // 16)
            block_bytes = block_bytes or sent / blocks
            self.assertIn(block_bytes, BLOCK_BYTES_BY_DTYPE, sent)  # whole pages of the pool's dtype
            self.assertEqual(sent, blocks * block_bytes, prompt)
        # Nothing was prefilled on the decode server, nothing fell back.
        samples = h.metrics(self.decode)
        self.assertEqual(samples["pagoda_prompt_tokens_total"], 0)
        self.assertEqual(samples['pagoda_disagg_fallbacks_total{role="decode",to="local"}'], 0)
        # The same prompt again: its full blocks but the last are in the decode server's cache.
        before = self.sample("pagoda_kv_transfer_bytes_total")
        text, prompt_tokens = complete(self.decode, prompts[2])
        self.assertEqual(text, complete(self.prefill, prompts[2])[0])
        sent = self.sample("pagoda_kv_transfer_bytes_total") - before
        self.assertEqual(sent, (-(-prompt_tokens // 16) - (prompt_tokens - 1) // 16) * block_bytes)
        self.assertGreater(h.metrics(self.decode)["pagoda_prefix_cache_hit_tokens_total"], 0)

    def test_b_hostile_peers_are_disconnected_and_serving_goes_on(self):
        port = self.prefill.peer_port
        cases = {
            "random bytes": os.urandom(4096),
            "truncated frame": frame(HELLO, os.urandom(32))[:30],
            "oversized length": MAGIC + struct.pack("<HHQ", VERSION, PREFILL, 1 << 40),
            "another version": frame(HELLO, os.urandom(32), version=1),
        }
        for name, data in cases.items():
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                # The server may close its side before all of it is sent (it read enough to
                # refuse), and at the latest after the handshake timeout.
                try:
                    sock.sendall(data)
                    sock.shutdown(socket.SHUT_WR)
                    while sock.recv(4096):
                        pass
                except OSError:
                    pass
        for reason in ["not a pagoda KV frame", "closed the connection mid-frame", "control frame of", "protocol version 1"]:
            self.assertTrue(wait_for_log(self.prefill, "disconnected: .*" + reason), self.prefill.log_tail())
        # The wrong key: a proper handshake, a wrong proof; refused with the reason.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            nonce = os.urandom(32)
            sock.sendall(frame(HELLO, nonce))
            msg_type, payload = read_frame(sock)
            self.assertEqual(msg_type, CHALLENGE)
            server_nonce = payload[:32]
            self.assertEqual(payload[32:], prove(KEY, "prefill", nonce, server_nonce))  # it knows the key
            fmt = b"\0" * 4 + struct.pack("<I4iQQ", 0, 30, 16, 3, 64, PAGE_BYTES, 0)
            sock.sendall(frame(AUTH, prove("not-the-key-0123456", "decode", nonce, server_nonce) + fmt))
            msg_type, payload = read_frame(sock)
            self.assertEqual(msg_type, REFUSE)
            self.assertIn(b"wrong peer key", payload)
        self.assertTrue(wait_for_log(self.prefill, "disconnected: wrong peer key"))
        # Both servers still serve, and the decode server still prefills remotely.
        before = self.sample("pagoda_kv_transfer_bytes_total")
        self.assertEqual(complete(self.decode, "Hello there")[0], complete(self.prefill, "Hello there")[0])
        self.assertGreater(self.sample("pagoda_kv_transfer_bytes_total"), before)
        self.assertEqual(self.sample("pagoda_disagg_peers_connected"), 1)

    def test_c_killed_prefill_falls_back_and_a_restart_reconnects(self):
        results = {}
        thread = threading.Thread(target=lambda: results.update(out=complete(self.decode, LONG_PROMPT, 8)))
        thread.start()
        # Kill it while it computes the request.
        self.assertTrue(h.wait_for_metrics(self.prefill, lambda m: m.get('pagoda_disagg_in_flight{role="prefill"}') == 1,
                                           timeout=60, interval=0.05)[1])
        peer_port = self.prefill.peer_port
        self.prefill.kill()
        thread.join(120)
        self.assertIn("out", results, self.decode.log_tail())
        self.assertEqual(h.metrics(self.decode)['pagoda_disagg_fallbacks_total{role="decode",to="local"}'], 1)
        self.assertTrue(wait_for_log(self.decode, "prefilling it here"))
        # A new prefill server on the same port: the decode server reconnects and uses it.
        type(self).prefill = prefill_server("--peer-port", peer_port)
        self.assertTrue(h.wait_for_metrics(self.decode, lambda m: m.get('pagoda_disagg_peers_connected{role="decode"}') == 1,
                                           timeout=30)[1])
        self.assertEqual(results["out"][0], complete(self.prefill, LONG_PROMPT, 8)[0])
        before = self.sample("pagoda_kv_transfer_bytes_total")
        self.assertEqual(complete(self.decode, "Paris is")[0], complete(self.prefill, "Paris is")[0])
        self.assertGreater(self.sample("pagoda_kv_transfer_bytes_total"), before)


class KvStorageOnTheWire(unittest.TestCase):
    """Both sides with --kv-cache-dtype f16, fp8 or int2: pages travel as the pool stores them."""

    LAYERS = 30
    # Bytes of a prompt of n tokens by hand (3 KV heads of 64 a layer): f16 and fp8 in blocks of
    # 16 tokens, a page of 16 x 3 x 64 values (fp8: one byte each, and an f32 scale per token and
    # head); int2 in blocks of 64 (the partition), a page of 2-bit codes and, per partition, an
    # f16 min, an f16 scale and a 1-byte sum, plus the V rows of the unsealed partition in f16.
    EXPECTED = {
        "f16": lambda n: -(-n // 16) * 30 * 2 * (16 * 3 * 64 * 2),
        "fp8": lambda n: -(-n // 16) * 30 * 2 * (16 * 3 * (64 + 4)),
        "int2": lambda n: 30 * (-(-n // 64) * 2 * (3 * 64 * (64 // 4 + 5)) + (n % 64) * 3 * 64 * 2),
    }

    @staticmethod
    def token_prompt(n, seed):
        rng = __import__("random").Random(seed)
        return [rng.randrange(100, 40000) for _ in range(n)]

    def complete_ids(self, server, prompt):
        status, _, body = h.post_json(server, "/v1/completions", {"prompt": prompt, "max_tokens": 10, "temperature": 0})
        self.assertEqual(status, 200, body[:300])
        answer = json.loads(body)
        self.assertEqual(answer["usage"]["prompt_tokens"], len(prompt))
        return answer["choices"][0]["text"]

    def test_outputs_equal_colocated_and_int2_moves_a_sixth_of_f16(self):
        sent_for_128 = {}
        # 128 tokens: whole int2 partitions; 120: a partition of 56 still in the f16 tail, which the
        # decode server fills and seals at its 8th token.
        prompts = {n: self.token_prompt(n, seed) for n, seed in ((128, 1), (120, 2))}
        for dtype in ("f16", "fp8", "int2"):
            # int2 travels in the paper's form: 2-bit keys, no f16 sink tokens (which pages do not carry).
            kv = ["--kv-cache-dtype", dtype] + (["--kv-key-dtype", "int2", "--kv-sink-tokens", "0"] if dtype == "int2" else [])
            with self.subTest(dtype=dtype):
                # The reference: a colocated server that computes each prompt whole, as the prefill
                # server does (a prefix-cache hit would compute it in two chunks, whose rounding
                # differs: int2 turns that into other tokens).
                with h.PagodaServer(BINARY, *kv) as colocated:
                    expected = {n: self.complete_ids(colocated, prompt) for n, prompt in prompts.items()}
                prefill = prefill_server("--peer-port", 0, *kv)
                self.addCleanup(prefill.stop)
                with h.PagodaServer(BINARY, "--role", "decode", "--peer-key", KEY, *kv,
                                    "--prefill", f"127.0.0.1:{prefill.peer_port}") as decode:
                    self.assertTrue(h.wait_for_metrics(
                        decode, lambda m: m.get('pagoda_disagg_peers_connected{role="decode"}') == 1)[1],
                        decode.log_tail())
                    for n, prompt in prompts.items():
                        before = h.metrics(decode).get('pagoda_kv_transfer_bytes_total{role="decode"}', 0)
                        text = self.complete_ids(decode, prompt)
                        sent = h.metrics(decode)['pagoda_kv_transfer_bytes_total{role="decode"}'] - before
                        self.assertEqual(text, expected[n], (dtype, n))
                        self.assertEqual(sent, self.EXPECTED[dtype](n), (dtype, n))
                        if n == 128:
                            sent_for_128[dtype] = sent
                    self.assertEqual(h.metrics(decode)["pagoda_prompt_tokens_total"], 0)  # all prefilled remotely
                if dtype == "int2":  # a decode server storing KV otherwise is refused at connect
                    with h.PagodaServer(BINARY, "--role", "decode", "--peer-key", KEY, "--kv-cache-dtype", "fp8",
                                        "--prefill", f"127.0.0.1:{prefill.peer_port}") as other:
                        self.assertTrue(wait_for_log(other, "KV formats differ: .*quantization int2"), other.log_tail())
                        self.assertTrue(wait_for_log(prefill, "disconnected: KV formats differ"), prefill.log_tail())
                prefill.stop()
        self.assertLessEqual(sent_for_128["int2"], 0.17 * sent_for_128["f16"])
        self.assertEqual(sent_for_128["int2"] * 2048, sent_for_128["f16"] * 336)  # 16.4%


class LyingAndStalledPrefill(unittest.TestCase):
    """A decode server whose only prefill server is a fake that passes the handshake (it holds
    the key) and then lies about the KV sizes, or never answers."""

    def fake_prefill(self, behaviour):
        listener = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(listener.close)
        stop = threading.Event()
        self.addCleanup(stop.set)

        def serve():
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except (socket.timeout, OSError):
                    continue
                with conn:
                    try:
                        msg_type, nonce = read_frame(conn)
                        server_nonce = os.urandom(32)
                        conn.sendall(frame(CHALLENGE, server_nonce + prove(KEY, "prefill", nonce, server_nonce)))
                        msg_type, payload = read_frame(conn)
                        conn.sendall(frame(ACCEPT, payload[32:]))  # the decode server's own format
                        while not stop.is_set():
                            msg_type, payload = read_frame(conn)
                            if msg_type == PREFILL:
                                request_id = struct.unpack_from("<Q", payload)[0]
                                behaviour(conn, request_id)
                    except (ConnectionError, OSError, AssertionError):
                        pass

        threading.Thread(target=serve, daemon=True).start()
        return listener.getsockname()[1]

    def run_against(self, behaviour, reason):
        port = self.fake_prefill(behaviour)
        with h.PagodaServer(BINARY, "--role", "decode", "--peer-key", KEY, "--prefill-timeout", 3,
                            "--prefill", f"127.0.0.1:{port}") as decode:
            self.assertTrue(h.wait_for_metrics(decode, lambda m: m.get('pagoda_disagg_peers_connected{role="decode"}') == 1)[1])
            text, _ = complete(decode, "The capital of France is")
            # The request was prefilled here; its output is the colocated one (openai_client_test
            # checks this prompt's colocated output against `pagoda generate`).
            self.assertEqual(text, LOCAL_REFERENCE)
            self.assertTrue(wait_for_log(decode, reason), decode.log_tail())
            self.assertEqual(h.metrics(decode)['pagoda_disagg_fallbacks_total{role="decode",to="local"}'], 1)

    def test_kv_frame_larger_than_asked_for(self):
        def lie(conn, request_id):
            conn.sendall(MAGIC + struct.pack("<HHQ", VERSION, KV, 20 + (1 << 34)) + struct.pack("<Qiii", request_id, 0, 30, 999))
        self.run_against(lie, "expected")

    def test_done_without_pages(self):
        self.run_against(lambda conn, request_id: conn.sendall(frame(DONE, struct.pack("<Qi", request_id, 42))),
                         "done without its KV pages")

    def test_stalled_prefill_times_out(self):
        self.run_against(lambda conn, request_id: None, "stalled: request")


LOCAL_REFERENCE = None


def setUpModule():
    global LOCAL_REFERENCE
    with h.PagodaServer(BINARY) as colocated:
        LOCAL_REFERENCE = complete(colocated, "The capital of France is")[0]


if __name__ == "__main__":
    BINARY = h.binary_from_argv(__doc__)
    unittest.main()

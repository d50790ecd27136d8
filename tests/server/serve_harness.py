"""Starting, talking to and stopping a `pagoda serve` process, for the tests in tests/server/.

Standard library only. A PagodaServer is started on port 0 (the server picks a free port) and
is ready once it prints `pagoda serve: listening on http://HOST:PORT` on stderr. Its output is
drained by a thread (a full pipe would block the server) and kept, so a failing test can show
the server's last lines.
"""

import collections
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import unittest

LISTENING = re.compile(r"pagoda serve: listening on http://([^\s:/]+|\[[^\]]+\]):(\d+)")
STARTUP_TIMEOUT_S = 120  # the model loads in a few seconds; ctest may run other tests beside us


class ServerError(RuntimeError):
    pass


class PagodaServer:
    """One `pagoda serve` child process. Use as a context manager, or call start() and stop()."""

    def __init__(self, binary, *args, kv_memory_mb=128):
        self.binary = binary
        self.args = ["--host", "127.0.0.1", "--port", "0", "--kv-memory-mb", str(kv_memory_mb), *map(str, args)]
        self.proc = None
        self.host = self.port = None
        self.model = None
        self._lines = collections.deque(maxlen=400)
        self._ready = threading.Event()
        self._reader = None

    # -- lifecycle --

    def start(self, timeout=STARTUP_TIMEOUT_S):
        cmd = [self.binary, "serve", *self.args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None:
                self._reader.join(2)
                raise ServerError(f"{' '.join(cmd)} exited with {self.proc.returncode} before listening:\n"
                                  + self.log_tail())
            if time.monotonic() > deadline:
                self.kill()
                raise ServerError(f"{' '.join(cmd)} did not print its listening line in {timeout} s:\n"
                                  + self.log_tail())
        status, _, body = request(self, "GET", "/v1/models", headers=self.auth_headers())
        if status == 200:
            self.model = json.loads(body)["data"][0]["id"]
        return self

    def _drain(self):
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._lines.append(line)
            match = LISTENING.search(line)
            if match and not self._ready.is_set():
                self.host, self.port = match.group(1).strip("[]"), int(match.group(2))
                self._ready.set()
        self.proc.stdout.close()

    def auth_headers(self):
        if "--api-key" in self.args:
            return {"Authorization": "Bearer " + self.args[self.args.index("--api-key") + 1]}
        return {}

    def metrics_headers(self):
        if "--metrics-key" in self.args:
            return {"Authorization": "Bearer " + self.args[self.args.index("--metrics-key") + 1]}
        return {}

    def log_tail(self, lines=40):
        return "\n".join(list(self._lines)[-lines:])

    def terminate(self):
        """SIGTERM: the server drains and exits by itself."""
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.returncode is not None and self._reader:
                self._reader.join(5)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self._reader:
            self._reader.join(5)

    def stop(self, timeout=30):
        """SIGTERM, then SIGKILL after `timeout` s; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.kill()
        return self.proc.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def base_url(self):
        return f"http://{self.host}:{self.port}"


# -- raw HTTP, so a test sees statuses and bodies exactly as sent --

def request(server, method, path, body=None, headers=None, timeout=120):
    """One request on a fresh connection; returns (status, headers dict (lower-case), body bytes)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        hdrs = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            body = body.encode()
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def post_json(server, path, payload, headers=None, timeout=120):
    hdrs = dict(server.auth_headers())
    hdrs.update(headers or {})
    return request(server, "POST", path, payload, hdrs, timeout)


def read_sse(data):
    """The `data:` payloads of a server-sent-events body, in order ("[DONE]" included, as text)."""
    events = []
    for block in data.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
        payload = [line[5:].lstrip(" ") for line in block.split("\n") if line.startswith("data:")]
        if payload:
            events.append("\n".join(payload))
    return events


# -- /metrics --

METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text):
    """Prometheus text -> {"name" or "name{labels}": float}."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = METRIC_LINE.match(line)
        if match:
            name, labels, value = match.groups()
            samples[name + (labels or "")] = float(value)
    return samples


def metrics(server):
    status, _, body = request(server, "GET", "/metrics", headers=server.metrics_headers(), timeout=30)
    if status != 200:
        raise ServerError(f"GET /metrics answered {status}: {body[:200]!r}")
    return parse_metrics(body.decode())


def wait_for_metrics(server, predicate, timeout=20.0, interval=0.2):
    """Polls /metrics until predicate(samples) holds; returns the last samples and whether it held."""
    deadline = time.monotonic() + timeout
    while True:
        samples = metrics(server)
        if predicate(samples):
            return samples, True
        if time.monotonic() > deadline:
            return samples, False
        time.sleep(interval)


# -- the CLI, for same-seed comparisons --

PREFILL = re.compile(r"\[prefill: (\d+) tokens")


def cli_generate(binary, prompt, max_tokens, temperature, seed, top_k=40, top_p=0.95, min_p=0.05, extra=()):
    """`pagoda generate`: returns (completion text, prompt tokens or None)."""
    cmd = [binary, "generate", "-p", prompt, "-n", str(max_tokens), "--temp", repr(float(temperature)),
           "--top-k", str(top_k), "--top-p", repr(float(top_p)), "--min-p", repr(float(min_p)),
           "-s", str(seed), "--kv-memory-mb", "128", *extra]
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=180)
    if done.returncode != 0:
        raise ServerError(f"{cmd} exited {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}")
    out = done.stdout.decode("utf-8")
    if not out.startswith(prompt) or not out.endswith("\n"):
        raise ServerError(f"pagoda generate printed {out!r}, which is not the prompt + completion + newline")
    match = PREFILL.search(done.stderr.decode(errors="replace"))
    return out[len(prompt):-1], int(match.group(1)) if match else None


def port_is_closed(host, port):
    try:
        with socket.create_connection((host, port), timeout=5):
            return False
    # A reset instead of a refusal: the connection reached the backlog just as the listening
    # socket closed, and the kernel dropped it. Nobody accepted it either way.
    except (ConnectionRefusedError, ConnectionResetError):
        return True


def binary_from_argv(usage):
    """argv[1] is the pagoda binary; the rest goes to unittest."""
    import sys
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(usage)
    binary = os.path.abspath(sys.argv[1])
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary} is not an executable")
    del sys.argv[1]
    return binary


class ServerTestCase(unittest.TestCase):
    """A test case that prints the server's last lines when a test fails."""

    server = None

    def run(self, result=None):
        errors_before = len(result.errors) + len(result.failures) if result else 0
        outcome = super().run(result)
        if result and len(result.errors) + len(result.failures) > errors_before and self.server:
            print(f"\n--- last lines of the server ({self.server.base_url}) ---\n{self.server.log_tail()}\n---")
        return outcome

"""The chat page of `pagoda serve` in headless Chromium: a typed question streams an answer.

    python3 tests/server/browser_test.py build/pagoda [--screenshot PATH]

Starts a server on a free port and Debian's chromium (headless, its own throw-away profile),
drives the page through the DevTools protocol over a WebSocket (websocket-client): types a
message into #prompt, clicks #send, and polls the last `.message.assistant` element. Passes when
its text was seen at two or more different non-empty lengths while data-state was "streaming"
(the answer streamed, not arrived as one blob) and the final text is non-empty. Chromium and the
server are stopped whatever happens.
"""

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

try:
    import websocket  # websocket-client
except ImportError:
    sys.exit("browser_test: the `websocket-client` package is missing; bash scripts/setup.sh installs it")

MESSAGE = "Write one sentence about pagodas."
MAX_TOKENS = 48  # the page's "max tokens" field, lowered from its default to keep the test short
CHROMIUM_START_TIMEOUT_S = 60
ANSWER_TIMEOUT_S = 120


def become_subreaper():
    """Chromium's helpers (crashpad handlers, zygotes) double-fork away from the browser; as a
    child subreaper this process inherits them when they are orphaned and can reap them, rather
    than leave zombies for PID 1."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def child_processes():
    """(pid, name, state) of this process's children, from /proc."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == os.getpid():
            children.append((int(entry), name, fields[0]))
    return children


def reap_chromium_orphans(timeout=10):
    """Waits for (and after a grace period kills) the chromium helpers this process inherited."""
    deadline = time.monotonic() + timeout
    while True:
        left = [(pid, name, state) for pid, name, state in child_processes() if name.startswith("chrom")]
        if not left:
            return
        for pid, name, state in left:
            if state != "Z" and time.monotonic() > deadline - timeout / 2:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if time.monotonic() > deadline:
            print(f"warning: chromium processes left: {left}", file=sys.stderr)
            return
        time.sleep(0.05)


class Chromium:
    """A headless chromium with remote debugging on a port of its own choosing."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="pagoda-chromium-")
        self.log = open(os.path.join(self.profile, "chromium.log"), "wb")
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if not binary:
            raise RuntimeError("chromium is not installed (bash scripts/setup.sh installs it)")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "--no-first-run", "--window-size=1000,800", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.port = self._wait_for_port()

    def _wait_for_port(self):
        path = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + CHROMIUM_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with open(path) as f:
                    lines = f.read().split("\n")
                if lines and lines[0].strip().isdigit():
                    return int(lines[0])
            except FileNotFoundError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"chromium wrote no {path} in {CHROMIUM_START_TIMEOUT_S} s:\n{self.log_tail()}")

    def page_websocket_url(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as response:
            targets = json.load(response)
        pages = [t for t in targets if t.get("type") == "page" and t.get("webSocketDebuggerUrl")]
        if not pages:
            raise RuntimeError(f"chromium has no page target: {targets}")
        return pages[0]["webSocketDebuggerUrl"]

    def log_tail(self, size=3000):
        self.log.flush()
        try:
            with open(self.log.name, "rb") as f:
                return f.read()[-size:].decode("utf-8", "replace")
        except OSError:
            return ""

    def close(self):
        """SIGTERM to the browser, then SIGKILL to its whole process group; reaps the browser."""
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # renderers and helpers left behind, if any
            except (ProcessLookupError, PermissionError):
                pass
            if self.proc.poll() is None:
                self.proc.wait(10)
            reap_chromium_orphans()
        finally:
            self.log.close()
            shutil.rmtree(self.profile, ignore_errors=True)


class DevTools:
    """The DevTools protocol on one page: send a command, wait for its answer (events are skipped)."""

    def __init__(self, url):
        # suppress_origin: Chromium refuses WebSocket clients that send an Origin it does not allow.
        self.ws = websocket.create_connection(url, timeout=30, suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self):
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 (closing anyway)
            pass


LAST_REPLY = """(() => {
  const replies = document.querySelectorAll('#messages .message.assistant');
  if (!replies.length) return null;
  const last = replies[replies.length - 1];
  const errors = Array.from(document.querySelectorAll('#messages .message.error')).map(e => e.textContent);
  return {text: last.textContent, state: last.getAttribute('data-state'), errors: errors};
})()"""


def wait_until(dev, expression, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dev.evaluate(expression):
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def run(binary, screenshot):
    server = chromium = dev = None
    become_subreaper()
    try:
        server = h.PagodaServer(binary).start()
        chromium = Chromium()
        dev = DevTools(chromium.page_websocket_url())
        dev.call("Page.enable")
        dev.call("Runtime.enable")
        dev.call("Page.navigate", url=server.base_url + "/")
        wait_until(dev, "document.readyState === 'complete' && !!document.querySelector('#prompt') && "
                   "!!document.querySelector('#send') && !!document.querySelector('#messages')", 30,
                   "the chat page with #prompt, #send and #messages")
        # The page learns the model id from /v1/models on load. A small max_tokens keeps this short,
        # temperature 0 makes the answer the same every run.
        dev.evaluate(f"""(() => {{
          const max = document.querySelector('#max-tokens');
          if (max) max.value = '{MAX_TOKENS}';
          const temperature = document.querySelector('#temperature');
          if (temperature) temperature.value = '0';  // greedy: the same answer every run
          const prompt = document.querySelector('#prompt');
          prompt.focus();
          prompt.value = {json.dumps(MESSAGE)};
          prompt.dispatchEvent(new Event('input', {{bubbles: true}}));
          document.querySelector('#send').click();
          return true;
        }})()""")

        lengths_while_streaming = set()
        states = []
        reply = None
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while time.monotonic() < deadline:
            reply = dev.evaluate(LAST_REPLY)
            if reply is not None:
                if not states or states[-1] != reply["state"]:
                    states.append(reply["state"])
                if reply["state"] == "done":
                    break
                if reply["state"] == "streaming" and reply["text"]:
                    lengths_while_streaming.add(len(reply["text"]))
            time.sleep(0.02)
        else:
            raise AssertionError(f"no finished reply after {ANSWER_TIMEOUT_S} s; last seen {reply}")

        if screenshot:
            shot = dev.call("Page.captureScreenshot", format="png")
            os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
            import base64
            with open(screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
            print(f"screenshot: {screenshot}")

        text = reply["text"]
        print(f"states: {' -> '.join(states)}; lengths while streaming: {sorted(lengths_while_streaming)}")
        print(f"reply: {text!r}")
        if reply["errors"]:
            raise AssertionError(f"the page shows errors: {reply['errors']}")
        if not text.strip():
            raise AssertionError("the finished reply is empty")
        if "streaming" not in states:
            raise AssertionError(f"data-state was never 'streaming' (states seen: {states})")
        if len(lengths_while_streaming) < 2:
            raise AssertionError(f"the reply did not stream: non-empty lengths seen while streaming: "
                                 f"{sorted(lengths_while_streaming)} (final length {len(text)})")
        print("PASS")
        return 0
    except Exception:
        if server:
            print(f"--- last lines of the server ---\n{server.log_tail()}", file=sys.stderr)
        if chromium:
            print(f"--- last lines of chromium ---\n{chromium.log_tail()}", file=sys.stderr)
        raise
    finally:
        if dev:
            dev.close()
        if chromium:
            chromium.close()
        if server:
            server.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pagoda", help="the pagoda binary")
    parser.add_argument("--screenshot", help="write a PNG of the page with its answer here")
    args = parser.parse_args()
    return run(os.path.abspath(args.pagoda), args.screenshot)


if __name__ == "__main__":
    sys.exit(main())

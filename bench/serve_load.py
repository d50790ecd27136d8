#!/usr/bin/env python3
"""Load test for `pagoda serve`: correctness under concurrency, then throughput and latency.

    python3 bench/serve_load.py --pagoda build/pagoda --requests 500 --concurrency 32 --out result.json
    python3 bench/serve_load.py --url http://127.0.0.1:8000 --requests 40 --concurrency 8

With --pagoda it starts its own server on a free port (extra flags through --server-args) and
stops it with SIGTERM at the end; with --url it uses a running one.

1. Reference: each of a fixed set of short prompts, as a completion and as a chat message, one
   request at a time, greedy (temperature 0), max_tokens --max-tokens.
2. Load: --requests requests from --concurrency clients at once, each a random prompt, chat or
   completion, streaming or not; a --disconnect-fraction of them closes its connection at a
   random point (after k stream chunks, or after a random delay when not streaming).
3. Checks: every completed response equals its reference exactly (text, finish_reason,
   completion_tokens); no error other than the intended disconnects; afterwards /metrics shows
   pagoda_kv_blocks_used, pagoda_running_requests and pagoda_queue_length at 0.

Prints a table and, with --out, writes JSON (machine, command line, git commit, config,
figures). Exits 1 when any check fails.
"""

import argparse
import asyncio
import collections
import json
import os
import platform
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

try:
    import httpx
except ImportError:  # newer openai releases bring httpx under the name httpx2
    import httpx2 as httpx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three primary colors:",
    "What is a pagoda?",
    "Explain gravity to a child.",
    "The quick brown fox",
    "Give me a name for a cat.",
    "1, 2, 3, 4,",
]
KINDS = ("completion", "chat")
PATHS = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}
LISTENING = re.compile(r"pagoda serve: listening on (http://\S+)")


# ---------------------------------------------------------------------------------------------
# The server, when we start it

class Server:
    def __init__(self, binary, extra_args):
        self.cmd = [binary, "serve", "--host", "127.0.0.1", "--port", "0", *extra_args]
        self.proc = None
        self.url = None
        self.lines = collections.deque(maxlen=200)
        self.ready = threading.Event()

    def start(self, timeout=120):
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise SystemExit(f"serve_load: {shlex.join(self.cmd)} did not start:\n" + "\n".join(self.lines))
        return self.url

    def _drain(self):
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            match = LISTENING.search(line)
            if match and not self.ready.is_set():
                self.url = match.group(1)
                self.ready.set()

    def stop(self, timeout=30):
        """SIGTERM and wait; returns the exit code (None if it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        return self.proc.returncode

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


# ---------------------------------------------------------------------------------------------
# Requests

def payload(model, kind, prompt, max_tokens, stream):
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "seed": 0}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def parse_whole(kind, data):
    choice = data["choices"][0]
    text = choice["message"]["content"] if kind == "chat" else choice["text"]
    return {"text": text, "finish_reason": choice["finish_reason"],
            "completion_tokens": data["usage"]["completion_tokens"], "prompt_tokens": data["usage"]["prompt_tokens"]}


class StreamState:
    """What a stream has delivered so far."""

    def __init__(self, kind):
        self.kind = kind
        self.pieces = []
        self.chunks = 0  # chunks with choices
        self.finish_reason = None
        self.usage = None
        self.done = False
        self.first_text_at = None

    def feed(self, line, now):
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        if self.done:
            raise ValueError("data after [DONE]")
        chunk = json.loads(data)
        if "error" in chunk:
            raise ValueError(f"error event in the stream: {chunk['error']}")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if not chunk.get("choices"):
            return
        self.chunks += 1
        choice = chunk["choices"][0]
        text = (choice.get("delta") or {}).get("content") if self.kind == "chat" else choice.get("text")
        if text:
            if self.first_text_at is None:
                self.first_text_at = now
            self.pieces.append(text)
        if choice.get("finish_reason"):
            if self.finish_reason:
                raise ValueError("two finish_reasons in one stream")
            self.finish_reason = choice["finish_reason"]

    def result(self):
        if not self.done:
            raise ValueError("the stream ended without [DONE]")
        if self.usage is None:
            raise ValueError("no usage chunk though include_usage was asked")
        return {"text": "".join(self.pieces), "finish_reason": self.finish_reason,
                "completion_tokens": self.usage["completion_tokens"], "prompt_tokens": self.usage["prompt_tokens"]}


async def run_one(client, base, headers, job, model, max_tokens):
    """One request of the load; returns a record (outcome: completed | disconnected | error)."""
    kind, prompt, stream = job["kind"], PROMPTS[job["prompt"]], job["stream"]
    body = payload(model, kind, prompt, max_tokens, stream)
    record = dict(job, outcome=None, latency=None, ttft=None, result=None, error=None)
    start = time.perf_counter()
    disconnect = job["disconnect"]
    # A disconnecting client gets a connection of its own, so closing it closes exactly that TCP
    # connection (the pool would otherwise keep or reuse connections behind our back).
    own = httpx.AsyncClient(timeout=client.timeout, trust_env=False) if disconnect else None
    http = own or client
    try:
        if stream:
            state = StreamState(kind)
            async with http.stream("POST", base + PATHS[kind], json=body, headers=headers) as response:
                if response.status_code != 200:
                    record.update(outcome="error", error=f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
                    return record
                async for line in response.aiter_lines():
                    state.feed(line, time.perf_counter())
                    if disconnect and state.chunks >= job["disconnect_after_chunks"] and not state.done:
                        record.update(outcome="disconnected", chunks_seen=state.chunks)
                        return record  # leaving the block closes the response and its connection
            record["result"] = state.result()
            if state.first_text_at is not None:
                record["ttft"] = state.first_text_at - start
        else:
            task = asyncio.ensure_future(http.post(base + PATHS[kind], json=body, headers=headers))
            if disconnect:
                done, _ = await asyncio.wait({task}, timeout=job["disconnect_after_s"])
                if not done:
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    record.update(outcome="disconnected")
                    return record
            response = await task
            if response.status_code != 200:
                record.update(outcome="error", error=f"HTTP {response.status_code}: {response.content[:300]!r}")
                return record
            record["result"] = parse_whole(kind, response.json())
        record.update(outcome="completed", latency=time.perf_counter() - start)
        return record
    except Exception as e:  # noqa: BLE001 (every failure is reported)
        record.update(outcome="error", error=f"{type(e).__name__}: {e}")
        return record
    finally:
        if own is not None:
            await own.aclose()


def make_jobs(count, fraction, max_tokens, nonstream_delay_s, seed):
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        stream = rng.random() < 0.5
        job = {"index": i, "prompt": rng.randrange(len(PROMPTS)), "kind": rng.choice(KINDS), "stream": stream,
               "disconnect": rng.random() < fraction}
        if job["disconnect"]:
            if stream:
                job["disconnect_after_chunks"] = rng.randint(1, max(1, max_tokens // 2))
            else:
                job["disconnect_after_s"] = round(rng.uniform(0.05, nonstream_delay_s), 3)
        jobs.append(job)
    return jobs


async def load_phase(base, headers, model, jobs, concurrency, max_tokens, timeout):
    queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    records = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        async def worker():
            while not queue.empty():
                job = queue.get_nowait()
                records.append(await run_one(client, base, headers, job, model, max_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return sorted(records, key=lambda r: r["index"]), wall


# ---------------------------------------------------------------------------------------------
# Metrics, figures, report

def parse_metrics(text):
    samples = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if match and not line.startswith("#"):
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def get_metrics(base, headers):
    response = httpx.get(base + "/metrics", headers=headers, timeout=30, trust_env=False)
    response.raise_for_status()
    return parse_metrics(response.text)


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    position = (len(values) - 1) * q
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def machine():
    info = {"platform": platform.platform(), "python": platform.python_version()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        info["cpu_model"] = fields.get("Model name", "").strip()
        info["cpus"] = int(fields.get("CPU(s)", "0").strip() or 0)
        sockets = int(fields.get("Socket(s)", "1").strip() or 1)
        info["cores"] = int(fields.get("Core(s) per socket", "0").strip() or 0) * sockets
    except (OSError, ValueError, subprocess.SubprocessError):
        info["cores"] = os.cpu_count()
    return info


def git_commit():
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True,
                              timeout=10)
        return done.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def fmt_s(value):
    return "-" if value is None else f"{value:.3f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--pagoda", metavar="BIN", help="start this pagoda binary's server")
    target.add_argument("--url", help="use the server running at this URL (http://HOST:PORT)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--disconnect-fraction", type=float, default=0.1)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random workload")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--server-args", default="", help="extra flags for `pagoda serve` (with --pagoda)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one request may take")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    if args.requests < 1 or args.concurrency < 1 or not 0 <= args.disconnect_fraction <= 1 or args.max_tokens < 1:
        parser.error("--requests, --concurrency and --max-tokens must be >= 1, --disconnect-fraction in [0, 1]")

    server = None
    if args.pagoda:
        server = Server(os.path.abspath(args.pagoda), shlex.split(args.server_args))
        base = server.start()
    else:
        base = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    failures = []
    try:
        report = run(args, base, headers, failures)
    except BaseException:
        if server:
            server.kill()
            print("--- server output ---\n" + "\n".join(server.lines), file=sys.stderr)
        raise
    if server:
        code = server.stop()
        report["server_exit_code"] = code
        if code != 0:
            failures.append(f"the server exited with {code} after SIGTERM (expected 0)")
        if failures:
            print("--- last lines of the server ---\n" + "\n".join(list(server.lines)[-30:]), file=sys.stderr)
    report["failures"] = failures
    report["passed"] = not failures
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
        print(f"wrote {args.out}")
    if failures:
        print(f"\nFAILED: {len(failures)} check(s)", file=sys.stderr)
        for failure in failures[:50]:
            print("  " + failure, file=sys.stderr)
        return 1
    print("\nall checks passed")
    return 0


def run(args, base, headers, failures):
    models = httpx.get(base + "/v1/models", headers=headers, timeout=30, trust_env=False)
    if models.status_code != 200:
        raise SystemExit(f"serve_load: GET {base}/v1/models answered {models.status_code}: {models.text[:300]}")
    model = models.json()["data"][0]["id"]

    # 1. References, one request at a time.
    references = {}
    reference_seconds = []
    with httpx.Client(timeout=args.timeout, trust_env=False) as client:
        for kind in KINDS:
            for i, prompt in enumerate(PROMPTS):
                start = time.perf_counter()
                response = client.post(base + PATHS[kind], json=payload(model, kind, prompt, args.max_tokens, False),
                                       headers=headers)
                reference_seconds.append(time.perf_counter() - start)
                if response.status_code != 200:
                    raise SystemExit(f"serve_load: reference {kind} {prompt!r}: HTTP {response.status_code} "
                                     f"{response.text[:300]}")
                references[(kind, i)] = parse_whole(kind, response.json())
    mean_reference_s = sum(reference_seconds) / len(reference_seconds)

    # 2. Load.
    load_average_before = os.getloadavg()  # other work on the machine skews the figures: record it
    before = get_metrics(base, headers)
    jobs = make_jobs(args.requests, args.disconnect_fraction, args.max_tokens,
                     nonstream_delay_s=max(0.2, 2 * mean_reference_s), seed=args.seed)
    records, wall = asyncio.run(load_phase(base, headers, model, jobs, args.concurrency, args.max_tokens,
                                           args.timeout))

    # 3. Checks.
    completed = [r for r in records if r["outcome"] == "completed"]
    disconnected = [r for r in records if r["outcome"] == "disconnected"]
    errors = [r for r in records if r["outcome"] == "error"]
    for r in errors:
        failures.append(f"request {r['index']} ({r['kind']}, {'stream' if r['stream'] else 'whole'}, "
                        f"prompt {r['prompt']}): {r['error']}")
    mismatches = 0
    for r in completed:
        reference = references[(r["kind"], r["prompt"])]
        got = r["result"]
        different = [k for k in ("text", "finish_reason", "completion_tokens", "prompt_tokens") if got[k] != reference[k]]
        if different:
            mismatches += 1
            failures.append(f"request {r['index']} ({r['kind']}, {'stream' if r['stream'] else 'whole'}, prompt "
                            f"{r['prompt']}) differs from its reference in {different}: got "
                            f"{ {k: got[k] for k in different} }, expected { {k: reference[k] for k in different} }")

    idle = ("pagoda_kv_blocks_used", "pagoda_running_requests", "pagoda_queue_length")
    deadline = time.monotonic() + 30
    while True:
        after = get_metrics(base, headers)
        if all(after.get(name) == 0 for name in idle) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    for name in idle:
        if after.get(name) != 0:
            failures.append(f"{name} is {after.get(name)} 30 s after the load ended (expected 0)")

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    latencies = [r["latency"] for r in completed]
    ttfts = [r["ttft"] for r in completed if r["stream"] and r["ttft"] is not None]
    output_tokens = sum(r["result"]["completion_tokens"] for r in completed)
    figures = {
        "wall_seconds": wall,
        "requests_per_second": len(completed) / wall,
        "output_tokens_per_second": output_tokens / wall,
        "output_tokens": output_tokens,
        "latency_p50_s": percentile(latencies, 0.5),
        "latency_p99_s": percentile(latencies, 0.99),
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "reference_latency_mean_s": mean_reference_s,
    }
    counts = {
        "requests": len(records),
        "completed": len(completed),
        "completed_streaming": sum(1 for r in completed if r["stream"]),
        "completed_chat": sum(1 for r in completed if r["kind"] == "chat"),
        "disconnect_planned": sum(1 for r in records if r["disconnect"]),
        "disconnected": len(disconnected),
        "disconnect_too_late": sum(1 for r in completed if r["disconnect"]),  # finished before the client left
        "errors": len(errors),
        "mismatches": mismatches,
        "server_client_disconnects": delta("pagoda_client_disconnects_total"),
        "server_generation_tokens": delta("pagoda_generation_tokens_total"),
        "server_prompt_tokens": delta("pagoda_prompt_tokens_total"),
        "server_requests_by_status": {k[len('pagoda_requests_total{status="'):-2]: delta(k)
                                      for k in after if k.startswith("pagoda_requests_total{") and delta(k)},
    }

    rows = [
        ("requests (completed / disconnected / errors)",
         f"{len(records)} ({len(completed)} / {len(disconnected)} / {len(errors)})"),
        ("mismatches with the reference", str(mismatches)),
        ("concurrency", str(args.concurrency)),
        ("max_tokens", str(args.max_tokens)),
        ("wall time (s)", f"{wall:.2f}"),
        ("requests/s", f"{figures['requests_per_second']:.2f}"),
        ("output tokens/s", f"{figures['output_tokens_per_second']:.1f}"),
        ("latency p50 / p99 (s)", f"{fmt_s(figures['latency_p50_s'])} / {fmt_s(figures['latency_p99_s'])}"),
        ("TTFT p50 / p99 (s, streaming)", f"{fmt_s(figures['ttft_p50_s'])} / {fmt_s(figures['ttft_p99_s'])}"),
        ("batch-1 latency, mean (s)", f"{mean_reference_s:.3f}"),
        ("server: client disconnects", f"{counts['server_client_disconnects']:.0f}"),
        ("server: KV blocks used / running / queued at the end",
         " / ".join(f"{after.get(n, float('nan')):.0f}" for n in idle)),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"\npagoda serve load: {base}, model {model}")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")

    return {
        "benchmark": "serve_load",
        "machine": dict(machine(), load_average_before=[round(x, 2) for x in load_average_before],
                        load_average_after=[round(x, 2) for x in os.getloadavg()]),
        "command": shlex.join([sys.executable, *sys.argv]),
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "server": base if args.url else f"{args.pagoda} serve {args.server_args}".strip(),
        "model": model,
        "config": {"requests": args.requests, "concurrency": args.concurrency,
                   "disconnect_fraction": args.disconnect_fraction, "max_tokens": args.max_tokens,
                   "seed": args.seed, "prompts": PROMPTS, "temperature": 0},
        "figures": figures,
        "counts": counts,
    }


if __name__ == "__main__":
    sys.exit(main())

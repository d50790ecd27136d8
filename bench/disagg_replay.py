#!/usr/bin/env python3
"""Replays a Mooncake-format trace against a colocated and a disaggregated `pagoda serve`
deployment, one after the other on the same machine, and reports TTFT, TPOT, JCT and the KV
bytes moved side by side (docs/disaggregation.md).

    python3 bench/disagg_replay.py --pagoda build/pagoda --trace trace.jsonl --max-requests 50 \\
        --out result.json --md result.md [--server-args "--kv-memory-mb 4096"]
    python3 bench/disagg_replay.py --pagoda build/pagoda --synthetic 12 ...   # a generated trace

The trace is one JSON object per line: {"timestamp": ms, "input_length": tokens,
"output_length": tokens, "hash_ids": [...]}, each hash id naming one 512-token block
(--length-scale shrinks blocks and lengths alike), so requests whose hash ids start alike share
a prompt prefix. Every hash id becomes the same block of token ids wherever it appears. Requests
are sent at their (scaled) arrival times, streamed, greedy, with ignore_eos so that each
generates exactly its output length.

Colocated: one `pagoda serve`. Disaggregated: `--role prefill` and `--role decode` processes
(--prefill-servers of them), started by this script on 127.0.0.1. With --kv-dtypes f16,int2 both
deployments run once per KV storage (`--kv-cache-dtype` on every server), so that the bytes each
moves sit side by side. Or give running servers: --colocated HOST:PORT --decode HOST:PORT (the
decode server's prefill servers are its own affair). Bytes moved and transfer time come from the
decode server's /metrics; the bound they are measured against is this machine's loopback TCP
bandwidth, measured here (bytes / bandwidth = the least time the bytes can take).
"""

import argparse
import json
import os
import random
import re
import shlex
import socket
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "server"))
sys.path.insert(0, os.path.join(REPO, "bench"))
import serve_harness as h  # noqa: E402
from serve_load import git_commit, machine, percentile  # noqa: E402

KEY = "disagg-replay-" + os.urandom(8).hex()
PEER_LINE = re.compile(r"decode servers connect to 127\.0\.0\.1:(\d+)")


def load_trace(args):
    if args.synthetic:
        rng = random.Random(args.seed)
        entries, next_hash = [], 0
        shared = [list(range(i * 4, i * 4 + 2)) for i in range(3)]  # three 2-block shared prefixes
        next_hash = 100
        for i in range(args.synthetic):
            blocks = rng.randint(2, 4)
            prefix = shared[rng.randrange(3)] if rng.random() < 0.5 else []
            own = list(range(next_hash, next_hash + blocks - len(prefix)))
            next_hash += len(own)
            entries.append({"timestamp": i * 1000.0, "input_length": blocks * 512 - rng.randint(0, 200),
                            "output_length": rng.choice([16, 32, 64]), "hash_ids": prefix + own})
        return entries
    with open(args.trace) as f:
        return [json.loads(line) for line in f if line.strip()]


def scaled_requests(entries, args):
    block = max(1, int(512 * args.length_scale))
    requests = []
    for e in entries[: args.max_requests or None]:
        n = max(1, int(e["input_length"] * args.length_scale))
        if args.max_input:
            n = min(n, args.max_input)
        out = max(1, int(e["output_length"] * (args.output_scale or args.length_scale)))
        if args.max_output:
            out = min(out, args.max_output)
        tokens = []
        for hash_id in e["hash_ids"]:
            rng = random.Random(hash_id * 7919 + args.seed)
            tokens += [rng.randrange(100, 40000) for _ in range(block)]
            if len(tokens) >= n:
                break
        tokens += [random.Random(len(requests)).randrange(100, 40000) for _ in range(n - len(tokens))]
        requests.append({"arrival": e["timestamp"] / 1000 * args.time_scale, "prompt": tokens[:n], "max_tokens": out})
    return requests


def one_request(server, request, start, out):
    time.sleep(max(0.0, start + request["arrival"] - time.monotonic()))
    sent = time.monotonic()
    import http.client
    conn = http.client.HTTPConnection(server.host, server.port, timeout=3600)
    body = json.dumps({"prompt": request["prompt"], "max_tokens": request["max_tokens"], "temperature": 0,
                       "ignore_eos": True, "stream": True})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    first = last = None
    for line in response:
        if line.startswith(b"data:") and b'"text"' in line:
            last = time.monotonic()
            first = first or last
    conn.close()
    out.update(status=response.status, ttft=first - sent if first else None, jct=(last or time.monotonic()) - sent,
               tpot=(last - first) / (request["max_tokens"] - 1) if first and request["max_tokens"] > 1 else None)


def replay(server, requests):
    results = [{} for _ in requests]
    start = time.monotonic() + 0.5
    threads = [threading.Thread(target=one_request, args=(server, r, start, out)) for r, out in zip(requests, results)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    failed = [r for r in results if r.get("status") != 200]
    if failed:
        sys.exit(f"disagg_replay: {len(failed)} requests failed: {failed[:3]}")
    summary = {"wall_s": wall, "requests": len(results),
               "output_tokens_per_s": sum(r["max_tokens"] for r in requests) / wall}
    for key in ("ttft", "tpot", "jct"):
        values = sorted(r[key] for r in results if r[key] is not None)
        summary[key] = {"mean": sum(values) / len(values), "p50": percentile(values, 0.5), "p90": percentile(values, 0.9)}
    return summary


def loopback_bandwidth(megabytes=256):
    """Bytes per second through one 127.0.0.1 TCP connection (the host path's medium)."""
    listener = socket.create_server(("127.0.0.1", 0))
    chunk = b"\0" * (4 << 20)
    received = [0]

    def drain():
        conn, _ = listener.accept()
        with conn:
            while data := conn.recv(1 << 20):
                received[0] += len(data)

    t = threading.Thread(target=drain)
    t.start()
    with socket.create_connection(listener.getsockname()) as s:
        begin = time.monotonic()
        for _ in range(megabytes // 4):
            s.sendall(chunk)
    t.join()
    elapsed = time.monotonic() - begin
    listener.close()
    return received[0] / elapsed


def kv_metrics(server):
    m = h.metrics(server)
    return {"bytes": m.get('pagoda_kv_transfer_bytes_total{role="decode"}', 0.0),
            "tokens": m.get('pagoda_kv_transfer_tokens_total{role="decode"}', 0.0),
            "seconds": m.get("pagoda_kv_transfer_seconds_sum", 0.0),
            "fallbacks": m.get('pagoda_disagg_fallbacks_total{role="decode",to="local"}', 0.0),
            "prefix_hit_tokens": m.get("pagoda_prefix_cache_hit_tokens_total", 0.0)}


class Running:
    """A server this script did not start, at HOST:PORT (the harness's request helpers need only these)."""

    def __init__(self, address):
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.args = []

    def auth_headers(self):
        return {}

    def metrics_headers(self):
        return {}


def replay_disaggregated(decode, requests):
    before = kv_metrics(decode)
    result = replay(decode, requests)
    after = kv_metrics(decode)
    return result, {k: after[k] - before[k] for k in after}


def run_deployments(binary, extra, requests, prefill_servers):
    """Colocated, then disaggregated, on servers started here; returns both results and the KV moved."""
    with h.PagodaServer(binary, *extra) as colocated:
        colocated_result = replay(colocated, requests)
    prefills = []
    try:
        for _ in range(prefill_servers):
            p = h.PagodaServer(binary, "--role", "prefill", "--peer-port", 0, "--peer-key", KEY, *extra).start()
            p.peer_port = int(PEER_LINE.search(p.log_tail(400)).group(1))
            prefills.append(p)
        peers = [a for p in prefills for a in ("--prefill", f"127.0.0.1:{p.peer_port}")]
        with h.PagodaServer(binary, "--role", "decode", "--peer-key", KEY, *peers, *extra) as decode:
            ok = h.wait_for_metrics(decode, lambda m: m.get('pagoda_disagg_peers_connected{role="decode"}') == len(prefills))[1]
            if not ok:
                sys.exit("disagg_replay: the decode server did not connect to its prefill servers")
            disagg_result, moved = replay_disaggregated(decode, requests)
    finally:
        for p in prefills:
            p.stop()
    return colocated_result, disagg_result, moved


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pagoda", help="the binary (needed unless --colocated and --decode are given)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace")
    source.add_argument("--synthetic", type=int, help="generate this many requests instead")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--length-scale", type=float, default=1.0)
    parser.add_argument("--output-scale", type=float, default=0.0)
    parser.add_argument("--max-requests", type=int, default=0)
    parser.add_argument("--max-input", type=int, default=0)
    parser.add_argument("--max-output", type=int, default=0)
    parser.add_argument("--prefill-servers", type=int, default=1)
    parser.add_argument("--kv-dtypes", default="", help="comma-separated --kv-cache-dtype values, one run of both "
                        "deployments each (default: the servers' default)")
    parser.add_argument("--colocated", help="HOST:PORT of a running colocated server (with --decode)")
    parser.add_argument("--decode", help="HOST:PORT of a running decode server (with --colocated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-args", default="", help="extra flags for every server")
    parser.add_argument("--out")
    parser.add_argument("--md")
    args = parser.parse_args()
    if bool(args.colocated) != bool(args.decode):
        parser.error("--colocated and --decode go together")
    if not args.colocated and not args.pagoda:
        parser.error("--pagoda is needed to start the servers")
    requests = scaled_requests(load_trace(args), args)

    runs = []  # (label, colocated result, disaggregated result, KV moved)
    if args.colocated:
        colocated_result = replay(Running(args.colocated), requests)
        disagg_result, moved = replay_disaggregated(Running(args.decode), requests)
        runs.append(("given servers", colocated_result, disagg_result, moved))
    else:
        binary = os.path.abspath(args.pagoda)
        extra = shlex.split(args.server_args)
        for dtype in [d for d in args.kv_dtypes.split(",") if d] or [""]:
            flags = extra + (["--kv-cache-dtype", dtype] if dtype else [])
            runs.append((f"KV {dtype or 'default'}", *run_deployments(binary, flags, requests, args.prefill_servers)))

    bandwidth = loopback_bandwidth()
    for _, _, _, moved in runs:
        moved["bytes_per_token"] = moved["bytes"] / moved["tokens"] if moved["tokens"] else None
        moved["loopback_bytes_per_s"] = bandwidth
        moved["bound_s"] = moved["bytes"] / bandwidth
        moved["seconds_over_bound"] = moved["seconds"] / moved["bound_s"] if moved["bound_s"] else None
    report = {"machine": machine(), "commit": git_commit(), "command": " ".join(map(shlex.quote, sys.argv)),
              "requests": len(requests), "prompt_tokens": sum(len(r["prompt"]) for r in requests),
              "output_tokens": sum(r["max_tokens"] for r in requests), "prefill_servers": args.prefill_servers,
              "runs": [{"label": label, "colocated": c, "disaggregated": d, "kv_moved": m} for label, c, d, m in runs]}
    lines = [
        f"# Disaggregated vs colocated replay ({len(requests)} requests, {report['prompt_tokens']} prompt tokens, "
        f"{report['output_tokens']} output tokens, {args.prefill_servers} prefill server(s))", "",
        "| KV | deployment | TTFT mean / p90 (s) | TPOT mean / p90 (s) | JCT mean / p90 (s) | output tok/s "
        "| KV moved (MB) | KB/token | wire s / bound s |",
        "|---|---|---|---|---|---|---|---|---|"]
    for label, colocated_result, disagg_result, moved in runs:
        for name, r in (("colocated", colocated_result), ("disaggregated", disagg_result)):
            kv = ("| - | - | - |" if name == "colocated" else
                  f"| {moved['bytes'] / 1e6:.1f} | {(moved['bytes_per_token'] or 0) / 1e3:.1f} | "
                  f"{moved['seconds']:.3f} / {moved['bound_s']:.3f} |")
            lines.append(f"| {label} | {name} | {r['ttft']['mean']:.3f} / {r['ttft']['p90']:.3f} | "
                         f"{r['tpot']['mean']:.4f} / {r['tpot']['p90']:.4f} | {r['jct']['mean']:.3f} / "
                         f"{r['jct']['p90']:.3f} | {r['output_tokens_per_s']:.1f} {kv}")
    lines += ["", f"KV moved: whole pages of the decode server's KV storage, prompt tokens not in its prefix cache; "
              f"the wire time (reading the pages off the socket, summed over frames and requests) against bytes / the measured loopback "
              f"bandwidth {bandwidth / 1e9:.2f} GB/s. Local fallbacks: "
              + ", ".join(f"{label} {int(m['fallbacks'])}" for label, _, _, m in runs) + "; decode-side prefix-cache "
              "hits: " + ", ".join(f"{label} {int(m['prefix_hit_tokens'])} tokens" for label, _, _, m in runs) + ".", ""]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    if args.md:
        with open(args.md, "w") as f:
            f.write("\n".join(lines))


if __name__ == "__main__":
    main()

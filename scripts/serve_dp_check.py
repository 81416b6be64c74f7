#!/usr/bin/env python3
"""`corolla serve --dp 2 --ep 2` against one process, over HTTP (issue 6).

Starts `corolla serve` once as one process and once with --dp 2 --ep 2 (the launcher starts the
ranks), sends both the same concurrent requests (token-id greedy completions on the qwen3-moe
fixture, text / chat / logprobs / n=3 / stop strings / streaming on the demo model), compares the
answers, cancels a long stream by closing its connection, checks the DP server is idle again
and still answers, then SIGTERMs both and checks they exit 0. On the CPU the token ids must be
identical; on CUDA (bf16: a request's batch differs between the two servers) it reports how many
leading tokens agree and fails only on HTTP errors, a hung cancel or a bad exit.

  python3 scripts/serve_dp_check.py --bin build/corolla --device cpu           # here
  python3 scripts/serve_dp_check.py --bin mgpu-bundle/corolla --device cuda    # 2 x H200

--dp-args='FLAGS' adds flags to the DP server only: --dp-args='--ep-capacity 16' on the CPU takes
the fixed-capacity exchange in decode rounds (CUDA's default, where those rounds also replay
decode graphs), --dp-args='--ep-capacity 0' the sized exchange in every round (no graphs).
"""
import argparse
import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def start(binary, args, log_path):
    log = open(log_path, "w+")
    proc = subprocess.Popen([binary, "serve", "--port", "0"] + args, stdout=log, stderr=log)
    deadline = time.time() + 600
    while time.time() < deadline:
        m = re.search(r"ready: http://127\.0\.0\.1:(\d+)/v1", open(log_path).read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    sys.exit(f"serve {' '.join(args)} did not start:\n{open(log_path).read()[-3000:]}")


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("corolla:" + name):
                return float(line.rsplit(" ", 1)[1])
    return -1.0


def strip_ids(text):
    return re.sub(r'"created":\d+', "", re.sub(r'"id":"[^"]*"', "", text))


def tokens_of(status, text):
    """Token ids (fixture) or texts (demo) of every choice, streamed or not."""
    if status != 200:
        return ("error", status, text)
    if text.startswith("data: "):
        out = {}
        for line in text.splitlines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:]).get("choices", []):
                    d = c.get("delta", {})
                    out.setdefault(c["index"], []).extend(c.get("token_ids", []) or [d.get("content") or c.get("text") or ""])
        return [v for _, v in sorted(out.items())]
    j = json.loads(text)
    return [c.get("token_ids") or c.get("text") or c.get("message", {}).get("content") for c in j["choices"]]


def agree(a, b):
    if a == b:
        return "identical"
    if isinstance(a, list) and isinstance(b, list):
        parts = []
        for x, y in zip(a, b):
            n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            parts.append(f"{n}/{len(x)}")
        return "leading tokens equal " + ", ".join(parts)
    return "DIFFERENT"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/corolla")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dp-args", default="", help="more flags for the --dp 2 --ep 2 server (--dp-args='...')")
    o = ap.parse_args()
    exact = o.device == "cpu"
    common = ["--device", o.device] + (["--threads", "1"] if o.device == "cpu" else [])
    failures = []
    tmp = tempfile.mkdtemp(prefix="serve_dp_")
    fixture = "tests/data/models/qwen3-moe"
    prompts = [[7], [1, 2, 3], [17, 300, 42, 99, 5, 6, 8], [(i * 37 + 11) % 1024 for i in range(20)],
               [(i * 53 + 3) % 1024 for i in range(40)], [(i * 7 + 1) % 1024 for i in range(300)]]
    suites = [
        ("qwen3-moe fixture", ["--model", fixture, "--max-model-len", "2048"],
         [("/v1/completions", {"prompt": p, "max_tokens": 8 + 3 * i, "temperature": 0, "ignore_eos": True,
                               "stream": i == 4}) for i, p in enumerate(prompts)]),
        ("demo model", [],
         [("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "logprobs": 3}),
          ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.8, "seed": 7, "n": 3}),
          ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 20, "temperature": 0}),
          ("/v1/chat/completions", {"messages": [{"role": "user", "content": "What is 2+3?"}], "max_tokens": 20,
                                    "temperature": 0, "stop": [" "], "stream": True}),
          ("/v1/completions", {"prompt": "1, 2, 3,", "max_tokens": 10, "temperature": 0, "presence_penalty": 0.5}),
          ("/v1/completions", {"prompt": "x" * 50000, "max_tokens": 10})]),
    ]
    for name, args, reqs in suites:
        one, p1 = start(o.bin, common + args, f"{tmp}/one.log")
        dp, p2 = start(o.bin, common + args + ["--dp", "2", "--ep", "2"] + o.dp_args.split(), f"{tmp}/dp.log")
        for line in open(f"{tmp}/dp.log"):
            if "decode graphs" in line:
                print(f"{name}: {line.strip()}")
        with ThreadPoolExecutor(2 * len(reqs) + 2) as ex:
            fa = [ex.submit(post, p1, path, body) for path, body in reqs]
            fb = [ex.submit(post, p2, path, body) for path, body in reqs]
            for (path, body), x, y in zip(reqs, fa, fb):
                a, b = x.result(), y.result()
                ta, tb = tokens_of(*a), tokens_of(*b)
                verdict = agree(ta, tb)
                same_errors = a[0] != 200 and a[0] == b[0] and strip_ids(a[1]) == strip_ids(b[1])
                ok = (a[0] == b[0]) and (same_errors or verdict == "identical" or (not exact and a[0] == 200))
                print(f"{name}: {path} {json.dumps(body)[:60]}: HTTP {a[0]} / {b[0]}, {verdict if a[0] == 200 else 'same error' if same_errors else 'errors differ'}")
                if not ok:
                    failures.append(f"{name} {path}: {a[1][:300]} | {b[1][:300]}")
        if name.startswith("qwen3-moe"):
            # A stream cancelled by its client: the DP server must end it and free its blocks.
            s = socket.create_connection(("127.0.0.1", p2))
            body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2000, "temperature": 0, "ignore_eos": True, "stream": True})
            s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode())
            got = b""
            while b"data: {" not in got:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            s.close()
            idle = False
            for _ in range(400):
                idle = metric(p2, "num_requests_running{") == 0 and metric(p2, "kv_cache_usage_perc{") == 0
                if idle:
                    break
                time.sleep(0.05)
            aborted = metric(p2, 'request_success_total{model_name="qwen3-moe",finished_reason="abort"}')
            print(f"{name}: cancelled stream: first chunk {'seen' if b'data: {' in got else 'MISSING'}, idle after {idle}, aborts {aborted:g}")
            if not idle or aborted != 1 or b"data: {" not in got:
                failures.append(f"{name}: cancel")
            after = post(p2, "/v1/completions", {"prompt": [7], "max_tokens": 4, "temperature": 0})
            if after[0] != 200:
                failures.append(f"{name}: no answer after the cancel: {after}")
        for label, proc in (("one process", one), ("--dp 2 --ep 2", dp)):
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "hung"
            print(f"{name}: {label} exit {rc} after SIGTERM")
            if rc != 0:
                failures.append(f"{name}: {label} exit {rc}")
        m = re.search(r"requests per rank: ([0-9, ]+)", open(f"{tmp}/dp.log").read())
        print(f"{name}: requests per rank {m.group(1) if m else '?'}")
        m = re.search(r"fixed-capacity rounds: [0-9]+ of [0-9]+", open(f"{tmp}/dp.log").read())
        print(f"{name}: {m.group(0) if m else 'fixed-capacity rounds: ?'}")
    print("serve_dp_check: " + ("PASS" if not failures else "FAIL\n  " + "\n  ".join(failures)))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())

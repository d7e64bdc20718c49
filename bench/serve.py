#!/usr/bin/python3
"""bench/serve.py - the load generator for `PROG serve` (docs/serve.md, "Benchmark").

Sends requests to an OpenAI-compatible server (ours, or any other: --url) and measures what each
client sees, with the definitions of vLLM's serving benchmark:
  - TTFT: from sending the request to receiving the first token;
  - TPOT: per request with more than one output token, (end-to-end latency - TTFT) / (output
    tokens - 1): the time per output token after the first;
  - ITL: every gap between consecutive streamed chunks, over all requests;
  - E2EL: from sending to the last byte;
  - throughput: completed requests, output tokens and all tokens (prompt + output) per second of
    the benchmark's duration (first send to last completion).
Each latency is reported as mean, P50, P90 and P99 (linear interpolation, as numpy.percentile).

Arrivals: a Poisson process at --request-rate requests/s (exponential gaps, seeded), or a burst
(`inf`: all at once). Prompts are token ids below --vocab (no tokenizer needed), lengths drawn from
--input-len and --output-len: `N` (fixed) or `uniform:LO:HI`; or a JSONL --dataset of
{"prompt": [ids] or "text", "output_len": N}. Output length is forced by max_tokens with no stop
condition. Clients are raw HTTP (streaming SSE) or the `openai` package (--client openai).

--capacity searches the highest request rate whose P99 TPOT stays under --tpot-slo-ms (bisection
over [--rate-lo, --rate-hi], --search-steps runs), as Sarathi-Serve measures capacity.

The server is --url, or one started here: --prog PROG --weights W [--server-arg=--batch-tokens=512 ...]
(on a free port; stopped with SIGTERM at the end). --arms NAME:ARGS;NAME:ARGS runs one server per arm
with the same trace and prints the arms side by side. Writes JSON to --json (default
bench/results/serve-<time>.json) with the machine, the commit and the configuration.

Usage: bench/serve.py --prog build/tmp/bench-serve/gpt --weights W --num-prompts 100 --request-rate 20
"""
import argparse
import http.client
import json
import math
import os
import platform
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse


def percentile(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def lengths(spec, n, rng):
    if spec.startswith("uniform:"):
        lo, hi = map(int, spec.split(":")[1:])
        return [rng.randint(lo, hi) for _ in range(n)]
    return [int(spec)] * n


def make_trace(a):
    rng = random.Random(a.seed)
    if a.dataset:
        rows = [json.loads(line) for line in open(a.dataset, encoding="utf-8") if line.strip()]
        reqs = [(r["prompt"], int(r["output_len"])) for r in rows[:a.num_prompts]]
    else:
        ins, outs = lengths(a.input_len, a.num_prompts, rng), lengths(a.output_len, a.num_prompts, rng)
        reqs = [([rng.randrange(a.vocab) for _ in range(i)], o) for i, o in zip(ins, outs)]
    return reqs


def gaps(rate, n, seed):
    if rate == math.inf:
        return [0.0] * n
    rng = random.Random(seed + 1)
    return [rng.expovariate(rate) for _ in range(n)]


def one_raw(url, model, prompt, out_len, res):
    u = urllib.parse.urlparse(url)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": out_len, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    start = time.perf_counter()
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        c.request("POST", u.path.rstrip("/") + "/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            res.update(ok=False, error=f"status {r.status}: {r.read()[:200]!r}")
            return
        times, ntok = [], 0
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                break
            ev = json.loads(line[6:])
            got = sum(len(ch.get("token_ids", [])) or (1 if ch.get("text") else 0) for ch in ev.get("choices", []))
            if got:
                times.append(time.perf_counter())
                ntok += got
        c.close()
        res.update(ok=True, start=start, times=times, end=time.perf_counter(), output_len=ntok)
    except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
        res.update(ok=False, error=repr(e))


def one_openai(client, model, prompt, out_len, res):
    start = time.perf_counter()
    try:
        times, ntok = [], 0
        for ch in client.completions.create(model=model, prompt=prompt, max_tokens=out_len, temperature=0, stream=True):
            if ch.choices and ch.choices[0].text:
                times.append(time.perf_counter())
                ntok += 1
        res.update(ok=True, start=start, times=times, end=time.perf_counter(), output_len=ntok)
    except Exception as e:  # noqa: BLE001
        res.update(ok=False, error=repr(e))


def run_trace(a, url, reqs, rate):
    model = a.model
    if not model:
        c = http.client.HTTPConnection(urllib.parse.urlparse(url).hostname, urllib.parse.urlparse(url).port, timeout=30)
        c.request("GET", urllib.parse.urlparse(url).path.rstrip("/") + "/models")
        model = json.loads(c.getresponse().read())["data"][0]["id"]
    client = None
    if a.client == "openai":
        import openai
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    results = [dict() for _ in reqs]
    threads = []
    t0 = time.perf_counter()
    for (prompt, out_len), gap, res in zip(reqs, gaps(rate, len(reqs), a.seed), results):
        time.sleep(gap)
        if client:
            t = threading.Thread(target=one_openai, args=(client, model, prompt, out_len, res))
        else:
            t = threading.Thread(target=one_raw, args=(url, model, prompt, out_len, res))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    duration = max((r["end"] for r in results if r.get("ok")), default=t0) - t0
    return metrics(results, reqs, duration, rate)


def metrics(results, reqs, duration, rate):
    ok = [(r, q) for r, q in zip(results, reqs) if r.get("ok") and r["times"]]
    ttft = [(r["times"][0] - r["start"]) * 1e3 for r, _ in ok]
    e2el = [(r["end"] - r["start"]) * 1e3 for r, _ in ok]
    tpot = [((r["end"] - r["start"]) - (r["times"][0] - r["start"])) / (r["output_len"] - 1) * 1e3
            for r, _ in ok if r["output_len"] > 1]
    itl = [(b - a) * 1e3 for r, _ in ok for a, b in zip(r["times"], r["times"][1:])]
    nin = sum(len(q[0]) if isinstance(q[0], list) else 0 for _, q in ok)
    nout = sum(r["output_len"] for r, _ in ok)
    m = {"request_rate": rate if rate != math.inf else "inf", "completed": len(ok), "failed": len(results) - len(ok),
         "duration_s": duration, "total_input_tokens": nin, "total_output_tokens": nout,
         "request_throughput": len(ok) / duration if duration > 0 else 0,
         "output_throughput": nout / duration if duration > 0 else 0,
         "total_token_throughput": (nin + nout) / duration if duration > 0 else 0}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        m[f"mean_{name}_ms"] = sum(xs) / len(xs) if xs else float("nan")
        for p in (50, 90, 99):
            m[f"p{p}_{name}_ms"] = percentile(xs, p)
    errs = [r.get("error") for r in results if not r.get("ok")]
    if errs:
        m["first_error"] = errs[0]
    return m


def table(rows, names):
    keys = [("completed", "requests completed", "{:.0f}"), ("failed", "requests failed", "{:.0f}"),
            ("duration_s", "duration (s)", "{:.2f}"), ("request_throughput", "requests/s", "{:.2f}"),
            ("output_throughput", "output tokens/s", "{:.1f}"), ("total_token_throughput", "all tokens/s", "{:.1f}")]
    for n in ("ttft", "tpot", "itl", "e2el"):
        for s in ("mean", "p50", "p90", "p99"):
            keys.append((f"{s}_{n}_ms", f"{s} {n.upper()} (ms)", "{:.2f}"))
    w = max(len(n) for n in names) + 2
    print(f"{'':<24}" + "".join(f"{n:>{max(w, 12)}}" for n in names))
    for k, label, fmt in keys:
        print(f"{label:<24}" + "".join(f"{fmt.format(r[k]):>{max(w, 12)}}" for r in rows))


class Server:
    def __init__(self, prog, weights, args, threads):
        cmd = [prog, "serve", "--weights", weights, "--port", "0", *args]
        if threads:
            cmd += ["--threads", str(threads)]
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.url, self.banner = None, []
        for line in self.p.stdout:
            self.banner.append(line.strip())
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1) + "/v1"
                break
        if not self.url:
            sys.exit("bench/serve.py: the server did not start:\n" + "\n".join(self.banner) + self.p.stderr.read())

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(timeout=120)


def capacity(a, url, reqs):
    lo, hi, best, runs = a.rate_lo, a.rate_hi, None, []
    for _ in range(a.search_steps):
        mid = (lo + hi) / 2
        m = run_trace(a, url, reqs, mid)
        runs.append(m)
        good = m["failed"] == 0 and m["p99_tpot_ms"] <= a.tpot_slo_ms
        print(f"  rate {mid:.3f}/s: P99 TPOT {m['p99_tpot_ms']:.2f} ms {'<=' if good else '>'} {a.tpot_slo_ms} ms", flush=True)
        if good:
            best, lo = mid, mid
        else:
            hi = mid
    return best, runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="the server's /v1 base, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--prog", help="start this executable's `serve` (with --weights)")
    ap.add_argument("--weights")
    ap.add_argument("--server-arg", action="append", default=[], help="a flag for `serve` (repeat)")
    ap.add_argument("--arms", help="NAME:ARG ARG;NAME:ARG... one server per arm, same trace")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--model", help="the model name (default: the server's first)")
    ap.add_argument("--client", choices=["raw", "openai"], default="raw")
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, Poisson; inf: a burst")
    ap.add_argument("--input-len", default="uniform:4:16")
    ap.add_argument("--output-len", default="uniform:4:16")
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--dataset", help="JSONL of {prompt, output_len}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--capacity", action="store_true")
    ap.add_argument("--tpot-slo-ms", type=float, default=100.0)
    ap.add_argument("--rate-lo", type=float, default=0.5)
    ap.add_argument("--rate-hi", type=float, default=200.0)
    ap.add_argument("--search-steps", type=int, default=6)
    ap.add_argument("--json")
    a = ap.parse_args()
    if not a.url and not a.prog:
        ap.error("give --url or --prog")
    reqs = make_trace(a)
    arms = [("server", a.server_arg)]
    if a.arms:
        arms = [(x.split(":", 1)[0], x.split(":", 1)[1].split()) for x in a.arms.split(";")]
    out = {"machine": {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
                       "cpus": os.cpu_count()},
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "config": vars(a), "arms": {}}
    rows = []
    for name, args in arms:
        srv = Server(a.prog, a.weights, args, a.threads) if a.prog else None
        url = srv.url if srv else a.url
        try:
            print(f"# arm {name}: {' '.join(args)}" + (f" ({srv.banner[0]})" if srv else ""), flush=True)
            if a.capacity:
                best, runs = capacity(a, url, reqs)
                print(f"  capacity: {best if best is not None else 'below ' + str(a.rate_lo)} requests/s at P99 TPOT "
                      f"<= {a.tpot_slo_ms} ms", flush=True)
                out["arms"][name] = {"args": args, "capacity": best, "runs": runs}
                rows.append(runs[-1])
            else:
                m = run_trace(a, url, reqs, a.request_rate)
                out["arms"][name] = {"args": args, **m}
                rows.append(m)
        finally:
            if srv:
                srv.stop()
    table(rows, [n for n, _ in arms])
    path = a.json or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                  time.strftime("serve-%Y%m%d-%H%M%S.json"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

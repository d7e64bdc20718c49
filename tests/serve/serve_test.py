#!/usr/bin/env python3
"""serve_test.py BUILD DIR - the serve layer's checks (tests/serve/run.sh builds DIR/gpt from
tests/serve/gpt.mbt and its weights DIR/gpt.safetensors first). Prints `PASS serve/NAME`,
`FAIL serve/NAME: why` or `SKIP serve/NAME: why` per check; exit status 1 when one failed.

The server is `DIR/gpt serve --port 0`; the port is read from its `listening on` line, so nothing
sleeps to wait for it. Each check says what it compares:
  - greedy tokens through the server equal `generate`'s (both the model's full recompute);
  - 16 different prompts sent at once (sampled, each with its own seed) give exactly the tokens
    each gives alone, and those `generate --seed` gives: the batch does not change a sequence;
    and bit for bit the same log-probabilities (`logprobs: 0`, printed to 17 digits: a function
    of the whole logits row, so a last-bit change in any logit shows);
  - chunked (4-token chunks) and unchunked prefill give the same tokens and log-probabilities,
    bit for bit;
  - a pool of one context (8 blocks) under 16 concurrent requests preempts (the metric says so)
    and still returns every request's tokens and log-probabilities, the same as alone (a
    preempted sequence's recomputation included);
  - a repeated prompt hits the prefix cache (the metric counts the blocks) with the same tokens
    as the miss;
  - 50 concurrent streaming clients, every fifth disconnecting after two events: the others get
    their whole streams, the server frees every block (kv_blocks_used 0) and keeps serving;
  - malformed requests (truncated JSON, wrong types, a 10 MB body, a prompt over the context,
    a client that sends half a body and stalls, one that sends slowly) get 400 with the field
    named, and the server keeps serving;
  - a pool smaller than one context is refused at start; SIGTERM ends a stream with [DONE] and
    the server exits 0;
  - the `openai` client streams a completion (SKIP without the package);
  - the tokenizer agrees with Hugging Face's `tokenizers` on a large text, for a GPT-2-style and a
    Llama-3-style byte-level BPE trained here, and text prompts and chat completions work through
    the server (SKIP without the package);
  - every server stopped by SIGTERM exited 0 with nothing on stderr but its shutdown line (under
    `tests/serve/run.sh build/asan`, no sanitizer report).

tests/gpu/run.sh runs some of these checks on the device under test: MBT_SERVE_DEVICE holds the
arguments every serve and generate gets (`--device cuda`), MBT_SERVE_CHECKS the names of the checks
to run (space-separated; all when unset), and with a device the check kv-pool-from-device-memory
holds the pool's size to kv.memory of the free memory the server reports, and its engine to the
cached one on the GPU."""
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

BUILD, DIR = sys.argv[1], sys.argv[2]
PROG = os.path.join(DIR, "gpt")
WEIGHTS = os.path.join(DIR, "gpt.safetensors")
CONTEXT = 32
DEVICE = os.environ.get("MBT_SERVE_DEVICE", "").split()
ONLY = os.environ.get("MBT_SERVE_CHECKS", "").split()
failed = False


def report(name, ok, why=""):
    global failed
    if ok is None:
        print(f"SKIP serve/{name}: {why}", flush=True)
    elif ok:
        print(f"PASS serve/{name}" + (f": {why}" if why else ""), flush=True)
    else:
        failed = True
        print(f"FAIL serve/{name}: {why}", flush=True)


STOPS = []  # (command, exit status, stderr) of every server stopped with SIGTERM


class Server:
    def __init__(self, *args, prog=PROG, env=None):
        self.p = subprocess.Popen([prog, "serve", "--weights", WEIGHTS, "--port", "0", "--threads", "1", *DEVICE, *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, **env) if env else None)
        self.port = None
        self.lines = []  # what it printed up to its listening line
        killer = threading.Timer(30, self.p.kill)  # a server that never says where it listens
        killer.start()
        lines = []
        for line in self.p.stdout:
            lines.append(line)
            self.lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        killer.cancel()
        if self.port is None:
            self.p.kill()
            raise RuntimeError("the server did not start: " + "".join(lines) + self.p.stderr.read())

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = "timeout"
        err = self.p.stderr.read()
        STOPS.append((self.p.args, rc, err))
        return rc, err


def request(port, method, path, body=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    c.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


def complete(port, **req):
    st, j = request(port, "POST", "/v1/completions", req)
    if st != 200:
        raise RuntimeError(f"status {st}: {j}")
    return j["choices"][0]["token_ids"]


def complete_lp(port, **req):
    """(token ids, their log-probabilities as the server printed them): logprobs 0 asked."""
    st, j = request(port, "POST", "/v1/completions", dict(req, logprobs=0))
    if st != 200:
        raise RuntimeError(f"status {st}: {j}")
    c = j["choices"][0]
    lp = c["logprobs"]
    if lp is None or len(lp["token_logprobs"]) != len(c["token_ids"]):
        raise RuntimeError(f"logprobs missing or of the wrong length: {c}")
    return (c["token_ids"], lp["token_logprobs"])


def stream(port, req, disconnect_after=None):
    """The SSE events of a streamed completion (their JSON), and whether [DONE] came."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", body=json.dumps(dict(req, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    events, done = [], False
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        events.append(json.loads(line[6:]))
        if disconnect_after is not None and len(events) >= disconnect_after:
            c.sock.shutdown(socket.SHUT_RDWR)
            c.close()
            return events, False
    c.close()
    return events, done


def metrics(port):
    st, text = request(port, "GET", "/metrics")
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def generate(prompt, n, temperature=0, seed=1):
    out = subprocess.run([PROG, "generate", "--weights", WEIGHTS, "--prompt-tokens", ",".join(map(str, prompt)),
                          "--max-tokens", str(n), "--temperature", str(temperature), "--seed", str(seed),
                          "--threads", "1", *DEVICE], capture_output=True, text=True, check=True)
    return [int(t) for t in out.stdout.split()]


def parallel(fn, args):
    res = [None] * len(args)
    errs = []

    def run(i):
        try:
            res[i] = fn(*args[i])
        except Exception as e:  # noqa: BLE001 - reported as the check's failure
            errs.append(repr(e))
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(args))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise RuntimeError(errs[0])
    return res


rng = random.Random(17)
PROMPTS = [[rng.randrange(320) for _ in range(rng.randrange(1, 22))] for _ in range(16)]


def check(name, fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - any exception is the check's failure
        report(name, False, repr(e)[:2000])


# ---- correctness ---------------------------------------------------------------------------------

def greedy_equals_generate():
    s = Server()
    try:
        for p in PROMPTS[:4]:
            got = complete(s.port, prompt=p, max_tokens=12, temperature=0)
            want = generate(p, 12)
            if got != want:
                return report("greedy-equals-generate", False, f"prompt {p}: server {got}, generate {want}")
        report("greedy-equals-generate", True, "4 prompts, 12 tokens each")
    finally:
        s.stop()


ALONE = {}


def batched_equals_alone():
    s = Server()
    try:
        reqs = [dict(prompt=p, max_tokens=10, temperature=1.0, seed=100 + i) for i, p in enumerate(PROMPTS)]
        alone = [complete_lp(s.port, **r) for r in reqs]
        together = parallel(lambda r: complete_lp(s.port, **r), [(r,) for r in reqs])
        gen = [generate(r["prompt"], 10, 1.0, r["seed"]) for r in reqs[:4]]
        bad = [i for i in range(16) if alone[i] != together[i]]
        ALONE.update({i: alone[i] for i in range(16)})
        if bad:
            return report("batched-equals-alone", False, f"{len(bad)} of 16 differ (tokens and log-probabilities bit for "
                          f"bit), first {bad[0]}: alone {alone[bad[0]]}, batched {together[bad[0]]}")
        if gen != [a[0] for a in alone[:4]]:
            return report("batched-equals-alone", False, f"generate --seed differs: {gen[0]} vs {alone[0]}")
        m = metrics(s.port)
        report("batched-equals-alone", True, f"16 sampled prompts, tokens and log-probabilities bit for bit as alone, "
               "tokens as generate; "
               f"{int(m['mbt_serve_iterations_total'])} iterations")
    finally:
        s.stop()


def chunked_equals_unchunked():
    outs = []
    for args in (["--prefill-chunk", "4", "--batch-tokens", "8"], ["--prefill-chunk", "64", "--batch-tokens", "64"]):
        s = Server(*args)
        try:
            outs.append([complete_lp(s.port, prompt=p, max_tokens=6, temperature=0) for p in PROMPTS[:6]])
        finally:
            s.stop()
    report("chunked-equals-unchunked", outs[0] == outs[1], "" if outs[0] == outs[1] else f"{outs[0]} vs {outs[1]}")


def preemption_loses_nothing():
    s = Server("--kv-blocks", "8")
    try:
        reqs = [dict(prompt=p, max_tokens=10, temperature=1.0, seed=100 + i) for i, p in enumerate(PROMPTS)]
        together = parallel(lambda r: complete_lp(s.port, **r), [(r,) for r in reqs])
        m = metrics(s.port)
        pre = int(m["mbt_serve_preemptions_total"])
        bad = [i for i in range(16) if together[i] != ALONE.get(i)]
        if bad:
            return report("preemption-loses-nothing", False, f"request {bad[0]}: {together[bad[0]]} vs alone {ALONE.get(bad[0])}")
        if pre == 0:
            return report("preemption-loses-nothing", False, "no preemption happened with a pool of one context")
        if m["mbt_serve_kv_blocks_used"] != 0:
            return report("preemption-loses-nothing", False, f"{m['mbt_serve_kv_blocks_used']} blocks still used")
        report("preemption-loses-nothing", True, f"8 blocks, 16 requests, {pre} preemptions, every token and "
               "log-probability as alone")
    finally:
        s.stop()


def decode_batch_one_call():
    """A decode batch of 64 sequences is one call of forward_chunk: gpt.mbt's batch.tokens = 64 gives
    calls of 64 rows (plan_kv_config), so no step of 64 decodes is split, and every sequence's tokens
    and log-probabilities are bit for bit its own alone. The control, gpt16 (the same model built
    with batch.tokens = 16, the old cap's geometry) under the same runtime budget, splits them (and,
    on the CPU, gives the same tokens: a row's bits do not depend on its call). Without DIR/gpt16
    (tests/gpu/kv.sh, on the device) the control is left out and the line says so.
    MBT_SERVE_GATHER holds the first step until all 64 wait, so they decode together whatever the
    client threads' timing."""
    reqs = [dict(prompt=[(7 * i) % 320], max_tokens=CONTEXT - 2, temperature=1.0, seed=500 + i) for i in range(64)]
    found = {}
    control = os.path.join(DIR, "gpt16")
    for name, prog in (("gpt", PROG), ("gpt16", control)) if os.path.exists(control) else (("gpt", PROG),):
        s = Server("--batch-seqs", "64", "--batch-tokens", "64", prog=prog, env={"MBT_SERVE_GATHER": "64"})
        try:
            rows = int(metrics(s.port)["mbt_serve_engine_call_rows"])
            together = parallel(lambda r: complete_lp(s.port, **r), [(r,) for r in reqs])
            m = metrics(s.port)
            alone = [complete_lp(s.port, **r) for r in reqs] if name == "gpt" else None
        finally:
            s.stop()
        found[name] = (rows, together, alone, m)
    rows, together, alone, m = found["gpt"]
    bad = [i for i in range(64) if together[i] != alone[i]]
    dec, split = int(m["mbt_serve_decode_batch_max"]), int(m["mbt_serve_split_iterations_total"])
    calls, its = int(m["mbt_serve_engine_calls_total"]), int(m["mbt_serve_iterations_total"])
    why = (f"calls of {rows} rows: the largest decode batch {dec}, {its} steps in {calls} calls ({split} split), "
           f"a call's most rows {int(m['mbt_serve_engine_call_rows_max'])}")
    ok = rows == 64 and dec == 64 and split == 0 and calls == its
    if "gpt16" in found:
        rows16, together16, _, m16 = found["gpt16"]
        split16, calls16, its16 = (int(m16[k]) for k in ("mbt_serve_split_iterations_total",
                                                         "mbt_serve_engine_calls_total", "mbt_serve_iterations_total"))
        why += f"; control (calls of {rows16} rows): {its16} steps in {calls16} calls ({split16} split)"
        ok = ok and rows16 == 16 and split16 > 0 and calls16 > its16
        if not DEVICE and together16 != together:
            return report("decode-batch-one-call", False, f"the control's tokens differ from the batch's; {why}")
    else:
        why += "; no control (no gpt16 beside the program)"
    if bad:
        return report("decode-batch-one-call", False, f"{len(bad)} of 64 differ from alone, first {bad[0]}: batched "
                      f"{together[bad[0]]}, alone {alone[bad[0]]}; {why}")
    report("decode-batch-one-call", ok, why + ("; 64 sequences bit for bit as alone" if ok else ""))


def prefix_sharing():
    p = PROMPTS[0] + list(range(20))
    p = p[:24]
    s = Server()
    try:
        miss = complete(s.port, prompt=p, max_tokens=6, temperature=0)
        h0 = metrics(s.port)["mbt_serve_prefix_cache_hit_blocks_total"]
        hit = complete(s.port, prompt=p, max_tokens=6, temperature=0)
        h1 = metrics(s.port)["mbt_serve_prefix_cache_hit_blocks_total"]
        other = complete(s.port, prompt=[(p[0] + 1) % 320] + p[1:], max_tokens=6, temperature=0)
        h2 = metrics(s.port)["mbt_serve_prefix_cache_hit_blocks_total"]
    finally:
        s.stop()
    ok = miss == hit and h0 == 0 and h1 >= 5 and h2 == h1 and other == generate([(p[0] + 1) % 320] + p[1:], 6)
    report("prefix-sharing", ok, f"miss {miss}, hit {hit} ({int(h1 - h0)} blocks shared); a changed first token shares "
           f"{int(h2 - h1)}")


def many_clients_some_leave():
    s = Server()
    try:
        def one(i):
            return stream(s.port, dict(prompt=PROMPTS[i % 16], max_tokens=8, temperature=1.0, seed=i),
                          disconnect_after=2 if i % 5 == 0 else None)
        res = parallel(one, [(i,) for i in range(50)])
        whole = [r for i, r in enumerate(res) if i % 5 != 0]
        bad = [i for i, (ev, done) in enumerate(res) if i % 5 != 0 and (not done or len(ev) != 8)]
        # the scheduler frees a departed client's blocks at its next iteration: wait for it
        deadline = time.time() + 20
        while True:
            m = metrics(s.port)
            if (m["mbt_serve_kv_blocks_used"] == 0 and m["mbt_serve_requests_running"] == 0) or time.time() > deadline:
                break
            time.sleep(0.05)
        after = complete(s.port, prompt=PROMPTS[0], max_tokens=4, temperature=0)
    finally:
        rc, err = s.stop()
    ok = not bad and m["mbt_serve_kv_blocks_used"] == 0 and after == generate(PROMPTS[0], 4) and rc == 0
    report("fifty-clients-some-leave", ok, f"{len(whole)} whole streams, {50 - len(whole)} left after 2 events, "
           f"{int(m['mbt_serve_requests_cancelled_total'])} cancelled, blocks used after: "
           f"{int(m['mbt_serve_kv_blocks_used'])}" + (f"; bad streams {bad[:5]}" if bad else ""))


def malformed_requests():
    s = Server()
    try:
        cases = [
            ("truncated-json", b'{"prompt": [1, 2, 3', None),
            ("not-an-object", b'[1, 2, 3]', None),
            ("prompt-type", {"prompt": 5}, "prompt"),
            ("prompt-id-range", {"prompt": [1, 400]}, "prompt"),
            ("max-tokens-type", {"prompt": [1], "max_tokens": "x"}, "max_tokens"),
            ("temperature-type", {"prompt": [1], "temperature": "hot"}, "temperature"),
            ("top-p-range", {"prompt": [1], "top_p": 1.5}, "top_p"),
            ("stream-type", {"prompt": [1], "stream": "yes"}, "stream"),
            ("n-not-1", {"prompt": [1], "n": 2}, "n"),
            ("stop-type", {"prompt": [1], "stop": 5}, "stop"),
            ("seed-type", {"prompt": [1], "seed": 1.5}, "seed"),
            ("logprobs-alternatives", {"prompt": [1], "logprobs": 2}, "logprobs"),
            ("logprobs-type", {"prompt": [1], "logprobs": "yes"}, "logprobs"),
            ("text-without-tokenizer", {"prompt": "hello"}, "prompt"),
        ]
        for name, body, param in cases:
            st, j = request(s.port, "POST", "/v1/completions", body)
            if st != 400 or j["error"]["param"] != param or j["error"]["type"] != "invalid_request_error":
                return report("malformed-requests", False, f"{name}: status {st}, {j}")
        long = list(range(1, 34))
        st, j = request(s.port, "POST", "/v1/completions", {"prompt": long})
        want = f"This model's maximum context length is {CONTEXT} tokens, the prompt has 33"
        if st != 400 or want not in j["error"]["message"]:
            return report("malformed-requests", False, f"too long: {st} {j}")
        st, j = request(s.port, "POST", "/v1/completions", b'{"prompt": "' + b"a" * (10 << 20) + b'"}')
        if st != 400 or "larger than" not in j["error"]["message"]:
            return report("malformed-requests", False, f"10 MB: {st} {str(j)[:200]}")
        # a client that sends half a body and stalls, and one that sends slowly: others are served
        stall = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 3}).encode()
        stall.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
        slow = socket.create_connection(("127.0.0.1", s.port))
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 8):
            slow.sendall(body[i:i + 8])
            time.sleep(0.02)
        reply = b""
        while True:
            chunk = slow.recv(65536)
            if not chunk:
                break
            reply += chunk
        slow.close()
        if b" 200 " not in reply.split(b"\r\n")[0] or b'"token_ids"' not in reply:
            return report("malformed-requests", False, f"slow client: {reply[:200]}")
        got = complete(s.port, prompt=PROMPTS[1], max_tokens=5, temperature=0)
        stall.close()
        st, h = request(s.port, "GET", "/health")
        ok = got == generate(PROMPTS[1], 5) and st == 200
        report("malformed-requests", ok, f"{len(cases) + 2} bad requests got 400 naming the field; a stalled and a slow "
               f"client; still serving: {got}")
    finally:
        s.stop()


def endpoints():
    s = Server()
    try:
        st, j = request(s.port, "GET", "/v1/models")
        ok = st == 200 and j["data"][0]["id"] == "small_chat" and j["data"][0]["max_model_len"] == CONTEXT
        st2, h = request(s.port, "GET", "/health")
        st3, e = request(s.port, "GET", "/nowhere")
        st4, e4 = request(s.port, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        ev, done = stream(s.port, dict(prompt=[5, 6, 7], max_tokens=4, temperature=0, stream_options={"include_usage": True}))
        usage = ev[-1].get("usage") if ev else None
        toks = [t for x in ev for c in x["choices"] for t in c["token_ids"]]
        ok = ok and st2 == 200 and st3 == 404 and st4 == 404 and done and toks == generate([5, 6, 7], 4)
        ok = ok and usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        m = metrics(s.port)
        need = ["mbt_serve_requests_running", "mbt_serve_requests_waiting", "mbt_serve_kv_blocks_used",
                "mbt_serve_generation_tokens_per_second", "mbt_serve_preemptions_total",
                "mbt_serve_time_to_first_token_seconds_count", "mbt_serve_inter_token_latency_seconds_count"]
        missing = [k for k in need if k not in m]
        ok = ok and not missing and m["mbt_serve_time_to_first_token_seconds_count"] == 1 and \
            m["mbt_serve_inter_token_latency_seconds_count"] == 3
        report("endpoints", ok, f"models, health, 404s, SSE with usage, metrics" + (f"; missing {missing}" if missing else "")
               + ("" if ok else f"; {st} {j} {st4} {e4} {ev} {m}"))
    finally:
        s.stop()


def pool_too_small():
    r = subprocess.run([PROG, "serve", "--weights", WEIGHTS, "--port", "0", "--kv-blocks", "7", *DEVICE], capture_output=True,
                       text=True, timeout=60)
    want = "the KV pool of 7 blocks of 4 tokens is smaller than one full context (32 tokens, 8 blocks)"
    report("pool-smaller-than-context", r.returncode == 1 and want in r.stderr, r.stderr.strip())


def kv_pool_from_device_memory():
    """On a device: the cached engine runs on the GPU, and the pool is kv.memory (the serve block's
    0.5) of the free memory the server read, in blocks of 4 tokens x 512 bytes (2 layers x k and v x
    2 heads x 16 x f32)."""
    s = Server()
    try:
        text = "".join(s.lines)
        eng = re.search(r"engine (\w+) on ([^,]+), .*KV pool (\d+) blocks of 4 tokens", text)
        bud = re.search(r"the KV pool is kv\.memory \(0\.5\) of (\d+) bytes \(the GPU's free memory\) at 2048 bytes a block",
                        text)
        if not eng or not bud:
            return report("kv-pool-from-device-memory", False, "start lines: " + text.replace("\n", " | "))
        want = int(0.5 * int(bud.group(1)) / 2048)
        ok = eng.group(1) == "cached" and eng.group(2) != "cpu" and int(eng.group(3)) == want
        got = complete(s.port, prompt=PROMPTS[0], max_tokens=4, temperature=0)
        report("kv-pool-from-device-memory", ok and len(got) == 4,
               f"engine {eng.group(1)} on {eng.group(2)}, {eng.group(3)} blocks (want {want}: 0.5 of {bud.group(1)} bytes free "
               "/ 2048 bytes a block)")
    finally:
        s.stop()


def sigterm_finishes():
    """SIGTERM while 8 streams run one at a time (--batch-seqs 1): every stream ends with [DONE]
    and its 25 tokens, and the server exits 0."""
    s = Server("--batch-seqs", "1")
    conns = []
    for i in range(8):
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        c.request("POST", "/v1/completions", body=json.dumps(dict(prompt=PROMPTS[i][:4], max_tokens=25, temperature=1.0,
                                                                  seed=i, stream=True)))
        conns.append(c)
    resp = [c.getresponse() for c in conns]
    s.p.send_signal(signal.SIGTERM)
    whole = 0
    for r in resp:
        lines = []
        while True:
            line = r.readline()
            if not line:
                break
            lines.append(line.decode(errors="replace").strip())
            if lines[-1] == "data: [DONE]":
                break
        n = sum(len(json.loads(x[6:])["choices"][0]["token_ids"]) for x in lines
                if x.startswith("data: {") and json.loads(x[6:])["choices"])
        whole += lines[-1:] == ["data: [DONE]"] and n == 25
    rc = s.p.wait(timeout=30)
    err = s.p.stderr.read().strip()
    report("sigterm-finishes-and-exits-0", whole == 8 and rc == 0, f"exit {rc}, {whole} of 8 streams whole; {err}")


def openai_client():
    try:
        import openai
    except ImportError:
        return report("openai-client-streams", None, "the openai package is not installed (pip install openai)")
    s = Server()
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="none")
        chunks = list(client.completions.create(model="small_chat", prompt=[1, 2, 3], max_tokens=6, temperature=0,
                                                stream=True))
        text = "".join(c.choices[0].text for c in chunks)
        want = generate([1, 2, 3], 6)
        ok = text.split() == [str(t) for t in want] and chunks[-1].choices[0].finish_reason == "length"
        models = [m.id for m in client.models.list()]
        report("openai-client-streams", ok and models == ["small_chat"], f"{len(chunks)} chunks: '{text}'")
    finally:
        s.stop()


TEXT = ("The quick brown fox jumps over the lazy dog. It's 2024; we've seen 12345 foxes, they'll say.\n\n"
        "  Indented   spaces\tand\ttabs, 'quotes' and \"double quotes\" — em dashes, café, naïve, Zürich, "
        "日本語のテキスト, emoji 🙂🚀, numbers 3.14159 and 1,000,000!\r\nWindows line\r\n"
        "I'M SHOUTING, YOU'RE NOT. don't won't can't. <|endoftext|> after special.\n")


def tokenizer_checks():
    try:
        import tokenizers
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers, Regex
    except ImportError:
        return report("tokenizer-matches-hf", None, "the tokenizers package is not installed (pip install tokenizers)")
    corpus = [TEXT * 3, open(os.path.join(os.path.dirname(__file__), "serve_test.py"), encoding="utf-8").read()]
    big = "".join(corpus) * 4 + TEXT
    llama_pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
    paths = {}
    for kind in ("gpt2", "llama3"):
        tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
        if kind == "gpt2":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(llama_pat), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(corpus, trainer)
        path = os.path.join(DIR, f"tok_{kind}.json")
        tok.save(path)
        paths[kind] = (path, tok)
    text_path = os.path.join(DIR, "big.txt")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write(big)
    tool = os.path.join(BUILD, "tests", "sv_tokenize")
    for kind, (path, tok) in paths.items():
        want = tok.encode(big).ids
        out = subprocess.run([tool, path, "encode", text_path], capture_output=True, text=True)
        got = [int(t) for t in out.stdout.split()] if out.returncode == 0 else None
        if got != want:
            first = next((i for i in range(min(len(got or []), len(want))) if got[i] != want[i]), None)
            report(f"tokenizer-matches-hf-{kind}", False, f"{out.stderr.strip()} {len(got or [])} ids vs {len(want)}; "
                   f"first difference at {first}: {got[first:first + 5] if got and first is not None else ''} vs "
                   f"{want[first:first + 5] if first is not None else ''}")
            continue
        dec = subprocess.run([tool, path, "decode", *map(str, want)], capture_output=True).stdout.decode("utf-8")
        report(f"tokenizer-matches-hf-{kind}", dec == tok.decode(want, skip_special_tokens=False) and dec == big,
               f"{len(big)} characters, {len(want)} ids, decode gives the text back")
    # vocab.json + merges.txt (GPT-2's files) from the GPT-2-style tokenizer.json
    path, tok = paths["gpt2"]
    j = json.load(open(path, encoding="utf-8"))
    vdir = os.path.join(DIR, "gpt2files")
    os.makedirs(vdir, exist_ok=True)
    json.dump(j["model"]["vocab"], open(os.path.join(vdir, "vocab.json"), "w", encoding="utf-8"))
    with open(os.path.join(vdir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for m in j["model"]["merges"]:
            f.write((m if isinstance(m, str) else " ".join(m)) + "\n")
    plain = TEXT.replace("<|endoftext|>", "")
    with open(os.path.join(DIR, "plain.txt"), "w", encoding="utf-8") as f:
        f.write(plain)
    out = subprocess.run([tool, os.path.join(vdir, "vocab.json"), "encode", os.path.join(DIR, "plain.txt")],
                         capture_output=True, text=True)
    report("tokenizer-vocab-merges", out.returncode == 0 and [int(t) for t in out.stdout.split()] == tok.encode(plain).ids,
           out.stderr.strip())
    # text prompts and chat through the server
    s = Server("--tokenizer", path, prog=os.path.join(DIR, "gptchat"))
    try:
        st, j = request(s.port, "POST", "/v1/completions", {"prompt": "The quick brown", "max_tokens": 5, "temperature": 0})
        ids = tok.encode("The quick brown").ids
        ok = st == 200 and j["usage"]["prompt_tokens"] == len(ids) and \
            j["choices"][0]["token_ids"] == generate(ids, 5) and \
            j["choices"][0]["text"] == tok.decode(j["choices"][0]["token_ids"], skip_special_tokens=False)
        st2, c = request(s.port, "POST", "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0})
        chat_ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n").ids
        ok2 = st2 == 200 and c["object"] == "chat.completion" and c["choices"][0]["message"]["role"] == "assistant" and \
            c["usage"]["prompt_tokens"] == len(chat_ids)
        st3, e = request(s.port, "POST", "/v1/chat/completions", {"messages": "hi"})
        st4, e4 = request(s.port, "POST", "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "hi"}], "logprobs": True})
        ok3 = st3 == 400 and e["error"]["param"] == "messages" and st4 == 400 and e4["error"]["param"] == "logprobs"
        report("text-and-chat-through-server", ok and ok2 and ok3, f"completion '{j['choices'][0]['text']}' "
               f"chat '{c['choices'][0]['message']['content']}'" if ok and ok2 else f"{st} {j} {st2} {c} {st3} {e}")
    finally:
        s.stop()


for name, fn in [("greedy-equals-generate", greedy_equals_generate), ("batched-equals-alone", batched_equals_alone),
                 ("chunked-equals-unchunked", chunked_equals_unchunked), ("decode-batch-one-call", decode_batch_one_call),
                 ("preemption-loses-nothing", preemption_loses_nothing), ("prefix-sharing", prefix_sharing),
                 ("fifty-clients-some-leave", many_clients_some_leave), ("malformed-requests", malformed_requests),
                 ("endpoints", endpoints), ("pool-smaller-than-context", pool_too_small),
                 ("sigterm-finishes-and-exits-0", sigterm_finishes), ("openai-client-streams", openai_client),
                 ("tokenizer-matches-hf", tokenizer_checks), ("kv-pool-from-device-memory", kv_pool_from_device_memory)]:
    if (ONLY and name not in ONLY) or (name == "kv-pool-from-device-memory" and not DEVICE):
        continue
    check(name, fn)
bad = [(cmd, rc, err) for cmd, rc, err in STOPS if rc != 0 or "ERROR" in err or "runtime error" in err]
report("servers-exit-0", not bad, f"{len(STOPS)} servers stopped by SIGTERM, each exit 0 with a clean stderr" if not bad else
       f"{' '.join(bad[0][0][1:])}: exit {bad[0][1]}: {bad[0][2][-1500:]}")
sys.exit(1 if failed else 0)

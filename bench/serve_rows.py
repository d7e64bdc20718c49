#!/usr/bin/python3
"""bench/serve_rows.py - decode tokens/s of a batch of B sequences when one call of forward_chunk
holds the whole step against calls of fewer rows (docs/serve.md, "What a call computes"): the
control for the rows a call takes.

For each --rows R the program (--source, its --train block) is built with its serve block's
batch.tokens = R (the first serve block's `tokens = N` replaced, or a serve block appended with the
train block's model), which makes calls of R rows (plan_kv_config: batch.tokens, at most 256). Every
arm is served with the same runtime budget (--batch-seqs B, --batch-tokens and --prefill-chunk B x
the prompt length: the burst's prompts are one step, then every step is the B decodes), so the
scheduler packs the same steps and only the calls differ: a step of B decodes is ceil(B / R) calls,
each reading every weight. The weights are one training step from the initialisers, the same file for every arm
(the same model; decode time does not depend on what the weights say: requests run to max_tokens).

Each run sends B streaming requests at once (bench/serve_gpu.py's burst, the server holding its first
step until all B wait: MBT_SERVE_GATHER) of --prompt-len random ids and --output-len tokens, and
measures, from the server's /metrics over the burst, the engine's decode rate (the tokens of the
steps that held decodes alone over the seconds inside them: mbt_serve_decode_step_tokens_total and
_seconds_total; the model's time, not the HTTP side's) and its calls a step
(mbt_serve_engine_calls_total over mbt_serve_iterations_total), and from the clients' timestamps the
decode tokens/s in the steady window (bench/serve_gpu.py's decode_stats: from the last request's
first token to the first request's last; on a small model that is the HTTP side's rate). The arms run
alternately --repeat times; the table has the best run of each by the engine's rate (the least
disturbed on a shared machine) and the ratio of each arm's engine rate to the first arm's.

Usage: bench/serve_rows.py [--build build] [--source tests/serve/gpt.mbt] [--train small] [-I DIR]
         [--batch 64] [--rows 16,64] [--prompt-len 2] [--output-len 28] [--threads 2] [--repeat 3]
         [--cuda-arch sm_90 --device cuda] [--json OUT]
"""
import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("serve_gpu", os.path.join(ROOT, "bench", "serve_gpu.py"))
sg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sg)


def with_rows(src, train, rows, seqs):
    """The source with its serve block's batch.tokens = rows (one appended when it has none)."""
    m = re.search(r"^serve\s+\w+\s*\{", src, re.M)
    if m:
        head, rest = src[:m.end()], src[m.end():]
        new, n = re.subn(r"(batch\s*\{[^}]*\btokens\s*=\s*)\d+", lambda x: x.group(1) + str(rows), rest, count=1)
        if n != 1:
            sys.exit("bench/serve_rows.py: the serve block has no batch { tokens = N }")
        # a prefill chunk above the budget is refused: keep it within
        new = re.sub(r"(prefill_chunk\s*=\s*)(\d+)", lambda x: x.group(1) + str(min(int(x.group(2)), rows)), new, count=1)
        return head + new
    t = re.search(r"^train\s+" + re.escape(train) + r"\s*\{(.*?)^\}", src, re.M | re.S)
    model = t and re.search(r"^\s*model\s*=\s*(.+)$", t.group(1), re.M)
    if not model:
        sys.exit(f"bench/serve_rows.py: no train block '{train}' with a model line")
    return (src + f"\nserve rows{rows} {{\n  model = {model.group(1).strip()}\n"
            f"  weights = \"weights.safetensors\"\n  batch {{ tokens = {rows}, prefill_chunk = {rows}, seqs = {seqs} }}\n}}\n")


def run(cmd, what, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"bench/serve_rows.py: {what} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--source", default="tests/serve/gpt.mbt")
    ap.add_argument("--train", default=None, help="the train block (default: the file's first)")
    ap.add_argument("-I", dest="incs", action="append", default=[])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rows", default="16,64", help="the rows a call takes, an arm each; the first is the base")
    ap.add_argument("--prompt-len", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=28)
    ap.add_argument("--vocab", type=int, default=320, help="prompt ids below this")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--cuda-arch", default="none", help="mbtc's --cuda-arch (none: the CPU alone)")
    ap.add_argument("--device", default="cpu", help="serve's --device (cuda with a --cuda-arch build)")
    ap.add_argument("--json")
    a = ap.parse_args()
    B, P, O = a.batch, a.prompt_len, a.output_len
    arms = [int(x) for x in a.rows.split(",")]
    work = os.path.join(a.build, "tmp", "bench-serve-rows")
    os.makedirs(work, exist_ok=True)
    src = open(os.path.join(ROOT, a.source)).read()
    train = a.train or re.search(r"^train\s+(\w+)", src, re.M).group(1)
    incs = [x for d in a.incs for x in ("-I", d)] + ["-I", os.path.dirname(os.path.join(ROOT, a.source))]
    progs = {}
    for R in arms:
        path = os.path.join(work, f"rows{R}.mbt")
        open(path, "w").write(with_rows(src, train, R, B))
        progs[R] = os.path.join(work, f"rows{R}")
        t0 = time.monotonic()
        run([os.path.join(a.build, "mbtc"), *incs, path, "--train", train, f"--cuda-arch={a.cuda_arch}", "-o", progs[R]],
            f"mbtc -o (rows {R})")
        info = run([progs[R], "info"], "info")
        got = re.search(r"a chunk call takes up to (\d+) new tokens", info)
        if not got or int(got.group(1)) != R:
            sys.exit(f"bench/serve_rows.py: the rows-{R} build takes {got and got.group(1)} rows a call")
        print(f"mbtc -o rows {R}: {time.monotonic() - t0:.1f} s; info: a chunk call takes up to {got.group(1)} "
              "new tokens", flush=True)
    data = os.path.join(work, "d", "t_train.bin")
    run([os.path.join(a.build, "mbt-gendata"), "--out-dir", os.path.join(work, "d"), "--name", "t", "--vocab",
         str(min(a.vocab, 1024)), "--tokens", "20000", "--val-tokens", "0"], "mbt-gendata")
    weights = os.path.join(work, "weights.safetensors")
    run([progs[arms[0]], "train", "--data", data, "--steps", "1", "--save-weights", weights], "train --steps 1")
    results = {R: [] for R in arms}
    for k in range(a.repeat):
        for R in arms:
            budget = str(max(B, B * P))
            cmd = [progs[R], "serve", "--weights", weights, "--port", "0", "--threads", str(a.threads), "--device", a.device,
                   "--batch-seqs", str(B), "--batch-tokens", budget, "--prefill-chunk", budget]
            srv = sg.Server(cmd, dict(os.environ, MBT_SERVE_GATHER=str(B)))
            try:
                m0 = srv.metrics()
                s = sg.decode_stats(sg.burst(srv, B, P, O, a.vocab, 17 + k, a.client_procs), P, O)
                m1 = srv.metrics()
            finally:
                srv.stop()
            steps = m1["mbt_serve_iterations_total"] - m0["mbt_serve_iterations_total"]
            calls = m1["mbt_serve_engine_calls_total"] - m0["mbt_serve_engine_calls_total"]
            dt = m1["mbt_serve_decode_step_tokens_total"] - m0["mbt_serve_decode_step_tokens_total"]
            ds = m1["mbt_serve_decode_step_seconds_total"] - m0["mbt_serve_decode_step_seconds_total"]
            s.update(calls=calls, steps=steps, decode_batch_max=m1["mbt_serve_decode_batch_max"], engine_decode_tokens=dt,
                     engine_decode_seconds=ds, engine_decode_tokens_per_s=dt / ds if ds > 0 else 0.0)
            results[R].append(s)
            print(f"run {k + 1} rows {R}: engine decode {s['engine_decode_tokens_per_s']:.1f} tokens/s ({int(dt)} tokens "
                  f"in {ds:.3f} s), clients' steady window {s['decode_tokens_per_s'] or 0:.1f} tokens/s, "
                  f"{int(calls)} calls in {int(steps)} steps, largest decode batch {int(s['decode_batch_max'])}",
                  flush=True)
    best = {R: max(results[R], key=lambda s: s["engine_decode_tokens_per_s"]) for R in arms}
    base = best[arms[0]]["engine_decode_tokens_per_s"]
    print(f"\n{a.source} --train {train}: batch {B}, prompt {P}, output {O}, --threads {a.threads}, best of {a.repeat}")
    print(f"{'rows a call':>11} {'engine decode tok/s':>20} {'ms a step':>10} {'calls/step':>10} {'clients tok/s':>14} "
          f"{'vs rows ' + str(arms[0]):>12}")
    for R in arms:
        s = best[R]
        e = s["engine_decode_tokens_per_s"]
        print(f"{R:>11} {e:>20.1f} {1e3 * B / e:>10.2f} {s['calls'] / s['steps']:>10.2f} "
              f"{s['decode_tokens_per_s'] or 0:>14.1f} {e / base:>11.2f}x")
    if a.json:
        json.dump(dict(source=a.source, train=train, batch=B, prompt_len=P, output_len=O, threads=a.threads,
                       runs={str(R): results[R] for R in arms}), open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()

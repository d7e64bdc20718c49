#!/usr/bin/python3
"""serve_gpu_json.py JSON - checks bench/serve_gpu.py --dry's JSON (tests/gpu/check_bench_gpu.sh,
bench-gpu/serve-dry): both models at batches 1, 4 and 16; every number labelled measured or computed;
a measured decode rate from a non-empty steady window; the bytes a step and the bound recomputed from
the weights' bytes, the KV bytes a token, the mean context and the measured bandwidth; the mean context
inside the prompt (8) + output (48); the rows a call of forward_chunk takes (the server's metrics) and
one call a step whenever the batch fits them (the calls the server counted), the "as built" bound
recomputed from them; the peer's rows (of a model with mbt's parameter count) or why it
was skipped. Exits 1 with the first
failure's reason."""
import json
import sys

j = json.load(open(sys.argv[1]))
bw = j["bandwidth"]["value"]
assert bw > 0 and j["bandwidth"]["how"].startswith("measured"), j["bandwidth"]
for name in ("gpt2", "llama"):
    m = j["models"][name]
    w, kv = m["weights_bytes"]["value"], m["kv_bytes_per_token"]["value"]
    assert w > 0 and kv > 0, (name, w, kv)
    assert [r["batch"] for r in m["rows"]] == [1, 4, 16], (name, [r["batch"] for r in m["rows"]])
    rows = m["call_rows"]["value"]
    assert rows >= 16 and m["call_rows"]["how"].startswith("measured"), (name, "call rows", m["call_rows"])
    for r in m["rows"]:
        B = r["batch"]
        for k, v in r.items():
            if k != "batch":
                assert v["how"].split(":")[0] in ("measured", "computed"), (name, B, k, v)
        assert r["decode_tokens_per_s"]["value"] > 0 and r["window"]["tokens"] > 0, (name, B, "decode rate")
        assert 8 < r["mean_context"]["value"] <= 8 + 48, (name, B, "mean context", r["mean_context"])
        step = w + B * r["mean_context"]["value"] * kv
        assert abs(r["bytes_per_step"]["value"] - step) <= 1e-9 * step, (name, B, "bytes a step")
        bound = B * bw / step
        assert abs(r["bound_tokens_per_s"]["value"] - bound) <= 1e-9 * bound, (name, B, "bound")
        frac = r["decode_tokens_per_s"]["value"] / bound
        built = B * bw / (-(-B // rows) * w + B * r["mean_context"]["value"] * kv)
        assert abs(r["bound_as_built_tokens_per_s"]["value"] - built) <= 1e-9 * built, (name, B, "as built")
        assert r["calls_per_step"]["value"] == 1.0, (name, B, "calls a step", r["calls_per_step"])
        assert abs(r["fraction_of_bound"]["value"] - frac) <= 1e-9 * frac, (name, B, "fraction")
    assert m["peer"].get("rows") or m["peer"].get("skipped"), (name, m["peer"])
    if m["peer"].get("rows"):  # transformers' model of the same size, a row each batch
        assert m["peer"]["same_params"], (name, "the peer's parameters", m["peer"]["params"], w)
        assert sorted(int(b) for b in m["peer"]["rows"]) == [1, 4, 16], (name, m["peer"]["rows"])
        assert all(r["ttft_ms"] > 0 and r["tpot_ms"] > 0 for r in m["peer"]["rows"].values()), (name, "peer")
print("ok")

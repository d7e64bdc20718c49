#!/usr/bin/env python3
"""trace_tracks.py TRACE.json [TID NAME COUNT]... - checks MBT_TRACE's tracks (runtime/gpu/gpu_timing.c).

The Chrome trace has one track (tid) a stream: 0 the compute stream, 1 offload { activations }'s
copy stream, 2 offload { optimizer }'s. Checked:
  - each tid an "X" event uses is named by one "thread_name" metadata event ("ph": "M") with the
    runtime's name for it ("compute", "activations' copies", "optimizer's copies");
  - for each TID NAME COUNT: exactly COUNT "X" events named NAME on track TID ("+": at least one),
    and none of that name on another track;
  - on a copy track (tid 1, 2) every event lasts more than 0 us and none starts before the one
    before it ended (a stream runs its work in order; 1 us allowed for the events' resolution).
Prints one line: the events per expected name and their total microseconds. Exit 1 with the reason.
"""
import json
import sys

TRACKS = {0: "compute", 1: "activations' copies", 2: "optimizer's copies"}


def main(argv):
    if len(argv) < 2 or (len(argv) - 2) % 3:
        sys.exit("usage: trace_tracks.py TRACE.json [TID NAME COUNT]...")
    try:
        with open(argv[1]) as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{argv[1]}: {e}")
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list) or not events:
        sys.exit(f"traceEvents is not a non-empty list: {str(trace)[:200]}")
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    meta = [e for e in events if isinstance(e, dict) and e.get("ph") == "M"]
    names = {}
    for m in meta:
        if m.get("name") != "thread_name":
            continue
        tid = m.get("tid")
        if tid in names:
            sys.exit(f"track {tid} is named twice: {names[tid]!r} and {m}")
        names[tid] = (m.get("args") or {}).get("name")
    for tid in sorted({e.get("tid") for e in spans}, key=str):
        if tid not in TRACKS:
            sys.exit(f"an event is on track {tid!r}, not one of {sorted(TRACKS)}")
        if names.get(tid) != TRACKS[tid]:
            sys.exit(f"track {tid} has events but its thread_name is {names.get(tid)!r}, not {TRACKS[tid]!r}")
    out = []
    for i in range(2, len(argv), 3):
        tid, name, want = int(argv[i]), argv[i + 1], argv[i + 2]
        mine = [e for e in spans if e.get("name") == name and e.get("tid") == tid]
        other = sorted({e.get("tid") for e in spans if e.get("name") == name and e.get("tid") != tid})
        if other:
            sys.exit(f"{name!r} is on track(s) {other}, not only {tid}")
        if (want == "+" and not mine) or (want != "+" and len(mine) != int(want)):
            sys.exit(f"{len(mine)} events {name!r} on track {tid}, want {want}")
        out.append(f"{len(mine)} {name!r} on {tid} ({sum(e['dur'] for e in mine):.1f} us)")
    for tid in (1, 2):
        mine = sorted((e for e in spans if e.get("tid") == tid), key=lambda e: e["ts"])
        for a, b in zip(mine, mine[1:]):
            if b["ts"] < a["ts"] + a["dur"] - 1.0:
                sys.exit(f"track {tid}: {b} starts before {a} ends (one stream's work overlaps)")
        short = [e for e in mine if not e["dur"] > 0]
        if short:
            sys.exit(f"track {tid}: {len(short)} copies last 0 us or less, e.g. {short[0]}")
    print(f"{len(spans)} events; " + "; ".join(out))


if __name__ == "__main__":
    main(sys.argv)

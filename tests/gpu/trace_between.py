#!/usr/bin/env python3
"""trace_between.py TRACE.json NAME - how MBT_TRACE's compute track interleaves NAME's events with others.

Prints two numbers: the events named NAME on track 0 (the compute stream), and the other track-0
events that start between the first and the last of them (launches queued between those waits:
tests/gpu/run.sh's gpu/offload-host-overlap). Exit 1 when the trace cannot be read.
"""
import json
import sys


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: trace_between.py TRACE.json NAME")
    try:
        with open(argv[1]) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"{argv[1]}: {e}")
    compute = sorted((e for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("tid") == 0),
                     key=lambda e: e.get("ts", 0))
    marks = [i for i, e in enumerate(compute) if e.get("name") == argv[2]]
    between = 0
    if marks:
        inside = set(marks)
        between = sum(1 for i in range(marks[0], marks[-1]) if i not in inside)
    print(len(marks), between)


if __name__ == "__main__":
    main(sys.argv)

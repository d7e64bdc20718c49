"""The sequence-length buckets' test helper (tests/exec/buckets.case, issue 20).

  buckets.py variants SRC DIR    writes SRC's variants into DIR:
      b8.mbt      buckets = [8, 16] with curriculum = [(0, 8)]: every step at 8; evaluates every step
      s8.mbt      no buckets, seq = 8 and global = 8: the program compiled for windows of 8; evaluates
                  every step too
      s16.mbt     no buckets: windows of seq = 16
      e16.mbt     s16 with lr = 1e-30 (too small to move an f32 weight), evaluating every step: the val loss of the weights it starts from
      r16.mbt     curriculum = [(0, 16), (2, 8)]: steps 1-2 at 16, then 8
      r8.mbt      curriculum = [(0, 8), (2, 16)]: steps 1-2 at 8, then 16
      d2.mbt      the default cycle [8, 16] with parallel { data = 2 }: the same global batch
  buckets.py mixing SRC DIR      writes variants of SRC that let a row's windows meet, which
      mbtc -o must refuse: table.mbt (wpe[0:T], positions by the row's index), mean.mbt (a mean
      over the token axis), rope.mbt (rope without pos)
  buckets.py losses A.out B.out FIRST LAST
      the per-step losses of two runs' stdout are equal (as printed, 6 decimals) at steps
      FIRST..LAST; prints "losses: same" or "losses: differ at step N" (exit 1)
  buckets.py vals A.out B.out FIRST LAST     the same for the evaluations' val losses
"""
import re
import sys


def variants(src, out):
    text = open(src).read()
    batch = ", buckets = [8, 16]"
    assert batch in text
    ev = ("  steps     = 20\n", "  steps     = 20\n  eval      { every = 1, steps = 2 }\n")
    subs = {
        "b8": text.replace(batch, batch + ", curriculum = [(0, 8)]").replace(*ev),
        "s8": text.replace(batch, "").replace("seq = 16", "seq = 8").replace("global = 4", "global = 8").replace(*ev),
        "s16": text.replace(batch, ""),
        "e16": text.replace(batch, "").replace("lr = 1e-3", "lr = 1e-30").replace(*ev),
        "r16": text.replace(batch, batch + ", curriculum = [(0, 16), (2, 8)]"),
        "r8": text.replace(batch, batch + ", curriculum = [(0, 8), (2, 16)]"),
        "d2": text.replace("  steps     = 20\n", "  steps     = 20\n  parallel  { data = 2 }\n"),
    }
    for name, t in subs.items():
        assert t != text or name == "", name
        open(f"{out}/{name}.mbt", "w").write(t)
    print("variants: written")


def mixing(src, out):
    text = open(src).read()
    subs = {
        "table": ("    x = wte[idx] + wpe[pos]", "    x = wte[idx] + wpe[0:T]"),
        "mean": ("    for blk in h { x = blk(x, pos) }",
                 "    x = x + mean(x, axis = 1, keepdim = true)\n    for blk in h { x = blk(x, pos) }"),
        "rope": ("    q = rope(q, pos = pos)", "    q = rope(q)"),
    }
    for name, (a, b) in subs.items():
        assert a in text, name
        open(f"{out}/{name}.mbt", "w").write(text.replace(a, b))
    print("mixing: written")


def losses(path, what="loss"):
    got = {}
    for line in open(path):
        m = re.match(r"step (\d+)/\d+: " + what + r" ([0-9.]+)", line)
        if m:
            got[int(m.group(1))] = m.group(2)
    return got


def main():
    if sys.argv[1] == "variants":
        variants(sys.argv[2], sys.argv[3])
        return 0
    if sys.argv[1] == "mixing":
        mixing(sys.argv[2], sys.argv[3])
        return 0
    what = "val loss" if sys.argv[1] == "vals" else "loss"
    a, b = losses(sys.argv[2], what), losses(sys.argv[3], what)
    first, last = int(sys.argv[4]), int(sys.argv[5])
    for s in range(first, last + 1):
        if s not in a or s not in b:
            print(f"losses: step {s} missing")
            return 1
        if a[s] != b[s]:
            print(f"losses: differ at step {s} ({a[s]} and {b[s]})")
            return 1
    print(f"losses: same at steps {first}..{last}")
    return 0


sys.exit(main())

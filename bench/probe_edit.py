"""Shared by the probe builds (bench/cta_probe.py, bench/tail_probe.py): the
edits of a probe tree's sources, each piece of text found exactly once or
the whole patch stops naming it, so that a probe never builds on a source
whose text moved under it."""
import sys


def edit(path, who, pieces):
    """Apply (old, new, what) pieces to the file at @path in order; exit
    with "@who: what: found N times, not once" where one does not fit."""
    s = open(path).read()
    for old, new, what in pieces:
        n = s.count(old)
        if n != 1:
            sys.exit(f"{who}: {what}: found {n} times, not once")
        s = s.replace(old, new)
    open(path, "w").write(s)

"""Shared by tests/bench's Python scripts: the repository's root, bench/
on the import path (the scripts under test), and a check that counts
failures instead of stopping at the first, so that one run names them
all."""
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
fails = 0


def check(cond, what):
    global fails
    if not cond:
        print("FAIL:", what)
        fails += 1

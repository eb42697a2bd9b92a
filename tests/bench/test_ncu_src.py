#!/usr/bin/env python3
"""bench/ncu_src.py on a hand-made source page: two launches, the second
with a loop body (three lines executed ten times), and every share the
report prints checked against the counts written here."""
import io
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import ncu_src  # noqa: E402

HDR = ('"Address","Source","Warp Stall Sampling (All Samples)",'
       '"Warp Stall Sampling (Not-issued Samples)","Instructions Executed",'
       '"stall_wait","stall_short_sb","stall_wait (Not Issued)"')


def line(addr, src, samples, executed, wait, short):
    return '"%s","%s","%d","0","%d","%d","%d","0"' % (addr, src, samples, executed, wait, short)


CSV = "\n".join([
    '"Kernel Name","k_one(int)",',
    HDR,
    line("0x0", "MOV R1, c[0x0][0x28]", 0, 4, 0, 0),
    line("0x10", "EXIT", 2, 4, 2, 0),
    '"Kernel Name","k_two(int)",',
    HDR,
    line("0x0", "S2R R0, SR_TID.X", 1, 2, 1, 0),
    line("0x10", "LDS R2, [R0]", 6, 10, 0, 6),
    line("0x20", "@P0 IMAD R3, R2, 0x2, R3", 2, 10, 2, 0),
    line("0x30", "@!P1 BRA 0x10", 1, 10, 1, 0),
    line("0x40", "EXIT", 0, 2, 0, 0),
]) + "\n"


def run(text):
    rows = list(ncu_src.csv.reader(io.StringIO(text)))
    tabs = ncu_src.tables(rows)
    out = []
    for name, hdr, body in tabs:
        buf = io.StringIO()
        ncu_src.report(name, hdr, body, 5, 3, buf)
        out.append(buf.getvalue())
    return tabs, out


def main():
    tabs, out = run(CSV)
    assert [t[0] for t in tabs] == ["k_one(int)", "k_two(int)"], [t[0] for t in tabs]
    assert [len(t[2]) for t in tabs] == [2, 5]
    one, two = out
    assert "k_one(int): 2 SASS lines, 8 warp instructions, 2 stall samples" in one, one
    # k_two: 2 + 3 * 10 + 2 = 34 instructions, 10 samples (wait 4, short_sb 6)
    assert "k_two(int): 5 SASS lines, 34 warp instructions, 10 stall samples" in two, two
    assert "stalls: short_sb 60.0%, wait 40.0%" in two, two
    # the loop body: lines 1-3, 10 executions, 30 of 34 instructions, 9 of 10 samples
    want = "    %5d-%-5d %4d lines x %9.0f  %5.1f%%  %5.1f%%" % (1, 3, 3, 10, 100 * 30 / 34, 90.0)
    assert want in two, (want, two)
    # opcodes: LDS 10 of 34 instructions and 6 of 10 samples; predicates stripped
    assert "LDS 29.4/60.0" in two and "IMAD 29.4/20.0" in two and "BRA 29.4/10.0" in two, two
    # the lines by samples: the LDS first
    tail = two.split("lines by stall samples:")[1].splitlines()
    assert "LDS R2, [R0]" in tail[1] and "60.0%" in tail[1], tail
    # no source table at all
    assert ncu_src.tables([["x", "y"]]) == []
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""bench/scatter_model.py on hand-made blocks whose wavefronts are worked
out here: the word layout (st_warp's rows and tiles), one store's count,
the ascending order's sum, and the schedule (every value of every lane
stored once, never more wavefronts than ascending, none below the bound,
one a store where the lanes' banks allow)."""
import random
import sys

import benchcheck
from benchcheck import check
import scatter_model as sm  # noqa: E402


# layout: LD = 16 * 6 + 8 = 104 halves = 52 words a row; V after 16 K rows
w = sm.words_of([[0, 3]] + [[]] * 15, [[]] * 15 + [[95]], 6)
check(w[0] == [0, 1], "K row 0: channels 0 and 3 in words 0 and 1")
check(w[31] == [832 + 15 * 52 + 47], "V row 15, channel 95")
# one store: words 0, 32, 64 share bank 0 (3 wavefronts); word 1 alone
check(sm.store_wavefronts([0, 32, 64, 1, None]) == 3, "three words in bank 0")
check(sm.store_wavefronts([5, 5, 5]) == 1, "one word, any number of lanes")
check(sm.store_wavefronts([None, None]) == 0, "no store")
# ascending: every lane's value i in bank 0 -> 32 lanes, 32 words a step
lanes = [[32 * lane + 1024 * i for i in range(4)] for lane in range(32)]
check(sm.ascending(lanes) == 4 * 32, "all in one bank: 32 a store")
check(sm.bound(lanes) == 128, "bound: 128 stores to bank 0")
# a case a schedule fixes: every lane has one value in each bank, given
# in bank order, so that store i puts all 32 lanes on bank i (32 a store);
# a schedule exists with one a store (lane l's store i on bank l + i)
lanes = [[32 * lane + ((i - lane) % 32) for i in range(32)] for lane in range(32)]
for lane in lanes:
    lane.sort(key=lambda x: x % 32)
check(sm.ascending(lanes) == 32 * 32, "the given order: 32 lanes a bank each store")
order, wf = sm.schedule(lanes)
check(wf == 32, f"scheduled: one wavefront a store ({wf})")
check(all(sorted(o) == list(range(32)) for o in order), "every value once")
# random blocks: a permutation per lane, bound <= scheduled <= ascending
rng = random.Random(7)
for trial in range(20):
    rows_k = sm.uniform_rows(rng, 16, 96, 32)
    rows_v = sm.uniform_rows(rng, 16, 96, 32)
    lanes = sm.words_of(rows_k, rows_v, 6)
    order, wf = sm.schedule(lanes)
    check(all(sorted(o) == list(range(32)) for o in order), f"trial {trial}: permutations")
    # recount the schedule's stores independently of schedule()
    re = sum(sm.store_wavefronts([lanes[ln][order[ln][i]] for ln in range(32)])
             for i in range(32))
    check(re == wf, f"trial {trial}: the schedule's count {wf}, recounted {re}")
    check(sm.bound(lanes) <= wf <= sm.ascending(lanes),
          f"trial {trial}: bound {sm.bound(lanes)} <= {wf} <= {sm.ascending(lanes)}")

if benchcheck.fails:
    sys.exit(1)
print("scatter_model: layout, counts and schedule hold")

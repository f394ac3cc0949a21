"""Context parallelism's plan (fa_course.cp_plan), no GPU or PyTorch: for every rank and every
visiting K/V slice, the plan's kernel calls cover each visible (query, key) pair of the global
sequence exactly once and no hidden pair, checked pair by pair on small irregular sequences."""
import itertools

import pytest

from fa_course import cp_plan


def global_rows(chunks):
    """Local row -> global row of a rank's chunks."""
    return [start + i for start, length in chunks for i in range(length)]


def coverage(n_q, n_kv, world, kind, causal, bottom_right):
    """How many times each global (i, j) pair is computed over all ranks and ring steps."""
    offset = n_kv - n_q if bottom_right else 0
    q_lay, kv_lay = cp_plan.layout(n_q, world, kind), cp_plan.layout(n_kv, world, kind)
    count = {}
    for r, src in itertools.product(range(world), range(world)):
        rows, cols = global_rows(q_lay[r]), global_rows(kv_lay[src])
        for c in cp_plan.plan_step(q_lay[r], kv_lay[src], causal, offset):
            for i, j in itertools.product(range(c.q0, c.q1), range(c.k0, c.k1)):
                if c.visible(i, j):
                    key = (rows[i], cols[j])
                    count[key] = count.get(key, 0) + 1
    return count, offset


CASES = [(n_q, n_kv, world, kind) for n_q, n_kv in ((17, 17), (40, 40), (23, 61), (61, 23), (64, 64))
         for world in (1, 2, 3, 4) for kind in cp_plan.LAYOUTS]


@pytest.mark.parametrize("n_q,n_kv,world,kind", CASES, ids=lambda x: str(x))
@pytest.mark.parametrize("causal,bottom_right", [(False, False), (True, False), (True, True)])
def test_every_visible_pair_once_and_no_hidden_pair(n_q, n_kv, world, kind, causal, bottom_right):
    count, offset = coverage(n_q, n_kv, world, kind, causal, bottom_right)
    for i, j in itertools.product(range(n_q), range(n_kv)):
        want = 1 if (not causal or j <= i + offset) else 0
        assert count.get((i, j), 0) == want, f"pair (q {i}, k {j}): computed {count.get((i, j), 0)}×, want {want}"


def test_layouts_hold_every_row_once():
    for n, world, kind in itertools.product((8, 17, 1000), (1, 2, 4), cp_plan.LAYOUTS):
        rows = [x for rank in cp_plan.layout(n, world, kind) for x in global_rows(rank)]
        assert sorted(rows) == list(range(n))
    assert cp_plan.layout(8, 2, "zigzag") == [[(0, 2), (6, 2)], [(2, 2), (4, 2)]]
    with pytest.raises(ValueError, match="cannot be split"):
        cp_plan.layout(3, 2, "zigzag")
    with pytest.raises(ValueError, match="layout must be"):
        cp_plan.layout(8, 2, "striped")


def test_zigzag_gives_every_rank_the_same_work_at_every_step_and_one_call():
    n, world = 64, 4
    lay = cp_plan.layout(n, world, "zigzag")
    for t in range(world):
        plans = [cp_plan.plan_step(lay[r], lay[(r - t) % world], True) for r in range(world)]
        assert len({cp_plan.work(p) for p in plans}) == 1, f"step {t}: unequal work {[cp_plan.work(p) for p in plans]}"
        assert all(len(p) == 1 for p in plans), f"step {t}: {plans}"


def test_contiguous_causal_leaves_ranks_idle():
    """The plain ring: at step t, ranks r < t see only later keys and have nothing to compute."""
    n, world = 64, 4
    lay = cp_plan.layout(n, world, "contiguous")
    for t in range(1, world):
        for r in range(world):
            assert (cp_plan.plan_step(lay[r], lay[(r - t) % world], True) == []) == (r < t)

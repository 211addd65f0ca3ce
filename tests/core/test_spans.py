from speedsplit.core.spans import length, overlap, union


def test_union_length_and_overlap():
    u = union([(5, 7), (0, 2), (1, 3), (3, 4)])
    assert u == [(0, 4), (5, 7)] and length(u) == 6
    assert overlap(u, union([(3.5, 6)])) == 0.5 + 1
    assert union([(5, 7), (0, 2), (1, 3), (3, 4)], join_gaps_under=1.5) == [(0, 7)]

"""``finish_pooled``: a batch sharing one params object takes the short way
(no grouping, one ``tobytes``) and gives the bytes the grouped way gives."""

from __future__ import annotations

import numpy as np

from octavo.core.pooling_params import PoolerConfig, PoolingParams
from octavo.models.pooling import NORM_EPS, finish_pooled


def test_shared_params_give_what_equal_params_give():
    pooler = PoolerConfig(task="embed", output_size=8, normalize=True)
    rows = np.random.default_rng(0).standard_normal((5, 8), dtype=np.float32)
    shared = PoolingParams(task="embed")
    expected = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), NORM_EPS)
    for params_list in ([shared] * 5, [PoolingParams(task="embed") for _ in range(5)]):
        out = finish_pooled(rows, params_list, pooler)
        assert [len(b) for b in out] == [32] * 5
        np.testing.assert_array_equal(np.frombuffer(b"".join(out), "<f4").reshape(5, 8), expected.astype("<f4"))


def test_mixed_params_each_row_its_own():
    pooler = PoolerConfig(task="embed", output_size=8, normalize=True)
    rows = np.random.default_rng(1).standard_normal((4, 8), dtype=np.float32)
    short, raw = PoolingParams(task="embed", dimensions=2), PoolingParams(task="embed", normalize=False)
    out = finish_pooled(rows, [short, raw, short, raw], pooler)
    assert [len(b) for b in out] == [8, 32, 8, 32]
    np.testing.assert_array_equal(np.frombuffer(out[1], "<f4"), rows[1])
    cut = rows[2, :2] / np.linalg.norm(rows[2, :2])
    np.testing.assert_allclose(np.frombuffer(out[2], "<f4"), cut, rtol=1e-6)

"""Many pooling inputs added to a data-parallel front at once
(``DataParallelEngine.add_pooling_requests``, ``distributed/dp_pooling.py``):
the vectors of the in-process engine, in order; a bad input refused at the
front before anything reaches a replica, which goes on serving."""

from __future__ import annotations

import pytest

from octavo import LLM
from octavo.distributed.data_parallel import DataParallelEngine
from octavo.errors import InvalidArgumentError
from tests.models.conftest import pooling_dirs, wordpiece_dir  # noqa: F401

TEXTS = ["the cat sits on the mat", "a dog runs", "Hello, World!", "naïve café", "the mat"] * 3


def test_a_batch_through_the_front_gives_the_in_process_vectors(pooling_dirs):  # noqa: F811
    path = str(pooling_dirs("bert"))
    local = LLM(path, dtype="float32", max_model_len=64)
    front = LLM(path, dtype="float32", max_model_len=64, engine_process=True)
    try:
        assert isinstance(front.engine, DataParallelEngine)
        sent = []
        send = front.engine._send
        front.engine._send = lambda replica, message: (sent.append(message[0]), send(replica, message))[1]
        expected = [o.outputs.raw for o in local.embed(TEXTS)]
        outputs = front.embed(TEXTS)
        assert [o.outputs.raw for o in outputs] == expected and [o.prompt for o in outputs] == TEXTS
        assert sent == ["add_pooling"]  # one message for the 15 inputs
        sent.clear()
        with pytest.raises(InvalidArgumentError, match="out of range"):
            front.embed([{"prompt_token_ids": [2, 5, 3]}, {"prompt_token_ids": [2, 10**6, 3]}])
        assert sent == [] and not front.engine._front.live_requests
        assert [o.outputs.raw for o in front.embed(TEXTS[:2])] == expected[:2]  # still serving
    finally:
        front.engine.shutdown()
        local.engine.shutdown()

"""The Ray executor on a local cluster started inside the test
(``ray.init(num_cpus=2)``): one worker actor per rank, placed by a placement
group, gives the tokens of the single-process engine at TP=2 and PP=2."""

from __future__ import annotations

import pytest

from octavo import LLM
from tests.distributed.common import engine_options, generate, greedy, make_prompts, reference, token_ids, vocab_size

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'octavo[ray]')")


@pytest.fixture(scope="module")
def local_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_ray_matches_single_process(local_cluster, llama_dir, tp, pp):
    from octavo.runtime.executors.ray_executor import RayExecutor

    prompts = make_prompts(vocab_size(llama_dir), seed=5)
    expected = reference(llama_dir, prompts, greedy())
    llm = LLM(
        str(llama_dir),
        **engine_options(tensor_parallel_size=tp, pipeline_parallel_size=pp, distributed_executor_backend="ray"),
    )
    executor = llm.engine.executor
    placement_group = executor._placement_group
    try:
        assert isinstance(executor, RayExecutor) and len(executor._actors) == 2
        outputs = generate(llm, prompts, greedy())
        llm.engine.check_health()
    finally:
        llm.engine.shutdown()
    assert token_ids(outputs) == token_ids(expected)
    # The actors are gone and their placement group released.
    from ray.util.placement_group import placement_group_table

    assert placement_group_table(placement_group)["state"] == "REMOVED"
    assert executor._actors == []

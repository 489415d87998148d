"""The objects a platform is handed (plugin API 1.1, ``octavo.platforms.contract``):
a vendor's graph runner built only from ``RunnerView`` members, and events
and pinned memory asked of the platform, never of ``torch.cuda``."""

from __future__ import annotations

from octavo import SamplingParams
from octavo.plugins.manager import reset_plugin_manager
from tests.models.test_hf_parity import make_prompts
from tests.runtime.test_decode_overlap import vocab

GRAPH_PLATFORM = '''
OCTAVO_PLUGIN_API_VERSION = "1.1"
from octavo.platforms.cpu import CpuPlatform
from octavo.runtime.attention.torch_paged import TorchPagedAttention


class ReplayablePaged(TorchPagedAttention):
    name = "replayable_paged"
    supports_graph_capture = True


class EagerGraphs:
    """StepGraphs whose "capture" keeps the step function and whose "replay"
    calls it again on the refilled inputs: the protocol without a device."""

    made = []

    def __init__(self, runner, sizes):
        self.runner, self.sizes, self.steps, self.replays = runner, sorted(sizes), {}, []
        EagerGraphs.made.append(self)

    def capture(self):
        for size in self.sizes:
            self.steps[size] = self.runner.decode_step_for_capture(size)

    def padded_size(self, num_reqs):
        return next((size for size in self.sizes if size >= num_reqs), None)

    def replay(self, size, num_reqs):
        self.replays.append(size)
        return self.steps[size]()[:num_reqs]


class CountingEvent:
    recorded = 0

    def record(self):
        CountingEvent.recorded += 1

    def synchronize(self):
        pass


class GraphCpu(CpuPlatform):
    name = "graph_cpu"
    priority = -1
    supports_graphs = True
    attention_backends = ("replayable_paged",)

    def graph_runner(self):
        return EagerGraphs

    def create_event(self):
        return CountingEvent()


@hookimpl
def octavo_platforms():
    return [GraphCpu]


@hookimpl
def octavo_attention_backends():
    return {"replayable_paged": ReplayablePaged}
'''


def test_a_graph_runner_needs_only_the_runner_view(sandbox, llama_dir, make_llm):
    prompts = [{"prompt_token_ids": p} for p in make_prompts(vocab(llama_dir))[:3]]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in make_llm(llama_dir).generate(prompts, params)]
    sandbox.add("graph_platform", GRAPH_PLATFORM)
    reset_plugin_manager()
    llm = make_llm(llama_dir, platform="graph_cpu", max_num_seqs=4, max_prefill_graph_tokens=0, overlap_decode=False)
    from graph_platform import CountingEvent, EagerGraphs

    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
    (graphs,) = EagerGraphs.made
    assert graphs.sizes == [1, 2, 4] and set(graphs.replays) == {4}  # three requests decode in the size-4 "graph"
    assert CountingEvent.recorded > 0  # the staging buffers' uploads were marked with the platform's events

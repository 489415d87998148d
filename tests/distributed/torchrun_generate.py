"""Run by ``torchrun`` in test_external_launcher.py: every process builds the
engine with the external launcher backend, generates the same prompts, and
writes its token ids to ``<out_dir>/rank<RANK>.json``.

Usage: torchrun --nproc-per-node 2 torchrun_generate.py MODEL TP PP PROMPTS_JSON OUT_DIR
"""

import json
import os
import sys
from pathlib import Path

from octavo import LLM, SamplingParams


def main() -> None:
    model, tp, pp, prompts_file, out_dir = sys.argv[1:6]
    prompts = json.loads(Path(prompts_file).read_text())
    llm = LLM(
        model,
        dtype="float32",
        max_model_len=256,
        num_kv_blocks=64,
        tensor_parallel_size=int(tp),
        pipeline_parallel_size=int(pp),
        distributed_executor_backend="external_launcher",
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    result = [o.outputs[0].token_ids for o in outputs]
    Path(out_dir, f"rank{os.environ['RANK']}.json").write_text(json.dumps(result))
    llm.engine.shutdown()


if __name__ == "__main__":
    main()

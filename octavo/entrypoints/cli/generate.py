"""``octavo generate [--model M] "prompt"``: stream a completion to the terminal.

Sampling flags left unset take the model's generation-config defaults
(``--generation-config``), else greedy decoding.
"""

from __future__ import annotations

import argparse
import sys

# Unless the flags or the model's generation config say otherwise.
CLI_SAMPLING_DEFAULTS = {"temperature": 0.0}


def add_parser(sub) -> None:
    from octavo.entrypoints.cli.common import add_engine_args

    parser = sub.add_parser("generate", help="generate text from a prompt, streamed to the terminal")
    parser.add_argument("prompt", nargs="?", default="Once upon a time", help="the prompt (default: 'Once upon a time')")
    add_engine_args(parser)
    # Long enough for the demo model to finish a story (about 100-150 tokens).
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=None, help="default: the model's, else 0 (greedy)")
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--min-p", type=float, default=None)
    parser.add_argument("--repetition-penalty", type=float, default=None)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.set_defaults(func=run)


def _load_engine(args):
    from octavo.engine_args import build_engine
    from octavo.entrypoints.cli.common import engine_args_from

    # A bar while the model loads, so that a slow load does not look hung.
    from tqdm.auto import tqdm

    with tqdm(total=1, desc="Loading model", unit="model", file=sys.stderr, leave=False) as bar:
        engine = build_engine(engine_args_from(args))
        bar.update(1)
    return engine


def sampling_params_for(args: argparse.Namespace, engine):
    from octavo.core.sampling_params import RequestOutputKind, SamplingParams
    from octavo.models.generation_defaults import engine_sampling_defaults, with_sampling_defaults

    given = {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
    }
    defaults = {**CLI_SAMPLING_DEFAULTS, **engine_sampling_defaults(engine)}
    return SamplingParams(
        **with_sampling_defaults(given, defaults),
        max_tokens=args.max_tokens,
        seed=args.seed,
        output_kind=RequestOutputKind.DELTA,
    )


def run(args: argparse.Namespace) -> int:
    from octavo.entrypoints.cli.common import print_startup_summary

    engine = _load_engine(args)
    print_startup_summary(engine)
    params = sampling_params_for(args, engine)
    prompt = args.prompt
    if args.chat:
        from octavo.entrypoints.llm import LLM

        llm = LLM.__new__(LLM)
        llm.engine = engine
        prompt = llm.render_chat([{"role": "user", "content": args.prompt}])
    engine.add_request("cli", prompt, params)
    if not args.chat:
        sys.stdout.write(args.prompt)
    while engine.has_unfinished_requests():
        for output in engine.step():
            sys.stdout.write(output.outputs[0].text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    engine.shutdown()
    return 0

#!/usr/bin/env bash
# A/B of two trees in one GPU run: an older commit unpacked beside this one
# (git archive OLD | tar -x -C abold, untracked so that it travels to the
# device) and the tree as it is; TTFT 512 / 2,048 twice each, the 512 x
# (256/256) throughput once each, interleaved, and the layer-op resolution.
# Usage: bash benchmarks/ab_trees.sh [OLD_DIR]
OLD=${1:-abold}
M="--model benchmarks/configs/llama-3.1-8b --load-format dummy --dtype bfloat16"
CLI="python -m octavo.entrypoints.cli.main"
PYTHONPATH=$PWD $CLI env --model benchmarks/configs/llama-3.1-8b 2>&1 | grep -A14 -i "layer op"
for round in 1 2; do for tree in "$OLD" .; do
  (cd "$tree" && export PYTHONPATH=$PWD
   for L in 512 2048; do $CLI bench latency $M --batch-size 1 --input-len $L --output-len 2 --num-iters 5 2>&1 | grep -E "^TTFT" | sed "s|^|$tree |"; done
   [ $round = 1 ] && $CLI bench throughput $M --num-prompts 512 --input-len 256 --output-len 256 --max-num-seqs 512 --max-num-batched-tokens 8192 2>&1 | grep -E "^output tokens" | sed "s|^|$tree |")
done; done

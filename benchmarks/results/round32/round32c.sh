#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
git log --oneline -1 2>/dev/null; nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== gpu tests: pooling, fp8 fused"; s=$SECONDS
timeout 200 python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_pooling.py tests/gpu/test_gpu_parity.py -k "pooling or graphs or fp8" 2>&1 | tail -3; echo "$((SECONDS-s))s"
echo "=== embed_host cuda"; s=$SECONDS
TOKENIZERS_PARALLELISM=true timeout 200 python benchmarks/embed_host.py --device cuda --minilm-layers --rounds 3 --num-batches 20 > $OUT/embed_host.log 2>&1
echo "$((SECONDS-s))s"; grep -v "Writing\|Loading" $OUT/embed_host.log | tail -5
OUT=$OUT bash benchmarks/gpu_round.sh embed
echo "=== fp8 tput (fast accum default) vs bf16, then fp8 with OCTAVO_FP8_FAST_ACCUM=0"; s=$SECONDS
timeout 200 python benchmarks/quant_e2e.py throughput --methods bf16,fp8 --output-json $OUT/fp8_tput_fast.json > $OUT/fp8_tput_fast.log 2>&1; tail -4 $OUT/fp8_tput_fast.log
OCTAVO_FP8_FAST_ACCUM=0 timeout 150 python benchmarks/quant_e2e.py throughput --methods fp8 --output-json $OUT/fp8_tput_slow.json > $OUT/fp8_tput_slow.log 2>&1; tail -3 $OUT/fp8_tput_slow.log
echo "$((SECONDS-s))s"

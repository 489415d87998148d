#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
git log --oneline -1 2>/dev/null; nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== embed_host cuda"; s=$SECONDS
TOKENIZERS_PARALLELISM=true timeout 200 python benchmarks/embed_host.py --device cuda --minilm-layers --rounds 3 --num-batches 20 > $OUT/embed_host.log 2>&1
echo "$((SECONDS-s))s"; grep -v "Writing\|Loading" $OUT/embed_host.log | tail -6
bash benchmarks/gpu_round.sh gemma2_lat1_tuned
echo "=== fp8 tput"; s=$SECONDS
timeout 400 python benchmarks/quant_e2e.py throughput --methods bf16,fp8 --output-json $OUT/fp8_tput.json > $OUT/fp8_tput.log 2>&1
echo "$((SECONDS-s))s"; tail -8 $OUT/fp8_tput.log

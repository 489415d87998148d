#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== gpu pooling tests"; s=$SECONDS
timeout 200 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_gpu_pooling.py 2>&1 | tail -3; echo "$((SECONDS-s))s"
echo "=== embed_host cuda"; s=$SECONDS
TOKENIZERS_PARALLELISM=true timeout 200 python benchmarks/embed_host.py --device cuda --minilm-layers --rounds 3 --num-batches 20 > $OUT/embed_host.log 2>&1
echo "$((SECONDS-s))s"; grep -v "Writing\|Loading" $OUT/embed_host.log | tail -5
OUT=$OUT bash benchmarks/gpu_round.sh embed

#!/usr/bin/env bash
bash .devcarry/setup.sh >/dev/null && source /tmp/mlxenv
mkdir -p /tmp/tqsrc/tqbridge && for d in bridge metal parity tools; do ln -sfn $PWD/$d /tmp/tqsrc/tqbridge/$d; done
export PYTHONPATH=/tmp/tqsrc:$PWD/.devcarry/pylib:$PYTHONPATH TQBRIDGE_CACHE=/tmp/tqc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
python -m pytest -m gpu -p no:cacheprovider -p no:tqbridge -q -x tests/test_calibrated_lane.py tests/test_decode_step.py tests/test_kv_append.py tests/test_deferred_append.py 2>&1 | tail -8
echo "gpu tests $(( $(date +%s) - T0 )) s"
T0=$(date +%s)
timeout 400 python -m tqbridge.tools.cli bench decode --models llama-3.1-8b --context 4096,32768 --caches fp16,q8_0/turbo3,q5_1/q5_0,q5_1+mean+scale/q5_0 --tokens 32 --rounds 4 --json $OUT/decode-8b.json 2>&1 | grep -v "^{" | tail -14
echo "bench decode $(( $(date +%s) - T0 )) s"

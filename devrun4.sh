bash .devcarry/setup.sh >/dev/null && source /tmp/mlxenv
mkdir -p /tmp/tqsrc/tqbridge && for d in bridge metal parity tools; do ln -sfn $PWD/$d /tmp/tqsrc/tqbridge/$d; done
export PYTHONPATH=/tmp/tqsrc:$PWD/.devcarry/pylib:$PYTHONPATH TQBRIDGE_CACHE=/tmp/tqc
timeout 420 python -m pytest -m gpu -p no:cacheprovider -p no:tqbridge -n 8 -q tests/ 2>&1 | tail -15

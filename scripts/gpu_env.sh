# Sourced by the device-machine scripts (gpu_session.sh, gpu_profile.sh): logs into $OUT (the device tool's, or
# ./out), carried wheels (.whl: FLA and what the machine lacks) installed into /tmp/site, this tree importable.
set -o pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1

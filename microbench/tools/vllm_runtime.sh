#!/usr/bin/env bash
# Carries a vLLM 0.24.0 runtime to the device (no package index there) in two ignored folders,
# each under the 64 MiB a device call may send, and installs it into /tmp/site there.
#
# Here (once):  DEVICE_HAS="<the image's package names>" bash microbench/tools/vllm_runtime.sh pack
#   (session 18 ran these steps by hand, in this order; the script form was not rerun end to end)
#   .vrt1/: the dependency wheels the device image lacks (cp312) + _C (sm_90 pruned, xz)
#   .vrt2/: vLLM's Python tree (xz) + _moe_C and FlashAttention-3 (sm_90 pruned, xz)
# Device, call 1 (carry .vrt1):  bash microbench/tools/vllm_runtime.sh install1
# Device, call 2 (carry .vrt2, same warm machine):  bash microbench/tools/vllm_runtime.sh install2
# Both calls must land on one machine (it stays warm 30 s after a call); install2 says so if
# the first half is missing. The device call sends the checkout's tracked files too: move the
# large data folders (calibration/, microbench/public/, microbench/data/) aside for those calls.
set -euo pipefail
mode=${1:?pack, install1 or install2}
SITE=/tmp/site
case "$mode" in
pack)
  W=${VLLM_WHEEL:-/tmp/vllm24/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl}
  [ -f "$W" ] || python3 -m pip download --no-deps vllm==0.24.0 -d "$(dirname "$W")"
  work=$(mktemp -d)
  mkdir -p .vrt1/deps .vrt2
  (cd "$work" && unzip -q -o "$W" -x 'vllm/vllm-rs' 'vllm/third_party/deep_gemm/*' 'vllm/third_party/fmha_sm100/*')
  for lib in _C_stable_libtorch:.vrt1/c _moe_C_stable_libtorch:.vrt2/moe vllm_flash_attn/_vllm_fa3_C:.vrt2/fa3; do
    src=$work/vllm/${lib%%:*}.abi3.so dst=${lib##*:}
    strip --strip-unneeded "$src" -o "$work/s.so"
    python3 microbench/tools/fatbin_prune.py "$work/s.so" "$work/h.so" 90
    xz -T2 -6 -c "$work/h.so" > "$dst.so.xz"
  done
  find "$work/vllm" -name '*.so' -delete
  tar -C "$work" -cJf .vrt2/vllm_py.tar.xz vllm vllm-0.24.0.dist-info
  # vLLM's Requires-Dist that the device image lacks (cp312), with what they need, less what
  # the image has (its package list: /work/.library/device/KINDS.md) and less the packages
  # vllm_step_probe.py stubs (server, telemetry, structured output, Mistral tokenizers).
  plat="--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64"
  plat="$plat --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64"
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp $plat -d "$work/deps" \
    cachetools blake3 "fastapi[standard]<0.137.0,>=0.133.0" "starlette>=1.0.1" "openai>=2.0.0" "pydantic>=2.12.0" \
    prometheus-fastapi-instrumentator lm-format-enforcer==0.11.3 outlines_core==0.2.14 diskcache==5.6.3 lark==1.2.2 \
    partial-json-parser "jsonschema>=4.23.0" pyzmq msgspec depyf==0.20.0 watchfiles python-json-logger pybase64 cbor2 \
    ijson setproctitle "openai-harmony>=0.0.3" gguf loguru
  python3 -m pip download -q --no-deps -d "$work/deps" compressed-tensors==0.17.0
  have=" $(tr 'A-Z_.' 'a-z--' <<< "${DEVICE_HAS:?space-separated package names the device image has}") "
  for w in "$work"/deps/*.whl; do
    n=$(basename "$w" | sed 's/-[0-9].*//' | tr 'A-Z_.' 'a-z--')
    case "$n" in nvidia-*|torch|triton|xgrammar|llguidance|anthropic|mcp|sentry-sdk|mistral-common|pycountry|cryptography|apache-tvm-ffi) continue;; esac
    [[ "$have" == *" $n "* ]] || cp "$w" .vrt1/deps/
  done
  du -sh .vrt1 .vrt2
  ;;
install1)
  rm -rf "$SITE" && mkdir -p "$SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .vrt1/deps/*.whl
  xz -dc .vrt1/c.so.xz > "$SITE/_C_stable_libtorch.abi3.so"
  echo "install1: $(ls "$SITE" | wc -l) entries in $SITE"
  ;;
install2)
  [ -f "$SITE/_C_stable_libtorch.abi3.so" ] || { echo "install2: first half missing (a fresh machine?): run install1 again" >&2; exit 3; }
  tar -C "$SITE" -xJf .vrt2/vllm_py.tar.xz
  mv "$SITE/_C_stable_libtorch.abi3.so" "$SITE/vllm/"
  xz -dc .vrt2/moe.so.xz > "$SITE/vllm/_moe_C_stable_libtorch.abi3.so"
  xz -dc .vrt2/fa3.so.xz > "$SITE/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
  echo "install2: vllm $(cat "$SITE"/vllm-0.24.0.dist-info/METADATA | grep -m1 ^Version)"
  ;;
*) echo "unknown mode $mode" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# GPU check of the real CUDA driver, in two parts.
#
# 1. HERE (Go, cmake, a C compiler; no GPU needed):
#        scripts/gpu-check.sh build
#    builds build/libkvbm.so, the test binaries of ./cuda ./core/transfer
#    ./core/worker, the C examples and the kvbmgo wheel (make wheel) into
#    build/gpu/ (under 64 MiB).
#
# 2. ON THE GPU MACHINE (no Go there; it has PyTorch with CUDA, which
#    scripts/gpu_check.py needs: the python-torch step fails with a plain
#    message where `import torch` fails), through the device tool's `run`:
#        command:  bash scripts/gpu-check.sh run
#        carry:    ["build/gpu"]        timeout_s: 420
#    runs, with KVBM_DEVICE=cuda: the Go test binaries (./cuda twice: as is
#    and with KVBM_CUDA_MEMCPY_BATCH=1), the C examples, and
#    scripts/gpu_check.py (PyTorch layer-wise onboard through ctypes, GB/s of
#    2 MiB blocks and 32 KiB fragments beside a raw pinned copy, host G1
#    pinned by its owner, and two processes on this host pulling G1 and G2
#    with CUDA IPC, KVBM_CUDA_IPC=1, beside the socket route) and
#    scripts/gpu_check_vllm.py (the vLLM connector's worker side: offload
#    after the forward's event, layer-wise onboard with torch events, on
#    vLLM-shaped strided CUDA views, and sleep mode: G1 unregistered, its
#    memory given back to the driver, a load refused, G1 registered again
#    on new memory and loaded byte-exact; vllm itself is optional there),
#    twice: on cudaMalloc'd memory and on VMM memory (PyTorch's expandable
#    segments, standing in for vLLM 0.34's extensible KV cache). The
#    summary names the driver's CUDA version and cuMemcpyBatchAsync (none,
#    v1 or v2), so that a skipped batch-API test shows why. Logs go to
#    $OUT (or build/gpu-out when OUT is unset). Finishes in about 3 minutes;
#    each step is bounded by `timeout`.
#
# Exit status: 0 when every step passed.
set -u
cd "$(dirname "$0")/.."
GPU=build/gpu

build() {
  set -e
  rm -rf "$GPU" && mkdir -p "$GPU"
  make lib
  cp build/libkvbm.so "$GPU/"
  for pkg in cuda core/transfer core/worker; do
    go test -c -o "$GPU/$(echo "$pkg" | tr / _).test" "./$pkg"
  done
  cmake -S . -B build/cmake -DKVBM_LIBRARY="$PWD/build/libkvbm.so" >/dev/null
  cmake --build build/cmake -j >/dev/null
  mkdir -p "$GPU/examples"
  for ex in offload_onboard handoff remote misuse; do cp "build/cmake/$ex" "$GPU/examples/"; done
  scripts/wheel.sh build >/dev/null
  cp build/wheel/kvbmgo-*.whl "$GPU/"
  strip "$GPU"/*.test "$GPU"/examples/* 2>/dev/null || true
  du -sh "$GPU"
  local kib; kib=$(du -sk "$GPU" | cut -f1)
  if [ "$kib" -gt $((60 * 1024)) ]; then echo "gpu-check: $GPU is ${kib} KiB, over the 64 MiB carry limit" >&2; exit 1; fi
  echo "gpu-check: built; on the GPU machine run: bash scripts/gpu-check.sh run  (carry build/gpu)"
}

run() {
  local out=${OUT:-build/gpu-out} fails=0 lib
  mkdir -p "$out"
  lib=$PWD/$GPU/libkvbm.so
  export KVBM_DEVICE=cuda KVBM_LIBRARY=$lib LD_LIBRARY_PATH=$PWD/$GPU${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local deadline=$((SECONDS + 330)) # the whole run stays under 6 minutes
  step() { # step NAME TIMEOUT_S CMD...: run, log to $out/NAME.log, report
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    limit=$((limit < deadline - SECONDS ? limit : deadline - SECONDS))
    if [ "$limit" -lt 5 ]; then echo "$name: skipped, out of time" | tee -a "$out/summary.txt"; fails=$((fails + 1)); return; fi
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    printf '%-28s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$out/summary.txt"
    if [ "$rc" -ne 0 ]; then fails=$((fails + 1)); tail -n 25 "$out/$name.log"; fi
  }
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/summary.txt"
  # The driver's batch API, from libcuda itself (as real_trampolines.c
  # resolves it): with none, go-cuda-batchapi's tests skip.
  python3 - <<'PY' 2>&1 | tee -a "$out/summary.txt"
import ctypes
try:
    cu = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print(f"libcuda.so.1: cannot load: {e}")
else:
    v = ctypes.c_int()
    cu.cuDriverGetVersion(ctypes.byref(v))
    has = lambda name: hasattr(cu, name)
    batch = "v2 (cuMemcpyBatchAsync_v2)" if has("cuMemcpyBatchAsync_v2") else \
        "v1 (cuMemcpyBatchAsync)" if has("cuMemcpyBatchAsync") else "none: the batch-API tests skip"
    print(f"CUDA driver API {v.value // 1000}.{v.value % 1000 // 10}; batch API {batch}")
PY
  # Go test binaries run in their package directory (testdata paths).
  step go-cuda 90 bash -c "cd cuda && ../$GPU/cuda.test -test.count=1 -test.v -test.run 'Real|Conformance|Open'"
  step go-cuda-batchapi 60 bash -c "cd cuda && KVBM_CUDA_MEMCPY_BATCH=1 ../$GPU/cuda.test -test.count=1 -test.v -test.run 'Real'"
  step go-core-transfer 60 bash -c "cd core/transfer && ../../$GPU/core_transfer.test -test.count=1"
  step go-core-worker 60 bash -c "cd core/worker && ../../$GPU/core_worker.test -test.count=1"
  for ex in offload_onboard handoff remote misuse; do
    step "c-$ex" 30 "$GPU/examples/$ex"
  done
  grep -ho 'batch API [0-9] (enabled [a-z]*)' "$out/go-cuda.log" "$out/go-cuda-batchapi.log" 2>/dev/null |
    sed 's/^/kvbm: /' | tee -a "$out/summary.txt"
  if ! torch_err=$(python3 -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA device"' 2>&1); then
    echo "gpu-check: PyTorch with CUDA is not usable here (import torch failed): ${torch_err##*$'\n'}" | tee -a "$out/summary.txt"
  fi
  step python-torch 150 env PYTHONPATH="$PWD/python" PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py
  tail -n 16 "$out/python-torch.log"
  # The vLLM connector's worker side on CUDA tensors (vLLM's LBNHC views)
  # with real torch events: kv_both offload, then layer-wise onboard.
  step python-vllm-connector 60 env PYTHONPATH="$PWD/python" PYTHONUNBUFFERED=1 python3 scripts/gpu_check_vllm.py
  tail -n 4 "$out/python-vllm-connector.log"
  # The same on VMM memory, as vLLM 0.34's extensible KV cache is
  # (cuMemCreate chunks mapped side by side): PyTorch's expandable segments
  # allocate the KV tensor so, its layers spanning several physical chunks
  # (kvbm declares IN_PROCESS: registration and copies over a VA range of
  # several chunks must work, and sleep mode must give the memory back).
  step python-vllm-connector-vmm 60 env PYTHONPATH="$PWD/python" PYTHONUNBUFFERED=1 \
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 scripts/gpu_check_vllm.py
  tail -n 4 "$out/python-vllm-connector-vmm.log"
  # The wheel as a user installs it (no Go there): into a venv that sees
  # the machine's packages (numpy), without the network; kvbmgo from it.
  step wheel-install 90 bash -c 'v=$(mktemp -d) && python3 -m venv --system-site-packages "$v" &&
    "$v/bin/python" -m pip install -q --no-deps --no-index '"$GPU"'/kvbmgo-*.whl &&
    cd /tmp && env -u KVBM_LIBRARY "$v/bin/python" -c "import kvbmgo; print(kvbmgo.__file__, kvbmgo.info())" &&
    env -u KVBM_LIBRARY KVBM_DEVICE=emulated "$v/bin/python" '"$PWD"'/python/examples/quickstart.py'
  tail -n 3 "$out/wheel-install.log"
  echo "gpu-check: $fails step(s) failed; logs in $out"
  [ "$fails" -eq 0 ]
}

case "${1:-}" in
  build) build ;;
  run) run ;;
  *) echo "usage: $0 build|run   (see the header)" >&2; exit 2 ;;
esac

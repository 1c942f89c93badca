# CUDA targets, included from the top Makefile: `make ptx`, `make ptx-check`.
# (Not `make -f Makefile -f cuda.mk`: that reads this file twice.)
#
#   ptx        cuda/kernels/copy.ptx from cuda/kernels/copy.cu (committed;
#              embedded in the Go package), always with NVRTC from the pip
#              package nvidia-cuda-nvrtc-cu12==$(NVRTC_VERSION), installed
#              under build/nvrtc-$(NVRTC_VERSION). Not with whatever nvcc is
#              installed: the PTX's .version follows the compiler, and the
#              driver must be at least that new to JIT it.
#   ptx-check  ptxas assembles the committed PTX for sm_75 and sm_90, and
#              checks its .version is the pinned one (needs ptxas: on PATH,
#              or from the pip package nvidia-cuda-nvcc-cu12)
#   gpu-pack   scripts/gpu-check.sh build: what the GPU machine runs, under build/gpu
#   test-cuda-abi  the driver ABI kvbm declares by hand (cuda/real_abi.h)
#              against the real cuda.h of CUDA 12.8 and 13.0 (headers from
#              NVIDIA's pip packages, kept under ~/.cache/kvbm/cuda-headers),
#              and the check itself against mutations of it; part of make test
#   test-cuda-double  the real backend over the CUDA double (cuda/testdriver:
#              a libcuda.so.1 on the CPU, built against that cuda.h): its
#              own tests, core/transfer and core/worker with KVBM_DEVICE=cuda,
#              the C examples and kvbmgo's worker over it, and three broken
#              doubles the conformance suite must catch; part of make test
#              (scripts/cuda-double.sh)
#
# The PTX targets compute_75 (Turing and later, all CUDA 13 GPUs). NVRTC
# 12.0 emits PTX ISA 8.0, which drivers of CUDA 12.0 and later (r525+) JIT;
# a newer NVRTC would raise that floor (12.9: ISA 8.8, r575+), and an older
# driver fails cuModuleLoadData with CUDA_ERROR_UNSUPPORTED_PTX_VERSION
# (222); the driver then logs that once and copies without the kernel.

PYTHON      ?= python3
PTX_ARCH    ?= compute_75
# Pinned: changing it changes the driver floor of the kernel (see above).
NVRTC_VERSION := 12.0.140
PTX_ISA     := 8.0
PTXAS_VERSION ?= 12.9.*
NVRTC_DIR   := $(BUILD)/nvrtc-$(NVRTC_VERSION)
PTXAS_DIR   := $(BUILD)/ptxas

.PHONY: ptx ptx-check gpu-pack test-cuda-abi test-cuda-double

ptx:
	@test -f $(NVRTC_DIR)/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 || \
	  $(PYTHON) -m pip install -q --no-deps --target $(NVRTC_DIR) "nvidia-cuda-nvrtc-cu12==$(NVRTC_VERSION)"
	@echo "NVRTC $(NVRTC_VERSION) --gpu-architecture=$(PTX_ARCH)"
	@$(PYTHON) cuda/kernels/nvrtc_ptx.py $(NVRTC_DIR)/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 \
	  $(PTX_ARCH) cuda/kernels/copy.cu cuda/kernels/copy.ptx
	@grep -qx '.version $(PTX_ISA)' cuda/kernels/copy.ptx || \
	  { echo "cuda/kernels/copy.ptx: expected .version $(PTX_ISA)" >&2; exit 1; }

ptx-check:
	@grep -qx '.version $(PTX_ISA)' cuda/kernels/copy.ptx || \
	  { echo "cuda/kernels/copy.ptx: expected .version $(PTX_ISA) (regenerate: make ptx)" >&2; exit 1; }
	@if command -v ptxas >/dev/null 2>&1; then PTXAS=ptxas; else \
	  test -x $(PTXAS_DIR)/nvidia/cuda_nvcc/bin/ptxas || \
	    $(PYTHON) -m pip install -q --no-deps --target $(PTXAS_DIR) "nvidia-cuda-nvcc-cu12==$(PTXAS_VERSION)"; \
	  PTXAS=$(PTXAS_DIR)/nvidia/cuda_nvcc/bin/ptxas; fi; \
	for sm in sm_75 sm_90; do $$PTXAS -arch=$$sm -v cuda/kernels/copy.ptx -o /dev/null || exit 1; done

gpu-pack:
	scripts/gpu-check.sh build

test-cuda-abi: deps deps-c
	scripts/cuda-abi-check.sh

test-cuda-double: deps deps-c deps-ucx py-venv
	PYBIN=$(PYBIN) scripts/cuda-double.sh test

# CUDA targets; included from the top Makefile, or run alone with
# `make -f Makefile -f cuda.mk <target>`.
#
#   ptx        cuda/kernels/copy.ptx from cuda/kernels/copy.cu (committed;
#              embedded in the Go package). Uses $(NVCC) when it exists (the
#              GPU machine's own, or a CUDA toolkit), else NVRTC from the
#              pip package nvidia-cuda-nvrtc-cu12 installed under
#              build/nvrtc (the nvidia-cuda-nvcc-cu12 12.9 wheel has no nvcc
#              binary, only ptxas and libnvvm).
#   ptx-check  ptxas assembles the committed PTX for sm_90 (needs ptxas:
#              from $(NVCC)'s toolkit or the pip package nvidia-cuda-nvcc-cu12)
#   gpu-pack   scripts/gpu-check.sh build: what the GPU machine runs, under build/gpu
#
# The PTX targets compute_75 (Turing and later, all CUDA 13 GPUs); its
# .version follows the compiler (12.9: PTX ISA 8.8, JIT-able by drivers of
# CUDA 12.9 and later). Older drivers fail cuModuleLoadData, and the driver
# then copies without the kernel.

NVCC        ?= nvcc
PYTHON      ?= python3
PTX_ARCH    ?= compute_75
CUDA_PIP_VERSION ?= 12.9.*
NVRTC_DIR   := $(BUILD)/nvrtc
PTXAS_DIR   := $(BUILD)/ptxas

.PHONY: ptx ptx-check gpu-pack

ptx:
	@if command -v $(NVCC) >/dev/null 2>&1; then \
	  echo "$(NVCC) -ptx -arch=$(PTX_ARCH)"; \
	  $(NVCC) -ptx -arch=$(PTX_ARCH) -o cuda/kernels/copy.ptx cuda/kernels/copy.cu; \
	else \
	  test -f $(NVRTC_DIR)/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 || \
	    $(PYTHON) -m pip install -q --target $(NVRTC_DIR) "nvidia-cuda-nvrtc-cu12==$(CUDA_PIP_VERSION)"; \
	  echo "NVRTC --gpu-architecture=$(PTX_ARCH)"; \
	  $(PYTHON) cuda/kernels/nvrtc_ptx.py $(NVRTC_DIR)/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 \
	    $(PTX_ARCH) cuda/kernels/copy.cu cuda/kernels/copy.ptx; \
	fi

ptx-check:
	@if command -v ptxas >/dev/null 2>&1; then PTXAS=ptxas; else \
	  test -x $(PTXAS_DIR)/nvidia/cuda_nvcc/bin/ptxas || \
	    $(PYTHON) -m pip install -q --target $(PTXAS_DIR) "nvidia-cuda-nvcc-cu12==$(CUDA_PIP_VERSION)"; \
	  PTXAS=$(PTXAS_DIR)/nvidia/cuda_nvcc/bin/ptxas; fi; \
	$$PTXAS -arch=sm_90 -v cuda/kernels/copy.ptx -o /dev/null

gpu-pack:
	scripts/gpu-check.sh build

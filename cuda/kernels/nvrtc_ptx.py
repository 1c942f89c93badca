"""Compile a .cu file to PTX with NVRTC, for machines with no nvcc binary.

The pip wheel nvidia-cuda-nvcc-cu12 12.9 ships ptxas and libnvvm but no nvcc
driver; nvidia-cuda-nvrtc-cu12 ships NVRTC, NVIDIA's CUDA C++ to PTX
compiler as a library. Used by cuda.mk's `ptx` target when nvcc is absent:

    python3 cuda/kernels/nvrtc_ptx.py LIBNVRTC ARCH IN.cu OUT.ptx
"""
import ctypes
import sys


def main() -> int:
    lib_path, arch, src_path, out_path = sys.argv[1:5]
    nvrtc = ctypes.CDLL(lib_path)
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p

    def ok(res: int, what: str) -> None:
        if res != 0:
            raise SystemExit(f"{what}: {nvrtc.nvrtcGetErrorString(res).decode()}")

    with open(src_path, "rb") as f:
        src = f.read()
    prog = ctypes.c_void_p()
    ok(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, src_path.encode(), 0, None, None), "nvrtcCreateProgram")
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"--use_fast_math"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    res = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if log.value.strip():
        sys.stderr.write(log.value.decode() + "\n")
    ok(res, "nvrtcCompileProgram")
    ok(nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
    ptx = ctypes.create_string_buffer(size.value)
    ok(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    with open(out_path, "wb") as f:
        f.write(ptx.value)
    return 0


if __name__ == "__main__":
    sys.exit(main())

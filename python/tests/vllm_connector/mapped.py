"""Memory the tests map and unmap themselves (mmap/munmap through libc):
a KV cache whose pages can really go away, so that a stale access by
kvbm faults the test process instead of passing silently."""

import ctypes

import torch

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

_PROT_NONE = 0
_PROT_RW = 0x1 | 0x2
_MAP_PRIVATE_ANON = 0x02 | 0x20
_MAP_FIXED = 0x10
_MAP_NORESERVE = 0x4000
_FAILED = ctypes.c_void_p(-1).value


class Mapped:
    """size bytes of anonymous memory at a fixed address: tensor() views
    it, unmap() takes its pages away (its address then faults), remap() maps
    fresh zero pages at the same address. Between the two the address range
    stays reserved (PROT_NONE), as vLLM's extensible KV cache keeps its
    reservation and recommits new physical memory under it; a plain munmap
    would let another thread's mmap take the hole before remap."""

    def __init__(self, size: int) -> None:
        self.size = size
        addr = _libc.mmap(None, size, _PROT_RW, _MAP_PRIVATE_ANON, -1, 0)
        if addr in (None, _FAILED):
            raise OSError(ctypes.get_errno(), "mmap")
        self.addr = addr
        self.mapped = True
        self._buf = (ctypes.c_int8 * size).from_address(addr)

    def tensor(self) -> torch.Tensor:
        return torch.frombuffer(self._buf, dtype=torch.int8)

    def _replace(self, prot: int, flags: int) -> None:
        # MAP_FIXED over our own range: the old pages go, the address stays ours.
        addr = _libc.mmap(self.addr, self.size, prot, _MAP_PRIVATE_ANON | _MAP_FIXED | flags, -1, 0)
        if addr != self.addr:
            raise OSError(ctypes.get_errno(), f"mmap at {self.addr:#x} gave {addr}")

    def unmap(self) -> None:
        self._replace(_PROT_NONE, _MAP_NORESERVE)
        self.mapped = False

    def remap(self) -> None:
        self._replace(_PROT_RW, 0)
        self.mapped = True

    def close(self) -> None:
        if _libc.munmap(self.addr, self.size) != 0:
            raise OSError(ctypes.get_errno(), "munmap")

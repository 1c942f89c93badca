"""Loaded by every Python process of kvbm's SGLang real-engine suite (this
directory is on PYTHONPATH for that suite only: SGLang's scheduler and
detokenizer are processes of their own): applies the CPU stand-ins of
cpu_hicache_host_pool.py and cpu_swa_attention.py to SGLang's modules as
SGLang imports them. The sgl_kernel stand-in is the package beside this
file."""
import importlib.abc
import importlib.util
import sys


def _patches() -> dict:
    """module -> what to do once SGLang has imported it."""
    import cpu_hicache_host_pool
    import cpu_short_conv
    import cpu_swa_attention
    return {**cpu_hicache_host_pool.PATCHES,
            "sglang.srt.layers.attention.torch_native_backend": cpu_swa_attention.apply,
            "sglang.srt.layers.attention.mamba.causal_conv1d": cpu_short_conv.apply}


#: The modules _patches() patches.
_PATCHED = {"sglang.srt.mem_cache.pool_host.common", "sglang.srt.mem_cache.pool_host.mha",
            "sglang.srt.mem_cache.pool_host.mamba",
            "sglang.srt.layers.attention.torch_native_backend",
            "sglang.srt.layers.attention.mamba.causal_conv1d"}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _PATCHED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patches()[fullname](module)
        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _PatchAfterImport())

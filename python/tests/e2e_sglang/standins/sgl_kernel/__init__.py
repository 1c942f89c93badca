"""A stand-in for sgl_kernel on a CPU-only machine: every sgl_kernel wheel on
PyPI is a CUDA build, and SGLang imports it (names and submodules) even with
its CPU engine. Every name here, and in every submodule, is a function that
raises when called: SGLang's CPU path without AMX calls none of them, and if
it ever does the test fails with the name. Put on sys.path ahead of the
installed sgl_kernel only by the SGLang real-engine suite (e2e_sglang)."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+kvbm-cpu-standin"


def _missing(qualname):
    def call(*args, **kwargs):
        raise RuntimeError(f"{qualname} was called: the sgl_kernel stand-in of kvbm's "
                           f"SGLang CPU tests has no kernels (a CPU path that needs one)")
    call.__name__ = call.__qualname__ = qualname.rsplit(".", 1)[-1]
    return call


class _StandinModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        f = _missing(f"{self.__name__}.{name}")
        setattr(self, name, f)
        return f


#: Submodules that do not import (ImportError), where SGLang has a fallback
#: for their absence that a raising stand-in would defeat.
_ABSENT = {"scalar_type"}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every other sgl_kernel.X is a stand-in module (a package, so that
    sgl_kernel.X.Y imports too)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            if fullname.split(".")[1] in _ABSENT:
                raise ModuleNotFoundError(f"{fullname}: not in the sgl_kernel stand-in",
                                          name=fullname)
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StandinModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _StandinModule


#: Torch ops of sgl_kernel's CPU build that SGLang looks up (not calls) when
#: a module imports, where the lookup failing would stop the engine:
#: gdn_triton.py's and gdn_backend.py's, imported for every hybrid linear-attention model (LFM2's
#: short convolution included).
_TORCH_OPS = ("fused_sigmoid_gating_delta_rule_update_cpu", "fused_gdn_gating_cpu")


def _define_torch_ops():
    import torch
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name in _TORCH_OPS:
        lib.define(f"{name}(Tensor x) -> Tensor")
        lib.impl(name, _missing(f"torch.ops.sgl_kernel.{name}"), "CompositeExplicitAutograd")
    return lib


_torch_ops = _define_torch_ops()  # kept: the ops live as long as this

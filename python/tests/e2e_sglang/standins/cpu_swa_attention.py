"""A stand-in fix for SGLang 0.5.23's CPU attention (torch_native) on a
hybrid sliding-window model (SWAKVPool): it writes a sliding-window
layer's K and V at the token's slot in the SWA pool (translated from the
full pool's slot) but reads them back at the full pool's slots
(req_to_token, untranslated). The two agree only while both allocators
have handed out the same slots, as in a fresh engine's first request; once
they differ (a prefix restored from HiCache holds 9 full pages and the 2
SWA pages of its window) every sliding-window layer reads other tokens' K
and V and the engine generates other tokens, with SGLang's own file
backend as with kvbm.

Here a sliding-window layer's forward reads through req_to_token
translated to SWA slots (rows of the batch only), as SGLang's other
attention backends do. Applied by sitecustomize.py of this directory when
SGLang imports the module; the installed files are not touched."""
import functools
import inspect
from types import SimpleNamespace


def _translated(backend, forward_batch):
    """req_to_token with the batch's rows in SWA slots."""
    pool = backend.token_to_kv_pool
    table = backend.req_to_token_pool.req_to_token.clone()
    rows = forward_batch.req_pool_indices.to(table.device).long()
    table[rows] = pool.translate_loc_from_full_to_swa(table[rows].long()).to(table.dtype)
    return SimpleNamespace(req_to_token=table)


def _swa_reads(forward):
    sig = inspect.signature(forward)

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        given = sig.bind(self, *args, **kwargs).arguments
        layer, pool = given["layer"], self.token_to_kv_pool
        if not (self.use_sliding_window_kv_pool and pool.layers_mapping[layer.layer_id][1]):
            return forward(self, *args, **kwargs)
        full = self.req_to_token_pool
        self.req_to_token_pool = _translated(self, given["forward_batch"])
        try:
            return forward(self, *args, **kwargs)
        finally:
            self.req_to_token_pool = full
    return wrapper


def apply(module) -> None:
    """sglang.srt.layers.attention.torch_native_backend: sliding-window
    layers read the SWA pool's slots."""
    cls = module.TorchNativeAttnBackend
    cls.forward_extend = _swa_reads(cls.forward_extend)
    cls.forward_decode = _swa_reads(cls.forward_decode)

"""SGLang plugin (entry point group ``sglang.srt.plugins``, name ``kvbm``):
makes ``--disaggregation-transfer-backend kvbm`` select kvbm's transfer
backend (kvbmgo.sglang.pd) without editing SGLang's files.

SGLang 0.5.23 has no registry of transfer backends: ``TransferBackend`` is a
closed Enum and ``get_kv_class`` an if/elif over it. ``register()`` (run by
SGLang's ``load_plugins()`` in every process: the launcher before it parses
the arguments, each scheduler, ...) therefore

- adds ``"kvbm"`` to the CLI choices (``add_disagg_transfer_backend_choices``),
- adds a ``TransferBackend.KVBM`` member with value ``"kvbm"`` (through
  CPython's Enum tables: ``TransferBackend("kvbm")`` is what the scheduler
  and the bootstrap service call),
- registers an AROUND hook on ``sglang.srt.disaggregation.utils.get_kv_class``
  through SGLang's ``HookRegistry``, which also rebinds the copies of the
  function that ``prefill.py``, ``decode.py`` and ``disagg_service.py``
  imported: "kvbm" gets kvbm's classes, every other backend SGLang's.

Importing this module imports nothing of SGLang's; the classes (and
libkvbm.so) load when SGLang first asks for one.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register", "BACKEND_NAME", "kv_class"]

BACKEND_NAME = "kvbm"
_TARGET = "sglang.srt.disaggregation.utils.get_kv_class"
_registered = False


def register() -> None:
    """The entry point: idempotent (a second installed copy of the entry
    point, or a second call, changes nothing)."""
    global _registered
    if _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    add_backend_name()
    HookRegistry.register(_TARGET, _get_kv_class, HookType.AROUND)
    _registered = True


def add_backend_name() -> None:
    """"kvbm" as a CLI choice and a TransferBackend member (idempotent)."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.disaggregation.utils import TransferBackend

    if BACKEND_NAME not in choices.DISAGG_TRANSFER_BACKEND_CHOICES:
        choices.add_disagg_transfer_backend_choices([BACKEND_NAME])
    if BACKEND_NAME in TransferBackend._value2member_map_:
        return
    member = object.__new__(TransferBackend)
    member._name_, member._value_ = "KVBM", BACKEND_NAME
    if hasattr(next(iter(TransferBackend)), "_sort_order_"):  # Python >= 3.11
        member._sort_order_ = len(TransferBackend._member_names_)
    type.__setattr__(TransferBackend, "KVBM", member)
    TransferBackend._member_map_["KVBM"] = member
    TransferBackend._value2member_map_[BACKEND_NAME] = member
    TransferBackend._member_names_.append("KVBM")


def _is_kvbm(transfer_backend: Any) -> bool:
    return getattr(transfer_backend, "value", transfer_backend) == BACKEND_NAME


def kv_class(class_type: Any) -> Any:
    """kvbm's class of KVClassType class_type (KVARGS: SGLang's KVArgs)."""
    from sglang.srt.disaggregation.utils import KVClassType

    if class_type == KVClassType.KVARGS:
        from sglang.srt.disaggregation.base import KVArgs
        return KVArgs
    from . import pd
    return {
        KVClassType.MANAGER: pd.KvbmKVManager,
        KVClassType.SENDER: pd.KvbmKVSender,
        KVClassType.RECEIVER: pd.KvbmKVReceiver,
        KVClassType.BOOTSTRAP_SERVER: pd.KvbmKVBootstrapServer,
    }.get(class_type)


def _get_kv_class(original: Any, transfer_backend: Any, class_type: Any) -> Any:
    if _is_kvbm(transfer_backend):
        return kv_class(class_type)
    return original(transfer_backend, class_type)

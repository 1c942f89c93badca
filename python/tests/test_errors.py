"""Error paths: closed objects, bad handles, lengths, dtypes, contiguity, the ABI check."""
import ast
import builtins
import gc
import inspect
import pathlib
import re
import threading
import weakref

import numpy as np
import pytest

import kvbmgo
from kvbmgo import (Event, HandoffCoordinator, HandoffOrder, LayoutConfig, Stream, Tier, Worker,
                    errors)
from kvbmgo._lib import lib

from conftest import NUM_BLOCKS, NUM_LAYERS, new_worker_id, wait_ok

IDS = list(range(NUM_BLOCKS))


def test_one_class_per_status():
    classes = {errors.error_class(s) for s in range(-15, 0)}
    assert len(classes) == 15
    for s in range(-15, 0):
        cls = errors.error_class(s)
        assert issubclass(cls, errors.KvbmError) and cls.status == s
        assert cls.status_name == kvbmgo.status_string(s)
    assert errors.error_class(-99) is errors.UnknownStatusError


def test_hierarchy():
    """The hierarchy of errors.py's table: each status class is a KvbmError
    and, where one fits, the builtin a caller would catch."""
    E = errors
    assert issubclass(E.KvbmError, Exception)
    # Out of range is a kind of invalid argument (as the Go core's
    # ErrOutOfRange is an ErrInvalidArgument), and an IndexError too.
    assert issubclass(E.OutOfRangeError, E.InvalidArgumentError)
    assert issubclass(E.OutOfRangeError, ValueError)
    assert issubclass(E.OutOfRangeError, IndexError)
    builtins = {E.InvalidArgumentError: ValueError, E.InvalidHandleError: ValueError,
                E.NotFoundError: LookupError, E.KvbmIOError: OSError,
                E.KvbmTimeoutError: TimeoutError}
    for cls, base in builtins.items():
        assert issubclass(cls, E.KvbmError) and issubclass(cls, base), cls
    assert not issubclass(E.NotFoundError, KeyError)  # str() of a KeyError quotes its text
    # A deadline that passed stopped the work: its operations were canceled
    # (a CanceledError), and it is a TimeoutError, but not a wait's
    # KvbmTimeoutError (the work does not go on).
    assert issubclass(E.DeadlineExceededError, E.CanceledError)
    assert issubclass(E.DeadlineExceededError, TimeoutError)
    assert not issubclass(E.DeadlineExceededError, E.KvbmTimeoutError)
    plain = [E.AlreadyExistsError, E.FailedPreconditionError, E.BufferTooSmallError,
             E.CudaError, E.CanceledError, E.UnsupportedError, E.DataCorruptionError,
             E.InternalError, E.UnknownStatusError]
    for cls in plain:
        assert cls.__bases__ == (E.KvbmError,), cls
    for cls in plain + [E.InvalidHandleError, E.KvbmIOError, E.KvbmTimeoutError]:
        assert not issubclass(cls, E.InvalidArgumentError), cls
    # Not statuses, so not KvbmErrors.
    assert issubclass(E.KvbmClosedError, ValueError)
    assert not issubclass(E.KvbmClosedError, E.KvbmError)
    assert issubclass(E.AbiMismatchError, ImportError)
    assert not issubclass(E.AbiMismatchError, E.KvbmError)
    # The builtin bases keep the message and the attributes.
    for cls in (E.OutOfRangeError, E.KvbmIOError, E.KvbmTimeoutError, E.NotFoundError):
        e = cls("why", status=cls.status, function="kvbm_f")
        assert str(e) == f"kvbm_f: {cls.status_name}: why" and e.args == (str(e),)
        assert (e.message, e.function) == ("why", "kvbm_f")


def test_every_status_maps_to_a_kvbm_error():
    """Every status of the table, and every name the library gives, has its
    class; the classes errors.py exports are the table's and the rest."""
    table = errors._BY_STATUS
    assert sorted(table) == list(range(-15, 0))
    for status, cls in table.items():
        assert issubclass(cls, errors.KvbmError) and cls.status == status
        assert errors.error_class(status) is cls
        assert cls.__name__ in errors.__all__
        assert kvbmgo.status_string(status) == cls.status_name
    assert kvbmgo.status_string(-16) == "KVBM_ERR_UNKNOWN"  # no status past the table
    assert errors.error_class(-16) is errors.UnknownStatusError
    exported = {n for n in errors.__all__ if n.endswith("Error")}
    assert exported == {c.__name__ for c in table.values()} | {
        "KvbmError", "UnknownStatusError", "KvbmClosedError", "AbiMismatchError"}


_ERROR_NAME = re.compile(r"\b[A-Za-z_]\w*(?:Error|Exception)\b")


def _wrong_error_names(doc):
    """The exception names in doc that are neither a class of kvbmgo.errors
    nor a builtin exception (IOError and EnvironmentError, OSError's old
    names, are refused: they read as a KvbmIOError that is not there)."""
    wrong = []
    for name in _ERROR_NAME.findall(doc):
        cls = getattr(errors, name, None) or getattr(builtins, name, None)
        if (not (isinstance(cls, type) and issubclass(cls, BaseException))
                or name in ("IOError", "EnvironmentError")):
            wrong.append(name)
    return wrong


def _docstrings():
    """(where, docstring) of every module, class and function of the package
    (vllm/ and sglang/ included), read from the source: importing those
    needs vllm and sglang."""
    root = pathlib.Path(kvbmgo.__file__).parent
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    yield f"{path.relative_to(root)}:{getattr(node, 'name', '')}", doc


def test_docstrings_name_only_real_exception_classes():
    assert _wrong_error_names("Raises InvalidArgumentsError, KvbmTimeoutError, IOError") == [
        "InvalidArgumentsError", "IOError"]  # the check catches a wrong name
    seen = set()
    bad = []
    for where, doc in _docstrings():
        seen.add(where)
        bad += [f"{where}: {name}" for name in _wrong_error_names(doc)]
    assert bad == []
    # The public API is among what was read.
    for where in ("_worker.py:transfer", "_cache.py:offload", "_notification.py:poll",
                  "_handoff.py:on_outcome", "errors.py:"):
        assert where in seen
    # And so do the objects kvbmgo exports, as Python sees them: their own
    # docstrings and those of their methods and properties, inherited ones
    # from kvbmgo's classes included.
    checked = 0
    for name in kvbmgo.__all__:
        obj = getattr(kvbmgo, name)
        docs = [(name, obj.__doc__)]
        if inspect.isclass(obj):
            for cls in obj.__mro__:
                if cls.__module__.startswith("kvbmgo"):
                    for attr, m in vars(cls).items():
                        m = m.fget if isinstance(m, property) else getattr(m, "__func__", m)
                        docs.append((f"{name}.{attr}", getattr(m, "__doc__", None)))
        for where, doc in docs:
            if isinstance(doc, str):
                checked += 1
                assert _wrong_error_names(doc) == [], where
    assert checked > 100


def test_use_after_close(worker):
    w, _ = worker
    n = w.transfer(Tier.G1, IDS, Tier.G2, IDS)
    n.wait()
    n.close()
    n.close()  # a second close does nothing
    with pytest.raises(errors.KvbmClosedError, match="Notification is closed"):
        n.poll()
    for obj, call in [(Event(), lambda o: o.query()), (Stream(), lambda o: o.synchronize()),
                      (HandoffCoordinator(bytes(16), HandoffOrder.SOURCE_FIRST),
                       lambda o: o.start()),
                      (Worker(new_worker_id()), lambda o: o.export_metadata())]:
        obj.close()
        with pytest.raises(errors.KvbmClosedError, match=type(obj).__name__):
            call(obj)
        assert "closed" in repr(obj)


def test_stale_handle_raises_with_message(worker):
    w, _ = worker
    n = w.transfer(Tier.G1, IDS, Tier.G2, IDS)
    raw = n.handle
    n.close()
    with pytest.raises(errors.InvalidHandleError) as e:
        lib.kvbm_notification_poll(raw)
    assert e.value.status == -2 and e.value.function == "kvbm_notification_poll"
    assert e.value.message  # kvbm_last_error() of this thread
    with pytest.raises(errors.InvalidHandleError):
        lib.kvbm_worker_destroy(12345)


def test_errors_carry_messages_per_thread(worker):
    """Each thread's error carries kvbm_last_error() of that thread: the
    message names the block id that thread asked for, no other thread's."""
    w, _ = worker
    ids = {i: 40000 + i for i in range(8)}  # none a substring of another
    got = {}
    barrier = threading.Barrier(len(ids))

    def bad(i):
        msgs = []
        barrier.wait()
        for _ in range(50):
            try:
                w.transfer(Tier.G1, [ids[i]], Tier.G2, [0])
            except (errors.InvalidArgumentError, errors.OutOfRangeError) as e:
                msgs.append(e.message)
        got[i] = msgs

    ts = [threading.Thread(target=bad, args=(i,)) for i in ids]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(got) == sorted(ids)
    for i, msgs in got.items():
        assert len(msgs) == 50
        for m in msgs:
            assert str(ids[i]) in m, f"thread {i} (block {ids[i]}) got {m!r}"
            others = [str(b) for j, b in ids.items() if j != i and str(b) in m]
            assert others == [], f"thread {i} got another thread's message {m!r}"


def test_transfer_argument_errors(worker):
    w, _ = worker
    with pytest.raises(ValueError, match="as long"):
        w.transfer(Tier.G1, [0, 1], Tier.G2, [0])
    with pytest.raises(errors.InvalidArgumentError):
        w.transfer(Tier.G1, [], Tier.G2, [])
    with pytest.raises(errors.InvalidArgumentError):
        w.transfer(Tier.G1, [0, 1], Tier.G2, [1, 1])  # a destination repeated
    # As the docstrings say: an id beyond the layout is OutOfRangeError.
    with pytest.raises(errors.OutOfRangeError, match="out of range"):
        w.transfer(Tier.G1, [NUM_BLOCKS], Tier.G2, [0])
    with pytest.raises(errors.OutOfRangeError):
        w.transfer(Tier.G1, [0], Tier.G2, [NUM_BLOCKS])
    with pytest.raises(errors.OutOfRangeError):
        w.object_put(["k"], Tier.G2, [NUM_BLOCKS])
    with pytest.raises(errors.OutOfRangeError):
        w.onboard_objects(["k"], Tier.G2, [NUM_BLOCKS])
    with pytest.raises(errors.InvalidArgumentError):
        w.transfer(Tier.G1, [0, 1], Tier.G1, [1, 2])  # block 1 both source and destination
    with pytest.raises(ValueError, match="outside"):
        w.transfer(Tier.G1, [-1], Tier.G2, [0])
    with pytest.raises(ValueError, match="outside"):
        w.transfer(Tier.G1, [2**32], Tier.G2, [0])
    with pytest.raises(TypeError, match="integer"):
        w.transfer(Tier.G1, np.zeros(1), Tier.G2, [0])
    with pytest.raises(TypeError):
        w.transfer(Tier.G1, [0.5], Tier.G2, [0])
    with pytest.raises(errors.OutOfRangeError):
        w.transfer(Tier.G1, IDS, Tier.G2, IDS, layers=(3, 1))
    with pytest.raises(TypeError, match="precondition"):
        w.transfer(Tier.G1, IDS, Tier.G2, IDS, precondition="event")
    with pytest.raises(errors.CudaError):
        w.transfer(Tier.G1, IDS, Tier.G2, IDS, precondition=0xBAD)
    with pytest.raises(errors.InvalidArgumentError):
        w.onboard_layerwise(IDS, IDS, [Event()])  # one event for four layers
    gc.collect()


def test_out_of_range_ids_are_invalid_arguments(worker):
    """Worker.transfer with an id beyond the layout raises OutOfRangeError,
    which except InvalidArgumentError, except ValueError and except
    IndexError all catch."""
    w, _ = worker
    for src, dst in (([NUM_BLOCKS], [0]), ([0], [NUM_BLOCKS])):
        for catch in (errors.InvalidArgumentError, ValueError, IndexError, errors.KvbmError):
            try:
                w.transfer(Tier.G1, src, Tier.G2, dst)
            except catch as e:
                assert type(e) is errors.OutOfRangeError and e.status == -6
                assert e.function == "kvbm_worker_transfer" and str(NUM_BLOCKS) in e.message
            else:
                pytest.fail(f"no error for {src} -> {dst}")
    with pytest.raises(errors.InvalidArgumentError, match="KVBM_ERR_OUT_OF_RANGE"):
        w.transfer(Tier.G1, IDS, Tier.G2, IDS, layers=(0, NUM_LAYERS + 1))


def test_register_g1_errors(g1_config):
    layer = (NUM_BLOCKS, 2, 4, 64)
    ok = lambda: [np.zeros(layer, np.uint16) for _ in range(4)]  # noqa: E731
    with Worker(new_worker_id()) as w:
        with pytest.raises(ValueError, match="3 buffers"):
            w.register_g1(g1_config, ok()[:3])
        with pytest.raises(TypeError, match="element size 4"):
            w.register_g1(g1_config, [np.zeros(layer, np.float32) for _ in range(4)])
        with pytest.raises(TypeError, match="not numeric"):
            w.register_g1(g1_config, [np.empty(layer, object) for _ in range(4)])
        with pytest.raises(ValueError, match="bytes"):
            w.register_g1(g1_config, [np.zeros((NUM_BLOCKS - 1,) + layer[1:], np.uint16)] * 4)
        with pytest.raises(ValueError, match="C-contiguous"):
            w.register_g1(g1_config, [np.zeros(layer[::-1], np.uint16).T for _ in range(4)])
        ro = ok()
        ro[2].flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            w.register_g1(g1_config, ro)
        with pytest.raises(TypeError, match="list"):
            w.register_g1(g1_config, [[0] * 10] * 4)
        h = w.register_g1(g1_config, ok())
        assert h.worker == w.worker_id
        with pytest.raises(errors.AlreadyExistsError):
            w.register_g1(g1_config, ok())
        with pytest.raises(errors.InvalidArgumentError):
            w.allocate_g3(g1_config)  # no disk_dir
        with pytest.raises(errors.NotFoundError):
            w.transfer(Tier.G1, [0], Tier.G2, [0])  # no G2


def test_registered_bytearray_cannot_be_resized():
    """The worker keeps the buffer export, not just the bytearray: resizing it
    (which would move its memory under the library) raises BufferError."""
    cfg = LayoutConfig(num_blocks=2, num_layers=1, outer_dim=1, page_size=4, inner_dim=8,
                       dtype_width=1)
    buf = bytearray(cfg.total_bytes)
    w = Worker(new_worker_id())
    w.register_g1(cfg, buf)
    w.allocate_g2(cfg)
    with pytest.raises(BufferError):
        buf.extend(b"x" * (1 << 20))
    with pytest.raises(BufferError):
        del buf[:]
    assert len(buf) == cfg.total_bytes
    wait_ok(w.transfer(Tier.G2, [0, 1], Tier.G1, [0, 1]))
    w.close()
    gc.collect()
    buf.extend(b"x")  # released with the worker
    assert len(buf) == cfg.total_bytes + 1


def test_bytearray_buffer_is_accepted():
    cfg = LayoutConfig(num_blocks=2, num_layers=1, outer_dim=1, page_size=4, inner_dim=8,
                       dtype_width=1)
    buf = bytearray(cfg.total_bytes)
    with Worker(new_worker_id()) as w:
        w.register_g1(cfg, buf)
        w.allocate_g2(cfg)
        buf[:] = bytes(range(64))
        wait_ok(w.transfer(Tier.G1, [0, 1], Tier.G2, [1, 0]))
        buf[:] = bytes(64)
        wait_ok(w.transfer(Tier.G2, [1, 0], Tier.G1, [0, 1]))
        assert bytes(buf) == bytes(range(64))


def test_worker_keeps_g1_alive():
    cfg = LayoutConfig(num_blocks=2, num_layers=1, outer_dim=1, page_size=4, inner_dim=8,
                       dtype_width=4)
    arr = np.zeros(64, np.float32)
    ref = weakref.ref(arr)
    w = Worker(new_worker_id())
    w.register_g1(cfg, arr)
    del arr
    gc.collect()
    assert ref() is not None
    w.close()
    gc.collect()
    assert ref() is None


def test_finalizer_frees_forgotten_handles(worker):
    w, _ = worker
    before = kvbmgo.handle_count()
    n = w.transfer(Tier.G1, IDS, Tier.G2, IDS)
    n.wait()
    h = HandoffCoordinator(bytes(16), HandoffOrder.DESTINATION_FIRST)
    w2 = Worker(new_worker_id())
    assert kvbmgo.handle_count() == before + 3
    refs = [weakref.ref(o) for o in (n, h, w2)]
    del n, h, w2
    # No cycle through the finalizer: plain reference counting frees them.
    assert all(r() is None for r in refs)
    assert kvbmgo.handle_count() == before


def test_abi_mismatch_names_both_versions(monkeypatch):
    kvbmgo.check_abi_version(kvbmgo.ABI_VERSION)
    with pytest.raises(errors.AbiMismatchError, match=r"ABI version 7.*ABI version 1"):
        kvbmgo.check_abi_version(7)


def test_abi_mismatch_at_load(monkeypatch):
    """Loading a library that reports another ABI version fails before the table."""
    from kvbmgo import _lib

    real = _lib.check_abi_version
    monkeypatch.setattr(_lib, "check_abi_version",
                        lambda reported, **kw: real(reported + 1, **kw))
    with pytest.raises(errors.AbiMismatchError, match=r"ABI version 2.*ABI version 1"):
        _lib._Lib(_lib.find_library())


def test_library_path_override(monkeypatch, tmp_path):
    from kvbmgo import _lib
    monkeypatch.setenv("KVBM_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(ImportError, match="KVBM_LIBRARY"):
        _lib.find_library()
    monkeypatch.setenv("KVBM_LIBRARY", lib.path)
    assert _lib.find_library() == lib.path


class FakeTensor:
    """Duck-typed like torch.Tensor (torch is not required by the suite)."""
    __module__ = "torch"

    def __init__(self, arr, contiguous=True):
        self.arr, self.contiguous, self.shape = arr, contiguous, arr.shape
        self.device = type("device", (), {"type": "cpu", "index": None})()

    def data_ptr(self):
        return self.arr.__array_interface__["data"][0]

    def element_size(self):
        return self.arr.itemsize

    def numel(self):
        return self.arr.size

    def is_contiguous(self):
        return self.contiguous


def test_torch_like_tensors():
    caches = [FakeTensor(np.zeros((2, 4, 16, 8), np.float16)) for _ in range(2)]
    with Worker(new_worker_id()) as w:
        cfg, _ = w.register_kv_caches(caches)
        assert (cfg.num_blocks, cfg.num_layers, cfg.dtype_width) == (4, 2, 2)
        w.allocate_g2(cfg.replace(layout="fully_contiguous"))
        caches[1].arr[...] = 3
        wait_ok(w.transfer(Tier.G1, [0, 1, 2, 3], Tier.G2, [0, 1, 2, 3]))
        caches[1].arr[...] = 0
        wait_ok(w.transfer(Tier.G2, [0, 1, 2, 3], Tier.G1, [0, 1, 2, 3]))
        assert (caches[1].arr == 3).all()
    with Worker(new_worker_id()) as w:
        bad = [FakeTensor(np.zeros((2, 4, 16, 8), np.float16), contiguous=False)]
        with pytest.raises(ValueError, match="not contiguous"):
            w.register_kv_caches(bad)


def cuda_tensor(index):
    t = FakeTensor(np.zeros((2, 4, 16, 8), np.float16))
    t.device = type("device", (), {"type": "cuda", "index": index})()
    return t


def test_cuda_tensor_under_the_emulated_backend_is_refused():
    assert kvbmgo.info().device_backend != "cuda"  # the suite runs emulated
    with Worker(new_worker_id(), device_id=0) as w:
        with pytest.raises(TypeError, match="CUDA tensor"):
            w.register_kv_caches([cuda_tensor(0), cuda_tensor(0)])
        with pytest.raises(TypeError, match="CUDA tensor"):
            w.register_kv_caches([cuda_tensor(3), cuda_tensor(3)])
        other = FakeTensor(np.zeros((2, 4, 16, 8), np.float16))
        other.device = type("device", (), {"type": "meta", "index": None})()
        with pytest.raises(TypeError, match="meta"):
            w.register_kv_caches([other])
        assert w.device_id == 0


def test_cuda_tensor_on_another_device_is_refused(monkeypatch):
    from kvbmgo import _worker
    monkeypatch.setattr(_worker, "backend", lambda: "cuda")  # checked before any C call
    # The emulated backend has one device (a worker on device 1 is refused
    # at create), so the worker is on device 0 and the tensors elsewhere.
    with pytest.raises(errors.InvalidArgumentError, match="device 1 does not exist"):
        Worker(new_worker_id(), device_id=1)
    with Worker(new_worker_id(), device_id=0) as w:
        assert w.device_id == 0
        with pytest.raises(ValueError, match="cuda:3.*device 0"):
            w.register_kv_caches([cuda_tensor(3), cuda_tensor(3)])
        with pytest.raises(ValueError, match="cuda:1"):
            w.register_kv_caches([cuda_tensor(0), cuda_tensor(1)])
        with pytest.raises(TypeError, match="host memory"):
            w.register_kv_caches([FakeTensor(np.zeros((2, 4, 16, 8), np.float16))])


def test_wait_forever(worker):
    w, _ = worker
    with w.transfer(Tier.G1, IDS, Tier.G2, IDS) as n:
        assert n.wait(float("inf")) is True
        assert n.wait(1e300) is True
        assert n.wait(-1) is True
        with pytest.raises(ValueError, match="NaN"):
            n.wait(float("nan"))
    # A finished transfer is never reported as timed out, with 0 ms neither.
    with w.transfer(Tier.G1, IDS, Tier.G2, IDS) as n:
        assert n.wait(10)
        assert all(n.wait(0) for _ in range(200))
    from kvbmgo._notification import _timeout_ms
    assert _timeout_ms(None) == _timeout_ms(float("inf")) == _timeout_ms(1e17) == -1
    assert _timeout_ms(0) == _timeout_ms(-5) == 0 and _timeout_ms(1.5) == 1500


def test_close_raises_a_failed_free_the_finalizer_does_not(worker, recwarn):
    w, _ = worker
    n = w.transfer(Tier.G1, IDS, Tier.G2, IDS)
    n.wait()
    lib.kvbm_notification_free(n.handle)  # freed behind the object's back
    with pytest.raises(errors.InvalidHandleError):
        n.close()
    assert n.closed
    n.close()  # the error was reported once; a second close does nothing

    n = w.transfer(Tier.G1, IDS, Tier.G2, IDS)
    n.wait()
    lib.kvbm_notification_free(n.handle)
    from kvbmgo._handle import _collected, _live
    _collected(n._finalizer)  # what collection runs: silent
    assert n._finalizer not in _live
    n.close()  # the finalizer freed it: nothing left to free


def test_worker_close_closes_it_even_if_a_coordinated_close_fails():
    before = kvbmgo.handle_count()
    w = Worker(new_worker_id())
    c = kvbmgo.CoordinatedWorker(w, 0, 1)
    lib.kvbm_coordinated_destroy(c.handle)  # freed behind the object's back
    with pytest.raises(errors.InvalidHandleError, match="kvbm_coordinated_destroy"):
        w.close()
    assert w.closed and c.closed
    assert kvbmgo.handle_count() == before


def test_worker_close_raises_a_failed_destroy(g1_config):
    w = Worker(new_worker_id())
    lib.kvbm_worker_destroy(w.handle)
    with pytest.raises(errors.InvalidHandleError, match="kvbm_worker_destroy"):
        w.close()
    assert w.closed


def test_library_lookup_prefers_a_newer_build(monkeypatch, tmp_path):
    import os
    from kvbmgo import _lib
    monkeypatch.delenv("KVBM_LIBRARY", raising=False)
    pkg = tmp_path / "python" / "kvbmgo"
    pkg.mkdir(parents=True)
    (tmp_path / "build").mkdir()
    beside, built = pkg / "libkvbm.so", tmp_path / "build" / "libkvbm.so"
    with pytest.raises(ImportError, match="not found"):
        _lib.find_library(pkg)
    built.write_bytes(b"")
    assert _lib.find_library(pkg) == str(built)
    beside.write_bytes(b"")
    os.utime(built, (1000, 1000))
    os.utime(beside, (2000, 2000))
    assert _lib.find_library(pkg) == str(beside)  # the copy, when up to date
    os.utime(built, (3000, 3000))
    assert _lib.find_library(pkg) == str(built)  # make lib without make py-lib
    monkeypatch.setenv("KVBM_LIBRARY", str(beside))
    assert _lib.find_library(pkg) == str(beside)  # the variable wins

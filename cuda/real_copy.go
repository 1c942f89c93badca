//go:build cgo

package cuda

/*
#include "real_trampolines.h"
*/
import "C"

import (
	"fmt"
	"log/slog"
	"unsafe"
)

// Copies of the real driver. One copy is one cuMemcpy*Async; a batch goes
// one of three ways, chosen per call by chooseCopyPath: the fragment-copy
// kernel (many small copies), cuMemcpyBatchAsync (CUDA 12.8+, when enabled
// by KVBM_CUDA_MEMCPY_BATCH=1), or a loop of cuMemcpy*Async inside one C
// call.

// MemcpyAsync enqueues one copy on s. A zero-size copy is a no-op.
func (r *Real) MemcpyAsync(kind CopyKind, c Copy, s Stream) error {
	op := copyOp(kind)
	if err := r.checkOpen(op); err != nil {
		return err
	}
	if err := checkKind(op, kind); err != nil {
		return err
	}
	if c.Size == 0 {
		return nil
	}
	return check(op, C.kv_cuMemcpyAsync(r.anyCtx(), C.int(kind), C.uint64_t(c.Dst), C.uint64_t(c.Src),
		C.uint64_t(c.Size), C.uint64_t(s)))
}

// MemcpyBatchAsync enqueues copies of one kind on s. The result is that of
// running them in order: when a destination overlaps another copy's source
// or destination, they run one by one in order; otherwise they may run
// concurrently (kernel, batch API). Zero-size copies are skipped.
func (r *Real) MemcpyBatchAsync(kind CopyKind, copies []Copy, s Stream) error {
	const op = "cuMemcpyBatchAsync"
	if err := r.checkOpen(op); err != nil {
		return err
	}
	if err := checkKind(op, kind); err != nil {
		return err
	}
	var n int
	var total uint64
	for _, c := range copies {
		if c.Size != 0 {
			n++
			total += c.Size
		}
	}
	if n == 0 {
		return nil
	}
	dev := r.streamDevice(s)
	// Never the batch API on the legacy default stream (0, or
	// CU_STREAM_LEGACY: 1): cuMemcpyBatchAsync rejects it.
	in := copyPlanInput{Copies: n, Bytes: total, BatchOK: r.batchOK && s != 0 && s != cuStreamLegacy && dev >= 0}
	if n >= batchMinCopies {
		in.HazardFree = hazardFree(copies)
	}
	if in.HazardFree && n >= kernelMinCopies && dev >= 0 {
		in.KernelOK = r.kernelMayCopy(dev, kind, copies)
	}
	switch chooseCopyPath(in) {
	case pathKernel:
		if err := r.kernelCopy(dev, copies, s); err == nil {
			return nil
		} else if !IsCode(err, ErrCodeNotSupported) {
			return err
		}
		// The kernel would not load: fall through to the copy engines.
		if in.BatchOK && n >= batchMinCopies {
			return r.batchCopy(kind, dev, copies, s)
		}
	case pathBatch:
		return r.batchCopy(kind, dev, copies, s)
	}
	return r.loopCopy(kind, copies, s)
}

// The C side names the copy kinds (kv_copy_kind) and takes CopyKind's
// values as they are: these fail to compile if the two ever disagree.
var (
	_ [HostToDevice - C.KV_COPY_HOST_TO_DEVICE]struct{}
	_ [C.KV_COPY_HOST_TO_DEVICE - HostToDevice]struct{}
	_ [DeviceToHost - C.KV_COPY_DEVICE_TO_HOST]struct{}
	_ [C.KV_COPY_DEVICE_TO_HOST - DeviceToHost]struct{}
	_ [DeviceToDevice - C.KV_COPY_DEVICE_TO_DEVICE]struct{}
	_ [C.KV_COPY_DEVICE_TO_DEVICE - DeviceToDevice]struct{}
)

func checkKind(op string, kind CopyKind) error {
	switch kind {
	case HostToDevice, DeviceToHost, DeviceToDevice:
		return nil
	}
	return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("invalid copy kind %v", kind))
}

// columns splits copies into the three arrays the C side takes, without
// the zero-size ones; idx maps a column index back to copies.
func columns(copies []Copy) (dst, src, size []uint64, idx []int) {
	dst = make([]uint64, 0, len(copies))
	src = make([]uint64, 0, len(copies))
	size = make([]uint64, 0, len(copies))
	idx = make([]int, 0, len(copies))
	for i, c := range copies {
		if c.Size != 0 {
			dst, src, size, idx = append(dst, c.Dst), append(src, c.Src), append(size, c.Size), append(idx, i)
		}
	}
	return dst, src, size, idx
}

func (r *Real) loopCopy(kind CopyKind, copies []Copy, s Stream) error {
	dst, src, size, idx := columns(copies)
	var failed C.size_t
	res := C.kv_memcpy_loop(r.anyCtx(), C.int(kind), (*C.uint64_t)(&dst[0]), (*C.uint64_t)(&src[0]),
		(*C.uint64_t)(&size[0]), C.size_t(len(dst)), C.uint64_t(s), &failed)
	if err := check(copyOp(kind), res); err != nil {
		c := copies[idx[failed]]
		return fmt.Errorf("copy %d of %d (%v %#x→%#x, %d bytes): %w", idx[failed], len(copies), kind, c.Src, c.Dst, c.Size, err)
	}
	return nil
}

// batchCopy copies with cuMemcpyBatchAsync. When the driver refuses the
// batch with CUDA_ERROR_INVALID_VALUE (a stream or attribute it does not
// take), the copies go through the loop instead, and that is logged once.
// Copies the refused call may have enqueued are harmless to repeat: the
// batch is hazard-free, so no copy changes another's source.
func (r *Real) batchCopy(kind CopyKind, dev int, copies []Copy, s Stream) error {
	dst, src, size, _ := columns(copies)
	var failed C.size_t
	res := C.kv_memcpy_batch(C.uint64_t(r.devices[dev].ctx), C.int(kind), C.int(dev), (*C.uint64_t)(&dst[0]),
		(*C.uint64_t)(&src[0]), (*C.uint64_t)(&size[0]), C.size_t(len(dst)), C.uint64_t(s), &failed)
	err := check("cuMemcpyBatchAsync", res)
	if err == nil {
		return nil
	}
	if IsCode(err, ErrCodeInvalidValue) {
		r.batchFallbackLog.Do(func() {
			slog.Info("kvbm: cuMemcpyBatchAsync refused a batch; such batches use a loop of cuMemcpy*Async",
				"device", dev, "stream", uint64(s), "err", err)
		})
		return r.loopCopy(kind, copies, s)
	}
	return fmt.Errorf("batch of %d %v copies: %w", len(dst), kind, err)
}

// streamDevice is the ordinal of the device whose context s belongs to,
// -1 when unknown. The legacy and per-thread default streams (0, 1, 2) are
// the calling thread's current context's (see stream_ctx_enter), device
// 0's when it has none. A thread has one only when it is the engine's,
// calling in through the C ABI: the goroutine stays on it for the call.
func (r *Real) streamDevice(s Stream) int {
	var ctx C.uint64_t
	if s <= 2 { // 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
		if C.kv_cuCtxGetCurrent(&ctx) != 0 || ctx == 0 {
			if len(r.devices) == 0 {
				return -1
			}
			return 0
		}
	} else if C.kv_cuStreamGetCtx(C.uint64_t(s), &ctx) != 0 {
		return -1
	}
	for i := range r.devices {
		if r.devices[i].ctx == uint64(ctx) {
			return i
		}
	}
	return -1
}

// kernelMayCopy reports whether the kernel on dev may touch every copy's
// memory: each device side must lie inside one allocation (MemAlloc) or
// registered range (RegisterDeviceRange) of dev, and each host side inside
// pinned memory this driver allocated or pinned itself (not a chunk
// HostRegister adopted), on a device that can use host pointers. A bad
// address faults inside the kernel, a sticky error that poisons the whole
// context (the engine's too), where a bad cuMemcpy only fails its call:
// anything unknown goes to the copy engines.
func (r *Real) kernelMayCopy(dev int, kind CopyKind, copies []Copy) bool {
	if kind != DeviceToDevice && !r.devices[dev].hostPtr {
		return false
	}
	host := func(p, n uint64) bool { return r.hosts.lookup(p, n) != nil && !r.adoptedLocked(p, n) }
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range copies {
		if c.Size == 0 {
			continue
		}
		var ok bool
		switch kind {
		case HostToDevice:
			ok = host(c.Src, c.Size) && r.devIndex.contains(dev, c.Dst, c.Size)
		case DeviceToHost:
			ok = r.devIndex.contains(dev, c.Src, c.Size) && host(c.Dst, c.Size)
		case DeviceToDevice:
			ok = r.devIndex.contains(dev, c.Src, c.Size) && r.devIndex.contains(dev, c.Dst, c.Size)
		}
		if !ok {
			return false
		}
	}
	return true
}

// adoptedLocked reports whether [p, p+n) meets a chunk HostRegister
// adopted: CUDA said it was registered already, which it also says when
// its owner pinned only part of it, and the kernel faults on a page that
// is not pinned. The copy engines take such memory pinned or not. r.mu
// held.
func (r *Real) adoptedLocked(p, n uint64) bool {
	for _, spans := range r.adopted {
		for _, s := range spans {
			if p < s.Start+s.Size && s.Start < p+n {
				return true
			}
		}
	}
	return false
}

// u64s is n uint64s at addr, memory outside the Go heap (pinned staging).
func u64s(addr uint64, n int) []uint64 {
	b := view(addr, uint64(n)*8)
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

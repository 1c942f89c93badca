//go:build cgo

package cuda

/*
#include "real_trampolines.h"
*/
import "C"

import (
	"fmt"
	"os"
	"unsafe"
)

// IPCExport names the allocation holding ptr with cuMemGetAddressRange and
// cuIpcGetMemHandle. Memory from cuMemCreate (VMM, PyTorch's expandable
// segments) is refused by CUDA here; callers move it another way.
func (r *Real) IPCExport(ptr, size uint64) (IPCHandle, uint64, uint64, error) {
	const op = "cuIpcGetMemHandle"
	var h IPCHandle
	if err := r.checkOpen(op); err != nil {
		return h, 0, 0, err
	}
	if os.Getenv(EnvIPC) != "1" {
		return h, 0, 0, NewError(op, ErrCodeNotSupported, "CUDA IPC is off until checked on a GPU ("+EnvIPC+"=1 turns it on)")
	}
	var base, n C.uint64_t
	if err := check(op, C.kv_cuIpcExport(r.anyCtx(), C.uint64_t(ptr), unsafe.Pointer(&h[0]), &base, &n)); err != nil {
		return h, 0, 0, err
	}
	if ptr < uint64(base) || size > uint64(n) || ptr-uint64(base) > uint64(n)-size {
		return IPCHandle{}, 0, 0, NewError(op, ErrCodeInvalidValue, fmt.Sprintf(
			"%#x+%d is not inside one allocation (the one at %#x is %d bytes)", ptr, size, uint64(base), uint64(n)))
	}
	return h, uint64(base), uint64(n), nil
}

// IPCOpen opens another process's handle in device's primary context
// (cuIpcOpenMemHandle with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS). CUDA
// counts opens of one handle and returns the same address: so do we, for
// the range index.
func (r *Real) IPCOpen(device int, h IPCHandle) (uint64, uint64, error) {
	const op = "cuIpcOpenMemHandle"
	d, err := r.device(op, device)
	if err != nil {
		return 0, 0, err
	}
	var p, n C.uint64_t
	if err := check(op, C.kv_cuIpcOpen(C.uint64_t(d.ctx), unsafe.Pointer(&h[0]), &p, &n)); err != nil {
		return 0, 0, err
	}
	if n == 0 { // cuMemGetAddressRange could not say: the size is unknown
		_ = C.kv_cuIpcClose(C.uint64_t(d.ctx), p)
		return 0, 0, NewError(op, ErrCodeNotSupported, "cuMemGetAddressRange cannot size the opened allocation")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if o, ok := r.ipcOpen[uint64(p)]; ok {
		o.refs++
		r.ipcOpen[uint64(p)] = o
		return uint64(p), o.size, nil
	}
	r.ipcOpen[uint64(p)] = ipcOpened{devRange{dev: device, start: uint64(p), size: uint64(n)}, 1}
	r.devIndex.add(device, uint64(p), uint64(n))
	return uint64(p), uint64(n), nil
}

// ipcOpened is an allocation IPCOpen opened, and how many times.
type ipcOpened struct {
	devRange
	refs int
}

// IPCClose undoes one IPCOpen (cuIpcCloseMemHandle each time).
func (r *Real) IPCClose(ptr uint64) error {
	const op = "cuIpcCloseMemHandle"
	r.mu.Lock()
	o, ok := r.ipcOpen[ptr]
	if ok {
		if o.refs--; o.refs == 0 {
			delete(r.ipcOpen, ptr)
			r.devIndex.remove(o.dev, o.start, o.size)
		} else {
			r.ipcOpen[ptr] = o
		}
	}
	r.mu.Unlock()
	if !ok {
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("%#x is not memory opened with IPCOpen", ptr))
	}
	return check(op, C.kv_cuIpcClose(C.uint64_t(r.devices[o.dev].ctx), C.uint64_t(ptr)))
}

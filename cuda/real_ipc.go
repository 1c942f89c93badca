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
// (cuIpcOpenMemHandle with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS).
func (r *Real) IPCOpen(device int, h IPCHandle) (uint64, error) {
	const op = "cuIpcOpenMemHandle"
	d, err := r.device(op, device)
	if err != nil {
		return 0, err
	}
	var p, n C.uint64_t
	if err := check(op, C.kv_cuIpcOpen(C.uint64_t(d.ctx), unsafe.Pointer(&h[0]), &p, &n)); err != nil {
		return 0, err
	}
	a := devRange{dev: device, start: uint64(p), size: uint64(n)}
	r.mu.Lock()
	r.ipcOpen[a.start] = a
	if a.size > 0 {
		r.devIndex.add(a.dev, a.start, a.size)
	}
	r.mu.Unlock()
	return uint64(p), nil
}

// IPCClose closes memory from IPCOpen.
func (r *Real) IPCClose(ptr uint64) error {
	const op = "cuIpcCloseMemHandle"
	r.mu.Lock()
	a, ok := r.ipcOpen[ptr]
	if ok {
		delete(r.ipcOpen, ptr)
		if a.size > 0 {
			r.devIndex.remove(a.dev, a.start, a.size)
		}
	}
	r.mu.Unlock()
	if !ok {
		return NewError(op, ErrCodeInvalidValue, fmt.Sprintf("%#x is not memory opened with IPCOpen", ptr))
	}
	return check(op, C.kv_cuIpcClose(C.uint64_t(r.devices[a.dev].ctx), C.uint64_t(ptr)))
}

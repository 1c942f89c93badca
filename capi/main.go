// Command capi is libkvbm: the C ABI of kvbm, built with
// -buildmode=c-shared. It holds no logic of its own — only argument checks,
// the handle table and the mapping of Go errors to kvbm_status_t. The
// contract is include/kvbm.h, written by hand.
//
// A kvbm_worker_t is a core/node.Node: the worker (core/worker), its
// network transport (core/remote, core/remote/tcp, core/remote/ucx) and
// its prefix cache (core/cache), assembled and closed by core/node. The
// other handles reach core/worker (coordinated workers), core/transfer
// (notifications), core/object (G4 keys) and core/handoff (the hand-off
// state machine, which stands apart from the data plane).
//
// Each public kvbm_* function is defined in C (shim.c) and forwards to its
// own Go export, kvbm_x to kvbmgo_x, so that a child process after fork()
// is refused before it enters the Go runtime. The exports live in one file
// per concept: exports_worker.go (create, tiers, local transfers),
// exports_metadata.go, exports_remote.go, exports_object.go,
// exports_counters.go, exports_coordinated.go, exports_notification.go,
// exports_handoff.go and exports_device.go.
package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include -Wall
#include <stdlib.h>
#include "kvbm.h"

// Defined in shim.c: stores the calling thread's last error message.
void kvbm_capi_set_error(const char *msg, size_t len);
*/
import "C"

import (
	"fmt"
	"runtime/debug"
	"unsafe"

	_ "github.com/ianlancetaylor/cgosymbolizer" // symbolize C frames in Go tracebacks

	"github.com/kvbm/kvbm/capi/internal/handles"
	"github.com/kvbm/kvbm/core/logging"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/kvbmerr"
	"github.com/kvbm/kvbm/kvbmerr/stdkind"

	// The UCX transport, selectable with KVBM_TRANSPORT=ucx (TCP comes
	// with core/node).
	_ "github.com/kvbm/kvbm/core/remote/ucx"
)

func main() {}

func init() { logging.Configure() }

// Statuses, mirrored from kvbm.h.
const (
	statusOK              = C.kvbm_status_t(C.KVBM_OK)
	statusInProgress      = C.kvbm_status_t(C.KVBM_IN_PROGRESS)
	errInvalidArgument    = C.kvbm_status_t(C.KVBM_ERR_INVALID_ARGUMENT)
	errInvalidHandle      = C.kvbm_status_t(C.KVBM_ERR_INVALID_HANDLE)
	errNotFound           = C.kvbm_status_t(C.KVBM_ERR_NOT_FOUND)
	errAlreadyExists      = C.kvbm_status_t(C.KVBM_ERR_ALREADY_EXISTS)
	errFailedPrecondition = C.kvbm_status_t(C.KVBM_ERR_FAILED_PRECONDITION)
	errOutOfRange         = C.kvbm_status_t(C.KVBM_ERR_OUT_OF_RANGE)
	errBufferTooSmall     = C.kvbm_status_t(C.KVBM_ERR_BUFFER_TOO_SMALL)
	errIO                 = C.kvbm_status_t(C.KVBM_ERR_IO)
	errCUDA               = C.kvbm_status_t(C.KVBM_ERR_CUDA)
	errTimeout            = C.kvbm_status_t(C.KVBM_ERR_TIMEOUT)
	errCanceled           = C.kvbm_status_t(C.KVBM_ERR_CANCELED)
	errUnsupported        = C.kvbm_status_t(C.KVBM_ERR_UNSUPPORTED)
	errDataCorruption     = C.kvbm_status_t(C.KVBM_ERR_DATA_CORRUPTION)
	errInternal           = C.kvbm_status_t(C.KVBM_ERR_INTERNAL)
	errDeadlineExceeded   = C.kvbm_status_t(C.KVBM_ERR_DEADLINE_EXCEEDED)
)

// Handle kinds.
const (
	kindWorker handles.Kind = iota + 1
	kindCoordinated
	kindNotification
	kindHandoff
)

// table holds every handle the library has issued.
var table = handles.New()

// loopback is the in-process transport every worker joins, so that workers
// of one process can transfer from each other.
var loopback = remote.NewLoopback()

// setError stores msg as the calling thread's last error. Exports run on
// the calling C thread, so the C thread-local is the caller's.
func setError(msg string) {
	if msg == "" {
		C.kvbm_capi_set_error(nil, 0)
		return
	}
	C.kvbm_capi_set_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
}

// fail records a message and returns st.
func fail(st C.kvbm_status_t, format string, args ...any) C.kvbm_status_t {
	setError("kvbm: " + fmt.Sprintf(format, args...))
	return st
}

// failErr records err's message and returns its status.
func failErr(err error) C.kvbm_status_t {
	setError(err.Error())
	return statusOf(err)
}

// result is KVBM_OK for a nil error, else the error's status (and message).
func result(err error) C.kvbm_status_t {
	if err != nil {
		return failErr(err)
	}
	return statusOK
}

// recoverStatus turns a panic in an export into KVBM_ERR_INTERNAL; every
// export defers it.
func recoverStatus(st *C.kvbm_status_t) {
	if r := recover(); r != nil {
		*st = fail(errInternal, "internal error (panic): %v\n%s", r, debug.Stack())
	}
}

// statusOfKind is the status of each kind of error (stdkind.KindOf); an
// error of a kind not listed, or of none, is KVBM_ERR_INTERNAL.
var statusOfKind = map[kvbmerr.Kind]C.kvbm_status_t{
	kvbmerr.InvalidArgument:    errInvalidArgument,
	kvbmerr.OutOfRange:         errOutOfRange,
	kvbmerr.NotFound:           errNotFound,
	kvbmerr.AlreadyExists:      errAlreadyExists,
	kvbmerr.FailedPrecondition: errFailedPrecondition,
	kvbmerr.DataCorruption:     errDataCorruption,
	kvbmerr.IO:                 errIO,
	kvbmerr.CUDA:               errCUDA,
	kvbmerr.Timeout:            errTimeout,
	kvbmerr.Canceled:           errCanceled,
	kvbmerr.Unsupported:        errUnsupported,
	kvbmerr.DeadlineExceeded:   errDeadlineExceeded,
}

// statusOf maps an error to its status through its kind.
func statusOf(err error) C.kvbm_status_t {
	if err == nil {
		return statusOK
	}
	if st, ok := statusOfKind[stdkind.KindOf(err)]; ok {
		return st
	}
	return errInternal
}

// get returns the value of a live handle of kind k.
func get[T any](h C.uintptr_t, k handles.Kind) (T, bool) {
	v, ok := table.Get(handles.Handle(h), k)
	if !ok {
		var zero T
		return zero, false
	}
	t, ok := v.(T)
	return t, ok
}

// lookup is get with the status of a handle that is not live; what names
// the handle's kind in the message.
func lookup[T any](h C.uintptr_t, k handles.Kind, what string) (T, C.kvbm_status_t) {
	v, ok := get[T](h, k)
	if !ok {
		return v, badHandle(what, h)
	}
	return v, statusOK
}

// badHandle is the status of a handle that is not live.
func badHandle(what string, h C.uintptr_t) C.kvbm_status_t {
	return fail(errInvalidHandle, "%s handle %#x is not a live handle (freed, stale, never issued or of another kind)",
		what, uint64(h))
}

//export kvbmgo_handle_count
func kvbmgo_handle_count(count *C.size_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if count == nil {
		return fail(errInvalidArgument, "handle_count: count is NULL")
	}
	*count = C.size_t(table.Len())
	return statusOK
}

//export kvbmgo_info
func kvbmgo_info(info *C.kvbm_info_t) (st C.kvbm_status_t) {
	defer recoverStatus(&st)
	if info == nil {
		return fail(errInvalidArgument, "info: info is NULL")
	}
	if info.struct_size < infoV1Size {
		return fail(errInvalidArgument, "info: struct_size %d is less than %d (use KVBM_INFO_INIT)",
			info.struct_size, infoV1Size)
	}
	drv, err := cuda.Default()
	if err != nil {
		return failErr(err)
	}
	n, err := drv.DeviceCount()
	if err != nil {
		return failErr(err)
	}
	info.version = C.kvbm_version()
	info.abi_version = C.KVBM_ABI_VERSION
	name := drv.Name()
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&info.device_backend[0])), len(info.device_backend))
	clear(buf)
	copy(buf[:len(buf)-1], name)
	info.device_count = C.int32_t(n)
	if info.struct_size >= C.sizeof_kvbm_info_t {
		choice, err := remote.EnvChoice()
		if err != nil {
			return failErr(err)
		}
		t := unsafe.Slice((*byte)(unsafe.Pointer(&info.transport[0])), len(info.transport))
		clear(t)
		copy(t[:len(t)-1], choice)
	}
	return statusOK
}

// infoV1Size is kvbm_info_t before the transport field: callers built
// against it keep working.
var infoV1Size = C.size_t(unsafe.Offsetof(C.kvbm_info_t{}.transport))

// C types named for the package's tests (test files cannot refer to C
// types).
type (
	status  = C.kvbm_status_t
	cUint8  = C.uint8_t
	cUint64 = C.uint64_t
	cSize   = C.size_t
)

// uintptrOf is a handle as exports receive it.
func uintptrOf(h handles.Handle) C.uintptr_t { return C.uintptr_t(h) }

// lastError is the calling thread's last error message, for the package's
// tests (which lock their goroutine to its thread around a call).
func lastError() string { return C.GoString(C.kvbm_last_error()) }

//go:build cgo

package ucx

/*
#include "shim.h"
*/
import "C"

import "unsafe"

// A sink (shim.h) is where UCX hands the fragments of one rendezvous data
// message: kvbm copies each to the destination while the sink is open.
// Its state is read and written on the progress thread only.

// newSink makes an open sink for a message of size bytes landing in dst;
// nil when memory ran out.
func newSink(dst []piece, size uint64) *C.kvbm_ucx_sink_t {
	s := C.kvbm_ucx_sink_new(C.uint64_t(len(dst)))
	if s == nil {
		return nil
	}
	s.total = C.uint64_t(size)
	ps := unsafe.Slice(C.kvbm_ucx_sink_pieces(s), len(dst))
	for i, d := range dst {
		ps[i] = C.kvbm_ucx_iov_t{buffer: C.uint64_t(d.addr), length: C.uint64_t(d.size)}
	}
	return s
}

// releaseSink drops a reference to s; the last frees it.
func releaseSink(s *C.kvbm_ucx_sink_t) { C.kvbm_ucx_sink_release(s) }

// sinksLive counts the sinks of the process not yet freed: none once UCX
// finished every receive.
func sinksLive() int { return int(C.kvbm_ucx_sinks_live()) }

// unpackInto hands s one fragment, at offset of its message, as UCX does.
func unpackInto(s *C.kvbm_ucx_sink_t, offset uint64, b []byte) {
	C.kvbm_ucx_sink_unpack(s, C.uint64_t(offset), unsafe.Pointer(unsafe.SliceData(b)), C.uint64_t(len(b)))
}

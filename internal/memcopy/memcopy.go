// Package memcopy copies bulk memory the way a copy engine does: without
// pulling the destination through the CPU's caches.
//
// Go's copy streams with non-temporal stores only from 1 MiB up; a block's
// fragments (32 KiB per layer in vLLM's layout) are copied with ordinary
// stores, which read each destination line into the cache before writing
// it and evict what the cache held. On this project's machines a loop of
// 32 KiB copies ran at about half the speed of one contiguous copy of the
// same bytes. Copy uses non-temporal stores from MinStreaming bytes up, so
// that fragments move at the speed of the contiguous copy, as on a GPU.
package memcopy

import "unsafe"

// MinStreaming is the size from which Copy streams: below it the
// destination is likely read again soon (a small transfer's block) and
// ordinary stores leave it in the cache.
const MinStreaming = 16 << 10

// piece bounds one call into the assembly loop, which cannot be preempted.
const piece = 1 << 20

// Copy copies min(len(dst), len(src)) bytes from src to dst, as copy does.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < MinStreaming || !streaming || overlap(dst[:n], src[:n]) {
		return copy(dst, src)
	}
	stream(dst[:n], src[:n])
	return n
}

// stream copies src into dst (of one length, not overlapping) with
// streaming stores where the architecture has them.
func stream(dst, src []byte) {
	n := len(dst)
	if !haveNT {
		copy(dst, src)
		return
	}
	// Head: up to the first 64-byte boundary of dst, so that every
	// streaming store is aligned; tail: what is left under 64 bytes.
	head := int(-uintptr(unsafe.Pointer(unsafe.SliceData(dst))) & 63)
	copy(dst[:head], src[:head])
	off := head
	for off+64 <= n {
		m := min(n-off, piece) &^ 63
		copyNT(unsafe.Pointer(&dst[off]), unsafe.Pointer(&src[off]), uintptr(m))
		off += m
	}
	copy(dst[off:n], src[off:n])
}

func overlap(a, b []byte) bool {
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

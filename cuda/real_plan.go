package cuda

import (
	"cmp"
	"runtime"
	"slices"
	"time"
)

// The real driver's decisions that need no GPU, kept apart so that they
// are tested on every machine: error mapping, the chunking of host
// registrations, the choice of copy path per call, and the polling backoff.

// CUresult codes the real driver treats specially.
const (
	cuSuccess  = 0
	cuNotReady = ErrCodeNotReady
)

// errorText returns the driver's name and description of a CUresult, with
// ok false when the driver does not know the code (cuGetErrorName fails).
type errorText func(code int) (name, desc string, ok bool)

// resultError maps a CUresult to nil (CUDA_SUCCESS) or an *Error carrying
// the driver's own name and description; text may be nil (no driver
// loaded) or fail, and then the name comes from NewError's table.
func resultError(op string, code int, text errorText) error {
	if code == cuSuccess {
		return nil
	}
	if text != nil {
		if name, desc, ok := text(code); ok {
			return &Error{Op: op, Code: code, Name: name, Desc: desc}
		}
	}
	return NewError(op, code, "no description from the driver")
}

// hostRegisterChunkMax is the most cuMemHostRegister is asked to pin in one
// call: very large single registrations have failed or taken minutes on
// some drivers, so a large host pool is registered in pieces.
const hostRegisterChunkMax uint64 = 64 << 30

// span is one range [Start, Start+Size).
type span struct{ Start, Size uint64 }

// hostRegisterChunks splits [ptr, ptr+size) into consecutive pieces of at
// most max bytes (the last may be shorter). size 0 gives none.
func hostRegisterChunks(ptr, size, max uint64) []span {
	if size == 0 || max == 0 {
		return nil
	}
	out := make([]span, 0, (size+max-1)/max)
	for off := uint64(0); off < size; off += max {
		out = append(out, span{Start: ptr + off, Size: min(max, size-off)})
	}
	return out
}

// copyPath is how one MemcpyBatchAsync call is carried out.
type copyPath uint8

const (
	pathLoop   copyPath = iota + 1 // one cuMemcpy*Async per copy, in order
	pathBatch                      // one cuMemcpyBatchAsync
	pathKernel                     // the fragment-copy kernel
)

func (p copyPath) String() string {
	switch p {
	case pathLoop:
		return "loop"
	case pathBatch:
		return "batch"
	case pathKernel:
		return "kernel"
	}
	return "copyPath(?)"
}

// Thresholds of the copy-path choice. PROVISIONAL: chosen from the copy
// engines' known per-copy overhead (a few µs), not yet measured on a GPU;
// scripts/gpu-check.sh prints the GB/s to set them by.
const (
	// kernelMinCopies: fewer copies than this never use the kernel (its
	// launch and table upload cost about as much as a few copies).
	kernelMinCopies = 8
	// kernelMaxAvgBytes: the kernel is used only while the average copy is
	// at most this large; bigger copies go to the copy engines, which
	// reach full bandwidth without taking SMs from the engine's compute.
	kernelMaxAvgBytes = 64 << 10
	// batchMinCopies: a batch of fewer copies goes through the loop.
	batchMinCopies = 2
)

// copyPlanInput is what chooseCopyPath decides from.
type copyPlanInput struct {
	Copies     int    // non-empty copies
	Bytes      uint64 // their total size
	KernelOK   bool   // the kernel is loaded and may touch both sides
	BatchOK    bool   // cuMemcpyBatchAsync is resolved and enabled, and the stream is not 0
	HazardFree bool   // no copy reads or writes another's destination
}

// chooseCopyPath picks the path for one batch. The kernel and the batch API
// both run the copies of a batch in no particular order, so either needs
// HazardFree; the loop keeps the interface's in-order promise always.
func chooseCopyPath(in copyPlanInput) copyPath {
	if in.Copies == 0 || !in.HazardFree {
		return pathLoop
	}
	if in.KernelOK && in.Copies >= kernelMinCopies && in.Bytes/uint64(in.Copies) <= kernelMaxAvgBytes {
		return pathKernel
	}
	if in.BatchOK && in.Copies >= batchMinCopies {
		return pathBatch
	}
	return pathLoop
}

// hazardFree reports whether no copy's destination overlaps another copy's
// source or destination, so that the copies may run in any order (or all
// at once) with the result of running them in order. Zero-size copies are
// ignored. O(n log n).
func hazardFree(copies []Copy) bool {
	type edge struct {
		start, end uint64
		dst        bool
		idx        int
	}
	es := make([]edge, 0, 2*len(copies))
	for i, c := range copies {
		if c.Size == 0 {
			continue
		}
		es = append(es, edge{c.Dst, c.Dst + c.Size, true, i}, edge{c.Src, c.Src + c.Size, false, i})
	}
	slices.SortFunc(es, func(a, b edge) int { return cmp.Compare(a.start, b.start) })
	// Sweep in order of start: a range overlaps an earlier one exactly when
	// it starts before that one ends. Of the earlier ranges only the two
	// furthest-reaching ones of different copies matter (a copy's own source
	// and destination are not compared).
	var dsts, all reach
	for _, e := range es {
		if dsts.overlaps(e.start, e.idx) || (e.dst && all.overlaps(e.start, e.idx)) {
			return false
		}
		if e.dst {
			dsts.add(e.end, e.idx)
		}
		all.add(e.end, e.idx)
	}
	return true
}

// Polling of EventSynchronize and StreamSynchronize: waiting goroutines
// query (cuEventQuery, cuStreamQuery) instead of blocking an OS thread in
// cuEventSynchronize, since the transfer manager may have thousands waiting
// at once. Go's timers round a sub-millisecond sleep up to about 1 ms, so a
// wait that sleeps at once costs a millisecond even for work that is about
// done: for the first pollSpin the waiter yields (runtime.Gosched) between
// queries, then sleeps from pollFirst doubling to pollMax.
const (
	pollSpin  = 50 * time.Microsecond
	pollFirst = 50 * time.Microsecond
	pollMax   = time.Millisecond
)

// nextPoll is how to wait after a query that found the work pending:
// elapsed is the time since the wait began, last the previous sleep (0
// before the first). 0 means yield and query again; otherwise sleep that
// long.
func nextPoll(elapsed, last time.Duration) time.Duration {
	if elapsed < pollSpin {
		return 0
	}
	if last < pollFirst {
		return pollFirst
	}
	return min(2*last, pollMax)
}

// poll calls query until it reports completion or fails, waiting as
// nextPoll says between calls.
func poll(query func() (bool, error)) error {
	start := time.Now()
	var last time.Duration
	for {
		if ok, err := query(); ok || err != nil {
			return err
		}
		d := nextPoll(time.Since(start), last)
		if d == 0 {
			runtime.Gosched()
			continue
		}
		last = d
		time.Sleep(d)
	}
}

// reach keeps the two furthest ends of ranges from different copies.
type reach struct {
	end  [2]uint64
	idx  [2]int
	have [2]bool
}

func (r *reach) add(end uint64, idx int) {
	switch {
	case r.have[0] && r.idx[0] == idx:
		r.end[0] = max(r.end[0], end)
	case r.have[1] && r.idx[1] == idx:
		r.end[1] = max(r.end[1], end)
	case !r.have[1] || end > r.end[1]:
		r.end[1], r.idx[1], r.have[1] = end, idx, true
	}
	if r.have[1] && (!r.have[0] || r.end[1] > r.end[0]) {
		r.end[0], r.end[1] = r.end[1], r.end[0]
		r.idx[0], r.idx[1] = r.idx[1], r.idx[0]
		r.have[0], r.have[1] = r.have[1], r.have[0]
	}
}

// overlaps reports whether a range of a copy other than idx ends after start.
func (r *reach) overlaps(start uint64, idx int) bool {
	for i := range 2 {
		if r.have[i] && r.idx[i] != idx && start < r.end[i] {
			return true
		}
	}
	return false
}

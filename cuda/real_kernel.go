//go:build cgo

package cuda

/*
#include <stdlib.h>
#include "real_trampolines.h"
*/
import "C"

import (
	_ "embed"
	"log/slog"
	"unsafe"
)

// The fragment-copy kernel (kernels/copy.cu), embedded as PTX and loaded
// per device with cuModuleLoadData at first use. Its argument tables live
// in device memory: each launch writes them to a pinned staging buffer,
// copies that to the device on the launch's stream, launches, and records
// an event; the tables are reused once the event is complete.

//go:embed kernels/copy.ptx
var copyPTX string

const (
	copyKernelName  = "kvbm_copy_fragments"
	kernelBlock     = 256  // threads per block: one block copies one fragment at a time
	kernelMaxGrid   = 2048 // blocks per launch; more fragments are taken in turn
	kernelTableCap  = 4096 // fragments per table set (96 KiB); bigger batches launch several times
	kernelTableCols = 3    // src, dst, size
)

type copyKernel struct {
	module, fn uint64
}

// kernelTables is one set of argument tables: pinned staging and device
// copies of src[cap], dst[cap], size[cap], and the event recorded after the
// launch that last used them. held: a caller is filling them, and their
// event is still the previous launch's (complete, it says nothing of this
// one); inFlight: launched, free again once the event completes.
type kernelTables struct {
	host, dev uint64
	event     Event
	held      bool
	inFlight  bool
}

// cuErrorUnsupportedPTXVersion: cuModuleLoadData's answer when the driver
// is older than the PTX's ISA version (kernels/copy.ptx is ISA 8.0, from
// NVRTC 12.0: drivers of CUDA 12.0, r525, and later JIT it).
const cuErrorUnsupportedPTXVersion = 222

// loadKernel returns device's kernel, loading it on first use. A failure
// (a driver older than the PTX, say) is remembered per device, logged once
// per driver, and reported as CUDA_ERROR_NOT_SUPPORTED so that callers fall
// back to the copy engines; kernelRes keeps the driver's own code.
func (r *Real) loadKernel(dev int) (*copyKernel, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if k := r.kernels[dev]; k != nil {
		return k, nil
	}
	if err := r.kernelErr[dev]; err != nil {
		return nil, err
	}
	ctx := C.uint64_t(r.devices[dev].ctx)
	image := C.CString(copyPTX)
	defer C.free(unsafe.Pointer(image))
	var mod, fn C.uint64_t
	res := C.kv_cuModuleLoadData(ctx, &mod, unsafe.Pointer(image))
	err := check("cuModuleLoadData", res)
	if err == nil {
		name := C.CString(copyKernelName)
		defer C.free(unsafe.Pointer(name))
		res = C.kv_cuModuleGetFunction(ctx, &fn, mod, name)
		if err = check("cuModuleGetFunction", res); err != nil {
			_ = C.kv_cuModuleUnload(ctx, mod)
		}
	}
	if err != nil {
		if !r.kernelLog {
			r.kernelLog = true
			msg := "kvbm: the CUDA copy kernel is unavailable; batches use the copy engines"
			if int(res) == cuErrorUnsupportedPTXVersion {
				msg = "kvbm: the CUDA driver is too old for the copy kernel's PTX (ISA 8.0 needs a CUDA 12.0 driver, r525 or later); batches use the copy engines"
			}
			slog.Warn(msg, "device", dev, "err", err)
		}
		r.kernelRes[dev] = int(res)
		r.kernelErr[dev] = NewError("cuModuleLoadData", ErrCodeNotSupported, err.Error())
		return nil, r.kernelErr[dev]
	}
	k := &copyKernel{module: uint64(mod), fn: uint64(fn)}
	r.kernels[dev] = k
	return k, nil
}

// acquireTables returns a free table set of device, making one if none is.
func (r *Real) acquireTables(dev int) (*kernelTables, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, NewError("cuLaunchKernel", ErrCodeNotInitialized, "the CUDA driver is closed")
	}
	for _, t := range r.tables[dev] {
		if t.held {
			// Being filled by another caller: its event is the last
			// launch's, complete, and would free the set under it.
			continue
		}
		if t.inFlight {
			// Not r.EventQuery: r.mu is held. Anything but NOT_READY frees
			// the set: after a sticky error no launch will ever complete,
			// and the error reaches the caller through its copy's own
			// synchronization, so waiting would only leak a set per batch.
			if C.kv_cuEventQuery(C.uint64_t(r.devices[dev].ctx), C.uint64_t(t.event)) != cuNotReady {
				t.inFlight = false
			}
		}
		if !t.inFlight {
			t.held = true
			r.mu.Unlock()
			return t, nil
		}
	}
	r.mu.Unlock()

	const bytes = kernelTableCap * kernelTableCols * 8
	d := r.devices[dev]
	t := &kernelTables{held: true}
	var host, devp, ev C.uint64_t
	if err := check("cuMemHostAlloc", C.kv_cuMemHostAlloc(C.uint64_t(d.ctx), &host, bytes, cuMemHostAllocPortable, -1)); err != nil {
		return nil, err
	}
	if err := check("cuMemAlloc", C.kv_cuMemAlloc(C.uint64_t(d.ctx), &devp, bytes)); err != nil {
		_ = C.kv_cuMemFreeHost(C.uint64_t(d.ctx), host)
		return nil, err
	}
	if err := check("cuEventCreate", C.kv_cuEventCreate(C.uint64_t(d.ctx), &ev, cuEventDisableTiming)); err != nil {
		_ = C.kv_cuMemFree(C.uint64_t(d.ctx), devp)
		_ = C.kv_cuMemFreeHost(C.uint64_t(d.ctx), host)
		return nil, err
	}
	t.host, t.dev, t.event = uint64(host), uint64(devp), Event(ev)
	r.mu.Lock()
	if r.closed { // closed meanwhile: Close freed the others
		r.mu.Unlock()
		_ = C.kv_cuEventDestroy(C.uint64_t(d.ctx), ev)
		_ = C.kv_cuMemFree(C.uint64_t(d.ctx), devp)
		_ = C.kv_cuMemFreeHost(C.uint64_t(d.ctx), host)
		return nil, NewError("cuLaunchKernel", ErrCodeNotInitialized, "the CUDA driver is closed")
	}
	r.tables[dev] = append(r.tables[dev], t)
	r.mu.Unlock()
	return t, nil
}

// kernelCopy copies with the kernel on s, kernelTableCap fragments per
// launch. The caller has checked that the copies are hazard-free and that
// the kernel may touch their memory.
func (r *Real) kernelCopy(dev int, copies []Copy, s Stream) error {
	k, err := r.loadKernel(dev)
	if err != nil {
		return err
	}
	ctx := C.uint64_t(r.devices[dev].ctx)
	for len(copies) > 0 {
		t, err := r.acquireTables(dev)
		if err != nil {
			return err
		}
		// Take up to kernelTableCap non-empty copies.
		var take []Copy
		for len(copies) > 0 && len(take) < kernelTableCap {
			if copies[0].Size != 0 {
				take = append(take, copies[0])
			}
			copies = copies[1:]
		}
		if len(take) == 0 {
			r.releaseTables(t)
			break
		}
		// Columns packed by n: src[0:n], dst[n:2n], size[2n:3n].
		n := len(take)
		tab := u64s(t.host, kernelTableCols*n)
		for i, c := range take {
			tab[i], tab[n+i], tab[2*n+i] = c.Src, c.Dst, c.Size
		}
		if err := r.launch(ctx, k, t, n, s); err != nil {
			// The staging buffer may still be read by an enqueued copy: the
			// set stays in flight until its event says otherwise.
			_ = C.kv_cuEventRecord(ctx, C.uint64_t(t.event), C.uint64_t(s))
			r.launched(t)
			return err
		}
		r.launched(t)
	}
	return nil
}

// launched hands a held set over to its launch: its event, recorded after
// the launch, now says when the set is free.
func (r *Real) launched(t *kernelTables) {
	r.mu.Lock()
	t.held, t.inFlight = false, true
	r.mu.Unlock()
}

func (r *Real) launch(ctx C.uint64_t, k *copyKernel, t *kernelTables, n int, s Stream) error {
	col := uint64(n) * 8
	// The three columns in one copy.
	if err := check("cuMemcpyHtoDAsync", C.kv_cuMemcpyAsync(ctx, C.int(HostToDevice), C.uint64_t(t.dev),
		C.uint64_t(t.host), C.uint64_t(kernelTableCols*col), C.uint64_t(s))); err != nil {
		return err
	}
	grid := min(n, kernelMaxGrid)
	if err := check("cuLaunchKernel", C.kv_launch_copy(ctx, C.uint64_t(k.fn), C.uint(grid), kernelBlock, C.uint64_t(s),
		C.uint64_t(t.dev), C.uint64_t(t.dev+col), C.uint64_t(t.dev+2*col), C.uint(n))); err != nil {
		return err
	}
	return check("cuEventRecord", C.kv_cuEventRecord(ctx, C.uint64_t(t.event), C.uint64_t(s)))
}

func (r *Real) releaseTables(t *kernelTables) {
	r.mu.Lock()
	t.held = false
	r.mu.Unlock()
}

// kernelStats is for tests: how many table sets device has.
func (r *Real) kernelTableSets(dev int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.tables[dev])
}

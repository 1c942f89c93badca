package baseline

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// DirectFile is the limit of disk paths: one preallocated file written or
// read sequentially with O_DIRECT, a request per block (buffered where the
// filesystem refuses O_DIRECT, as the disk tier does).
type DirectFile struct {
	f       *os.File
	direct  bool
	request int
}

// CreateDirectFile creates and preallocates path with size bytes, to be
// written and read in requests of request bytes (a block: 2 MiB for a
// Llama-3-8B block of 16 tokens), a multiple of 4 KiB.
func CreateDirectFile(path string, size uint64, request int) (*DirectFile, error) {
	if request <= 0 || request%4096 != 0 {
		return nil, fmt.Errorf("baseline file %s: request of %d bytes is not a positive multiple of 4096", path, request)
	}
	direct := true
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
	if err != nil {
		direct = false
		if f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
			return nil, fmt.Errorf("baseline file %s: %w", path, err)
		}
	}
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil {
		return nil, errors.Join(fmt.Errorf("baseline file %s: fallocate %d bytes: %w", path, size, err), f.Close(), os.Remove(path))
	}
	return &DirectFile{f: f, direct: direct, request: request}, nil
}

// Direct reports whether the file is open with O_DIRECT.
func (p *DirectFile) Direct() bool { return p.direct }

// IO writes buf to the start of the file (or reads it back) on workers
// goroutines, each its own contiguous share, and returns how long it took.
// buf must be aligned for O_DIRECT (mmap'd memory is) and a multiple of
// the request size long.
func (p *DirectFile) IO(buf []byte, write bool, workers int) (time.Duration, error) {
	req := p.request
	if len(buf)%req != 0 {
		return 0, fmt.Errorf("baseline file: %d bytes is not a multiple of the request size %d", len(buf), req)
	}
	reqs := len(buf) / req
	workers = max(1, min(workers, reqs))
	t0 := time.Now()
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		from, to := reqs*w/workers, reqs*(w+1)/workers
		wg.Go(func() {
			for r := from; r < to; r++ {
				off := r * req
				var err error
				if write {
					_, err = p.f.WriteAt(buf[off:off+req], int64(off))
				} else {
					_, err = p.f.ReadAt(buf[off:off+req], int64(off))
				}
				if err != nil {
					errs[w] = fmt.Errorf("baseline file: request at %d: %w", off, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// Close closes and removes the file.
func (p *DirectFile) Close() error {
	return errors.Join(p.f.Close(), os.Remove(p.f.Name()))
}

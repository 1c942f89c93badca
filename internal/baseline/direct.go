package baseline

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// DirectRequest is the size of one request of DirectFile: 2 MiB, a
// Llama-3-8B block of 16 tokens.
const DirectRequest = 2 << 20

// DirectFile is the limit of disk paths: one preallocated file written or
// read sequentially with O_DIRECT in DirectRequest requests (buffered
// where the filesystem refuses O_DIRECT, as the disk tier does).
type DirectFile struct {
	f      *os.File
	direct bool
}

// CreateDirectFile creates and preallocates path with size bytes.
func CreateDirectFile(path string, size uint64) (*DirectFile, error) {
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
	return &DirectFile{f: f, direct: direct}, nil
}

// Direct reports whether the file is open with O_DIRECT.
func (p *DirectFile) Direct() bool { return p.direct }

// IO writes buf to the start of the file (or reads it back) on workers
// goroutines, each its own contiguous share, and returns how long it took.
// buf must be aligned for O_DIRECT (mmap'd memory is) and a multiple of
// DirectRequest long.
func (p *DirectFile) IO(buf []byte, write bool, workers int) (time.Duration, error) {
	if len(buf)%DirectRequest != 0 {
		return 0, fmt.Errorf("baseline file: %d bytes is not a multiple of %d", len(buf), DirectRequest)
	}
	reqs := len(buf) / DirectRequest
	workers = max(1, min(workers, reqs))
	t0 := time.Now()
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		from, to := reqs*w/workers, reqs*(w+1)/workers
		wg.Go(func() {
			for r := from; r < to; r++ {
				off := r * DirectRequest
				var err error
				if write {
					_, err = p.f.WriteAt(buf[off:off+DirectRequest], int64(off))
				} else {
					_, err = p.f.ReadAt(buf[off:off+DirectRequest], int64(off))
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

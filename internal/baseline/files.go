package baseline

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kvbm/kvbm/internal/crc32c"
)

// Files is the limit of the filesystem object store: one plain file per
// block in a directory of its own, written with an fsync per file (the
// durability the store pays for) and read into the caller's buffers (no
// allocation per file).
type Files struct {
	dir   string
	paths []string
}

// NewFiles makes dir (which must not exist) for n files.
func NewFiles(dir string, n int) (*Files, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("baseline files: %w", err)
	}
	f := &Files{dir: dir, paths: make([]string, n)}
	for i := range f.paths {
		f.paths[i] = filepath.Join(dir, fmt.Sprintf("block-%06d", i))
	}
	return f, nil
}

// IO writes blocks[i] to file i (or reads file i into blocks[i]) on
// workers goroutines and returns how long it took.
func (f *Files) IO(blocks [][]byte, write bool, workers int) (time.Duration, error) {
	return f.io(blocks, write, false, workers)
}

// ReadChecked reads file i into blocks[i] as IO does and computes the
// CRC32C of each piece of 256 KiB right after it lands, while it is hot:
// the least a read that verifies a checksum can cost, the limit of a store
// that checks what it loads.
func (f *Files) ReadChecked(blocks [][]byte, workers int) (time.Duration, error) {
	return f.io(blocks, false, true, workers)
}

func (f *Files) io(blocks [][]byte, write, check bool, workers int) (time.Duration, error) {
	if len(blocks) > len(f.paths) {
		return 0, fmt.Errorf("baseline files: %d blocks for %d files", len(blocks), len(f.paths))
	}
	workers = max(1, min(workers, len(blocks)))
	errs := make([]error, workers)
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(blocks); i += workers {
				var err error
				switch {
				case write:
					err = writeSync(f.paths[i], blocks[i])
				default:
					err = readInto(f.paths[i], blocks[i], check)
				}
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

func writeSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("baseline files: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		return errors.Join(fmt.Errorf("baseline files: write %s: %w", path, err), f.Close())
	}
	if err := f.Sync(); err != nil {
		return errors.Join(fmt.Errorf("baseline files: fsync %s: %w", path, err), f.Close())
	}
	return f.Close()
}

// checkPiece is how much a checked read reads before checksumming it.
const checkPiece = 256 << 10

// readInto reads the file into b: in one call, or, when check, in pieces
// of checkPiece each checksummed right after it lands.
func readInto(path string, b []byte, check bool) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("baseline files: %w", err)
	}
	defer f.Close()
	piece := len(b)
	if check {
		piece = checkPiece
	}
	var crc uint32
	for p := b; len(p) > 0; {
		n := min(len(p), piece)
		if _, err := io.ReadFull(f, p[:n]); err != nil {
			return fmt.Errorf("baseline files: read %s: %w", path, err)
		}
		if check {
			crc = crc32c.Update(crc, p[:n])
		}
		p = p[n:]
	}
	_ = crc // computing it is the work measured; its value is not compared
	return nil
}

// DropCache drops the files' cached pages: the next IO reads the device.
func (f *Files) DropCache() error { return DropCache(f.dir) }

// Close removes the directory and its files.
func (f *Files) Close() error { return os.RemoveAll(f.dir) }

package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/kvbm/kvbm/internal/privdir"
)

// OpenNamedDiskFile opens the G3 file dir/name of size bytes that outlives
// the process (a persistent disk tier, warm after a restart): the file
// kept from an earlier run when it has that size (Reused then says so: its
// bytes are the earlier run's, which the owner's journal vouches for block
// by block), else made anew and reserved as CreateDiskFile does. One
// process at a time: the file is locked (flock) for as long as it is open,
// and a second opener is refused, wrapping syscall.EWOULDBLOCK. dir must
// be private as for CreateDiskFile; the file is 0600.
func OpenNamedDiskFile(dir, name string, size uint64) (*DiskFile, error) {
	if dir == "" || name == "" || filepath.Base(name) != name {
		return nil, fmt.Errorf("open disk layout: directory %q and file name %q must be set, the name without a directory", dir, name)
	}
	if size == 0 {
		return nil, fmt.Errorf("open disk layout: size must be > 0")
	}
	if err := privdir.Check(dir); err != nil {
		return nil, fmt.Errorf("open disk layout: %w", err)
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, privdir.FileMode)
	if err != nil {
		return nil, fmt.Errorf("open disk layout %q: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("open disk layout %q: another process has it open (one process per persistent G3 directory): %w", path, err)
	}
	d := &DiskFile{dir: dir, path: path, size: size, buffered: f, named: true}
	st, err := f.Stat()
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("open disk layout %q: %w", path, err)
	}
	if direct, derr := os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT|syscall.O_CLOEXEC, 0); derr == nil {
		d.direct = direct
	} else {
		warnBuffered(dir, derr)
	}
	if uint64(st.Size()) == size {
		d.reused = true
		return d, nil
	}
	// Another size (another layout) or a new file: made anew.
	if err := f.Truncate(0); err != nil {
		d.Close()
		return nil, fmt.Errorf("open disk layout %q: truncate: %w", path, err)
	}
	release, err := checkSpace(dir, size)
	if err != nil {
		d.Close()
		return nil, err
	}
	defer release()
	if err := reserve(f, size); err != nil {
		d.Close()
		if errors.Is(err, syscall.ENOSPC) {
			if free, ok := freeBytes(dir); ok {
				err = fmt.Errorf("%w (%d bytes free)", err, free)
			}
		}
		return nil, fmt.Errorf("reserve %d bytes for disk layout %q: %w", size, path, err)
	}
	return d, nil
}

// Named reports whether the file has a name and outlives the process
// (OpenNamedDiskFile).
func (d *DiskFile) Named() bool { return d.named }

// Reused reports whether a named file's bytes are an earlier run's.
func (d *DiskFile) Reused() bool { return d.reused }

// Dir is the directory the file is in.
func (d *DiskFile) Dir() string { return d.dir }

package storage

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/internal/memavail"
	"github.com/kvbm/kvbm/internal/privdir"
)

// DirectIOAlignment is the alignment O_DIRECT needs of buffer addresses, file
// offsets and lengths.
const DirectIOAlignment = 4096

var bufferedFallbackOnce sync.Once

// DiskFile is one file holding one layout (G3). Reads and writes whose
// buffer, offset and length are all 4 KiB-aligned go through an O_DIRECT
// descriptor, so that they bypass the page cache; others, or all of them
// where the filesystem refuses O_DIRECT (tmpfs), through a buffered one.
// The file has no name from the moment it is open (O_TMPFILE, or unlinked
// at once where the filesystem lacks O_TMPFILE): its blocks go back to the
// filesystem when its descriptors close, on Close or when the process dies,
// SIGKILL included, so nothing is ever left on disk.
type DiskFile struct {
	dir      string
	path     string // /proc/self/fd/N of the buffered descriptor
	size     uint64
	direct   *os.File // nil when O_DIRECT is unavailable
	buffered *os.File

	// fault, when set (tests), is called before each read or write and
	// fails it with the returned error.
	fault func(op string, off int64, n int) error

	// named: the file has a name and outlives the process
	// (OpenNamedDiskFile); reused: its bytes are an earlier run's.
	named, reused bool

	closeOnce sync.Once
	closeErr  error
}

// CreateDiskFile creates a new file of size bytes in dir (which must exist)
// and reserves its space with fallocate, falling back to writing zeros
// where the filesystem does not support it. The file is 0600; dir must be
// the user's own and writable by no other (privdir.Check), else it is
// refused, wrapping privdir.ErrNotPrivate, and nothing is made in it.
func CreateDiskFile(dir string, size uint64) (*DiskFile, error) {
	if dir == "" {
		return nil, fmt.Errorf("create disk layout: directory must be set")
	}
	if size == 0 {
		return nil, fmt.Errorf("create disk layout: size must be > 0")
	}
	if err := privdir.Check(dir); err != nil {
		return nil, fmt.Errorf("create disk layout: %w", err)
	}
	release, err := checkSpace(dir, size)
	if err != nil {
		return nil, err
	}
	defer release()
	f, direct, err := openUnnamed(dir)
	if err != nil {
		return nil, fmt.Errorf("create disk layout in %q: %w", dir, err)
	}
	d := &DiskFile{dir: dir, path: fmt.Sprintf("/proc/self/fd/%d", f.Fd()), size: size,
		buffered: f, direct: direct}
	if err := reserve(f, size); err != nil {
		d.Close()
		if errors.Is(err, syscall.ENOSPC) {
			if free, ok := freeBytes(dir); ok {
				err = fmt.Errorf("%w (%d bytes free)", err, free)
			}
		}
		return nil, fmt.Errorf("reserve %d bytes for a disk layout in %q: %w", size, dir, err)
	}
	return d, nil
}

// openUnnamed opens a new file in dir that no name reaches: O_TMPFILE where
// the filesystem has it, else a temporary name unlinked as soon as both
// descriptors are open (a kill between the two leaves at most an empty
// file). The O_DIRECT descriptor is a second open of the same file (through
// /proc/self/fd for O_TMPFILE); it is nil where O_DIRECT is refused.
func openUnnamed(dir string) (buffered, direct *os.File, err error) {
	fd, err := syscall.Open(dir, unix.O_TMPFILE|syscall.O_RDWR|syscall.O_CLOEXEC, uint32(privdir.FileMode))
	if err == nil && noTmpfile {
		syscall.Close(fd)
		err = syscall.EOPNOTSUPP
	}
	if err == nil {
		buffered = os.NewFile(uintptr(fd), dir+"/(unnamed G3 file)")
		direct, derr := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_RDWR|syscall.O_DIRECT, 0)
		if derr != nil {
			warnBuffered(dir, derr)
			direct = nil
		}
		return buffered, direct, nil
	}
	if !errors.Is(err, syscall.EOPNOTSUPP) && !errors.Is(err, syscall.EISDIR) &&
		!errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
		return nil, nil, err
	}
	// No O_TMPFILE here (ENOENT: a missing dir, reported by CreateTemp below).
	// CreateTemp makes the file 0600, as privdir.FileMode.
	f, err := os.CreateTemp(dir, "kvbm-layout-*.g3")
	if err != nil {
		return nil, nil, err
	}
	name := f.Name()
	direct, derr := os.OpenFile(name, os.O_RDWR|syscall.O_DIRECT, 0)
	if derr != nil {
		warnBuffered(dir, derr)
		direct = nil
	}
	if err := os.Remove(name); err != nil {
		f.Close()
		if direct != nil {
			direct.Close()
		}
		return nil, nil, fmt.Errorf("unlink %q: %w", name, err)
	}
	return f, direct, nil
}

// noTmpfile (tests) takes the path of a filesystem without O_TMPFILE.
var noTmpfile bool

func warnBuffered(dir string, err error) {
	bufferedFallbackOnce.Do(func() {
		slog.Warn("kvbm: O_DIRECT unavailable, disk tier uses buffered I/O", "dir", dir, "err", err)
	})
}

// checkSpace refuses a layout larger than the free space of dir's
// filesystem before a block is written (fallocate of too much may first
// fill the disk, zero-filling would), naming the bytes requested and free.
// A file on tmpfs is shared memory: its pages are reserved as
// AllocShared's are (internal/memavail), until release.
func checkSpace(dir string, size uint64) (release func(), err error) {
	var st syscall.Statfs_t
	if err := statfs(dir, &st); err != nil {
		return nil, fmt.Errorf("create disk layout in %q: %w", dir, err)
	}
	if free := availBytes(&st); size > free {
		return nil, fmt.Errorf("create disk layout in %q: %d bytes requested, %d free: %w", dir, size, free, syscall.ENOSPC)
	}
	if st.Type != tmpfsMagic {
		return func() {}, nil
	}
	release, err = memavail.Reserve(size)
	if err != nil {
		return nil, fmt.Errorf("create disk layout in %q (tmpfs: its files are memory): %w (%w)", dir, err, syscall.ENOMEM)
	}
	return release, nil
}

const tmpfsMagic = 0x01021994 // TMPFS_MAGIC

// freeBytes is the free space of dir's filesystem for an unprivileged
// user.
func freeBytes(dir string) (uint64, bool) {
	var st syscall.Statfs_t
	if statfs(dir, &st) != nil {
		return 0, false
	}
	return availBytes(&st), true
}

// statfs is syscall.Statfs; tests give other figures.
var statfs = syscall.Statfs

// availBytes is the space statfs says an unprivileged user may still
// write: Bavail counts fragments of Frsize bytes, as statvfs's f_bavail
// does, and Bsize is only the preferred I/O size (a filesystem may say
// 1 MiB there while its blocks are 4 KiB). Frsize 0 (a kernel before
// 2.6) means Bsize.
func availBytes(st *syscall.Statfs_t) uint64 {
	unit := uint64(st.Frsize)
	if unit == 0 {
		unit = uint64(st.Bsize)
	}
	return st.Bavail * unit
}

// reserve allocates the file's blocks so that a full disk fails now, not in
// the middle of an offload.
func reserve(f *os.File, size uint64) error {
	err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(size))
	if err == nil {
		return nil
	}
	if !errors.Is(err, syscall.EOPNOTSUPP) && !errors.Is(err, syscall.ENOSYS) {
		return fmt.Errorf("fallocate: %w", err)
	}
	zeros := make([]byte, 1<<20)
	for off := uint64(0); off < size; off += uint64(len(zeros)) {
		n := min(uint64(len(zeros)), size-off)
		if _, err := f.WriteAt(zeros[:n], int64(off)); err != nil {
			return fmt.Errorf("zero-fill at offset %d: %w", off, err)
		}
	}
	return f.Sync()
}

// Path is a name that reaches the file while it is open (/proc/self/fd/N
// for a file that has none, else its path).
func (d *DiskFile) Path() string { return d.path }

// name names the file in errors.
func (d *DiskFile) name() string {
	if d.named {
		return "the G3 file " + d.path
	}
	return "the G3 file in " + d.dir
}

// Size is the file's length in bytes.
func (d *DiskFile) Size() uint64 { return d.size }

// Direct reports whether aligned I/O bypasses the page cache.
func (d *DiskFile) Direct() bool { return d.direct != nil }

// SetFaultInjector makes every later read and write call fn first; a non-nil
// result fails that I/O. For tests of the failure paths.
func (d *DiskFile) SetFaultInjector(fn func(op string, off int64, n int) error) { d.fault = fn }

func (d *DiskFile) pick(p []byte, off uint64) *os.File {
	if d.direct != nil && off%DirectIOAlignment == 0 && len(p)%DirectIOAlignment == 0 &&
		addrOf(p)%DirectIOAlignment == 0 {
		return d.direct
	}
	return d.buffered
}

func (d *DiskFile) check(op string, p []byte, off uint64) error {
	if off+uint64(len(p)) > d.size || off+uint64(len(p)) < off {
		return fmt.Errorf("%s %s: range [%d, %d) beyond the file's %d bytes", op, d.name(), off, off+uint64(len(p)), d.size)
	}
	if d.fault != nil {
		if err := d.fault(op, int64(off), len(p)); err != nil {
			return fmt.Errorf("%s %s at offset %d: %w", op, d.name(), off, err)
		}
	}
	return nil
}

// ReadAt fills p from offset off. A read that ends early because the file
// was cut short behind the layout's back fails with an error matching
// io.ErrUnexpectedEOF: the bytes it should hold are gone.
func (d *DiskFile) ReadAt(p []byte, off uint64) error {
	if err := d.check("read", p, off); err != nil {
		return err
	}
	n, err := d.pick(p, off).ReadAt(p, int64(off))
	if err == io.EOF {
		if n == len(p) {
			err = nil
		} else {
			err = fmt.Errorf("%w: %d of %d bytes, the file ends before its layout does", io.ErrUnexpectedEOF, n, len(p))
		}
	}
	if err != nil {
		return fmt.Errorf("read %s at offset %d (%d bytes): %w", d.name(), off, len(p), err)
	}
	return nil
}

// WriteAt writes p at offset off.
func (d *DiskFile) WriteAt(p []byte, off uint64) error {
	if err := d.check("write", p, off); err != nil {
		return err
	}
	if _, err := d.pick(p, off).WriteAt(p, int64(off)); err != nil {
		return fmt.Errorf("write %s at offset %d (%d bytes): %w", d.name(), off, len(p), err)
	}
	return nil
}

// Close closes the descriptors; an unnamed file's blocks are freed, a
// named one's lock is released.
func (d *DiskFile) Close() error {
	d.closeOnce.Do(func() {
		var errs []error
		if d.direct != nil {
			errs = append(errs, d.direct.Close())
		}
		errs = append(errs, d.buffered.Close())
		d.closeErr = errors.Join(errs...)
	})
	return d.closeErr
}

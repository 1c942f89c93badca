// Package memfd makes and checks the sealed shared memory files that
// another process of this host may map: kvbm's shared host layouts
// (core/storage) and the emulated device's IPC-exportable allocations
// (cuda). The seals forbid resizing, so an importer may trust the size it
// maps: a file that shrank under a mapping would SIGBUS it.
package memfd

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/kvbmerr"
)

// ErrUnavailable is wrapped when the kernel makes no memory file at all
// (memfd_create refused: an old kernel, a sandbox), so that callers fall
// back to private memory.
var ErrUnavailable = kvbmerr.New(kvbmerr.Unsupported, "shared memory files are not available here")

// Seals are the seals every file of New carries.
const Seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// New makes a sealed shared memory file of size zeroed bytes, closed on
// exec.
func New(name string, size uint64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("%w: memfd_create: %w", ErrUnavailable, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("ftruncate: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, Seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal: %w", err)
	}
	return f, nil
}

// Check checks that f, handed over by another process, carries Seals and is
// exactly size bytes, and returns its inode.
func Check(f *os.File, size uint64) (inode uint64, err error) {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return 0, fmt.Errorf("not a sealed memory file: %w", err)
	}
	if seals&Seals != Seals {
		return 0, fmt.Errorf("the file's seals are %#x, want at least %#x (it could shrink under the mapping)", seals, Seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	if size == 0 || uint64(st.Size) != size {
		return 0, fmt.Errorf("the file is %d bytes, the peer said %d", st.Size, size)
	}
	return st.Ino, nil
}

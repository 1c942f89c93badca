package baseline

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// DropCache asks the kernel to drop the cached pages of every file under
// dir (posix_fadvise DONTNEED), so that the next read comes from the
// device: a cold read. Dirty pages are written first. On tmpfs, whose files
// live in the cache, it changes nothing.
func DropCache(dir string) error {
	var errs []error
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		defer f.Close()
		if err := f.Sync(); err != nil {
			errs = append(errs, fmt.Errorf("drop cache: fsync %s: %w", path, err))
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			errs = append(errs, fmt.Errorf("drop cache: fadvise %s: %w", path, err))
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}

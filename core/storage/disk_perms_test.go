package storage

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/internal/privdir"
	"github.com/kvbm/kvbm/kvbmerr"
)

// privateDir makes a fresh directory of exactly mode under a new temporary
// directory, whatever the umask.
func privateDir(t *testing.T, mode fs.FileMode) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "g3")
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.Chmod(dir, mode))
	return dir
}

// A G3 file is 0600 even under an umask of 0, unnamed (O_TMPFILE) or
// named and unlinked, and its directory is left as it was: 0700, empty.
func TestDiskFileIsPrivate(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprintf("unlinked=%v", named), func(t *testing.T) {
			noTmpfile = named
			defer func() { noTmpfile = false }()
			dir := privateDir(t, 0o700)
			d, err := CreateDiskFile(dir, 64<<10)
			require.NoError(t, err)
			defer d.Close()
			fi, err := os.Stat(d.Path())
			require.NoError(t, err)
			require.Equal(t, fs.FileMode(0o600), fi.Mode(), "the G3 file")
			err = filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
				require.NoError(t, err)
				require.Equal(t, dir, path, "nothing but the directory")
				fi, err := e.Info()
				require.NoError(t, err)
				require.Equal(t, fs.ModeDir|0o700, fi.Mode(), "the directory keeps its mode")
				return nil
			})
			require.NoError(t, err)
		})
	}
}

// requireRefused requires the refusal of a directory open to other users,
// of kind FailedPrecondition, naming dir and leaving it empty.
func requireRefused(t *testing.T, err error, dir string) {
	t.Helper()
	require.ErrorIs(t, err, privdir.ErrNotPrivate)
	require.ErrorIs(t, err, kvbmerr.ErrFailedPrecondition)
	require.Equal(t, kvbmerr.FailedPrecondition, kvbmerr.KindOf(err))
	require.ErrorContains(t, err, dir)
	requireEmptyDir(t, dir, "the refusal makes nothing")
}

// A G3 directory that its group or any user can write is refused before
// any file is made in it, by either way of making one.
func TestDiskFileRefusesADirectoryOthersCanWrite(t *testing.T) {
	for _, named := range []bool{false, true} {
		for _, tc := range []struct {
			mode  fs.FileMode
			octal string
		}{{0o777, "0777"}, {0o770, "0770"}, {0o702, "0702"}, {0o777 | fs.ModeSticky, "1777"}} {
			t.Run(fmt.Sprintf("%s/unlinked=%v", tc.octal, named), func(t *testing.T) {
				noTmpfile = named
				defer func() { noTmpfile = false }()
				dir := privateDir(t, tc.mode)
				_, err := CreateDiskFile(dir, 64<<10)
				requireRefused(t, err, dir)
				require.ErrorContains(t, err, "mode "+tc.octal)
				require.ErrorContains(t, err, "chmod 700")
			})
		}
	}
}

func TestDiskFileRefusesADirectoryOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root can give a directory to another user (chown to 65534)")
	}
	dir := privateDir(t, 0o700)
	require.NoError(t, os.Chown(dir, 65534, 65534))
	_, err := CreateDiskFile(dir, 64<<10)
	requireRefused(t, err, dir)
	require.ErrorContains(t, err, "owned by uid 65534")
	require.ErrorContains(t, err, "chown")
}

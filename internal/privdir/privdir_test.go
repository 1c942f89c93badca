package privdir

import (
	"bytes"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/kvbmerr"
)

// captureWarnings sends slog's default logger to a buffer for the test.
func captureWarnings(t *testing.T) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return &buf
}

// mkdirMode makes dir with exactly mode, whatever the umask.
func mkdirMode(t *testing.T, dir string, mode fs.FileMode) string {
	t.Helper()
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.Chmod(dir, mode))
	return dir
}

// Make creates every missing directory 0700 even under an umask of 0.
func TestMakeCreatesPrivateDirectoriesWhateverTheUmask(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	root := t.TempDir()
	leaf := filepath.Join(root, "a", "b", "c")
	require.NoError(t, Make(leaf))
	for d := leaf; d != root; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		require.Equal(t, fs.ModeDir|DirMode, fi.Mode(), d)
	}
	require.NoError(t, Make(leaf), "an existing private directory is accepted")
}

func TestCheckRefusesDirectoriesOthersCanWrite(t *testing.T) {
	root := t.TempDir()
	for _, mode := range []fs.FileMode{0o770, 0o730, 0o707, 0o777, 0o777 | fs.ModeSticky, 0o720 | fs.ModeSetgid} {
		dir := mkdirMode(t, filepath.Join(root, strings.ReplaceAll(mode.String(), "-", "_")), mode)
		err := Check(dir)
		require.ErrorIs(t, err, ErrNotPrivate, "%v", mode)
		require.ErrorIs(t, err, kvbmerr.ErrFailedPrecondition)
		require.Equal(t, kvbmerr.FailedPrecondition, kvbmerr.KindOf(err))
		require.ErrorContains(t, err, dir)
		require.ErrorContains(t, err, "chmod 700")
		require.ErrorContains(t, err, "owner uid")
		require.ErrorIs(t, Make(dir), ErrNotPrivate, "Make checks an existing directory: %v", mode)
		fi, err := os.Stat(dir)
		require.NoError(t, err)
		require.Equal(t, mode, fi.Mode().Perm()|fi.Mode()&(fs.ModeSticky|fs.ModeSetgid), "no chmod")
	}
}

func TestCheckRefusesADirectoryOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root can give a directory to another user (chown to 65534)")
	}
	dir := mkdirMode(t, filepath.Join(t.TempDir(), "nobody"), 0o700)
	require.NoError(t, os.Chown(dir, 65534, 65534))
	err := Check(dir)
	require.ErrorIs(t, err, ErrNotPrivate)
	require.Equal(t, kvbmerr.FailedPrecondition, kvbmerr.KindOf(err))
	require.ErrorContains(t, err, "owned by uid 65534")
	require.ErrorContains(t, err, "chown")
	require.ErrorIs(t, Make(dir), ErrNotPrivate)
}

// A directory of the user's own that others may only read is used as it
// is, and warned of once.
func TestCheckWarnsOnceOfADirectoryOthersCanList(t *testing.T) {
	logs := captureWarnings(t)
	dir := mkdirMode(t, filepath.Join(t.TempDir(), "listable"), 0o755)
	require.NoError(t, Check(dir))
	require.NoError(t, Check(dir))
	require.Equal(t, 1, strings.Count(logs.String(), "readable by other users"), logs.String())
	require.Contains(t, logs.String(), dir)
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o755), fi.Mode().Perm(), "not chmod'ed")

	private := mkdirMode(t, filepath.Join(t.TempDir(), "private"), 0o700)
	logs.Reset()
	require.NoError(t, Check(private))
	require.Empty(t, logs.String())
}

func TestCheckRefusesWhatIsNoDirectory(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.ErrorIs(t, Check(file), syscall.ENOTDIR)
	require.ErrorIs(t, Check(filepath.Join(root, "missing")), fs.ErrNotExist)
	require.Error(t, Make(filepath.Join(file, "sub")))
}

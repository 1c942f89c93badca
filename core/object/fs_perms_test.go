package object

import (
	"context"
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

// requirePrivateTree walks root and requires every directory, root
// included, to be 0700 and every file 0600.
func requirePrivateTree(t *testing.T, root string) (files int) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = fs.ModeDir | 0o700
		} else {
			files++
		}
		require.Equal(t, want, fi.Mode(), "%s", path)
		return nil
	})
	require.NoError(t, err)
	return files
}

// chmodDir makes dir (missing) with exactly mode, whatever the umask.
func chmodDir(t *testing.T, dir string, mode fs.FileMode) {
	t.Helper()
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.Chmod(dir, mode))
}

// A store made in a fresh root, even under an umask of 0, makes its
// directories 0700 and its objects 0600, also where a put makes the
// directories again.
func TestFSStoreMakesPrivateDirectoriesAndObjects(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	for _, hasRank := range []bool{false, true} {
		t.Run(fmt.Sprintf("rank=%v", hasRank), func(t *testing.T) {
			top := filepath.Join(t.TempDir(), "g4")
			root := filepath.Join(top, "deploy", "model")
			s := newTestStore(t, FSConfig{Dir: root, HasRank: hasRank, Rank: 2})
			keys := testKeys(t, 4, "private")
			src := randomBlocks(t, 4, testBlockSize, 31)
			requireAllOK(t, keys[:2], s.PutBlocksWithLayout(context.Background(), keys[:2], src, seq(0, 2)))
			require.Equal(t, 2, requirePrivateTree(t, top))

			require.NoError(t, os.RemoveAll(top))
			requireAllOK(t, keys[2:], s.PutBlocksWithLayout(context.Background(), keys[2:], src, seq(2, 2)))
			require.Equal(t, 2, requirePrivateTree(t, top), "after the directories were made again")
		})
	}
}

// requireRefused requires err to be the refusal of a directory open to
// other users, of kind FailedPrecondition, naming dir.
func requireRefused(t *testing.T, err error, dir string) {
	t.Helper()
	require.ErrorIs(t, err, privdir.ErrNotPrivate)
	require.ErrorIs(t, err, kvbmerr.ErrFailedPrecondition)
	require.Equal(t, kvbmerr.FailedPrecondition, kvbmerr.KindOf(err))
	require.ErrorContains(t, err, dir)
}

// A root, or a rank directory, that its group or any user can write is
// refused, and nothing is made in it: no rank directory, no probe.
func TestFSStoreRefusesADirectoryOthersCanWrite(t *testing.T) {
	for _, tc := range []struct {
		mode  fs.FileMode
		octal string
	}{{0o777, "0777"}, {0o770, "0770"}, {0o777 | fs.ModeSticky, "1777"}} {
		for _, hasRank := range []bool{false, true} {
			mode := tc.mode
			t.Run(fmt.Sprintf("%s/rank=%v", tc.octal, hasRank), func(t *testing.T) {
				root := filepath.Join(t.TempDir(), "g4")
				chmodDir(t, root, mode)
				_, err := NewFSStore(FSConfig{Dir: root, HasRank: hasRank, Rank: 1})
				requireRefused(t, err, root)
				require.ErrorContains(t, err, "mode "+tc.octal)
				entries, err := os.ReadDir(root)
				require.NoError(t, err)
				require.Empty(t, entries, "the refusal makes nothing")
			})
		}
	}
	root := t.TempDir()
	chmodDir(t, filepath.Join(root, "1"), 0o777)
	_, err := NewFSStore(FSConfig{Dir: root, HasRank: true, Rank: 1})
	requireRefused(t, err, filepath.Join(root, "1"))
	entries, err := os.ReadDir(filepath.Join(root, "1"))
	require.NoError(t, err)
	require.Empty(t, entries)
}

func TestFSStoreRefusesADirectoryOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root can give a directory to another user (chown to 65534)")
	}
	root := filepath.Join(t.TempDir(), "g4")
	chmodDir(t, root, 0o700)
	require.NoError(t, os.Chown(root, 65534, 65534))
	_, err := NewFSStore(FSConfig{Dir: root, HasRank: true, Rank: 0})
	requireRefused(t, err, root)
	require.ErrorContains(t, err, "owned by uid 65534")
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Empty(t, entries, "the refusal makes nothing")
}

// A store whose directory vanished and came back open to other users
// (someone else made it again) refuses to put there, and writes nothing.
func TestPutRefusesADirectoryRemadeOpenToOthers(t *testing.T) {
	root := filepath.Join(t.TempDir(), "g4")
	s := newTestStore(t, FSConfig{Dir: root, HasRank: true, Rank: 4})
	require.NoError(t, os.RemoveAll(root))
	chmodDir(t, root, 0o777)

	keys := testKeys(t, 2, "remade")
	src := randomBlocks(t, 2, testBlockSize, 32)
	for _, r := range s.PutBlocksWithLayout(context.Background(), keys, src, seq(0, 2)) {
		requireRefused(t, r.Err, root)
	}
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Empty(t, entries, "no rank directory, no object")
}

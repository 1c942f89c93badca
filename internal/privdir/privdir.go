// Package privdir keeps the directories of kvbm's disk tiers private to the
// user kvbm runs as: G3's disk directory and the G4 filesystem store's
// directories. What lies there is KV cache, and the G4 objects' names are
// the hashes of the prompts' prefixes: another user who can write such a
// directory can plant, replace or remove what kvbm reads back, and one who
// can list it learns which prefixes were served.
//
// kvbm makes its directories DirMode and its files FileMode (the umask only
// narrows a mode, so nothing wider comes of it). A directory that kvbm is
// given or uses is refused, before anything is made in it, unless it is
// owned by this process's effective user and neither group- nor
// world-writable (the sticky bit does not make it acceptable). One that
// others may read or search (0755) is accepted, with a warning logged once
// for it: it is the user's own and kvbm does not change its mode.
package privdir

import (
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"syscall"

	"github.com/kvbm/kvbm/kvbmerr"
)

// The modes kvbm creates its G3 and G4 directories and files with.
const (
	DirMode  fs.FileMode = 0o700
	FileMode fs.FileMode = 0o600
)

// ErrNotPrivate is wrapped by the refusal of a directory another user can
// write. Its kind is FailedPrecondition (KVBM_ERR_FAILED_PRECONDITION): the
// directory must be fixed before kvbm will use it.
var ErrNotPrivate = kvbmerr.New(kvbmerr.FailedPrecondition, "directory writable by another user")

// warned holds the directories already warned of as readable by others.
var warned sync.Map

// Make creates dir where it is missing, with the parents it lacks, as
// DirMode, and then checks it as Check does. An existing dir is checked
// without anything being made in it. The parents that exist are not
// checked: a caller that makes a directory beneath one it was given
// Makes that one first.
func Make(dir string) error {
	if err := os.MkdirAll(dir, DirMode); err != nil {
		return err
	}
	return Check(dir)
}

// Check refuses dir, wrapping ErrNotPrivate and naming its mode, its owner
// and the remedy, unless it is a directory owned by the effective user
// that no group or other user may write. A dir that others may read or
// search is accepted and warned of once. Symbolic links are followed: the
// directory checked is the one kvbm would use.
func Check(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return &fs.PathError{Op: "use as directory", Path: dir, Err: syscall.ENOTDIR}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("directory %q: no owner to check", dir)
	}
	mode, uid, euid := st.Mode&0o7777, int(st.Uid), os.Geteuid()
	switch {
	case uid != euid:
		return fmt.Errorf("%w: %q (mode %04o) is owned by uid %d, not by uid %d that kvbm runs as; "+
			"use a directory of your own, or chown it to uid %d and chmod it 700", ErrNotPrivate, dir, mode, uid, euid, euid)
	case mode&0o022 != 0:
		return fmt.Errorf("%w: %q (mode %04o, owner uid %d) can be written by its group or by any user; "+
			"chmod 700 it, or use a directory of your own", ErrNotPrivate, dir, mode, uid)
	case mode&0o077 != 0:
		if _, seen := warned.LoadOrStore(dir, true); !seen {
			slog.Warn("kvbm: directory readable by other users: they can list the names kvbm keeps there (chmod 700 it to stop that)",
				"dir", dir, "mode", fmt.Sprintf("%04o", mode))
		}
	}
	return nil
}

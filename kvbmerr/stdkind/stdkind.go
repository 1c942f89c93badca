// Package stdkind gives kvbm's error kinds to the standard library's errors
// that carry none: the adapter between the pure kvbmerr and the operating
// system. The C ABI reads every error's kind through it, so that an
// unwrapped *fs.PathError still reads as I/O there, while the packages that
// only name kinds (core/pool, core/handoff) depend on nothing of the OS.
package stdkind

import (
	"context"
	"io/fs"
	"syscall"

	"github.com/kvbm/kvbm/kvbmerr"
)

// KindOf is kvbmerr.KindOf that also reads the standard library's errors:
// context.DeadlineExceeded is Timeout, context.Canceled Canceled,
// *fs.PathError and syscall.Errno IO. The outermost error with a kind
// decides, as in kvbmerr.KindOf.
func KindOf(err error) kvbmerr.Kind { return kvbmerr.KindBy(err, Classify) }

// Classify is the kind of err itself, not looking at what it wraps, when it
// is one of the standard library's errors that kvbm reads; Unknown otherwise.
func Classify(err error) kvbmerr.Kind {
	switch err.(type) {
	case *fs.PathError, syscall.Errno:
		return kvbmerr.IO
	}
	switch err {
	case context.DeadlineExceeded:
		return kvbmerr.Timeout
	case context.Canceled:
		return kvbmerr.Canceled
	}
	return kvbmerr.Unknown
}

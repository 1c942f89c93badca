package transfer

import (
	"fmt"

	"github.com/kvbm/kvbm/core/kvbmerr"
)

// Sentinel errors, for errors.Is; their kinds are the C ABI's status codes.
var (
	// ErrInvalidArgument: the request is malformed (lengths, ids, ranges).
	ErrInvalidArgument = kvbmerr.New(kvbmerr.InvalidArgument, "invalid argument")
	// ErrOutOfRange: an id or index beyond its bound. It is also an
	// ErrInvalidArgument under errors.Is, and reads as one; its kind is
	// OutOfRange.
	ErrOutOfRange error = outOfRange{}
	// ErrAlreadyExists: something that is set once was set again.
	ErrAlreadyExists = kvbmerr.New(kvbmerr.AlreadyExists, "already exists")
	// ErrNotFound: no layout is registered under the handle.
	ErrNotFound = kvbmerr.New(kvbmerr.NotFound, "not found")
	// ErrUnsupported: no strategy moves data between the two kinds.
	ErrUnsupported = kvbmerr.New(kvbmerr.Unsupported, "unsupported")
	// ErrCorrupt: data read back does not match its checksum.
	ErrCorrupt = kvbmerr.New(kvbmerr.DataCorruption, "data corruption")
	// ErrTimeout: a wait ended before the transfer completed.
	ErrTimeout = kvbmerr.New(kvbmerr.Timeout, "timeout")
	// ErrClosed: the manager was closed.
	ErrClosed = kvbmerr.New(kvbmerr.Canceled, "transfer manager closed")
)

type outOfRange struct{}

func (outOfRange) Error() string        { return ErrInvalidArgument.Error() }
func (outOfRange) Is(target error) bool { return target == ErrInvalidArgument }
func (outOfRange) Kind() kvbmerr.Kind   { return kvbmerr.OutOfRange }

// Error is a failed transfer: what failed, between which layouts, and which
// destination blocks did not receive their data.
type Error struct {
	Src, Dst LayoutHandle
	// FailedBlocks are destination block ids whose data is not valid.
	FailedBlocks []int
	Err          error
}

func (e *Error) Error() string {
	what := fmt.Sprintf("transfer %v -> %v", e.Src, e.Dst)
	if e.Src == (LayoutHandle{}) && e.Dst == (LayoutHandle{}) {
		what = "transfers" // an aggregate
	} else if e.Src == (LayoutHandle{}) {
		what = fmt.Sprintf("transfer into %v", e.Dst)
	}
	return fmt.Sprintf("%s failed for %d block(s) %v: %v", what, len(e.FailedBlocks), abbreviate(e.FailedBlocks), e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

func abbreviate(ids []int) string {
	if len(ids) <= 8 {
		return fmt.Sprint(ids)
	}
	return fmt.Sprintf("%v…", ids[:8])
}

// Failed builds the Error for a transfer between src and dst whose listed
// destination blocks failed.
func Failed(src, dst LayoutHandle, failedBlocks []int, err error) *Error {
	return &Error{Src: src, Dst: dst, FailedBlocks: failedBlocks, Err: err}
}

package transfer

import (
	"fmt"

	"github.com/kvbm/kvbm/kvbmerr"
)

// Sentinel errors, for errors.Is. The generic ones are the kinds'
// sentinels under the names this package has always given them; ErrNotFound
// and ErrClosed are its own (a missing layout, a closed manager).
var (
	// ErrInvalidArgument: the request is malformed (lengths, ids, ranges).
	ErrInvalidArgument = kvbmerr.ErrInvalidArgument
	// ErrOutOfRange: an id or index beyond its bound. It is also an
	// ErrInvalidArgument under errors.Is, and reads as one; its kind is
	// OutOfRange.
	ErrOutOfRange = kvbmerr.ErrOutOfRange
	// ErrAlreadyExists: something that is set once was set again.
	ErrAlreadyExists = kvbmerr.ErrAlreadyExists
	// ErrNotFound: no layout is registered under the handle.
	ErrNotFound = kvbmerr.New(kvbmerr.NotFound, "not found")
	// ErrUnsupported: no strategy moves data between the two kinds.
	ErrUnsupported = kvbmerr.ErrUnsupported
	// ErrCorrupt: data read back does not match its checksum.
	ErrCorrupt = kvbmerr.ErrDataCorruption
	// ErrTimeout: a wait ended before the transfer completed.
	ErrTimeout = kvbmerr.ErrTimeout
	// ErrClosed: the manager was closed.
	ErrClosed = kvbmerr.New(kvbmerr.Canceled, "transfer manager closed")
)

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

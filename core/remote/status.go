package remote

import (
	"errors"

	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// The statuses a serving transport answers a request with, on the wire of
// the TCP and UCX transports alike, mapped back to the transfer manager's
// sentinels on the requester's side.
const (
	StatusOK byte = iota
	StatusInvalid
	StatusOutOfRange
	StatusNotFound
	StatusUnsupported
	StatusClosed
	StatusFailed
	StatusWithdrawn // the layout's owner took its memory back
)

var statusErrs = []struct {
	status byte
	err    error
}{
	{StatusOutOfRange, kvbmerr.ErrOutOfRange}, // before ErrInvalidArgument, which it wraps
	{StatusInvalid, kvbmerr.ErrInvalidArgument},
	{StatusNotFound, transfer.ErrNotFound},
	{StatusUnsupported, kvbmerr.ErrUnsupported},
	{StatusClosed, transfer.ErrClosed},
	{StatusWithdrawn, transfer.ErrWithdrawn},
}

// StatusOf is the status that answers a request that failed with err.
func StatusOf(err error) byte {
	if err == nil {
		return StatusOK
	}
	for _, s := range statusErrs {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	return StatusFailed
}

// StatusError is an error a serving peer reported: the request was
// refused or failed there, the connection is fine. It unwraps to the
// sentinel of its status.
type StatusError struct {
	Status byte
	Msg    string
}

func (e *StatusError) Error() string { return e.Msg }

func (e *StatusError) Unwrap() error {
	for _, s := range statusErrs {
		if s.status == e.Status {
			return s.err
		}
	}
	return nil
}

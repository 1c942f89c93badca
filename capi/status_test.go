package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/handoff"
	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
)

func TestStatusOf(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("context: %w", err) }
	_, openErr := os.Open("/nonexistent/kvbm")
	cases := []struct {
		err  error
		want status
	}{
		{nil, statusOK},
		{wrap(transfer.ErrInvalidArgument), errInvalidArgument},
		{wrap(object.ErrInvalidArgument), errInvalidArgument},
		{wrap(handoff.ErrForeignHandoff), errInvalidArgument},
		{wrap(transfer.ErrNotFound), errNotFound},
		{wrap(object.ErrNotFound), errNotFound},
		{wrap(handoff.ErrUnknownAction), errNotFound},
		{wrap(worker.ErrAlreadyExists), errAlreadyExists},
		{wrap(handoff.ErrConflictingOutcome), errAlreadyExists},
		{wrap(handoff.ErrFactOutOfOrder), errFailedPrecondition},
		{wrap(transfer.ErrCorrupt), errDataCorruption},
		{wrap(object.ErrCorrupt), errDataCorruption},
		{wrap(worker.ErrBadMetadata), errDataCorruption},
		{wrap(transfer.ErrTimeout), errTimeout},
		{wrap(transfer.ErrClosed), errCanceled},
		{wrap(transfer.ErrUnsupported), errUnsupported},
		{wrap(cuda.ErrCUDAUnavailable), errUnsupported},
		{wrap(cuda.NewError("cuMemAlloc", cuda.ErrCodeOutOfMemory, "out of memory")), errCUDA},
		{transfer.Failed(transfer.LayoutHandle{}, transfer.LayoutHandle{}, []int{1},
			cuda.NewError("cuMemcpyHtoDAsync", cuda.ErrCodeIllegalAddress, "bad address")), errCUDA},
		{wrap(openErr), errIO},
		{&fs.PathError{Op: "pwrite", Path: "/x", Err: errors.New("disk full")}, errIO},
		{wrap(fmt.Errorf("%w: credentials refused", object.ErrIO)), errIO},
		{wrap(fmt.Errorf("%w (s3 …): %w", context.DeadlineExceeded, object.ErrIO)), errTimeout},
		{errors.New("something else"), errInternal},
		// The outermost kind decides: a silent peer is a failed transfer,
		// not a wait that ran out of time.
		{wrap(fmt.Errorf("%w: %w: no answer within the deadline", remote.ErrPeerUnavailable, transfer.ErrTimeout)), errIO},
		{wrap(fmt.Errorf("%w: peer: %w", remote.ErrPeerUnavailable, context.DeadlineExceeded)), errIO},
		// Out of range is also an invalid argument under errors.Is; its
		// status is its own.
		{wrap(transfer.ErrOutOfRange), errOutOfRange},
		{wrap(fmt.Errorf("%w waiting for transfer: %w", transfer.ErrTimeout, context.Canceled)), errTimeout},
		{wrap(context.Canceled), errCanceled},
		{wrap(fmt.Errorf("%w: %w", transfer.ErrUnsupported, cuda.NewError("cuIpcGetMemHandle", cuda.ErrCodeNotSupported, "no"))), errUnsupported},
	}
	for _, c := range cases {
		require.Equal(t, c.want, statusOf(c.err), "%v", c.err)
	}
}

func TestRecoverStatusTurnsPanicsIntoInternal(t *testing.T) {
	call := func() (st status) {
		defer recoverStatus(&st)
		var m map[string]int
		m["boom"] = 1 // nil map write panics
		return statusOK
	}
	require.Equal(t, errInternal, call())
}

func TestHandleTableEmptyAfterClose(t *testing.T) {
	require.Equal(t, 0, table.Len())
	n := transfer.Go(func() error { return nil })
	h := table.Add(kindNotification, n)
	_, ok := get[*transfer.Notification](uintptrOf(h), kindNotification)
	require.True(t, ok)
	_, ok = get[*worker.PhysicalWorker](uintptrOf(h), kindWorker)
	require.False(t, ok, "wrong kind")
	_, ok = table.Remove(h, kindNotification)
	require.True(t, ok)
	require.Equal(t, 0, table.Len())
}

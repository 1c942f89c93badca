package stdkind_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/kvbmerr"
	"github.com/kvbm/kvbm/kvbmerr/stdkind"
)

var (
	errPeer    = kvbmerr.New(kvbmerr.IO, "peer unavailable")
	errTimeout = kvbmerr.New(kvbmerr.Timeout, "timeout")
)

func TestKindOf(t *testing.T) {
	_, openErr := os.Open("/nonexistent/kvbm")
	for _, c := range []struct {
		err  error
		want kvbmerr.Kind
	}{
		{nil, kvbmerr.Unknown},
		{errors.New("no kind"), kvbmerr.Unknown},
		{fmt.Errorf("%w: no answer: %w", errPeer, context.DeadlineExceeded), kvbmerr.IO},
		{fmt.Errorf("%w waiting: %w", errTimeout, context.Canceled), kvbmerr.Timeout},
		{fmt.Errorf("%w (s3): %w", context.DeadlineExceeded, errPeer), kvbmerr.Timeout},
		{fmt.Errorf("ctx: %w", context.DeadlineExceeded), kvbmerr.Timeout},
		{fmt.Errorf("ctx: %w", context.Canceled), kvbmerr.Canceled},
		{fmt.Errorf("open: %w", openErr), kvbmerr.IO},
		{&fs.PathError{Op: "pwrite", Path: "/x", Err: errors.New("disk full")}, kvbmerr.IO},
		{fmt.Errorf("space: %w", syscall.ENOSPC), kvbmerr.IO},
	} {
		require.Equal(t, c.want, stdkind.KindOf(c.err), "%v", c.err)
	}
}

// The pure KindOf gives the standard library's errors no kind.
func TestPureKindOfLeavesThemUnknown(t *testing.T) {
	for _, err := range []error{context.DeadlineExceeded, context.Canceled, syscall.ENOSPC,
		&fs.PathError{Op: "pwrite", Path: "/x", Err: errors.New("disk full")}} {
		require.Equal(t, kvbmerr.Unknown, kvbmerr.KindOf(err), "%v", err)
		require.NotEqual(t, kvbmerr.Unknown, stdkind.KindOf(err), "%v", err)
	}
}

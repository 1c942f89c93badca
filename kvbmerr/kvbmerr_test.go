package kvbmerr_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/kvbmerr"
)

var (
	errNotFound = kvbmerr.New(kvbmerr.NotFound, "not found")
	errPeer     = kvbmerr.New(kvbmerr.IO, "peer unavailable")
	errTimeout  = kvbmerr.New(kvbmerr.Timeout, "timeout")
)

// ownKind is an error type that knows its kind, as cuda.Error does.
type ownKind struct{}

func (ownKind) Error() string        { return "driver failed" }
func (ownKind) Kind() kvbmerr.Kind   { return kvbmerr.CUDA }
func (ownKind) Is(target error) bool { return target == errNotFound } // identity does not decide the kind

func TestKindOf(t *testing.T) {
	_, openErr := os.Open("/nonexistent/kvbm")
	for _, c := range []struct {
		err  error
		want kvbmerr.Kind
	}{
		{nil, kvbmerr.Unknown},
		{errors.New("no kind"), kvbmerr.Unknown},
		{errNotFound, kvbmerr.NotFound},
		{fmt.Errorf("layout 3: %w", errNotFound), kvbmerr.NotFound},
		{fmt.Errorf("a: %w", fmt.Errorf("b: %w", errNotFound)), kvbmerr.NotFound},
		{fmt.Errorf("%w: %w: no answer", errPeer, errTimeout), kvbmerr.IO},
		{fmt.Errorf("%w: no answer: %w", errPeer, context.DeadlineExceeded), kvbmerr.IO},
		{fmt.Errorf("%w waiting: %w", errTimeout, context.Canceled), kvbmerr.Timeout},
		{fmt.Errorf("%w (s3): %w", context.DeadlineExceeded, errPeer), kvbmerr.Timeout},
		{errors.Join(errors.New("no kind"), fmt.Errorf("x: %w", errTimeout), errNotFound), kvbmerr.Timeout},
		{fmt.Errorf("x: %w", ownKind{}), kvbmerr.CUDA},
		{fmt.Errorf("ctx: %w", context.DeadlineExceeded), kvbmerr.Timeout},
		{fmt.Errorf("ctx: %w", context.Canceled), kvbmerr.Canceled},
		{fmt.Errorf("open: %w", openErr), kvbmerr.IO},
		{&fs.PathError{Op: "pwrite", Path: "/x", Err: errors.New("disk full")}, kvbmerr.IO},
		{fmt.Errorf("space: %w", syscall.ENOSPC), kvbmerr.IO},
	} {
		require.Equal(t, c.want, kvbmerr.KindOf(c.err), "%v", c.err)
	}
}

func TestSentinelsAreDistinct(t *testing.T) {
	a := kvbmerr.New(kvbmerr.NotFound, "not found")
	require.NotErrorIs(t, a, errNotFound, "same kind and message, another sentinel")
	require.ErrorIs(t, fmt.Errorf("x: %w", a), a)
	require.Equal(t, "not found", a.Error())
}

func TestKindNames(t *testing.T) {
	seen := map[string]kvbmerr.Kind{}
	for _, k := range kvbmerr.Kinds() {
		require.NotEqual(t, kvbmerr.Unknown, k)
		name := k.String()
		require.NotEmpty(t, name, "kind %d has no name", uint8(k))
		require.NotContains(t, seen, name, "kinds %d and %d", uint8(seen[name]), uint8(k))
		seen[name] = k
	}
	require.Equal(t, "unknown", kvbmerr.Unknown.String())
	require.Equal(t, "Kind(200)", kvbmerr.Kind(200).String())
}

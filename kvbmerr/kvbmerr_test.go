package kvbmerr_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/kvbmerr"
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
		{errors.Join(errors.New("no kind"), fmt.Errorf("x: %w", errTimeout), errNotFound), kvbmerr.Timeout},
		{fmt.Errorf("x: %w", ownKind{}), kvbmerr.CUDA},
		{fmt.Errorf("x: %w", kvbmerr.ErrTimeout), kvbmerr.Timeout},
	} {
		require.Equal(t, c.want, kvbmerr.KindOf(c.err), "%v", c.err)
	}
}

// Every kind has one sentinel of its kind, and a package's own sentinel of
// a kind is that kind's under errors.Is, and no other kind's.
func TestSentinelPerKind(t *testing.T) {
	for _, k := range kvbmerr.Kinds() {
		s := kvbmerr.Sentinel(k)
		require.NotNil(t, s, "kind %v has no sentinel", k)
		require.Equal(t, k, kvbmerr.KindOf(s))
		own := kvbmerr.New(k, "own")
		require.ErrorIs(t, fmt.Errorf("x: %w", own), s)
		for _, o := range kvbmerr.Kinds() {
			if o != k {
				require.NotErrorIs(t, own, kvbmerr.Sentinel(o), "%v is not %v", k, o)
			}
		}
	}
	require.Nil(t, kvbmerr.Sentinel(kvbmerr.Unknown))
	require.ErrorIs(t, kvbmerr.ErrOutOfRange, kvbmerr.ErrInvalidArgument, "out of range is an invalid argument")
	require.NotErrorIs(t, kvbmerr.ErrInvalidArgument, kvbmerr.ErrOutOfRange)
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

func TestDetailAndContext(t *testing.T) {
	d := kvbmerr.Detail(errNotFound, "key 7")
	require.Equal(t, "not found: key 7", d.Error())
	require.ErrorIs(t, d, errNotFound)
	require.Equal(t, kvbmerr.NotFound, kvbmerr.KindOf(d))
	c := kvbmerr.Context("keys[3]", d)
	require.Equal(t, "keys[3]: not found: key 7", c.Error())
	require.ErrorIs(t, c, errNotFound)
	require.ErrorIs(t, c, kvbmerr.ErrNotFound)
	require.Equal(t, fmt.Errorf("%w: key 7", errNotFound).Error(), d.Error(), "reads as fmt's")
}

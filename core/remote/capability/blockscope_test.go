package capability

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/kvbmerr"
)

// FuzzParseScope: a scope descriptor comes in a hello, from whoever
// reaches the port. What parses is canonical: it encodes back to the same
// bytes.
func FuzzParseScope(f *testing.F) {
	good, _ := EncodeBlockScope(7, []LayoutBlocks{
		{Handle: Handle{Worker: 7, Layout: 1}, Blocks: []int{1, 2, 3, 9}},
		{Handle: Handle{Worker: 7, Layout: 4}, Blocks: []int{0}},
	}, time.Now().Add(time.Hour), 42)
	f.Add(good)
	f.Add([]byte{ScopeVersion})
	f.Add(make([]byte, ScopeHeadLen+12))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseBlockScope(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument)
			return
		}
		require.Equal(t, b, s.AppendTo(nil))
	})
}

// EncodeBlockScope merges and sorts blocks into canonical ranges.
func TestEncodeScopeMergesBlocksIntoRanges(t *testing.T) {
	h := func(l uint16) Handle { return Handle{Worker: 7, Layout: l} }
	b, err := EncodeBlockScope(7, []LayoutBlocks{{Handle: h(3), Blocks: []int{5, 1, 2, 2, 3, 9}}, {Handle: h(1), Blocks: []int{0}}}, time.Time{}, 1)
	require.NoError(t, err)
	s, err := ParseBlockScope(b)
	require.NoError(t, err)
	require.Equal(t, BlockScope{Epoch: 1, Layouts: []LayoutRanges{{1, Ranges{{0, 1}}}, {3, Ranges{{1, 3}, {5, 1}, {9, 1}}}}}, s)
	for name, bad := range map[string][]LayoutBlocks{
		"no layouts":      {},
		"no blocks":       {{Handle: h(1)}},
		"negative":        {{Handle: h(1), Blocks: []int{-1}}},
		"another worker":  {{Handle: Handle{Worker: 8, Layout: 1}, Blocks: []int{1}}},
		"a layout twice":  {{Handle: h(1), Blocks: []int{1}}, {Handle: h(1), Blocks: []int{2}}},
		"too many ranges": {{Handle: h(1), Blocks: everyOther(MaxScopeLen / 8)}},
	} {
		_, err := EncodeBlockScope(7, bad, time.Time{}, 1)
		require.Error(t, err, name)
	}
	_, err = EncodeBlockScope(7, []LayoutBlocks{{Handle: h(1), Blocks: []int{-1}}}, time.Time{}, 1)
	require.ErrorIs(t, err, kvbmerr.ErrOutOfRange)
	_, err = EncodeBlockScope(7, []LayoutBlocks{{Handle: h(1), Blocks: []int{1}}}, time.Now().Add(-time.Second), 1)
	require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument, "an expiry in the past")
	_, err = EncodeBlockScope(7, []LayoutBlocks{{Handle: h(1), Blocks: []int{1}}, {Handle: h(1), Blocks: []int{2}}}, time.Time{}, 1)
	require.ErrorContains(t, err, "block scope names layout 7/1 twice", "named as transfer.LayoutHandle prints")
}

func everyOther(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 2 * i
	}
	return out
}

// The descriptor's bytes are those of the wire format, and a scope covers
// a run of blocks only inside one of its ranges, until it expires
// (rounded up to the second).
func TestABlockScopeOnTheWireAndWhatItCovers(t *testing.T) {
	exp := time.Now().Add(time.Hour).Truncate(time.Second).Add(time.Nanosecond)
	b, err := EncodeBlockScope(7, []LayoutBlocks{{Handle: Handle{Worker: 7, Layout: 2}, Blocks: []int{4, 5, 6, 9}}}, exp, 0x0102)
	require.NoError(t, err)
	s, err := ParseBlockScope(b)
	require.NoError(t, err)
	require.Equal(t, uint64(exp.Unix()+1), s.Expires, "rounded up")
	require.Equal(t, uint64(0x0102), s.Epoch)
	s.Expires = 1001
	require.Equal(t, []byte{2, 0xE9, 3, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0,
		1, 2, 0, 2, 0, 4, 0, 0, 0, 3, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0}, s.AppendTo(nil))
	v1 := append([]byte{1}, s.AppendTo(nil)[1:]...)
	_, err = ParseBlockScope(v1)
	require.ErrorIs(t, err, ErrMalformed, "a version 1 scope, which could not be revoked")
	require.False(t, s.Expired(time.Unix(1000, 999)))
	require.True(t, s.Expired(time.Unix(1001, 0)))
	_, ok := s.Ranges(3)
	require.False(t, ok, "another layout")
	r, ok := s.Ranges(2)
	require.True(t, ok)
	for _, c := range []struct {
		first, last int
		ok          bool
	}{{4, 4, true}, {4, 6, true}, {9, 9, true}, {3, 4, false}, {6, 7, false}, {6, 9, false}, {10, 10, false}, {0, 0, false}} {
		require.Equal(t, c.ok, r.Covers(c.first, c.last), "%d to %d", c.first, c.last)
	}
}

package ucx

import (
	"strconv"
	"strings"
	"testing"

	"github.com/kvbm/kvbm/kvbmerr"
	"github.com/stretchr/testify/require"
)

func TestParseMemunits(t *testing.T) {
	for _, tc := range []struct {
		in string
		n  uint64
		ok bool
	}{
		{"8256", 8256, true}, {"64k", 64 << 10, true}, {"64K", 64 << 10, true}, {"64kb", 64 << 10, true},
		{"64KB", 64 << 10, true}, {"1m", 1 << 20, true}, {"2g", 2 << 30, true}, {"100b", 100, true},
		{"inf", ^uint64(0), true}, {"INF", ^uint64(0), true}, {"99999999999e", ^uint64(0), true},
		{"auto", 0, false}, {"", 0, false}, {"k", 0, false}, {"64x", 0, false}, {"64kx", 0, false}, {"64kbb", 0, false}, {"-1", 0, false},
	} {
		n, ok := parseMemunits(tc.in)
		require.Equal(t, tc.ok, ok, tc.in)
		require.Equal(t, tc.n, n, tc.in)
	}
}

// A segment that UCX's shared-memory FIFO cannot carry is refused, named;
// one that fits, and one UCX reads as something else, are left to UCX.
func TestSegmentsOverSixteenBitsAreRefused(t *testing.T) {
	for _, name := range segSizeVars {
		t.Run(name, func(t *testing.T) {
			for _, v := range []string{"65535", "64kb", "65600", "1m", "inf"} {
				t.Setenv(name, v)
				err := checkSegSize()
				if v == "65535" {
					require.NoError(t, err)
					continue
				}
				require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument, v)
				require.ErrorContains(t, err, name+"="+v+" is more than 65535 bytes")
			}
			t.Setenv(name, "auto")
			require.NoError(t, checkSegSize())
		})
	}
	require.NoError(t, checkSegSize())
}

// Whatever the environment holds, a size is read without a panic, and a
// plain number of bytes as the number.
func FuzzParseMemunits(f *testing.F) {
	for _, s := range []string{"8256", "64kb", "inf", "auto", "1e", "99999999999999999999", " 7 ", "3KB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := parseMemunits(s)
		if v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64); err == nil && strings.Trim(strings.TrimSpace(s), "0123456789") == "" {
			require.True(t, ok)
			require.Equal(t, v, n)
		}
		if !ok {
			require.Zero(t, n)
		}
	})
}

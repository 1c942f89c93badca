package ucx

import (
	"maps"
	"os"
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
				err := checkSegSize(nil)
				if v == "65535" {
					require.NoError(t, err)
					continue
				}
				require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument, v)
				require.ErrorContains(t, err, name+"="+v+" is more than 65535 bytes")
			}
			t.Setenv(name, "auto")
			require.NoError(t, checkSegSize(nil))
		})
	}
	require.NoError(t, checkSegSize(nil))
	// Config.Options' too.
	for _, name := range segSizeVars {
		name = strings.TrimPrefix(name, "UCX_")
		err := checkSegSize(map[string]string{name: "64k"})
		require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument, name)
		require.ErrorContains(t, err, "option "+name+"=64k is more than 65535 bytes")
		require.NoError(t, checkSegSize(map[string]string{name: "65535"}))
	}
}

// kvbm's context takes the largest segment where nothing sets one, and
// an endpoint names the segments UCX then runs with: an option over the
// environment, a transport's variable over UCX_MM_SEG_SIZE.
func TestSegmentDefaults(t *testing.T) {
	ucxDefault := shmSegs{ucxSegSize, ucxSegSize, ucxSegSize}
	for _, tc := range []struct {
		name string
		env  map[string]string
		opts map[string]string
		set  map[string]string // what addSegDefaults adds
		segs shmSegs
	}{
		{name: "nothing set", set: map[string]string{"MM_SEG_SIZE": "65535", "MM_RX_BUFS_GROW": "64"}, segs: shmSegs{65535, 65535, 65535}},
		{name: "the environment's for all", env: map[string]string{"UCX_MM_SEG_SIZE": "16k"}, segs: shmSegs{16384, 16384, 16384}},
		{name: "the environment's UCX default", env: map[string]string{"UCX_MM_SEG_SIZE": "8256"}, segs: ucxDefault},
		{name: "the environment's for one", env: map[string]string{"UCX_SYSV_SEG_SIZE": "4096"}, segs: shmSegs{ucxSegSize, 4096, ucxSegSize}},
		{name: "one over all", env: map[string]string{"UCX_MM_SEG_SIZE": "16k", "UCX_POSIX_SEG_SIZE": "32k"}, segs: shmSegs{32768, 16384, 16384}},
		{name: "an option over the environment", env: map[string]string{"UCX_POSIX_SEG_SIZE": "4096"},
			opts: map[string]string{"MM_SEG_SIZE": "20000"}, segs: shmSegs{20000, 20000, 20000}},
		{name: "an option's growth is kept", opts: map[string]string{"MM_RX_BUFS_GROW": "8"},
			set: map[string]string{"MM_SEG_SIZE": "65535"}, segs: shmSegs{65535, 65535, 65535}},
		{name: "a size kvbm cannot read", env: map[string]string{"UCX_MM_SEG_SIZE": "auto"}, segs: shmSegs{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, name := range segSizeVars {
				t.Setenv(name, "") // registers the restore
				require.NoError(t, os.Unsetenv(name))
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			opts := maps.Clone(tc.opts)
			if opts == nil {
				opts = map[string]string{}
			}
			addSegDefaults(opts)
			for k := range tc.opts {
				delete(opts, k)
			}
			require.Equal(t, len(tc.set), len(opts), "added %v", opts)
			for k, v := range tc.set {
				require.Equal(t, v, opts[k], k)
			}
			for k, v := range tc.opts {
				opts[k] = v
			}
			require.Equal(t, tc.segs, segsOf(opts))
		})
	}
	require.Equal(t, "posix 65535, sysv 8256, xpmem unknown", shmSegs{65535, 8256, 0}.String())
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

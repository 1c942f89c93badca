package ucx

import (
	"maps"
	"os"
	"slices"
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

// A segment that UCX's shared-memory FIFO cannot carry is refused, named,
// and so is one kvbm cannot read as UCX does (peers compare them), and
// options whose effect on the segment depends on UCX's version.
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
			for _, v := range []string{"auto", "+16k", "16kbytes", "-1", ""} {
				t.Setenv(name, v)
				err := checkSegSize(nil)
				require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument, v)
				require.ErrorContains(t, err, name+"=\""+v+"\" is not a size kvbm reads as UCX does")
			}
		})
	}
	require.NoError(t, checkSegSize(nil))
	// Config.Options' too: MM_SEG_SIZE only.
	err := checkSegSize(map[string]string{"MM_SEG_SIZE": "64k"})
	require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument)
	require.ErrorContains(t, err, "option MM_SEG_SIZE=64k is more than 65535 bytes")
	require.NoError(t, checkSegSize(map[string]string{"MM_SEG_SIZE": "65535", "TLS": "sm"}))
	for _, name := range []string{"POSIX_SEG_SIZE", "SYSV_SEG_SIZE", "XPMEM_SEG_SIZE"} {
		err := checkSegSize(map[string]string{name: "16k"})
		require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument, name)
		require.ErrorContains(t, err, "option "+name+": UCX before 1.17 ignores a transport's prefix")
	}
	for _, name := range []string{"*SEG_SIZE", "MM_SEG_SIZ?", "[MP]*"} {
		err := checkSegSize(map[string]string{name: "16k"})
		require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument, name)
		require.ErrorContains(t, err, "a name with a wildcard")
	}
}

// kvbm's context takes the largest segment where nothing sets one, and
// an endpoint names the segments UCX then runs with: an option over the
// environment, a transport's variable over UCX_MM_SEG_SIZE.
func TestSegmentDefaults(t *testing.T) {
	ucxDefault := shmSegs{ucxSegSize, ucxSegSize, ucxSegSize}
	largest := shmSegs{maxSegSize, maxSegSize, maxSegSize}
	both := map[string]string{"MM_SEG_SIZE": "65535", "MM_RX_BUFS_GROW": "64"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		opts map[string]string
		want map[string]string // the options addSegDefaults leaves
		segs shmSegs
	}{
		{name: "nothing set", want: both, segs: largest},
		{name: "the environment's for all", env: map[string]string{"UCX_MM_SEG_SIZE": "16k"}, segs: shmSegs{16384, 16384, 16384}},
		{name: "the environment's UCX default", env: map[string]string{"UCX_MM_SEG_SIZE": "8256"}, segs: ucxDefault},
		{name: "the environment's for one", env: map[string]string{"UCX_SYSV_SEG_SIZE": "4096"}, segs: shmSegs{ucxSegSize, 4096, ucxSegSize}},
		{name: "one over all", env: map[string]string{"UCX_MM_SEG_SIZE": "16k", "UCX_POSIX_SEG_SIZE": "32k"}, segs: shmSegs{32768, 16384, 16384}},
		{name: "an option over the environment", env: map[string]string{"UCX_POSIX_SEG_SIZE": "4096"},
			opts: map[string]string{"MM_SEG_SIZE": "20000"}, want: map[string]string{"MM_SEG_SIZE": "20000"}, segs: shmSegs{20000, 20000, 20000}},
		{name: "an option's growth is kept", opts: map[string]string{"MM_RX_BUFS_GROW": "8"},
			want: map[string]string{"MM_SEG_SIZE": "65535", "MM_RX_BUFS_GROW": "8"}, segs: largest},
		{name: "a transport's growth in the options", opts: map[string]string{"SYSV_RX_BUFS_GROW": "8"},
			want: map[string]string{"MM_SEG_SIZE": "65535", "SYSV_RX_BUFS_GROW": "8"}, segs: largest},
		{name: "the environment's growth", env: map[string]string{"UCX_POSIX_RX_BUFS_GROW": "1024"},
			want: map[string]string{"MM_SEG_SIZE": "65535"}, segs: largest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unsetEnv(t, append(slices.Clone(segSizeVars), envNames(shmSettings("RX_BUFS_GROW"))...)...)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			opts := maps.Clone(tc.opts)
			if opts == nil {
				opts = map[string]string{}
			}
			require.NoError(t, checkSegSize(opts))
			addSegDefaults(opts)
			want := tc.want
			if want == nil {
				want = map[string]string{}
			}
			require.Equal(t, want, opts)
			require.Equal(t, tc.segs, segsOf(opts))
		})
	}
	require.Equal(t, "posix 65535, sysv 8256, xpmem unknown", shmSegs{65535, 8256, 0}.String())
}

// An exporter of this boot (or of one either side cannot tell) must run
// this transport's segments, all known; one of another boot is not
// compared.
func TestCheckSegs(t *testing.T) {
	own := shmSegs{maxSegSize, maxSegSize, maxSegSize}
	here, elsewhere, unknown := thisProcess(), thisProcess(), thisProcess()
	elsewhere.bootID = "another-boot"
	unknown.bootID = ""
	for _, tc := range []struct {
		name string
		proc procIdentity
		segs shmSegs
		own  shmSegs
		ok   bool
	}{
		{"this host, the same", here, own, own, true},
		{"this host, another", here, shmSegs{16384, 16384, 16384}, own, false},
		{"this host, one transport differs", here, shmSegs{maxSegSize, 4096, maxSegSize}, own, false},
		{"this host, both unknown", here, shmSegs{}, shmSegs{}, false},
		{"a boot it cannot tell, another", unknown, shmSegs{16384, 16384, 16384}, own, false},
		{"a boot it cannot tell, the same", unknown, own, own, true},
		{"another boot, another", elsewhere, shmSegs{16384, 16384, 16384}, own, true},
	} {
		err := checkSegs(&endpointInfo{proc: tc.proc, segs: tc.segs, worker: 0xE}, tc.own)
		if tc.ok {
			require.NoError(t, err, tc.name)
			continue
		}
		require.ErrorIs(t, err, kvbmerr.ErrUnsupported, tc.name)
		require.ErrorContains(t, err, "the exporting worker e runs on this host with shared-memory segments (bytes) "+tc.segs.String(), tc.name)
	}
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

// unsetEnv unsets the variables names for the test, restored after it.
func unsetEnv(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		t.Setenv(name, "") // registers the restore
		require.NoError(t, os.Unsetenv(name))
	}
}

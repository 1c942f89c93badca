package ucx

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/stretchr/testify/require"
)

func TestParseResources(t *testing.T) {
	info := `#
# UCP context
#
#     component 0  :  self
#            md 0  :  component 0  self 
#
#      resource 0  :  md 0  dev 0  flags -- self/memory
#      resource 1  :  md 1  dev 1  flags -- tcp/lo
#      resource 2  :  md 1  dev 2  flags -- tcp/eth0
#      resource 3  :  md 2  dev 3  flags a- rc_mlx5/mlx5_0:1
#      resource 4  :  md 1  dev 1  flags -- tcp/lo
#
`
	require.Equal(t, []string{"self/memory", "tcp/lo", "tcp/eth0", "rc_mlx5/mlx5_0:1"}, parseResources(info))
	require.Empty(t, parseResources("# resource"))
}

// The loaded UCX finds at least its loopback transport and shared memory.
func TestResources(t *testing.T) {
	if err := Available(); err != nil {
		if os.Getenv("KVBM_REQUIRE_UCX") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	rs, err := Resources()
	require.NoError(t, err)
	t.Logf("UCX %s: %v", Version(), rs)
	for _, tl := range []string{"self/", "tcp/"} {
		require.True(t, slices.ContainsFunc(rs, func(r string) bool { return strings.HasPrefix(r, tl) }),
			"no %s resource in %v", tl, rs)
	}
	// This machine has no RDMA network: auto keeps TCP, and says why.
	ok, why := rdma(rs)
	choice, err := remote.Choice("auto")
	require.NoError(t, err)
	if ok {
		require.Equal(t, "ucx", choice, why)
	} else {
		require.Equal(t, "tcp", choice, why)
	}
	require.Contains(t, remote.AutoWhy(), why)
}

// auto picks UCX only over an RDMA network: verbs, mlx5 or EFA, not tcp
// or shared memory.
func TestAutoPicksUCXOverRDMAOnly(t *testing.T) {
	for _, tc := range []struct {
		resources []string
		want      bool
	}{
		{[]string{"tcp/eth0", "tcp/lo", "sysv/memory", "posix/memory", "cma/memory"}, false},
		{[]string{"tcp/eth0", "cuda_copy/cuda", "cuda_ipc/cuda"}, false},
		{[]string{"tcp/eth0", "rc_mlx5/mlx5_0:1", "dc_mlx5/mlx5_0:1", "ud_mlx5/mlx5_0:1"}, true},
		{[]string{"rc_verbs/rxe0:1"}, true},
		{[]string{"srd/rdmap0s6"}, true},
		{nil, false},
	} {
		ok, why := rdma(tc.resources)
		require.Equal(t, tc.want, ok, "%v: %s", tc.resources, why)
	}
}

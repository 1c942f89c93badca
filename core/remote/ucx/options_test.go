package ucx

import (
	"errors"
	"testing"

	"github.com/kvbm/kvbm/kvbmerr"
	"github.com/stretchr/testify/require"
)

// What a context is made with (exposure.go), with UCX's resources given.
func TestContextOptions(t *testing.T) {
	rs := []string{"self/memory0", "rc_mlx5/mlx5_0:1", "dc_mlx5/mlx5_0:1", "tcp/eth9", "tcp/lo", "tcp/ib0",
		"sysv/memory", "cma/memory", "cuda_copy/cuda", "srd/efa0"}
	resources := func() ([]string, error) { return rs, nil }
	ucx := map[string]string{"NET_DEVICES": "all", "RNDV_SCHEME": "auto"} // UCX's defaults
	settings := func() (map[string]string, error) { return ucx, nil }
	for _, k := range []string{"UCX_RNDV_SCHEME", "UCX_NET_DEVICES", envAdvertise} {
		t.Setenv(k, "")
	}
	opts := func(t *testing.T, cfg Config) map[string]string {
		t.Helper()
		o, err := cfg.contextOptions(resources, settings)
		require.NoError(t, err)
		return o
	}

	t.Run("a shared-memory segment UCX cannot carry is refused", func(t *testing.T) {
		t.Setenv("UCX_MM_SEG_SIZE", "65600")
		_, err := Config{}.contextOptions(resources, settings)
		require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument)
		require.ErrorContains(t, err, "UCX_MM_SEG_SIZE=65600 is more than 65535 bytes")
	})

	t.Run("the message mode's rendezvous copies", func(t *testing.T) {
		require.Equal(t, "am", opts(t, Config{})["RNDV_SCHEME"])
		require.Equal(t, "am", opts(t, Config{Options: map[string]string{"RNDV_SCHEME": "am"}})["RNDV_SCHEME"])
		require.NotContains(t, opts(t, Config{OneSided: true}), "RNDV_SCHEME")
		require.Equal(t, "am", opts(t, Config{Options: map[string]string{"RNDV_SCHEME": "AM"}})["RNDV_SCHEME"])
		for _, scheme := range []string{"auto", "get_zcopy", "put_zcopy", "get_ppln", "put_ppln", "rkey_ptr"} {
			_, err := Config{Options: map[string]string{"RNDV_SCHEME": scheme}}.contextOptions(resources, settings)
			require.ErrorIs(t, err, kvbmerr.ErrUnsupported, scheme)
			require.ErrorContains(t, err, "option RNDV_SCHEME="+scheme+": the message mode takes the \"am\" rendezvous only")
			// The environment's, which tunes every UCX of the process, is overridden.
			t.Setenv("UCX_RNDV_SCHEME", scheme)
			require.Equal(t, "am", opts(t, Config{})["RNDV_SCHEME"])
			t.Setenv("UCX_RNDV_SCHEME", "")
		}
	})

	t.Run("devices: the RDMA ones and tcp on the advertised interface", func(t *testing.T) {
		require.Equal(t, "mlx5_0:1,lo,efa0", opts(t, Config{})["NET_DEVICES"])
		require.Equal(t, "mlx5_0:1,lo,efa0", opts(t, Config{OneSided: true})["NET_DEVICES"])
		require.Equal(t, "mlx5_0:1,lo,efa0", opts(t, Config{Advertise: "localhost"})["NET_DEVICES"])
		t.Setenv(envAdvertise, "127.0.0.1")
		require.Equal(t, "mlx5_0:1,lo,efa0", opts(t, Config{})["NET_DEVICES"])
	})

	t.Run("devices the caller names, or every one", func(t *testing.T) {
		require.Equal(t, "eth9", opts(t, Config{Options: map[string]string{"NET_DEVICES": "eth9"}})["NET_DEVICES"])
		require.NotContains(t, opts(t, Config{Advertise: "0.0.0.0"}), "NET_DEVICES")
		require.NotContains(t, opts(t, Config{Advertise: "::"}), "NET_DEVICES")
		t.Setenv("UCX_NET_DEVICES", "mlx5_0:1")
		require.NotContains(t, opts(t, Config{}), "NET_DEVICES") // UCX reads the environment
		t.Setenv("UCX_NET_DEVICES", "")
		ucx["NET_DEVICES"] = "eth0" // a ucx.conf's: the operator's
		require.NotContains(t, opts(t, Config{}), "NET_DEVICES")
		ucx["NET_DEVICES"] = "all"
	})

	t.Run("a ucx.conf's rendezvous is overridden too", func(t *testing.T) {
		ucx["RNDV_SCHEME"] = "get_zcopy"
		defer func() { ucx["RNDV_SCHEME"] = "auto" }()
		require.Equal(t, "am", opts(t, Config{})["RNDV_SCHEME"])
	})

	t.Run("a loopback address", func(t *testing.T) {
		require.Equal(t, "mlx5_0:1,lo,efa0", opts(t, Config{Advertise: "127.0.1.1"})["NET_DEVICES"])
		require.Equal(t, "mlx5_0:1,lo,efa0", opts(t, Config{Advertise: "::1"})["NET_DEVICES"])
		// An IPv6 address with a zone: the zone's interface only.
		require.Equal(t, "mlx5_0:1,lo,efa0", opts(t, Config{Advertise: "::1%lo"})["NET_DEVICES"])
		require.Equal(t, "mlx5_0:1,efa0", opts(t, Config{Advertise: "::1%eth9"})["NET_DEVICES"], "lo carries ::1, eth9 does not")
	})

	t.Run("an advertised host that is not here", func(t *testing.T) {
		// Behind NAT: tcp is left out, RDMA kept.
		require.Equal(t, "mlx5_0:1,efa0", opts(t, Config{Advertise: "192.0.2.254"})["NET_DEVICES"])
		tcpOnly := func() ([]string, error) { return []string{"self/memory0", "tcp/lo", "tcp/eth9", "sysv/memory"}, nil }
		_, err := Config{Advertise: "192.0.2.254"}.contextOptions(tcpOnly, settings)
		require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument)
		require.ErrorContains(t, err, "no network device to use: the advertised host 192.0.2.254 is on no interface")
		_, err = Config{Advertise: "no-such-host.invalid"}.contextOptions(resources, settings)
		require.ErrorContains(t, err, "does not resolve")
		// Shared memory only (UCX_TLS=sm): no network device to name.
		shmOnly := func() ([]string, error) {
			return []string{"self/memory0", "sysv/memory", "posix/memory", "cma/memory"}, nil
		}
		o, err := Config{}.contextOptions(shmOnly, settings)
		require.NoError(t, err)
		require.NotContains(t, o, "NET_DEVICES")
		broken := func() ([]string, error) { return nil, errors.New("no UCX") }
		_, err = Config{}.contextOptions(broken, settings)
		require.ErrorContains(t, err, "no UCX")
	})
}

package tcp

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
)

// With nothing configured a transport listens on nothing until its first
// endpoint is asked for (the worker's first metadata export), and then on
// the loopback interface only, which its endpoint advertises;
// KVBM_TCP_ADVERTISE names the interface it listens on instead.
func TestListensAtTheFirstEndpointOnTheAdvertisedInterface(t *testing.T) {
	emu := cuda.NewEmulated(1)
	defer emu.Close()
	m, err := transfer.NewManager(transfer.Config{WorkerID: 0xAB, Driver: emu})
	require.NoError(t, err)
	defer m.Close()
	for _, c := range []struct{ advertise, want string }{{"", "127.0.0.1"}, {"127.0.0.2", "127.0.0.2"}} {
		t.Setenv("KVBM_TCP_LISTEN", "")
		t.Setenv("KVBM_TCP_ADVERTISE", c.advertise)
		tr := New(Config{})
		require.NoError(t, tr.Serve(m))
		require.Nil(t, tr.Addr(), "serving, but nobody asked for the endpoint: no listener")
		ep, err := tr.Endpoint()
		require.NoError(t, err)
		require.Equal(t, c.want, tr.Addr().(*net.TCPAddr).IP.String())
		e, err := parseTCPEndpoint(ep)
		require.NoError(t, err)
		require.Equal(t, tr.Addr().String(), e.addr, "it advertises what it listens on")
		again, err := tr.Endpoint()
		require.NoError(t, err)
		require.Equal(t, ep, again, "one listener")
		require.NoError(t, tr.Close())
		_, err = tr.Endpoint()
		require.ErrorIs(t, err, transfer.ErrClosed, "a closed transport does not listen again")
	}
	// KVBM_TCP_LISTEN is an explicit setting: it listens at Serve.
	t.Setenv("KVBM_TCP_LISTEN", "127.0.0.1:0")
	tr := New(Config{})
	defer tr.Close()
	require.NoError(t, tr.Serve(m))
	require.NotNil(t, tr.Addr())
}

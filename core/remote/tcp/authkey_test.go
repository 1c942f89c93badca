package tcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
)

// logs captures what the default logger writes while a test runs.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(b)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func captureLogs(t *testing.T) *logs {
	l := &logs{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(l, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return l
}

// readBlock2 reads block 2 of the pair's G2 through peer.
func readBlock2(t *testing.T, p *tcpPair, peer remote.Peer) []byte {
	t.Helper()
	d, err := p.exp.Describe(p.remote["g2"])
	require.NoError(t, err)
	a, err := peer.Attach(d)
	require.NoError(t, err)
	bs := uint64(p.cfg.BlockSize())
	buf, err := storage.AllocSystem(bs)
	require.NoError(t, err)
	defer buf.Close()
	op := transfer.RemoteOp{Remote: d.Bases[0] + 2*bs, Local: buf.Addr(), Size: bs}
	require.NoError(t, a.Memory.Read(context.Background(), p.remote["g2"], []transfer.RemoteOp{op}))
	return append([]byte(nil), storage.HostBytes(buf.Addr(), bs)...)
}

// With a deployment key, only a client with the same key connects, over
// TCP and on the same host: another key, or none, is refused at the hello
// with nothing said (the client's error names the likely causes), and the
// reverse (a client with a key, a server without) too. Every refusal is
// counted and logged through the server's refusal log.
func TestTheDeploymentKeyIsRequiredOnBothSides(t *testing.T) {
	key, other := []byte("0123456789abcdef-deployment-A"), []byte("0123456789abcdef-deployment-B")
	for _, sameHost := range []bool{false, true} {
		for _, tc := range []struct {
			name           string
			server, client []byte
			ok             bool
			logged         string
		}{
			{"same key", key, key, true, ""},
			{"another key", key, other, false, "or another " + EnvAuthKey},
			{"client without key", key, nil, false, "but no " + EnvAuthKey},
			{"server without key", nil, key, false, "the client has " + EnvAuthKey + " set and this worker has not"},
			{"neither", nil, nil, true, ""},
		} {
			l := captureLogs(t)
			p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: !sameHost, AuthKey: tc.server})
			fill(t, p.exp, p.remote["g2"], 0x5A)
			ep, err := p.expTCP.ReadOnlyEndpoint()
			require.NoError(t, err)
			client := New(Config{NoSameHost: !sameHost, AuthKey: tc.client})
			before := p.expTCP.Refused()
			peer, err := client.Connect(context.Background(), ep)
			if tc.ok {
				require.NoError(t, err, tc.name)
				require.Equal(t, sameHost, SameHost(peer), tc.name)
				require.Equal(t, block(t, p.exp, p.remote["g2"], 2), readBlock2(t, p, peer), tc.name)
				require.NoError(t, peer.Close())
				require.Equal(t, before, p.expTCP.Refused(), tc.name)
			} else {
				require.ErrorIs(t, err, remote.ErrPeerUnavailable, tc.name)
				require.ErrorContains(t, err, "closed the connection at the hello", tc.name)
				require.ErrorContains(t, err, EnvAuthKey+" differs", tc.name)
				require.Eventually(t, func() bool { return p.expTCP.Refused() > before }, 5*time.Second, time.Millisecond, tc.name)
				require.Eventually(t, func() bool { return strings.Contains(l.String(), tc.logged) }, 5*time.Second, time.Millisecond,
					"%s: logged why: %s", tc.name, l.String())
				require.Contains(t, l.String(), "refused a connection at the hello", tc.name)
			}
			require.NoError(t, client.Close())
		}
	}
}

// A client that holds the metadata but not the deployment key learns
// nothing on the wire: its hello (a genuine proof under the capability's
// key alone) gets the challenge and nothing after it.
func TestAClientWithTheMetadataButNotTheKeyLearnsNothing(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", AuthKey: []byte("0123456789abcdef-deployment")})
	e, nets := routes(t, p)
	for network, addr := range nets {
		c, err := net.Dial(network, addr)
		require.NoError(t, err)
		sn := make([]byte, capability.NonceLen)
		_, err = io.ReadFull(c, sn)
		require.NoError(t, err)
		cn := make([]byte, capability.NonceLen)
		rand.Read(cn)
		_, err = c.Write(helloUnder(e.key, sn, cn, e.worker, 0x11, nil))
		require.NoError(t, err)
		require.Empty(t, readAll(t, c), "%s: no proof, no reason", network)
		c.Close()
	}
}

// KVBM_AUTH_KEY and KVBM_AUTH_KEY_FILE are read as the SGLang PD backend
// reads them: the file's whitespace stripped, both set refused, a short
// key refused naming where it came from; a transport with a bad setting
// refuses to serve and to connect.
func TestTheDeploymentKeyIsReadFromTheEnvironment(t *testing.T) {
	t.Setenv(EnvAuthKey, "")
	t.Setenv(EnvAuthKeyFile, "")
	k, err := AuthKeyFromEnv()
	require.NoError(t, err)
	require.Nil(t, k, "unset: no key")

	t.Setenv(EnvAuthKey, "0123456789abcdef")
	k, err = AuthKeyFromEnv()
	require.NoError(t, err)
	require.Equal(t, []byte("0123456789abcdef"), k)

	path := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(path, []byte("  0123456789abcdef-from-a-file\n"), 0o600))
	t.Setenv(EnvAuthKeyFile, path)
	_, err = AuthKeyFromEnv()
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	require.ErrorContains(t, err, "not both")

	t.Setenv(EnvAuthKey, "")
	k, err = AuthKeyFromEnv()
	require.NoError(t, err)
	require.Equal(t, []byte("0123456789abcdef-from-a-file"), k, "whitespace stripped")

	t.Setenv(EnvAuthKeyFile, filepath.Join(t.TempDir(), "absent"))
	_, err = AuthKeyFromEnv()
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	require.ErrorContains(t, err, EnvAuthKeyFile+"=")

	t.Setenv(EnvAuthKeyFile, "")
	t.Setenv(EnvAuthKey, "short")
	_, err = AuthKeyFromEnv()
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	require.ErrorContains(t, err, "the key in KVBM_AUTH_KEY has 5 bytes, at least 16")

	tr := New(Config{})
	defer tr.Close()
	_, err = tr.Connect(context.Background(), tcpEndpoint{worker: 1, addr: "127.0.0.1:1"}.append(nil))
	require.ErrorContains(t, err, "at least 16", "a bad setting refuses to connect")
}

// A connection gets its buffers only once its hello verified: one that
// has not sent it holds the kernel's default socket buffers, a genuine
// one the large ones.
func TestNothingIsAllocatedForAConnectionBeforeItsHello(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	rcvbuf := func() (sizes []int) {
		p.expTCP.mu.Lock()
		defer p.expTCP.mu.Unlock()
		for c := range p.expTCP.conns {
			raw, err := c.(*net.TCPConn).SyscallConn()
			require.NoError(t, err)
			raw.Control(func(fd uintptr) {
				n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
				require.NoError(t, err)
				sizes = append(sizes, n)
			})
		}
		return sizes
	}
	big := 0
	for _, n := range rcvbuf() { // the pair's own peer's connections
		require.GreaterOrEqual(t, n, 4<<20)
		big++
	}
	require.NotZero(t, big)
	_, nets := routes(t, p)
	c, err := net.Dial("tcp", nets["tcp"])
	require.NoError(t, err)
	defer c.Close()
	_, err = io.ReadFull(c, make([]byte, capability.NonceLen))
	require.NoError(t, err)
	sizes := rcvbuf()
	require.Len(t, sizes, big+1)
	small := 0
	for _, n := range sizes {
		if n < 4<<20 {
			small++
		}
	}
	require.Equal(t, 1, small, "the connection that has not proved anything: %v", sizes)
}

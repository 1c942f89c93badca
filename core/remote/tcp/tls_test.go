package tcp

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/testpki"
	"github.com/kvbm/kvbm/kvbmerr"
)

// pki is a test's throwaway CA, another CA, and a directory for files.
type pki struct {
	dir       string
	ca, other *testpki.CA
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca, err := testpki.NewCA("kvbm test CA")
	require.NoError(t, err)
	other, err := testpki.NewCA("another CA")
	require.NoError(t, err)
	return &pki{dir: t.TempDir(), ca: ca, other: other}
}

// files issues a certificate of ca for l (for 127.0.0.1 unless l names
// hosts) and returns its files.
func (k *pki) files(t *testing.T, ca *testpki.CA, name string, l testpki.Leaf) TLSFiles {
	t.Helper()
	if l.Hosts == nil {
		l.Hosts = []string{"127.0.0.1"}
	}
	f, err := ca.Write(k.dir, name, l)
	require.NoError(t, err)
	return TLSFiles(f)
}

// good is a valid certificate of the test CA for 127.0.0.1.
func (k *pki) good(t *testing.T, name string) TLSFiles {
	return k.files(t, k.ca, name, testpki.Leaf{Name: name})
}

// tlsCfg is a TCP-only transport configuration with TLS files.
func tlsCfg(f TLSFiles) Config { return Config{Listen: "127.0.0.1:0", NoSameHost: true, TLS: f} }

// recordingListener keeps every byte its connections read: what crossed
// the wire towards the server.
type recordingListener struct {
	net.Listener
	mu  sync.Mutex
	got bytes.Buffer
}

type recordingConn struct {
	net.Conn
	l *recordingListener
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordingConn{c, l}, nil
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.l.mu.Lock()
	c.l.got.Write(b[:n])
	c.l.mu.Unlock()
	return n, err
}

// Under TLS, pull and push between host and device layouts move every
// byte, over TLS 1.3 connections, and the bytes of a push do not cross
// the wire in the clear.
func TestTLSMovesEveryByteBothWays(t *testing.T) {
	k := newPKI(t)
	var rec []*recordingListener
	listenWrap = func(ln net.Listener) net.Listener {
		r := &recordingListener{Listener: ln}
		rec = append(rec, r)
		return r
	}
	p := newTCPPair(t, 5*time.Second, tlsCfg(k.good(t, "exporter")), tlsCfg(k.good(t, "importer")))
	listenWrap = nil
	peer := p.peer.(*tcpPeer)
	require.Equal(t, "tcp", peer.network)
	require.True(t, p.expTCP.TLS())
	c, err := peer.get(context.Background())
	require.NoError(t, err)
	tc, ok := c.c.(*tls.Conn)
	require.True(t, ok, "the peer's connection is TLS")
	require.Equal(t, uint16(tls.VersionTLS13), tc.ConnectionState().Version)
	peer.put(c)

	movesEveryByteBothWays(t, p)

	// A push of a block whose every 64 bytes are one recognisable run.
	clear := bytes.Repeat([]byte("kvbm plaintext that TLS must hide from the wire, 64 bytes long.\n"), p.cfg.BlockSize()/64)
	bio, err := p.imp.BlockIO(p.local["g2"])
	require.NoError(t, err)
	require.NoError(t, bio.WriteBlock(0, clear))
	n, err := p.imp.ExecuteTransfer(p.local["g2"], []int{0}, p.remote["g2"], []int{4}, transfer.Options{})
	require.NoError(t, err)
	require.NoError(t, n.WaitTimeout(-1))
	require.Equal(t, clear, block(t, p.exp, p.remote["g2"], 4))
	require.Len(t, rec, 2)
	rec[0].mu.Lock()
	defer rec[0].mu.Unlock()
	require.Greater(t, rec[0].got.Len(), len(clear), "the exporter read the push")
	require.NotContains(t, rec[0].got.String(), "kvbm plaintext", "a pushed block crossed the wire in the clear")
}

// The same-host route stays a Unix socket without TLS when TLS is set:
// its bytes never reach a network.
func TestTLSLeavesTheSameHostRouteAsItIs(t *testing.T) {
	k := newPKI(t)
	cfg := Config{Listen: "127.0.0.1:0", TLS: k.good(t, "both")}
	p := newTCPPair(t, 5*time.Second, cfg)
	peer := p.peer.(*tcpPeer)
	require.Equal(t, "unix", peer.network)
	c, err := peer.get(context.Background())
	require.NoError(t, err)
	_, isTLS := c.c.(*tls.Conn)
	require.False(t, isTLS)
	peer.put(c)
	movesEveryByteBothWays(t, p)
}

// newManager is a manager on an emulated device, closed after the test
// (after the transports: cleanups run last first).
func newManager(t *testing.T, worker uint64, deadline time.Duration) *transfer.Manager {
	t.Helper()
	emu := cuda.NewEmulated(1)
	m, err := transfer.NewManager(transfer.Config{WorkerID: worker, Driver: emu, RemoteDeadline: deadline})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, m.Close())
		require.NoError(t, emu.Close())
	})
	return m
}

func swapCert(t *testing.T, tr *Transport, f TLSFiles) {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	require.NoError(t, err)
	tr.tls.server.Certificates = []tls.Certificate{pair}
	tr.tls.client.Certificates = []tls.Certificate{pair}
}

// A client with a certificate of another CA, one that trusts another CA,
// one without a certificate, or with an expired one, and a server whose
// certificate expired or names another host: each connection is refused
// in the TLS handshake, with the reason named, and the server counts and
// logs it; a genuine client is served after them.
func TestTLSRefusesWhatTheCAdoesNotVouchFor(t *testing.T) {
	k := newPKI(t)
	expired := testpki.Leaf{Name: "expired", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)}
	bothCAs := filepath.Join(k.dir, "both-cas.crt")
	require.NoError(t, os.WriteFile(bothCAs, append(append([]byte{}, k.ca.PEM...), k.other.PEM...), 0o600))
	for _, tc := range []struct {
		name string
		// server and client make each side's files; tweak changes the
		// client or server after load.
		server, client func() TLSFiles
		tweak          func(srv, cli *Transport)
		want           string
		badServer      bool // no client is served
	}{
		{name: "client certificate of another CA", client: func() TLSFiles {
			f := k.files(t, k.other, "other", testpki.Leaf{Name: "other"})
			f.CA = bothCAs // it trusts the server; the server does not trust it
			return f
		}, want: "refused this transport's TLS certificate"},
		{name: "client trusts another CA", client: func() TLSFiles { return k.files(t, k.other, "other", testpki.Leaf{Name: "other"}) },
			want: "certificate signed by unknown authority"},
		{name: "client without a certificate", tweak: func(_, cli *Transport) { cli.tls.client.Certificates = nil },
			want: "refused this transport's TLS certificate"},
		{name: "expired client certificate", tweak: func(_, cli *Transport) { swapCert(t, cli, k.files(t, k.ca, "expired", expired)) },
			want: "refused this transport's TLS certificate"},
		{name: "expired server certificate", tweak: func(srv, _ *Transport) { swapCert(t, srv, k.files(t, k.ca, "expired", expired)) },
			want: "certificate has expired", badServer: true},
		{name: "server certificate of another host", server: func() TLSFiles {
			return k.files(t, k.ca, "elsewhere", testpki.Leaf{Name: "elsewhere", Hosts: []string{"10.9.9.9", "elsewhere.example"}})
		}, want: "not 127.0.0.1", badServer: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := captureLogs(t)
			srvFiles, cliFiles := k.good(t, "server"), k.good(t, "client")
			if tc.server != nil {
				srvFiles = tc.server()
			}
			if tc.client != nil {
				cliFiles = tc.client()
			}
			m := newManager(t, 0xE1, 5*time.Second)
			srv, cli := New(tlsCfg(srvFiles)), New(tlsCfg(cliFiles))
			defer srv.Close()
			defer cli.Close()
			require.NoError(t, srv.Serve(m))
			if tc.tweak != nil {
				tc.tweak(srv, cli)
			}
			ep, err := srv.Endpoint()
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = cli.Connect(ctx, ep)
			t.Log(err)
			require.ErrorIs(t, err, remote.ErrPeerUnavailable)
			require.ErrorContains(t, err, tc.want)
			require.Eventually(t, func() bool { return srv.Refused() >= 1 }, 5*time.Second, time.Millisecond, "the server counted the refusal")
			require.Zero(t, srv.Served())
			require.Eventually(t, func() bool { return strings.Contains(out.String(), "TLS handshake") }, 5*time.Second, time.Millisecond)
			if tc.badServer {
				return
			}
			good := New(tlsCfg(k.good(t, "genuine")))
			defer good.Close()
			peer, err := good.Connect(ctx, ep)
			require.NoError(t, err, "a genuine client is served after the refusal")
			require.NoError(t, peer.Close())
		})
	}
}

// TLS on one end only is refused at Connect, before a byte is sent, with
// the variables to set; a plain client that connects anyway learns
// nothing (not even the challenge) and is closed by the hello deadline
// (its slot freed), counted as a slow hello; one that says something that
// is not TLS is refused, counted and logged.
func TestTLSOnOneEndOnlyIsRefusedClearly(t *testing.T) {
	const deadline = 300 * time.Millisecond
	k := newPKI(t)
	out := captureLogs(t)
	mk := func(cfg Config) (*Transport, []byte) {
		m := newManager(t, 0xE1, deadline)
		tr := New(cfg)
		t.Cleanup(func() { tr.Close() })
		require.NoError(t, tr.Serve(m))
		ep, err := tr.Endpoint()
		require.NoError(t, err)
		return tr, ep
	}
	srvCfg := tlsCfg(k.good(t, "server"))
	srvCfg.HelloDeadline = deadline
	tlsSrv, tlsEP := mk(srvCfg)
	_, plainEP := mk(Config{Listen: "127.0.0.1:0", NoSameHost: true})

	plainCli := New(Config{NoSameHost: true})
	defer plainCli.Close()
	_, err := plainCli.Connect(context.Background(), tlsEP)
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	require.ErrorContains(t, err, "serves TLS and this transport does not: set KVBM_TLS_CERT, KVBM_TLS_KEY and KVBM_TLS_CA here")
	tlsCli := New(tlsCfg(k.good(t, "client")))
	defer tlsCli.Close()
	_, err = tlsCli.Connect(context.Background(), plainEP)
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	require.ErrorContains(t, err, "serves plain TCP and this transport requires TLS: set KVBM_TLS_CERT, KVBM_TLS_KEY and KVBM_TLS_CA there too")

	// A plain kvbm client given the endpoint without its TLS flag.
	e, err := parseTCPEndpoint(tlsEP)
	require.NoError(t, err)
	e.flags = 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = plainCli.Connect(ctx, e.append(nil))
	require.ErrorIs(t, err, remote.ErrPeerUnavailable)
	require.ErrorContains(t, err, "closed the connection at the hello")
	require.Equal(t, uint64(1), tlsSrv.Limits().SlowHellos)
	require.Zero(t, tlsSrv.Refused())

	// A raw client that says something that is not TLS, or nothing.
	for _, say := range []string{"KVBT hello", ""} {
		c, err := net.Dial("tcp", e.addr)
		require.NoError(t, err)
		c.Write([]byte(say))
		require.Empty(t, readAll(t, c), "%q: no challenge, nothing", say)
		c.Close()
	}
	require.Eventually(t, func() bool { return tlsSrv.Refused() == 1 && tlsSrv.Limits().SlowHellos == 2 }, 5*time.Second, time.Millisecond,
		"not TLS: refused; nothing: slow")
	require.Eventually(t, func() bool {
		tlsSrv.mu.Lock()
		defer tlsSrv.mu.Unlock()
		return len(tlsSrv.conns) == 0
	}, 5*time.Second, time.Millisecond, "the slots are free")
	require.Equal(t, 1, strings.Count(out.String(), "refused a connection at the hello"), "logged once for the peer: %s", out)
	require.Contains(t, out.String(), "TLS handshake")
}

// A partial or broken TLS configuration is a named error when the
// transport is created (remote.Open) or starts serving, and at Connect,
// never at the first transfer.
func TestTLSConfigurationErrorsAreNamedAtStart(t *testing.T) {
	k := newPKI(t)
	good := k.good(t, "good")
	other := k.good(t, "other")
	junk := filepath.Join(k.dir, "junk.pem")
	require.NoError(t, os.WriteFile(junk, []byte("not PEM\n"), 0o600))
	serverOnly := k.files(t, k.ca, "server-only", testpki.Leaf{Name: "server-only", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	for _, tc := range []struct {
		name string
		f    TLSFiles
		want string
	}{
		{"cert only", TLSFiles{Cert: good.Cert}, "KVBM_TLS_CERT set but KVBM_TLS_KEY and KVBM_TLS_CA not"},
		{"no CA", TLSFiles{Cert: good.Cert, Key: good.Key}, "KVBM_TLS_CERT and KVBM_TLS_KEY set but KVBM_TLS_CA not"},
		{"CA only", TLSFiles{CA: good.CA}, "KVBM_TLS_CA set but KVBM_TLS_CERT and KVBM_TLS_KEY not"},
		{"unreadable key", TLSFiles{Cert: good.Cert, Key: filepath.Join(k.dir, "missing.key"), CA: good.CA}, "KVBM_TLS_KEY: open"},
		{"bad certificate PEM", TLSFiles{Cert: junk, Key: good.Key, CA: good.CA}, "KVBM_TLS_CERT"},
		{"bad CA PEM", TLSFiles{Cert: good.Cert, Key: good.Key, CA: junk}, "holds no PEM certificate"},
		{"key of another certificate", TLSFiles{Cert: good.Cert, Key: other.Key, CA: good.CA}, "private key does not match public key"},
		{"certificate of another CA", TLSFiles{Cert: k.files(t, k.other, "foreign", testpki.Leaf{}).Cert, Key: k.dir + "/foreign.key", CA: good.CA},
			"does not verify against KVBM_TLS_CA"},
		{"server use only", serverOnly, "as a client certificate"},
		{"expired", k.files(t, k.ca, "expired", testpki.Leaf{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}), "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(tlsCfg(tc.f))
			defer tr.Close()
			err := tr.Serve(newManager(t, 1, time.Second))
			require.ErrorIs(t, err, ErrTLSConfig)
			require.Equal(t, kvbmerr.InvalidArgument, kvbmerr.KindOf(err), "an invalid argument across the ABI")
			require.ErrorContains(t, err, tc.want)
			_, err = tr.Connect(context.Background(), tcpEndpoint{worker: 2, flags: flagTLS, addr: "127.0.0.1:1"}.append(nil))
			require.ErrorIs(t, err, ErrTLSConfig)
		})
	}
	// From the environment, through remote.Open: at create.
	t.Setenv("KVBM_TLS_CERT", good.Cert)
	t.Setenv("KVBM_TLS_KEY", "")
	t.Setenv("KVBM_TLS_CA", "")
	_, err := remote.Open("tcp", remote.OpenOptions{})
	require.ErrorIs(t, err, ErrTLSConfig)
	require.ErrorContains(t, err, "KVBM_TLS_CERT set but KVBM_TLS_KEY and KVBM_TLS_CA not")
	t.Setenv("KVBM_TLS_KEY", good.Key)
	t.Setenv("KVBM_TLS_CA", good.CA)
	tr, err := remote.Open("tcp", remote.OpenOptions{})
	require.NoError(t, err)
	require.True(t, tr.(*Transport).TLS(), "the variables make it TLS")
	require.NoError(t, tr.Close())
	plain := New(Config{NoTLS: true})
	require.False(t, plain.TLS(), "NoTLS keeps plain TCP whatever the environment says")
	require.NoError(t, plain.Close())
}

package tcp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/kvbmerr"
)

// TLS. With KVBM_TLS_CERT, KVBM_TLS_KEY and KVBM_TLS_CA set (PEM files),
// every TCP connection of the transport, served or dialed, is TLS 1.3
// with certificates both ways: the server requires a client certificate
// that chains to the CA, the client checks the server's chain against
// the CA and the server's name (below). The hello (package capability) runs inside
// TLS unchanged: TLS encrypts and proves membership of the deployment
// (a certificate of its CA), the hello proves the capability (the
// metadata). The same-host route (samehost_*.go) stays a Unix socket
// without TLS: its bytes never reach a network.
//
// The server's name: the client asks for a certificate of the host the
// endpoint advertises (its DNS or IP SAN, as HTTPS does), not only one of
// the CA. The hello is not bound to the TLS session, so a holder of any
// certificate of the CA placed on the path could otherwise open one TLS
// session to each side and relay the hello between them, reading what
// passes; with the name checked, that takes the certificate of the
// server's host. The client's name is not checked (its address is not
// advertised; the hello proves what it may do).
//
// A TLS server says so in its endpoint (flagTLS), so that a mismatch is
// refused at Connect with the variables to set, before a byte is sent.

// TLSFiles names the PEM files of TLS: the certificate (chain) this
// transport presents, both serving and dialing; its private key; and the
// CA that the peers' certificates must chain to.
type TLSFiles struct{ Cert, Key, CA string }

// The variables TLSFiles defaults from.
const (
	envTLSCert = "KVBM_TLS_CERT"
	envTLSKey  = "KVBM_TLS_KEY"
	envTLSCA   = "KVBM_TLS_CA"
)

// flagTLS, in an endpoint's flags, says that the server speaks TLS.
const flagTLS byte = 1

// ErrTLSConfig is wrapped by every error of the TLS configuration.
var ErrTLSConfig = kvbmerr.New(kvbmerr.InvalidArgument, "tcp transport: TLS configuration")

// tlsFilesFromEnv reads the variables.
func tlsFilesFromEnv() TLSFiles {
	return TLSFiles{Cert: os.Getenv(envTLSCert), Key: os.Getenv(envTLSKey), CA: os.Getenv(envTLSCA)}
}

// tlsSide is a transport's TLS: its server's configuration and the
// client's, whose ServerName is set per dial.
type tlsSide struct{ server, client *tls.Config }

// loadTLS loads the files; nil, nil when none is named. A partial
// configuration, an unreadable file, a file that holds no PEM, a key that
// does not match the certificate, or a certificate that does not verify
// against the CA for both uses is an error naming the variable.
func loadTLS(f TLSFiles) (*tlsSide, error) {
	if f == (TLSFiles{}) {
		return nil, nil
	}
	var set, unset []string
	for _, v := range []struct{ name, val string }{{envTLSCert, f.Cert}, {envTLSKey, f.Key}, {envTLSCA, f.CA}} {
		if v.val == "" {
			unset = append(unset, v.name)
		} else {
			set = append(set, v.name)
		}
	}
	if len(unset) > 0 {
		return nil, fmt.Errorf("%w: %s set but %s not: set all three (PEM files of the certificate, its key and the CA) or none",
			ErrTLSConfig, strings.Join(set, " and "), strings.Join(unset, " and "))
	}
	for _, v := range []struct{ name, path string }{{envTLSCert, f.Cert}, {envTLSKey, f.Key}, {envTLSCA, f.CA}} {
		if _, err := os.ReadFile(v.path); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrTLSConfig, v.name, err)
		}
	}
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %q with %s %q: %w", ErrTLSConfig, envTLSCert, f.Cert, envTLSKey, f.Key, err)
	}
	caPEM, _ := os.ReadFile(f.CA)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%w: %s %q holds no PEM certificate", ErrTLSConfig, envTLSCA, f.CA)
	}
	// Every worker both serves and dials with its one certificate: it must
	// verify against the CA, as the peers will check it, for both.
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("%w: %s %q: %w", ErrTLSConfig, envTLSCert, f.Cert, err)
		}
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	for _, use := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{use}}); err != nil {
			return nil, fmt.Errorf("%w: the certificate of %s %q does not verify against %s %q as a %s certificate (each worker serves and dials with it): %w",
				ErrTLSConfig, envTLSCert, f.Cert, envTLSCA, f.CA, map[x509.ExtKeyUsage]string{x509.ExtKeyUsageServerAuth: "server", x509.ExtKeyUsageClientAuth: "client"}[use], err)
		}
	}
	// Records of the largest size from the first byte: the streams carry
	// megabytes, not a web page whose first bytes should come early.
	return &tlsSide{
		server: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots, DynamicRecordSizingDisabled: true},
		client: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair}, RootCAs: roots, DynamicRecordSizingDisabled: true},
	}, nil
}

// checkTLSMatch refuses an endpoint whose server does not speak as this
// transport does: TLS on both ends or on neither.
func (t *Transport) checkTLSMatch(ep tcpEndpoint) error {
	switch serverTLS := ep.flags&flagTLS != 0; {
	case serverTLS && t.tls == nil:
		return fmt.Errorf("%w: worker %x at %s serves TLS and this transport does not: set %s, %s and %s here (PEM files of a certificate of the same CA)",
			kvbmerr.ErrInvalidArgument, ep.worker, ep.addr, envTLSCert, envTLSKey, envTLSCA)
	case !serverTLS && t.tls != nil:
		return fmt.Errorf("%w: worker %x at %s serves plain TCP and this transport requires TLS: set %s, %s and %s there too, or unset them here",
			kvbmerr.ErrInvalidArgument, ep.worker, ep.addr, envTLSCert, envTLSKey, envTLSCA)
	}
	return nil
}

// serverTLS runs the server's TLS handshake on a TCP connection, within
// the hello deadline already set on it (a slow handshake holds its slot
// of the pending budget no longer than a slow hello would, admission.go);
// c itself when TLS is off or c is the same-host socket. A client that
// fails it (no certificate, one of another CA, expired, or a plain
// client) is refused as a failed hello is.
func (t *Transport) serverTLS(c net.Conn) (net.Conn, bool) {
	if t.tls == nil || c.LocalAddr().Network() != "tcp" {
		return c, true
	}
	tc := tls.Server(c, t.tls.server)
	if err := tc.Handshake(); err != nil {
		t.helloFailed(c, "TLS handshake", err)
		return nil, false
	}
	return tc, true
}

// clientTLS runs the client's TLS handshake on a TCP connection to addr,
// asking for a certificate of addr's host; c itself when TLS is off.
func (p *tcpPeer) clientTLS(ctx context.Context, c net.Conn) (net.Conn, error) {
	if p.t.tls == nil || p.network != "tcp" {
		return c, nil
	}
	host, _, _ := net.SplitHostPort(p.addr)
	cfg := p.t.tls.client.Clone()
	cfg.ServerName = host
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		var he x509.HostnameError
		if errors.As(err, &he) {
			return nil, fmt.Errorf("%w: TLS handshake with peer %x at %s: %w (its certificate must name the host its metadata advertises: KVBM_TCP_ADVERTISE there)",
				remote.ErrPeerUnavailable, p.worker, p.addr, err)
		}
		return nil, fmt.Errorf("%w: TLS handshake with peer %x at %s: %w", remote.ErrPeerUnavailable, p.worker, p.addr, err)
	}
	return tc, nil
}

// refusedByTLS names a failure of the hello that the server's TLS caused:
// in TLS 1.3 the client's handshake ends before the server checks the
// client's certificate, whose refusal then comes as an alert at the first
// read.
func refusedByTLS(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error" // how crypto/tls reports an alert received
}

// rawConn is the socket under a TLS connection (c itself otherwise): its
// descriptor is polled and reset, and it is closed without TLS's
// close_notify (which could wait for a full socket buffer; the stream is
// framed, so a truncation is seen anyway).
func rawConn(c net.Conn) net.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return c
}

// TLS reports whether the transport's TCP connections are TLS.
func (t *Transport) TLS() bool { return t.tls != nil }

// DialOnce opens one TCP connection to the worker of endpoint, runs the
// TLS handshake where the transport has TLS, and the hello, then closes
// it: what each connection of a peer costs before its first request
// (kvbm bench times it), the same-host route not taken.
func (t *Transport) DialOnce(ctx context.Context, endpoint []byte) error {
	ep, err := parseTCPEndpoint(endpoint)
	if err != nil {
		return err
	}
	if t.tlsErr != nil {
		return t.tlsErr
	}
	if err := t.checkTLSMatch(ep); err != nil {
		return err
	}
	p := newTCPPeer(t, ep, "tcp", ep.addr)
	c, err := p.dialConn(ctx)
	if err != nil {
		return err
	}
	rawConn(c.c).Close()
	return nil
}

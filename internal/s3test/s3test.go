// Package s3test gives tests a real S3-compatible server: the one `make
// test` starts (scripts/with-s3.sh) for ordinary tests, and private
// versitygw processes for tests that stop and restart their server.
//
// The shared server is found through AWS_ENDPOINT_URL_S3,
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; the versitygw binary
// through KVBM_VERSITYGW. When they are absent a test skips, saying why,
// unless KVBM_REQUIRE_S3=1 (set by `make test`), where it fails.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/stretchr/testify/require"
)

// Server is an S3 endpoint and its root credentials.
type Server struct {
	Endpoint  string // "http://127.0.0.1:port"
	AccessKey string
	SecretKey string
	Region    string
}

// unavailable skips t, or fails it when KVBM_REQUIRE_S3=1.
func unavailable(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("KVBM_REQUIRE_S3") == "1" {
		t.Fatalf("S3 server required (KVBM_REQUIRE_S3=1) but %s", why)
	}
	t.Skipf("no S3 server: %s (`make test` starts one; see scripts/with-s3.sh)", why)
}

// Shared returns the server `make test` started.
func Shared(t testing.TB) Server {
	t.Helper()
	s := Server{
		Endpoint:  os.Getenv("AWS_ENDPOINT_URL_S3"),
		AccessKey: os.Getenv("AWS_ACCESS_KEY_ID"),
		SecretKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
		Region:    os.Getenv("AWS_REGION"),
	}
	if s.Endpoint == "" || s.AccessKey == "" || s.SecretKey == "" {
		unavailable(t, "AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY is not set")
	}
	if s.Region == "" {
		s.Region = "us-east-1"
	}
	return s
}

// Client returns a plain client of the server, for setting up and
// inspecting what the code under test does.
func (s Server) Client(t testing.TB) *minio.Client {
	t.Helper()
	secure := strings.HasPrefix(s.Endpoint, "https://")
	host := strings.TrimPrefix(strings.TrimPrefix(s.Endpoint, "https://"), "http://")
	tr, err := minio.DefaultTransport(secure)
	require.NoError(t, err)
	c, err := minio.New(host, &minio.Options{
		Creds:     credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Secure:    secure,
		Region:    s.Region,
		Transport: tr,
	})
	require.NoError(t, err)
	t.Cleanup(tr.CloseIdleConnections)
	return c
}

// NewBucket creates a bucket of a fresh name on s and returns its name.
func (s Server) NewBucket(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "kvbm-test-" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Client(t).MakeBucket(ctx, name, minio.MakeBucketOptions{Region: s.Region}), "make bucket %s", name)
	return name
}

// Private is a versitygw process of the test's own, which the test may
// stop and start again on the same port and directory.
type Private struct {
	Server
	t    testing.TB
	bin  string
	dir  string
	addr string
	cmd  *exec.Cmd
	log  *os.File
}

// StartPrivate starts a versitygw of the test's own (posix backend on a
// temporary directory, 127.0.0.1 on a free port). It is killed when the
// test ends.
func StartPrivate(t testing.TB) *Private {
	t.Helper()
	bin := os.Getenv("KVBM_VERSITYGW")
	if bin == "" {
		unavailable(t, "KVBM_VERSITYGW (the versitygw binary) is not set")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "data"), 0o755))
	p := &Private{
		Server: Server{Endpoint: "http://" + addr, AccessKey: "private", SecretKey: "private-secret", Region: "us-east-1"},
		t:      t, bin: bin, dir: dir, addr: addr,
	}
	p.Start()
	t.Cleanup(p.Stop)
	return p
}

// Start starts the server (again), waiting until it accepts connections.
func (p *Private) Start() {
	p.t.Helper()
	require.Nil(p.t, p.cmd, "server already running")
	log, err := os.OpenFile(filepath.Join(p.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(p.t, err)
	cmd := exec.Command(p.bin, "--port", p.addr, "posix", filepath.Join(p.dir, "data"))
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+p.AccessKey, "ROOT_SECRET_KEY="+p.SecretKey)
	cmd.Stdout, cmd.Stderr = log, log
	require.NoError(p.t, cmd.Start())
	p.cmd, p.log = cmd, log
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(p.dir, "server.log"))
			p.t.Fatalf("versitygw did not start on %s: %v\n%s", p.addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server (SIGKILL: no chance to finish what it holds) and
// waits for it to exit. Stopping a stopped server does nothing.
func (p *Private) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.log.Close()
	p.cmd, p.log = nil, nil
}

// String names the server in messages.
func (p *Private) String() string { return fmt.Sprintf("versitygw at %s", p.addr) }

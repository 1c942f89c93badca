package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/kvbm/kvbm/core/remote/ucx"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The process-wide driver of `kvbm info` (cuda.Default) lives on; nothing
// else may.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// kvbm runs a command line and returns its status, stdout and stderr.
func kvbm(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	rc := run(args, &out, &errb)
	return rc, out.String(), errb.String()
}

func TestUsage(t *testing.T) {
	rc, _, stderr := kvbm()
	require.Equal(t, 2, rc)
	require.Contains(t, stderr, "usage: kvbm <command>")
	rc, _, stderr = kvbm("frobnicate")
	require.Equal(t, 2, rc)
	require.Contains(t, stderr, `unknown command "frobnicate"`)
	rc, stdout, _ := kvbm("help")
	require.Equal(t, 0, rc)
	require.Contains(t, stdout, "bench")
	rc, _, stderr = kvbm("bench", "-blocks", "0")
	require.Equal(t, 2, rc)
	require.Contains(t, stderr, `-blocks: "0" is not a positive integer`)
	rc, _, stderr = kvbm("info", "extra")
	require.Equal(t, 2, rc)
	require.Contains(t, stderr, `unexpected argument "extra"`)
	rc, _, stderr = kvbm("demo")
	require.Equal(t, 1, rc)
	require.Contains(t, stderr, "-dir is required")
	rc, _, _ = kvbm("info", "-h")
	require.Equal(t, 0, rc)
}

func TestInfo(t *testing.T) {
	dir := t.TempDir()
	rc, stdout, stderr := kvbm("info", "-dir", dir)
	require.Equal(t, 0, rc, stderr)
	require.Contains(t, stdout, "kvbm 0.")
	require.Contains(t, stdout, "device backend: ")
	require.Contains(t, stdout, "GPUs")
	require.Contains(t, stdout, "disk tier: "+dir)
	require.Contains(t, stdout, "transports: loopback (workers of one process)")
	require.Contains(t, stdout, "tcp (selected); same host: Unix socket")
	require.Regexp(t, `tcp( \(selected\))?`, stdout)
	if ucx.Available() == nil {
		// The worker opened as a first export would, and what kvbm set.
		require.Regexp(t, `library UCX [0-9.]+, resources [^;]+; kvbm sets UCX_MM_RX_BUFS_GROW=64 UCX_MM_SEG_SIZE=65535 [^;]*UCX_RNDV_SCHEME=am; the worker opens`, stdout)
	}

	rc, stdout, stderr = kvbm("info", "--json", "-dir", dir)
	require.Equal(t, 0, rc, stderr)
	var r infoReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &r))
	require.Equal(t, dir, r.Disk.Dir)
	require.NotEmpty(t, r.Disk.Filesystem)
	require.Empty(t, r.Disk.Error)
	require.NotEmpty(t, r.Device.Backend)
	require.NotEmpty(t, r.Device.Devices)
	if !r.NVML.Available {
		require.NotEmpty(t, r.NVML.Error, "where NVML is absent, the report says why")
	}

	rc, stdout, _ = kvbm("info", "-dir", dir+"/missing")
	require.Equal(t, 0, rc, "a missing directory is reported, not fatal")
	require.Contains(t, stdout, "no such file or directory")
}

func TestBench(t *testing.T) {
	rc, stdout, stderr := kvbm("bench", "--json", "-dir", t.TempDir(), "-blocks", "4", "-concurrency", "1,2",
		"-reps", "1", "-small-ops", "10")
	require.Equal(t, 0, rc, stderr)
	var r benchReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &r))
	// The grid twice (with the S3 get beside an S3 server: make test runs
	// under scripts/with-s3.sh), small transfers, remote (same host, tcp,
	// tls, tls vs tcp, request-scoped vs tcp; two connects).
	grid := 16
	withS3 := os.Getenv("KVBM_S3_BUCKET") != "" && os.Getenv("AWS_ENDPOINT_URL_S3") != ""
	if withS3 {
		grid++
	}
	require.Len(t, r.Results, 2*grid+2*len(smallBlockSizes)+11)
	if withS3 {
		require.Contains(t, stderr, "kvbm bench: "+s3GetPath+", 2 MiB blocks ×4, concurrency 2")
	}
	for _, x := range r.Results {
		require.Empty(t, x.Error, x.Path)
		require.Positive(t, x.Value, x.Path)
		require.Positive(t, x.BaselineValue, x.Path)
		require.Positive(t, x.Ratio, x.Path)
		require.LessOrEqual(t, x.RatioMin, x.RatioMax, x.Path)
	}
	require.Contains(t, stderr, "kvbm bench: G2→G3 disk write, 2 MiB blocks ×4, concurrency 2")

	rc, stdout, stderr = kvbm("bench", "-dir", t.TempDir(), "-blocks", "2", "-concurrency", "1",
		"-reps", "1", "-paths", "G3,G4", "-tokens", "8")
	require.Equal(t, 0, rc, stderr)
	require.Contains(t, stdout, "| G2→G3 disk write ")
	require.Contains(t, stdout, "| 1 MiB ")
	require.NotContains(t, stdout, "layer-wise")
	rows := 2 + 6 // header, rule, 6 rows (G3 write, read; G4 put, get, get vs read+crc32c, cold get; and the S3 get)
	if withS3 {
		rows++
	}
	require.Equal(t, rows, strings.Count(stdout, "\n|"), stdout)

	// The gets alone: the put they read runs first, untimed.
	rc, stdout, stderr = kvbm("bench", "--json", "-dir", t.TempDir(), "-blocks", "2", "-concurrency", "1",
		"-reps", "1", "-paths", "G4→G2 get")
	require.Equal(t, 0, rc, stderr)
	r = benchReport{}
	require.NoError(t, json.Unmarshal([]byte(stdout), &r))
	require.Len(t, r.Results, 3)
	for _, x := range r.Results {
		require.Empty(t, x.Error, x.Path)
		require.Positive(t, x.Ratio, x.Path)
	}

	// The TLS figures alone, each beside the raw socket or plain TCP, with
	// the plain TCP pair they are compared to made for them.
	rc, stdout, stderr = kvbm("bench", "--json", "-dir", t.TempDir(), "-reps", "1", "-paths", "tls")
	require.Equal(t, 0, rc, stderr)
	r = benchReport{}
	require.NoError(t, json.Unmarshal([]byte(stdout), &r))
	baselines := map[string]string{}
	for _, x := range r.Results {
		require.Empty(t, x.Error, x.Path)
		require.Positive(t, x.Ratio, x.Path)
		baselines[x.Path] = x.Baseline
	}
	require.Equal(t, map[string]string{
		"remote pull G2←G2 (tls)":            "plain TCP stream",
		"remote push G2→G2 (tls)":            "plain TCP stream",
		"remote pull G2←G2 (tls, vs tcp)":    "remote pull G2←G2 (tcp)",
		"remote push G2→G2 (tls, vs tcp)":    "remote push G2→G2 (tcp)",
		"remote connect + TLS + hello (tls)": "remote connect + hello (tcp)",
	}, baselines)
}

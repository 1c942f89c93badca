package object

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLocationParse(t *testing.T) {
	base := S3Config{AccessKeyID: "id", SecretAccessKey: "secret", Region: "from-config", Endpoint: "http://config:1"}
	for _, tc := range []struct {
		url              string
		kind, dir        string
		bucket, prefix   string
		endpoint, region string
	}{
		{url: "/mnt/kv", kind: "fs", dir: "/mnt/kv"},
		{url: "relative/dir", kind: "fs", dir: "relative/dir"},
		{url: "file:///mnt/kv", kind: "fs", dir: "/mnt/kv"},
		{url: "file://localhost/mnt/kv", kind: "fs", dir: "/mnt/kv"},
		{url: "s3://bucket", kind: "s3", bucket: "bucket", endpoint: "http://config:1", region: "from-config"},
		{url: "s3://bucket/deploy/model/", kind: "s3", bucket: "bucket", prefix: "deploy/model",
			endpoint: "http://config:1", region: "from-config"},
		{url: "s3://b/p?endpoint=http://127.0.0.1:7070&region=eu-west-1", kind: "s3", bucket: "b", prefix: "p",
			endpoint: "http://127.0.0.1:7070", region: "eu-west-1"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			kind, dir, cfg, err := Location{URL: tc.url, HasRank: true, Rank: 3, S3: base}.parse()
			require.NoError(t, err)
			require.Equal(t, tc.kind, kind)
			require.Equal(t, tc.dir, dir)
			if kind == "s3" {
				require.Equal(t, tc.bucket, cfg.Bucket)
				require.Equal(t, tc.prefix, cfg.Prefix)
				require.Equal(t, tc.endpoint, cfg.Endpoint)
				require.Equal(t, tc.region, cfg.Region)
				require.True(t, cfg.HasRank)
				require.Equal(t, 3, cfg.Rank)
				require.Equal(t, "id", cfg.AccessKeyID)
			}
		})
	}
	for _, tc := range []struct{ url, msg string }{
		{"", "empty"},
		{"http://host/x", `unsupported scheme "http"`},
		{"s3://", "no bucket"},
		{"s3:///prefix", "no bucket"},
		{"s3://user:pw@bucket/p", "takes no user or port"},
		{"s3://bucket/p?secret=x", `unknown query parameter "secret"`},
		{"s3://bucket/p?region=", `query parameter "region" needs one non-empty value`},
		{"file://host/x", `host "host"`},
		{"file://", "absolute path"},
		{"file:///x?y=1", "takes no query"},
	} {
		t.Run("bad "+tc.url, func(t *testing.T) {
			_, err := Open(Location{URL: tc.url})
			require.ErrorIs(t, err, ErrInvalidArgument)
			require.ErrorContains(t, err, tc.msg)
			require.ErrorContains(t, err, `"`+tc.url+`"`)
		})
	}
}

// A directory and the same directory as a file:// URL open the same store.
func TestOpenFilesystemLocations(t *testing.T) {
	dir := t.TempDir()
	for _, url := range []string{dir, "file://" + dir} {
		s, err := Open(Location{URL: url, HasRank: true, Rank: 2})
		require.NoError(t, err)
		require.Equal(t, filepath.Join(dir, "2"), s.(*FSStore).Dir())
	}
}

func TestS3ConfigRefusesBadValues(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_S3", "")
	t.Setenv("AWS_ENDPOINT_URL", "")
	ok := S3Config{Bucket: "b", AccessKeyID: "id", SecretAccessKey: "s"}
	for _, tc := range []struct {
		mut func(*S3Config)
		msg string
	}{
		{func(c *S3Config) { c.Bucket = "" }, "empty bucket"},
		{func(c *S3Config) { c.HasRank, c.Rank = true, -1 }, "invalid rank -1"},
		{func(c *S3Config) { c.Concurrency = -2 }, "invalid concurrency -2"},
		{func(c *S3Config) { c.OpTimeout = -1 }, "invalid operation timeout"},
		{func(c *S3Config) { c.MaxRetries = -1 }, "invalid max retries -1"},
		{func(c *S3Config) { c.Endpoint = "127.0.0.1:7070" }, `endpoint "127.0.0.1:7070"`},
		{func(c *S3Config) { c.Endpoint = "ftp://host" }, `endpoint "ftp://host"`},
		{func(c *S3Config) { c.Endpoint = "http://host/path" }, `endpoint "http://host/path"`},
	} {
		cfg := ok
		tc.mut(&cfg)
		_, err := NewS3Store(cfg)
		require.ErrorIs(t, err, ErrInvalidArgument, tc.msg)
		require.ErrorContains(t, err, tc.msg)
	}
	// Endpoint and region from the environment, in the documented order.
	t.Setenv("AWS_ENDPOINT_URL", "http://generic:1")
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "ap-south-1")
	r, err := ok.resolve()
	require.NoError(t, err)
	require.Equal(t, "generic:1", r.host)
	require.Equal(t, "ap-south-1", r.region)
	require.False(t, r.secure)
	t.Setenv("AWS_ENDPOINT_URL_S3", "https://s3-specific:2")
	r, err = ok.resolve()
	require.NoError(t, err)
	require.Equal(t, "s3-specific:2", r.host)
	require.True(t, r.secure)
}

package object

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Defaults of an S3Store.
const (
	// DefaultS3Concurrency is the number of blocks an S3Store moves at
	// once when S3Config.Concurrency is 0: enough requests in flight to
	// hide a round trip per 2 MiB block.
	DefaultS3Concurrency = 16
	// DefaultS3OpTimeout bounds one block's operation, retries included.
	DefaultS3OpTimeout = 30 * time.Second
	// DefaultS3MaxRetries is the client's attempts per request on
	// retryable errors (network errors, 5xx, throttling), with
	// exponential backoff and jitter, all within the operation's deadline.
	DefaultS3MaxRetries = 5
	// DefaultS3Region is used when neither S3Config.Region nor AWS_REGION
	// (or AWS_DEFAULT_REGION) is set.
	DefaultS3Region = "us-east-1"
)

// S3Config configures an S3Store. Empty fields take the standard AWS
// environment variables, read when the store is opened.
type S3Config struct {
	// Bucket must exist; the store never creates it.
	Bucket string
	// Prefix namespaces the store's objects inside the bucket, e.g.
	// "deployment/model", so that deployments and models sharing a bucket
	// never collide. Leading and trailing slashes are ignored.
	Prefix string
	// HasRank and Rank add the worker's rank to the prefix
	// ("{Prefix}/{Rank}/{hex key}"), so SPMD workers never collide.
	HasRank bool
	Rank    int

	// Endpoint is the server's URL ("http://127.0.0.1:7070",
	// "https://s3.us-west-2.amazonaws.com"); "" takes AWS_ENDPOINT_URL_S3,
	// then AWS_ENDPOINT_URL, then AWS's own endpoint for the region.
	Endpoint string
	// Region; "" takes AWS_REGION, then AWS_DEFAULT_REGION, then
	// DefaultS3Region.
	Region string
	// AccessKeyID and SecretAccessKey (and SessionToken for temporary
	// credentials); when AccessKeyID is "" all three come from
	// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN.
	// A store without credentials is refused.
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string

	// Concurrency bounds the blocks moved at once by one call; 0 means
	// DefaultS3Concurrency.
	Concurrency int
	// OpTimeout is each block's deadline, retries included; 0 means
	// DefaultS3OpTimeout.
	OpTimeout time.Duration
	// MaxRetries is the attempts per request; 0 means DefaultS3MaxRetries.
	MaxRetries int
	// Transport, when set, carries the client's requests (a proxy, a
	// custom TLS configuration); nil uses the client's default.
	Transport http.RoundTripper
}

// s3Resolved is an S3Config with its defaults and environment applied.
type s3Resolved struct {
	bucket       string
	objectPrefix string
	host         string
	secure       bool
	region       string
	creds        *credentials.Credentials
	concurrency  int
	opTimeout    time.Duration
	maxRetries   int
	transport    http.RoundTripper
	ownTransport *http.Transport // the transport made here, nil for S3Config.Transport
	location     string
}

func (cfg S3Config) resolve() (s3Resolved, error) {
	prefix := strings.Trim(cfg.Prefix, "/")
	name := "s3://" + cfg.Bucket
	if prefix != "" {
		name += "/" + prefix
	}
	r := s3Resolved{bucket: cfg.Bucket, transport: cfg.Transport}
	fail := func(format string, args ...any) (s3Resolved, error) {
		return s3Resolved{}, fmt.Errorf("s3 object store %s: %w: %s", name, ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	if cfg.Bucket == "" {
		return fail("empty bucket")
	}
	if cfg.HasRank && cfg.Rank < 0 {
		return fail("invalid rank %d", cfg.Rank)
	}
	if cfg.Concurrency < 0 {
		return fail("invalid concurrency %d", cfg.Concurrency)
	}
	if cfg.OpTimeout < 0 {
		return fail("invalid operation timeout %v", cfg.OpTimeout)
	}
	if cfg.MaxRetries < 0 {
		return fail("invalid max retries %d", cfg.MaxRetries)
	}
	if prefix != "" {
		r.objectPrefix = prefix + "/"
	}
	if cfg.HasRank {
		r.objectPrefix += strconv.Itoa(cfg.Rank) + "/"
	}

	r.region = firstSet(cfg.Region, os.Getenv("AWS_REGION"), os.Getenv("AWS_DEFAULT_REGION"), DefaultS3Region)
	endpoint := firstSet(cfg.Endpoint, os.Getenv("AWS_ENDPOINT_URL_S3"), os.Getenv("AWS_ENDPOINT_URL"),
		"https://s3."+r.region+".amazonaws.com")
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") {
		return fail("endpoint %q is not an http:// or https:// URL of a host", endpoint)
	}
	r.host, r.secure = u.Host, u.Scheme == "https"

	if cfg.AccessKeyID != "" {
		r.creds = credentials.NewStaticV4(cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken)
	} else {
		id, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
		if id == "" || secret == "" {
			return fail("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
		}
		r.creds = credentials.NewStaticV4(id, secret, os.Getenv("AWS_SESSION_TOKEN"))
	}

	r.concurrency = cmp.Or(cfg.Concurrency, DefaultS3Concurrency)
	if r.transport == nil {
		// The client's own transport, with an idle connection kept for
		// every block in flight, and closable by S3Store.Close.
		tr, err := minio.DefaultTransport(r.secure)
		if err != nil {
			return fail("transport: %v", err)
		}
		tr.MaxIdleConnsPerHost = max(tr.MaxIdleConnsPerHost, r.concurrency)
		r.transport, r.ownTransport = tr, tr
	}
	r.opTimeout = cmp.Or(cfg.OpTimeout, DefaultS3OpTimeout)
	r.maxRetries = cmp.Or(cfg.MaxRetries, DefaultS3MaxRetries)
	r.location = "s3 object store s3://" + cfg.Bucket + "/" + r.objectPrefix + " at " + u.Scheme + "://" + u.Host
	return r, nil
}

func firstSet(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

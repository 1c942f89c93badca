package object

import (
	"fmt"
	"net/url"
	"strings"
)

// Location selects and configures a store by URL, as the worker's
// configuration names it:
//
//	/mnt/kv or kv/g4               a filesystem store in that directory
//	file:///mnt/kv                 the same, as a URL (absolute paths only)
//	s3://bucket/deployment/model   an S3 store: the bucket and a prefix
//	s3://bucket/p?endpoint=http://127.0.0.1:7070&region=eu-west-1
//
// An s3:// location's query may set endpoint and region, which take
// precedence over S3Config's fields, which take precedence over the AWS
// environment variables (S3Config). Credentials never come from the URL,
// so that a location can be logged: they come from S3Config or from
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
type Location struct {
	// URL is the location: a directory, file://… or s3://….
	URL string
	// HasRank and Rank namespace the worker's objects by rank.
	HasRank bool
	Rank    int
	// S3 holds the S3 settings not given by URL (credentials, endpoint,
	// limits); its Bucket and Prefix are ignored.
	S3 S3Config
}

// Open opens the store loc names. The caller owns the store; a store with a
// Close method (an S3Store) is closed when no longer used.
func Open(loc Location) (Store, error) {
	kind, dir, s3cfg, err := loc.parse()
	if err != nil {
		return nil, err
	}
	if kind == "s3" {
		return NewS3Store(s3cfg)
	}
	return NewFSStore(FSConfig{Dir: dir, HasRank: loc.HasRank, Rank: loc.Rank})
}

// parse splits a location into its kind ("fs" or "s3") and that kind's
// configuration, refusing, by name, whatever it does not understand.
func (loc Location) parse() (kind, dir string, s3cfg S3Config, err error) {
	bad := func(format string, args ...any) (string, string, S3Config, error) {
		return "", "", S3Config{}, fmt.Errorf("%w: object store location %q: %s", ErrInvalidArgument, loc.URL, fmt.Sprintf(format, args...))
	}
	if loc.URL == "" {
		return bad("empty")
	}
	scheme, _, hasScheme := strings.Cut(loc.URL, "://")
	if !hasScheme {
		return "fs", loc.URL, S3Config{}, nil
	}
	u, perr := url.Parse(loc.URL)
	if perr != nil {
		return bad("%v", perr)
	}
	switch scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return bad("host %q: a file:// location names a local path (file:///path)", u.Host)
		}
		if u.Path == "" || !strings.HasPrefix(u.Path, "/") {
			return bad("a file:// location needs an absolute path (file:///path)")
		}
		if u.RawQuery != "" {
			return bad("a file:// location takes no query")
		}
		return "fs", u.Path, S3Config{}, nil
	case "s3":
		if u.Host == "" {
			return bad("no bucket (s3://bucket/prefix)")
		}
		if u.User != nil || u.Port() != "" {
			return bad("s3://bucket/prefix takes no user or port; the endpoint goes in ?endpoint= or AWS_ENDPOINT_URL_S3")
		}
		s3cfg = loc.S3
		s3cfg.Bucket, s3cfg.Prefix = u.Host, strings.Trim(u.Path, "/")
		s3cfg.HasRank, s3cfg.Rank = loc.HasRank, loc.Rank
		for name, vals := range u.Query() {
			if len(vals) != 1 || vals[0] == "" {
				return bad("query parameter %q needs one non-empty value", name)
			}
			switch name {
			case "endpoint":
				s3cfg.Endpoint = vals[0]
			case "region":
				s3cfg.Region = vals[0]
			default:
				return bad("unknown query parameter %q (known: endpoint, region)", name)
			}
		}
		return "s3", "", s3cfg, nil
	}
	return bad("unsupported scheme %q (a directory, file:// or s3://)", scheme)
}

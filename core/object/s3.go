package object

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/minio/minio-go/v7"
)

// S3Store is a Store over an S3 bucket: one object per block, named
// "{prefix}/{rank}/{hex key}", holding the same bytes as an FSStore's file
// (format.go). Every object is written by one single-part PUT, so the
// server shows it whole or not at all; a PUT carries If-None-Match: * so
// that a block another worker or instance already stored is not written
// again (see putOne).
//
// Each block of a batch is one request (a put that finds an object: a HEAD
// too, and a second PUT when the object differs), with a deadline of its own (S3Config.OpTimeout) covering the
// client's retries, and the batch's context canceling it. The store holds
// no connection state beyond the HTTP client's pool, so a restarted server
// is used again by the next call.
type S3Store struct {
	core        minio.Core
	bucket      string
	prefix      string // "{Prefix}/{rank}/" or a part of it, ending in "/" unless empty
	location    string // "s3://bucket/prefix at endpoint", for messages
	concurrency int
	opTimeout   time.Duration
	transport   *http.Transport // closed by Close when the store made it
}

var _ Store = (*S3Store)(nil)

// NewS3Store opens an S3 store. It checks, within one OpTimeout, that the
// endpoint answers, that the credentials are accepted and that the bucket
// exists, so that a misconfigured store fails when the worker is created
// rather than on its first offload. The bucket is never created.
func NewS3Store(cfg S3Config) (*S3Store, error) {
	r, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	client, err := minio.New(r.host, &minio.Options{
		Creds:        r.creds,
		Secure:       r.secure,
		Region:       r.region,
		Transport:    r.transport,
		BucketLookup: minio.BucketLookupAuto,
		MaxRetries:   r.maxRetries,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.location, err)
	}
	s := &S3Store{
		core:        minio.Core{Client: client},
		bucket:      r.bucket,
		prefix:      r.objectPrefix,
		location:    r.location,
		concurrency: r.concurrency,
		opTimeout:   r.opTimeout,
		transport:   r.ownTransport,
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opTimeout)
	defer cancel()
	if err := s.probe(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("%s: %w", s.location, err)
	}
	return s, nil
}

// probe reads an object name that no block uses: "not found" proves that
// the endpoint answers, accepts the credentials and has the bucket. A GET
// rather than a HEAD, whose error would come without a body, so that an
// unknown access key, a bad secret and a missing bucket read differently.
func (s *S3Store) probe(ctx context.Context) error {
	body, _, _, err := s.core.GetObject(ctx, s.bucket, s.prefix+".kvbm-probe", minio.GetObjectOptions{})
	if err == nil {
		return body.Close()
	}
	if minio.ToErrorResponse(err).Code == "NoSuchBucket" {
		return fmt.Errorf("%w: bucket %q does not exist (the store does not create it)", ErrIO, s.bucket)
	}
	if err := s.classify(ctx, err); !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// Close releases the store's idle connections. Calls in flight finish; a
// store is not used after Close.
func (s *S3Store) Close() error {
	if s.transport != nil {
		s.transport.CloseIdleConnections()
	}
	return nil
}

// Location names the store in messages: "s3://bucket/prefix/rank at endpoint".
func (s *S3Store) Location() string { return s.location }

// ObjectName returns the name of key's object in the bucket.
func (s *S3Store) ObjectName(key Key) string { return s.prefix + key.String() }

// Bucket returns the store's bucket.
func (s *S3Store) Bucket() string { return s.bucket }

// Client is the store's S3 client (its endpoint, credentials and
// transport), for requests of the caller's own: the bench's bare GETs.
func (s *S3Store) Client() *minio.Client { return s.core.Client }

// HasBlocks reports which objects exist with one HEAD per key: the
// object's metadata (objectMeta) says which key, length and checksum it
// holds, so an object this store did not write, or wrote under another
// key, reads as corrupt without a byte of it being read.
func (s *S3Store) HasBlocks(ctx context.Context, keys []Key) []Presence {
	out := make([]Presence, len(keys))
	forEach(ctx, len(keys), s.concurrency,
		func() func(int) {
			return func(i int) { out[i] = s.hasOne(ctx, keys[i]) }
		},
		func(i int, err error) { out[i] = Presence{Key: keys[i], Err: err} })
	return out
}

func (s *S3Store) hasOne(ctx context.Context, key Key) Presence {
	p := Presence{Key: key}
	if err := key.valid(); err != nil {
		p.Err = fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		return p
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	h, err := s.stat(ctx, key)
	switch {
	case errors.Is(err, ErrNotFound):
		return p
	case err != nil:
		p.Err = fmt.Errorf("object %s: %w", key, err)
		return p
	}
	p.Found, p.Size = true, int64(h.length)
	return p
}

// metaName is the user metadata entry (x-amz-meta-kvbm-object) that
// repeats an object's header: "{format version} {hex key} {payload length}
// {payload CRC32C, 8 hex digits}". It is written by the same PUT as the
// bytes, and S3 objects are never changed in place, so it describes the
// bytes it came with; Get still checks the bytes themselves.
const metaName = "Kvbm-Object"

func objectMeta(key Key, length int, crc uint32) string {
	return fmt.Sprintf("%d %s %d %08x", formatVersion, key, length, crc)
}

// stat reads key's object's metadata with a HEAD and checks it: written by
// this store's format, under key, and as long as it records.
func (s *S3Store) stat(ctx context.Context, key Key) (header, error) {
	name := s.ObjectName(key)
	info, err := s.core.StatObject(ctx, s.bucket, name, minio.StatObjectOptions{})
	if err != nil {
		return header{}, fmt.Errorf("s3 head %s: %w", name, s.classify(ctx, err))
	}
	meta := info.Metadata.Get("X-Amz-Meta-" + metaName)
	if meta == "" {
		return header{}, corruptf("no x-amz-meta-kvbm-object metadata: not an object of this store")
	}
	var version int
	var hexKey string
	var h header
	if n, err := fmt.Sscanf(meta, "%d %s %d %x", &version, &hexKey, &h.length, &h.crc); err != nil || n != 4 {
		return header{}, corruptf("malformed x-amz-meta-kvbm-object %q", meta)
	}
	if version != formatVersion {
		return header{}, corruptf("unsupported format version %d, want %d", version, formatVersion)
	}
	if h.key, err = ParseKey(hexKey); err != nil {
		return header{}, corruptf("x-amz-meta-kvbm-object: %v", err)
	}
	if err := h.checkKey(key); err != nil {
		return header{}, err
	}
	if err := h.checkHeldLength(info.Size - HeaderSize); err != nil {
		return header{}, err
	}
	return h, nil
}

// PutBlocksWithLayout writes each block of src to its key's object.
func (s *S3Store) PutBlocksWithLayout(ctx context.Context, keys []Key, src BlockIO, blockIDs []int) []Result {
	// One object's bytes, header then payload, sent in one PUT.
	return eachBlock(ctx, keys, src, blockIDs, roleSource, s.concurrency, HeaderSize,
		func(i int, buf func() []byte) error { return s.putOne(ctx, keys[i], src, blockIDs[i], buf()) })
}

// putOne stores one block. The PUT is conditional (If-None-Match: *): when
// an object already exists the server refuses it with 412, and the object
// is kept if its metadata says it holds this very payload (the same block,
// stored by another instance of the deployment or an earlier put: the
// server writes nothing), and replaced by an unconditional PUT otherwise, as the
// Store contract asks. A server that ignores the condition simply replaces
// the object.
func (s *S3Store) putOne(ctx context.Context, key Key, src BlockIO, id int, buf []byte) error {
	payload := buf[HeaderSize:]
	if err := src.ReadBlock(id, payload); err != nil {
		return fmt.Errorf("object %s: read source block %d: %w", key, id, err)
	}
	putHeader(buf[:HeaderSize], key, payload)
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()

	h, err := decodeHeader(buf[:HeaderSize]) // for the payload's CRC32C, computed once
	if err != nil {
		return fmt.Errorf("object %s: %w", key, err)
	}
	crc := h.crc
	meta := objectMeta(key, len(payload), crc)
	err = s.put(ctx, key, buf, meta, true)
	if !isPreconditionFailed(err) {
		return err
	}
	if s.holds(ctx, key, len(payload), crc) {
		return nil
	}
	return s.put(ctx, key, buf, meta, false)
}

// holds reports whether key's object is this very block: its metadata
// records this key, length and CRC32C.
func (s *S3Store) holds(ctx context.Context, key Key, length int, crc uint32) bool {
	h, err := s.stat(ctx, key)
	return err == nil && h.length == uint64(length) && h.crc == crc
}

// put sends one whole object, with its metadata, in a single-part PUT;
// conditional adds If-None-Match: *.
func (s *S3Store) put(ctx context.Context, key Key, obj []byte, meta string, conditional bool) error {
	name := s.ObjectName(key)
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: true,
		UserMetadata: map[string]string{metaName: meta}}
	if conditional {
		opts.SetMatchETagExcept("*")
	}
	_, err := s.core.PutObject(ctx, s.bucket, name, bytes.NewReader(obj), int64(len(obj)), "", "", opts)
	if err == nil {
		return nil
	}
	if conditional && isPreconditionFailedResponse(err) {
		return errPreconditionFailed
	}
	return fmt.Errorf("object %s: s3 put %s: %w", key, name, s.classify(ctx, err))
}

var errPreconditionFailed = errors.New("object exists (412 Precondition Failed)")

func isPreconditionFailed(err error) bool { return err == errPreconditionFailed }

func isPreconditionFailedResponse(err error) bool {
	r := minio.ToErrorResponse(err)
	return r.StatusCode == http.StatusPreconditionFailed || r.Code == "PreconditionFailed"
}

// GetBlocksWithLayout loads each key's object into its block of dst.
func (s *S3Store) GetBlocksWithLayout(ctx context.Context, keys []Key, dst BlockIO, blockIDs []int) []Result {
	// The body streams straight into a host destination block, checked as
	// it lands; a block that fails may hold any bytes but is reported failed.
	return eachBlock(ctx, keys, dst, blockIDs, roleDestination, s.concurrency, 0,
		func(i int, buf func() []byte) error { return s.getOne(ctx, keys[i], dst, blockIDs[i], buf) })
}

func (s *S3Store) getOne(ctx context.Context, key Key, dst BlockIO, id int, buf func() []byte) error {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	name := s.ObjectName(key)
	body, info, _, err := s.core.GetObject(ctx, s.bucket, name, minio.GetObjectOptions{})
	if err != nil {
		return fmt.Errorf("object %s: s3 get %s: %w", key, name, s.classify(ctx, err))
	}
	defer body.Close()
	var hb [HeaderSize]byte
	n, err := io.ReadFull(body, hb[:])
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("object %s: s3 read %s: %w", key, name, s.classify(ctx, err))
	}
	h, err := decodeHeader(hb[:n])
	if err != nil {
		return fmt.Errorf("object %s: %w", key, err)
	}
	if err := h.checkKey(key); err != nil {
		return fmt.Errorf("object %s: %w", key, err)
	}
	if err := h.checkHeldLength(info.Size - HeaderSize); err != nil {
		return fmt.Errorf("object %s: %w", key, err)
	}
	if bs := dst.BlockSize(); h.length != uint64(bs) {
		return fmt.Errorf("object %s: %w", key,
			corruptf("length mismatch: object holds %d bytes, destination block is %d bytes", h.length, bs))
	}
	return loadPayload(key, h, dst, id, buf, func(p []byte) error {
		if _, err := io.ReadFull(body, p); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return fmt.Errorf("object %s: s3 read %s: %w: truncated payload: %v", key, name, ErrIO, err)
			}
			return fmt.Errorf("object %s: s3 read %s: %w", key, name, s.classify(ctx, err))
		}
		return nil
	})
}

// Delete removes the objects of keys; a missing object counts as deleted.
func (s *S3Store) Delete(ctx context.Context, keys []Key) []Result {
	return eachKey(ctx, keys, s.concurrency, func(i int) error { return s.deleteOne(ctx, keys[i]) })
}

func (s *S3Store) deleteOne(ctx context.Context, key Key) error {
	if err := key.valid(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	name := s.ObjectName(key)
	err := s.core.RemoveObject(ctx, s.bucket, name, minio.RemoveObjectOptions{})
	if err != nil && !errors.Is(s.classify(ctx, err), ErrNotFound) {
		return fmt.Errorf("object %s: s3 delete %s: %w", key, name, s.classify(ctx, err))
	}
	return nil
}

// classify turns a client error into one the store's callers can test:
// ErrNotFound for a missing object, the context's error when the deadline
// passed or the batch was canceled (the client's own message kept), and
// ErrIO for everything else, with refused credentials said in words.
func (s *S3Store) classify(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%w (%s): %v", ctxErr, s.location, err)
	}
	r := minio.ToErrorResponse(err)
	switch {
	case r.Code == "NoSuchKey" || r.StatusCode == http.StatusNotFound && r.Code == "":
		// A HEAD's 404 comes without a body, hence without a code.
		return fmt.Errorf("%w: %v", ErrNotFound, err)
	case r.Code == "InvalidAccessKeyId" || r.Code == "SignatureDoesNotMatch" || r.Code == "AccessDenied" ||
		r.Code == "XAdminUserNotFound" || // versitygw's unknown access key
		r.StatusCode == http.StatusForbidden:
		return fmt.Errorf("%w: credentials refused by %s (%s): %v; check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
			ErrIO, s.location, r.Code, err)
	}
	return fmt.Errorf("%w: %v", ErrIO, err)
}

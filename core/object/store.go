package object

import (
	"context"

	"github.com/kvbm/kvbm/kvbmerr"
)

// Store is the object-store side of the G4 tier (the seeds' ObjectBlockOps).
// Every method takes a batch and returns one entry per key, in the order of
// the keys; each block succeeds or fails on its own. A Store is safe for
// concurrent use.
//
// The logical-handle variants (put the blocks of tier G2) live on workers,
// which resolve the tier to a BlockIO and call PutBlocksWithLayout or
// GetBlocksWithLayout.
type Store interface {
	// HasBlocks reports, for each key, whether its object exists and the
	// size of its payload, without reading the payload.
	HasBlocks(ctx context.Context, keys []Key) []Presence

	// PutBlocksWithLayout stores block blockIDs[i] of src under keys[i],
	// replacing any object already there. An object is either whole or
	// absent: a failed put never leaves a partial object behind.
	PutBlocksWithLayout(ctx context.Context, keys []Key, src BlockIO, blockIDs []int) []Result

	// GetBlocksWithLayout loads the object of keys[i] into block
	// blockIDs[i] of dst. An object's header (format, recorded key,
	// length) is verified before any payload byte is read; the payload may
	// then be read straight into the destination block and its checksum
	// checked as it lands. A block that fails therefore may hold any bytes
	// in its destination, but is reported failed and never loaded; it is
	// the caller's to reuse.
	GetBlocksWithLayout(ctx context.Context, keys []Key, dst BlockIO, blockIDs []int) []Result

	// Delete removes the objects of keys. Deleting an object that does not
	// exist succeeds, as eviction may race with another worker's.
	Delete(ctx context.Context, keys []Key) []Result
}

// Presence is HasBlocks' answer for one key.
type Presence struct {
	Key Key
	// Size is the payload size in bytes when Found.
	Size int64
	// Found is true when a well-formed object exists under Key.
	Found bool
	// Err says why the store could not tell, or why an object that exists
	// is unusable (errors.Is(Err, ErrCorrupt)); Found is then false. A
	// plainly missing object has Found false and Err nil.
	Err error
}

// Result is the outcome of one block of a put, get or delete.
type Result struct {
	Key Key
	// Err is nil when the block succeeded.
	Err error
}

// Errors that results wrap; test them with errors.Is. Their kinds are the
// C ABI's status codes.
var (
	// ErrNotFound: no object exists under the key.
	ErrNotFound = kvbmerr.New(kvbmerr.NotFound, "not found")
	// ErrCorrupt: the object exists but fails verification (magic,
	// version, recorded key, length or checksum), or its length differs
	// from the block size it is loaded into.
	ErrCorrupt = kvbmerr.New(kvbmerr.DataCorruption, "corrupt object")
	// ErrInvalidArgument: the batch itself is malformed (lengths differ,
	// block ids out of range or repeated, invalid key); every block of the
	// batch fails with it and nothing is read or written.
	ErrInvalidArgument = kvbmerr.ErrInvalidArgument
	// ErrIO: the store could not be read or written: an S3 server that
	// does not answer, refuses the credentials or fails the request. The
	// filesystem store's errors are the operating system's own.
	ErrIO = kvbmerr.New(kvbmerr.IO, "object store I/O")
)

// FailedKeys returns the keys of the results that failed, in order.
func FailedKeys(results []Result) []Key {
	var failed []Key
	for _, r := range results {
		if r.Err != nil {
			failed = append(failed, r.Key)
		}
	}
	return failed
}

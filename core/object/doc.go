// Package object is the G4 tier: block stores addressed by key rather than by
// block id: a directory, local or a shared mount (FSStore), or an S3 bucket
// (S3Store), chosen by a location string (Open: "/dir", "file:///dir",
// "s3://bucket/prefix").
//
// A Store moves whole blocks between a resolved layout (a BlockIO) and
// objects named by Keys. Every call is a batch: each block succeeds or fails
// on its own, and results come back in the order of the input keys, so a
// worker can report exactly which blocks failed to load.
//
// Workers hold the logical-handle variants (put G2 blocks 3, 7, 9 under these
// keys): they resolve the tier to a BlockIO and call the Store. Keys are
// prefixed by the worker's rank inside the store, so SPMD workers that share
// a bucket or mount never collide.
//
// Both stores write the same objects: a small header with a magic, a format
// version, the key it was written under, the payload length and a CRC32C of
// the payload (format.go), then the payload; Get verifies all of them
// before a byte reaches the destination.
package object

package pool

import "github.com/kvbm/kvbm/kvbmerr"

// Errors that the pool's calls wrap; test them with errors.Is. Their kinds
// are the C ABI's status codes.
var (
	// ErrInvalidArgument: the call's input is malformed (lengths differ,
	// a zero key, a key or id repeated in one call).
	ErrInvalidArgument = kvbmerr.ErrInvalidArgument
	// ErrOutOfRange: a block id outside [0, Blocks).
	ErrOutOfRange = kvbmerr.New(kvbmerr.OutOfRange, "block id out of range")
	// ErrAlreadyExists: a key registered that the pool already holds.
	ErrAlreadyExists = kvbmerr.New(kvbmerr.AlreadyExists, "key already present")
	// ErrState: a block is not in the state the call needs (registering a
	// free block, releasing a registered one, unpinning an unpinned one).
	ErrState = kvbmerr.New(kvbmerr.FailedPrecondition, "block in the wrong state")
	// ErrNoSpace: fewer blocks than asked are free or evictable; a failed
	// precondition, as the ABI has no status for exhaustion.
	ErrNoSpace = kvbmerr.New(kvbmerr.FailedPrecondition, "not enough free or evictable blocks")
)

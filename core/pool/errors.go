package pool

import "errors"

// Errors that the pool's calls wrap; test them with errors.Is.
var (
	// ErrInvalidArgument: the call's input is malformed (lengths differ,
	// a zero key, a key or id repeated in one call).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrOutOfRange: a block id outside [0, Blocks).
	ErrOutOfRange = errors.New("block id out of range")
	// ErrAlreadyExists: a key registered that the pool already holds.
	ErrAlreadyExists = errors.New("key already present")
	// ErrState: a block is not in the state the call needs (registering a
	// free block, releasing a registered one, unpinning an unpinned one).
	ErrState = errors.New("block in the wrong state")
	// ErrNoSpace: fewer blocks than asked are free or evictable.
	ErrNoSpace = errors.New("not enough free or evictable blocks")
)

// Package kvbmerr is kvbm's error vocabulary: the kinds of failure that the
// C ABI tells apart. Each package declares its sentinel errors with New,
// naming their kind, and wraps them with context as usual
// (fmt.Errorf("register G2 layout: %w", err)); KindOf reads the kind back
// from any error built that way, and the C ABI maps kinds to statuses in one
// table.
//
// Identity stays with the sentinels: errors.Is(err, transfer.ErrNotFound)
// still tells a missing layout from a missing object. A kind only says how
// a caller on the other side of the ABI should react.
//
// kvbmerr is a leaf: it imports nothing of kvbm, so that every package,
// the pure ones (core/layout, core/handoff, core/pool) and cuda/ included,
// may use it.
package kvbmerr

import (
	"context"
	"fmt"
	"io/fs"
	"syscall"
)

// Kind is a class of failure, one per error status of the C ABI.
type Kind uint8

// The kinds. The zero Kind, Unknown, is an error nothing classified: a bug
// (KVBM_ERR_INTERNAL). A new kind is one constant here, its name in
// kindNames and its status in capi's table; the tests fail until all three
// are there.
const (
	Unknown            Kind = iota // nothing classified the error: a bug
	InvalidArgument                // a malformed request: a bad length, id or value
	OutOfRange                     // an id or index beyond its bound
	NotFound                       // no such layout, key, object, action or peer
	AlreadyExists                  // something set once was set again
	FailedPrecondition             // the state does not allow the call now
	DataCorruption                 // data read back fails its checksum or format
	IO                             // a file system, disk, store or peer failed
	CUDA                           // the device driver failed
	Timeout                        // a wait ended before the work did
	Canceled                       // the work was canceled, or its owner closed
	Unsupported                    // no such path, backend or facility here

	numKinds // keep last
)

var kindNames = [numKinds]string{
	Unknown:            "unknown",
	InvalidArgument:    "invalid argument",
	OutOfRange:         "out of range",
	NotFound:           "not found",
	AlreadyExists:      "already exists",
	FailedPrecondition: "failed precondition",
	DataCorruption:     "data corruption",
	IO:                 "I/O",
	CUDA:               "CUDA",
	Timeout:            "timeout",
	Canceled:           "canceled",
	Unsupported:        "unsupported",
}

func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Kinds returns every kind but Unknown, in order.
func Kinds() []Kind {
	ks := make([]Kind, 0, numKinds-1)
	for k := Kind(1); k < numKinds; k++ {
		ks = append(ks, k)
	}
	return ks
}

// Error is a sentinel error of a kind; New makes one.
type Error struct {
	kind Kind
	msg  string
}

// New returns a sentinel error of kind k with message msg. Each call
// returns a distinct error, for errors.Is:
//
//	var ErrNotFound = kvbmerr.New(kvbmerr.NotFound, "not found")
func New(k Kind, msg string) error { return &Error{kind: k, msg: msg} }

func (e *Error) Error() string { return e.msg }

// Kind is the error's kind.
func (e *Error) Kind() Kind { return e.kind }

// kinded is an error that knows its kind: a sentinel from New, or a type of
// its own with a Kind method (cuda.Error).
type kinded interface{ Kind() Kind }

// KindOf returns the kind of err: that of the first error in its tree that
// has one, in the order errors.As visits them (err, then what it wraps,
// depth first, the operands of a multiple %w or errors.Join left to right).
// The outermost error decides, so that a wrapper gives its own kind to what
// it wraps (remote.ErrPeerUnavailable, IO, wraps the timeout that revealed
// the peer's silence). Errors of the standard library that carry no kind
// are read as kvbm's: context.DeadlineExceeded is Timeout,
// context.Canceled Canceled, *fs.PathError and syscall.Errno IO.
// KindOf(nil) and an error with no kind in its tree are Unknown.
func KindOf(err error) Kind {
	if err == nil {
		return Unknown
	}
	if k := kindHere(err); k != Unknown {
		return k
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return KindOf(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if k := KindOf(e); k != Unknown {
				return k
			}
		}
	}
	return Unknown
}

// kindHere is err's own kind, not looking at what it wraps.
func kindHere(err error) Kind {
	if k, ok := err.(kinded); ok {
		return k.Kind()
	}
	switch err.(type) {
	case *fs.PathError, syscall.Errno:
		return IO
	}
	switch err {
	case context.DeadlineExceeded:
		return Timeout
	case context.Canceled:
		return Canceled
	}
	return Unknown
}

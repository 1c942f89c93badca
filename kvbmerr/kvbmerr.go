// Package kvbmerr is kvbm's error vocabulary: the kinds of failure that the
// C ABI tells apart, one sentinel per kind (ErrInvalidArgument, ErrNotFound,
// …). A package either uses a kind's sentinel, wrapping it with context
// (fmt.Errorf("register G2 layout: %w", kvbmerr.ErrInvalidArgument)), or
// declares a sentinel of its own with New, naming its kind, where callers
// must tell its failure from others of the same kind (errors.Is(err,
// object.ErrNotFound) tells a missing object from a missing layout). Such a
// sentinel is also its kind's under errors.Is. KindOf reads the kind back
// from any error built that way, and the C ABI maps kinds to statuses in one
// table.
//
// kvbmerr is the ground floor of the module and pure: it imports nothing of
// kvbm and nothing that reaches the operating system (no os, syscall, time
// or context, not even through fmt), so that the pure packages
// (core/layout, core/handoff, core/pool), cuda/ and internal/ may all use
// it. Errors of the standard library that carry no kind (a *fs.PathError,
// context.DeadlineExceeded) are given one where they arise, or by
// kvbmerr/stdkind at the ABI.
package kvbmerr

import "strconv"

// Kind is a class of failure, one per error status of the C ABI.
type Kind uint8

// The kinds. The zero Kind, Unknown, is an error nothing classified: a bug
// (KVBM_ERR_INTERNAL). A new kind is one constant here, its name in
// kindNames (which is also its sentinel's message) and its status in
// capi's table; the tests fail until all are there.
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
	Timeout                        // a wait or a deadline ended before the work did
	Canceled                       // the work was canceled, or its owner closed
	Unsupported                    // no such path, backend or facility here
	DeadlineExceeded               // a deadline passed and stopped the work

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
	DeadlineExceeded:   "deadline exceeded",
}

func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Kinds returns every kind but Unknown, in order.
func Kinds() []Kind {
	ks := make([]Kind, 0, numKinds-1)
	for k := Kind(1); k < numKinds; k++ {
		ks = append(ks, k)
	}
	return ks
}

// sentinels holds each kind's sentinel, named by its kind (the messages
// every package used before it had them, so that messages read as they
// did); an out-of-range id reads as the invalid argument it also is.
var sentinels = func() (s [numKinds]*Error) {
	for k := Kind(1); k < numKinds; k++ {
		s[k] = &Error{kind: k, msg: kindNames[k]}
	}
	s[OutOfRange].msg = kindNames[InvalidArgument]
	return s
}()

// The sentinel of each kind.
var (
	// ErrInvalidArgument: the request is malformed (lengths, ids, ranges).
	ErrInvalidArgument = sentinels[InvalidArgument]
	// ErrOutOfRange: an id or index beyond its bound. It is also an
	// ErrInvalidArgument under errors.Is, and reads as one.
	ErrOutOfRange = sentinels[OutOfRange]
	// ErrNotFound: no such thing.
	ErrNotFound = sentinels[NotFound]
	// ErrAlreadyExists: something that is set once was set again.
	ErrAlreadyExists = sentinels[AlreadyExists]
	// ErrFailedPrecondition: the state does not allow the call now.
	ErrFailedPrecondition = sentinels[FailedPrecondition]
	// ErrDataCorruption: data read back does not match its checksum.
	ErrDataCorruption = sentinels[DataCorruption]
	// ErrIO: a file system, disk, store or peer failed.
	ErrIO = sentinels[IO]
	// ErrCUDA: the device driver failed.
	ErrCUDA = sentinels[CUDA]
	// ErrTimeout: a wait or a deadline ended before the work did.
	ErrTimeout = sentinels[Timeout]
	// ErrCanceled: the work was canceled, or its owner closed.
	ErrCanceled = sentinels[Canceled]
	// ErrUnsupported: no such path, backend or facility here.
	ErrUnsupported = sentinels[Unsupported]
	// ErrDeadlineExceeded: the work's deadline passed and stopped it (a
	// Timeout says a wait ended while the work goes on; this, that the work
	// is over).
	ErrDeadlineExceeded = sentinels[DeadlineExceeded]
)

// Sentinel is kind k's sentinel error; nil for Unknown.
func Sentinel(k Kind) error {
	if k == Unknown || k >= numKinds {
		return nil
	}
	return sentinels[k]
}

// Error is a sentinel error of a kind; New makes one.
type Error struct {
	kind Kind
	msg  string
}

// New returns a sentinel error of kind k with message msg, for failures a
// caller must tell from others of kind k. Each call returns a distinct
// error; under errors.Is it is also kind k's sentinel:
//
//	var ErrNotCached = kvbmerr.New(kvbmerr.NotFound, "not cached")
func New(k Kind, msg string) error { return &Error{kind: k, msg: msg} }

func (e *Error) Error() string { return e.msg }

// Kind is the error's kind.
func (e *Error) Kind() Kind { return e.kind }

// Is reports whether target is the sentinel of e's kind (an out-of-range
// sentinel is also an invalid argument).
func (e *Error) Is(target error) bool {
	if e.kind >= numKinds {
		return false
	}
	if s := sentinels[e.kind]; s != nil && target == error(s) {
		return true
	}
	return e == ErrOutOfRange && target == error(ErrInvalidArgument)
}

// kinded is an error that knows its kind: a sentinel, or a type of its own
// with a Kind method (cuda.Error).
type kinded interface{ Kind() Kind }

// KindOf returns the kind of err: that of the first error in its tree that
// has one, in the order errors.As visits them (err, then what it wraps,
// depth first, the operands of a multiple %w or errors.Join left to right).
// The outermost error decides, so that a wrapper gives its own kind to what
// it wraps (remote.ErrPeerUnavailable, IO, wraps the timeout that revealed
// the peer's silence). KindOf(nil) and an error with no kind in its tree are
// Unknown.
func KindOf(err error) Kind {
	return KindBy(err, nil)
}

// KindBy is KindOf that asks classify for the kind of each error in the
// tree that has none of its own (an adapter's view of errors kvbm did not
// make; nil asks nothing). The outermost error with a kind still decides.
func KindBy(err error, classify func(error) Kind) Kind {
	if err == nil {
		return Unknown
	}
	if k, ok := err.(kinded); ok {
		return k.Kind()
	}
	if classify != nil {
		if k := classify(err); k != Unknown {
			return k
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return KindBy(u.Unwrap(), classify)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if k := KindBy(e, classify); k != Unknown {
				return k
			}
		}
	}
	return Unknown
}

// Detail returns err followed by detail ("err: detail"), wrapping err: the
// form of fmt.Errorf("%w: …", err) for the pure packages, which do without
// fmt (it imports os).
func Detail(err error, detail string) error {
	return &wrapped{err: err, msg: err.Error() + ": " + detail}
}

// Context returns err preceded by context ("context: err"), wrapping err:
// fmt.Errorf("…: %w", err) for the pure packages.
func Context(context string, err error) error {
	return &wrapped{err: err, msg: context + ": " + err.Error()}
}

// wrapped is an error with a message of its own around the error it wraps.
type wrapped struct {
	err error
	msg string
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.err }

package handoff

import "github.com/kvbm/kvbm/kvbmerr"

// Errors returned by this package wrap one of these, with the bad value
// added, so callers can tell them apart with errors.Is. Their kinds are the
// C ABI's status codes.
var (
	// ErrInvalidConfig: NewCoordinator was given an unknown order or a
	// fallback delay that is not a finite number ≥ 0.
	ErrInvalidConfig = kvbmerr.New(kvbmerr.InvalidArgument, "handoff: invalid coordinator config")
	// ErrUnsupportedEngine: the engine cannot take part in a hand-off.
	ErrUnsupportedEngine = kvbmerr.New(kvbmerr.InvalidArgument, "handoff: engine does not support destination handoff")
	// ErrForeignHandoff: a fact names another hand-off than the coordinator's.
	ErrForeignHandoff = kvbmerr.New(kvbmerr.InvalidArgument, "handoff: fact for another handoff")
	// ErrInvalidFact: a fact's kind is not a FactKind.
	ErrInvalidFact = kvbmerr.New(kvbmerr.InvalidArgument, "handoff: invalid fact")
	// ErrFactOutOfOrder: a fact reports something that cannot have happened
	// yet, such as the source holding KV for a prefill never acknowledged.
	ErrFactOutOfOrder = kvbmerr.New(kvbmerr.FailedPrecondition, "handoff: fact out of order")
	// ErrInvalidTiming: a source's TransferTiming is unusable.
	ErrInvalidTiming = kvbmerr.New(kvbmerr.InvalidArgument, "handoff: invalid transfer timing")
	// ErrUnknownAction: an outcome names an action the coordinator did not
	// issue.
	ErrUnknownAction = kvbmerr.New(kvbmerr.NotFound, "handoff: unknown action")
	// ErrConflictingOutcome: an action already has a different outcome.
	ErrConflictingOutcome = kvbmerr.New(kvbmerr.AlreadyExists, "handoff: conflicting outcome")
	// ErrInvalidOutcome: the outcome's kind is unknown or does not fit the
	// action's kind.
	ErrInvalidOutcome = kvbmerr.New(kvbmerr.InvalidArgument, "handoff: invalid outcome")
	// ErrCleanupFailed: a cancel action reported OutcomeFailed. The outcome
	// is not recorded; retry the cancel and report again.
	ErrCleanupFailed = kvbmerr.New(kvbmerr.FailedPrecondition, "handoff: cleanup action failed")
)

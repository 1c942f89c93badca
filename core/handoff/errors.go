package handoff

import "errors"

// Errors returned by this package wrap one of these, with the bad value
// added, so callers can tell them apart with errors.Is. The C ABI maps each
// to a status code.
var (
	// ErrInvalidConfig: NewCoordinator was given an unknown order or a
	// fallback delay that is not a finite number ≥ 0.
	ErrInvalidConfig = errors.New("handoff: invalid coordinator config")
	// ErrUnsupportedEngine: the engine cannot take part in a hand-off.
	ErrUnsupportedEngine = errors.New("handoff: engine does not support destination handoff")
	// ErrForeignHandoff: a fact names another hand-off than the coordinator's.
	ErrForeignHandoff = errors.New("handoff: fact for another handoff")
	// ErrInvalidFact: a fact's kind is not a FactKind.
	ErrInvalidFact = errors.New("handoff: invalid fact")
	// ErrFactOutOfOrder: a fact reports something that cannot have happened
	// yet, such as the source holding KV for a prefill never acknowledged.
	ErrFactOutOfOrder = errors.New("handoff: fact out of order")
	// ErrInvalidTiming: a source's TransferTiming is unusable.
	ErrInvalidTiming = errors.New("handoff: invalid transfer timing")
	// ErrUnknownAction: an outcome names an action the coordinator did not
	// issue.
	ErrUnknownAction = errors.New("handoff: unknown action")
	// ErrConflictingOutcome: an action already has a different outcome.
	ErrConflictingOutcome = errors.New("handoff: conflicting outcome")
	// ErrInvalidOutcome: the outcome's kind is unknown or does not fit the
	// action's kind.
	ErrInvalidOutcome = errors.New("handoff: invalid outcome")
	// ErrCleanupFailed: a cancel action reported OutcomeFailed. The outcome
	// is not recorded; retry the cancel and report again.
	ErrCleanupFailed = errors.New("handoff: cleanup action failed")
)

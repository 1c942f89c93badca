package handoff

import "strconv"

// ActionKind says what an Action asks the driver to do, and so which
// outcomes it may report for it (see Coordinator.Outcome).
//
// The values are stable (see the package documentation).
type ActionKind uint8

const (
	// ActionSubmitPrefill: submit the request's prefill to the source.
	// Report OutcomeSubmitted once it is queued, or OutcomeFailed.
	ActionSubmitPrefill ActionKind = 1
	// ActionReserveDestination: ask the destination to take ownership and
	// reserve blocks. Report OutcomeAccepted once it agreed, or OutcomeFailed;
	// the reservation itself arrives as FactDestinationReserved.
	ActionReserveDestination ActionKind = 2
	// ActionStartTransfer: start moving the KV from source to destination;
	// Action.DelayMs is how long it should take. Report OutcomeScheduled, or
	// OutcomeFailed; the arrival comes as FactTransferCompleted.
	ActionStartTransfer ActionKind = 3
	// ActionActivateDestination: let the destination use the KV it received
	// and go on decoding. Report OutcomeApplied, or OutcomeFailed.
	ActionActivateDestination ActionKind = 4
	// ActionReleaseSource: the destination owns the KV; let the source free
	// it. Report OutcomeApplied or OutcomeNoop (nothing was held), or
	// OutcomeFailed.
	ActionReleaseSource ActionKind = 5
	// ActionCancelSource: abandon the source's side (cancel the prefill, free
	// its KV). Report OutcomeApplied or OutcomeNoop. A cancel cannot fail: an
	// OutcomeFailed is refused with ErrCleanupFailed, so retry the cancel and
	// report again.
	ActionCancelSource ActionKind = 6
	// ActionCancelDestination: abandon the destination's side (drop its
	// reservation). Report OutcomeApplied or OutcomeNoop; as for
	// ActionCancelSource, OutcomeFailed is refused.
	ActionCancelDestination ActionKind = 7
	// ActionComplete: the hand-off is over; Action.Completion says how.
	// Nothing needs reporting; any outcome is ignored.
	ActionComplete ActionKind = 8
)

// maxActions bounds the actions one coordinator issues: each kind at most once.
const maxActions = int(ActionComplete)

// MaxActionsPerCall is the most actions one call of Start, Step or Outcome
// appends: cleanup's CancelSource and CancelDestination. A caller array of
// this many actions is always big enough.
const MaxActionsPerCall = 2

// String returns the kind's name, or ActionKind(n) for an unknown value.
func (k ActionKind) String() string {
	switch k {
	case ActionSubmitPrefill:
		return "SubmitPrefill"
	case ActionReserveDestination:
		return "ReserveDestination"
	case ActionStartTransfer:
		return "StartTransfer"
	case ActionActivateDestination:
		return "ActivateDestination"
	case ActionReleaseSource:
		return "ReleaseSource"
	case ActionCancelSource:
		return "CancelSource"
	case ActionCancelDestination:
		return "CancelDestination"
	case ActionComplete:
		return "Complete"
	}
	return "ActionKind(" + strconv.Itoa(int(k)) + ")"
}

// isCancel reports whether the kind is one of cleanup's cancels, whose
// failure the coordinator cannot act on.
func (k ActionKind) isCancel() bool {
	return k == ActionCancelSource || k == ActionCancelDestination
}

// Completion says how a hand-off ended.
//
// The values are stable (see the package documentation).
type Completion uint8

const (
	// CompletionNone: the hand-off has not ended.
	CompletionNone Completion = 0
	// CompletionSuccess: the destination owns the KV and the source has let
	// go of it.
	CompletionSuccess Completion = 1
	// CompletionCanceled: the hand-off was abandoned and every side that had
	// started was canceled.
	CompletionCanceled Completion = 2
)

// String returns the completion's name, or Completion(n) for an unknown value.
func (c Completion) String() string {
	switch c {
	case CompletionNone:
		return "None"
	case CompletionSuccess:
		return "Success"
	case CompletionCanceled:
		return "Canceled"
	}
	return "Completion(" + strconv.Itoa(int(c)) + ")"
}

// Action is one thing the driver must do. It is a plain value; fields other
// than ID, Kind and Handoff are zero unless the kind says otherwise.
type Action struct {
	// ID names the action when its outcome is reported.
	ID ActionID
	// Kind says what to do.
	Kind ActionKind
	// Handoff is the coordinator's hand-off.
	Handoff HandoffID
	// DelayMs is, for ActionStartTransfer, how long the transfer should take
	// in milliseconds: the source's TransferTiming.DelayMs, or the
	// coordinator's fallback when the timing gives none. Finite and ≥ 0.
	DelayMs float64
	// Completion is, for ActionComplete, how the hand-off ended.
	Completion Completion
}

// String formats the action as its id and kind, followed by the delay of a
// StartTransfer or the completion of a Complete: "3 StartTransfer delay=7.5ms".
func (a Action) String() string {
	s := strconv.FormatUint(uint64(a.ID), 10) + " " + a.Kind.String()
	switch a.Kind {
	case ActionStartTransfer:
		s += " delay=" + strconv.FormatFloat(a.DelayMs, 'g', -1, 64) + "ms"
	case ActionComplete:
		s += " " + a.Completion.String()
	}
	return s
}

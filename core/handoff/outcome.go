package handoff

import (
	"strconv"
)

// OutcomeKind says how the execution of an action went.
//
// The values are stable (see the package documentation).
type OutcomeKind uint8

const (
	// OutcomeSubmitted: the prefill was submitted (ActionSubmitPrefill).
	OutcomeSubmitted OutcomeKind = 1
	// OutcomeAccepted: the destination accepted ownership
	// (ActionReserveDestination).
	OutcomeAccepted OutcomeKind = 2
	// OutcomeScheduled: the transfer was scheduled (ActionStartTransfer).
	OutcomeScheduled OutcomeKind = 3
	// OutcomeApplied: the action took effect (ActionActivateDestination,
	// ActionReleaseSource, ActionCancelSource, ActionCancelDestination).
	OutcomeApplied OutcomeKind = 4
	// OutcomeNoop: there was nothing to do (ActionReleaseSource,
	// ActionCancelSource, ActionCancelDestination).
	OutcomeNoop OutcomeKind = 5
	// OutcomeFailed: the action could not be done; Outcome.Message says why.
	// It begins cleanup, except for a cancel, where it is refused.
	OutcomeFailed OutcomeKind = 6
)

// String returns the kind's name, or OutcomeKind(n) for an unknown value.
func (k OutcomeKind) String() string {
	switch k {
	case OutcomeSubmitted:
		return "Submitted"
	case OutcomeAccepted:
		return "Accepted"
	case OutcomeScheduled:
		return "Scheduled"
	case OutcomeApplied:
		return "Applied"
	case OutcomeNoop:
		return "Noop"
	case OutcomeFailed:
		return "Failed"
	}
	return "OutcomeKind(" + strconv.Itoa(int(k)) + ")"
}

func (k OutcomeKind) valid() bool { return k >= OutcomeSubmitted && k <= OutcomeFailed }

// Outcome is how the execution of one action went.
type Outcome struct {
	// Kind says how it went.
	Kind OutcomeKind
	// Message says why an OutcomeFailed failed. The coordinator only stores
	// it, to tell a repeated report from a conflicting one; it is ignored for
	// other kinds.
	Message string
}

// String returns the kind's name, and for a failure the message: Failed("why").
func (o Outcome) String() string {
	if o.Kind == OutcomeFailed {
		return "Failed(" + strconv.Quote(o.Message) + ")"
	}
	return o.Kind.String()
}

// normalized drops the message of a kind that has none, so that it cannot
// make two equal reports look different.
func (o Outcome) normalized() Outcome {
	if o.Kind != OutcomeFailed {
		o.Message = ""
	}
	return o
}

// accepts reports whether an action of kind k may report an outcome of kind
// o, other than OutcomeFailed, which is decided by isCancel.
func (k ActionKind) accepts(o OutcomeKind) bool {
	switch k {
	case ActionSubmitPrefill:
		return o == OutcomeSubmitted
	case ActionReserveDestination:
		return o == OutcomeAccepted
	case ActionStartTransfer:
		return o == OutcomeScheduled
	case ActionActivateDestination:
		return o == OutcomeApplied
	case ActionReleaseSource, ActionCancelSource, ActionCancelDestination:
		return o == OutcomeApplied || o == OutcomeNoop
	case ActionComplete:
		return true
	}
	return false
}

// wantOutcomes names the outcomes an action of kind k accepts, for errors.
func (k ActionKind) wantOutcomes() string {
	switch k {
	case ActionSubmitPrefill:
		return "Submitted or Failed"
	case ActionReserveDestination:
		return "Accepted or Failed"
	case ActionStartTransfer:
		return "Scheduled or Failed"
	case ActionActivateDestination:
		return "Applied or Failed"
	case ActionReleaseSource:
		return "Applied, Noop or Failed"
	case ActionCancelSource, ActionCancelDestination:
		return "Applied or Noop"
	}
	return "any"
}

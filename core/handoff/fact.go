package handoff

import "strconv"

// FactKind says what a Fact reports.
//
// The values are stable (see the package documentation).
type FactKind uint8

const (
	// FactSourceHeld: the source has run the prefill and holds its KV.
	// Fact.Timing says how long moving it should take. Valid only once
	// SubmitPrefill was acknowledged (OutcomeSubmitted).
	FactSourceHeld FactKind = 1
	// FactDestinationReserved: the destination has reserved blocks for the
	// KV. Fact.TransferableTokens says how many prompt tokens it can take.
	// Valid only once ReserveDestination was accepted (OutcomeAccepted).
	FactDestinationReserved FactKind = 2
	// FactTransferCompleted: the KV has arrived at the destination. Valid only
	// once StartTransfer was scheduled (OutcomeScheduled).
	FactTransferCompleted FactKind = 3
	// FactFailed: something outside the coordinator failed; clean up.
	FactFailed FactKind = 4
	// FactTimedOut: the driver's deadline for the hand-off passed; clean up.
	FactTimedOut FactKind = 5
	// FactCanceled: the request was canceled; clean up.
	FactCanceled FactKind = 6
)

// String returns the kind's name, or FactKind(n) for an unknown value.
func (k FactKind) String() string {
	switch k {
	case FactSourceHeld:
		return "SourceHeld"
	case FactDestinationReserved:
		return "DestinationReserved"
	case FactTransferCompleted:
		return "TransferCompleted"
	case FactFailed:
		return "Failed"
	case FactTimedOut:
		return "TimedOut"
	case FactCanceled:
		return "Canceled"
	}
	return "FactKind(" + strconv.Itoa(int(k)) + ")"
}

func (k FactKind) valid() bool { return k >= FactSourceHeld && k <= FactCanceled }

// Fact is something the driver learned about the world. It is a plain value;
// only the fields of its Kind are read.
type Fact struct {
	// Kind says what happened.
	Kind FactKind
	// Handoff is the hand-off the fact is about. A fact for another hand-off
	// is an error.
	Handoff HandoffID
	// Timing describes the transfer; read for FactSourceHeld.
	Timing TransferTiming
	// TransferableTokens is how many prompt tokens the destination can take;
	// read for FactDestinationReserved.
	TransferableTokens uint64
}

package handoff

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// NormalizedEvent is one step of a hand-off's lifecycle as every engine sees
// it, whatever its own vocabulary. Conformance tests record these from real
// engines and compare them with ExpectedLifecycle.
//
// The values are stable.
type NormalizedEvent uint8

const (
	// EventSourceHeld: the source holds the prefilled KV.
	EventSourceHeld NormalizedEvent = 1
	// EventDestinationAccepted: the destination accepted ownership.
	EventDestinationAccepted NormalizedEvent = 2
	// EventDestinationReserved: the destination reserved blocks.
	EventDestinationReserved NormalizedEvent = 3
	// EventDestinationActivated: the destination began using the KV.
	EventDestinationActivated NormalizedEvent = 4
	// EventSourceReleased: the source let go of the KV.
	EventSourceReleased NormalizedEvent = 5
	// EventCompleted: the hand-off completed.
	EventCompleted NormalizedEvent = 6
)

// String returns the event's name, or NormalizedEvent(n) for an unknown value.
func (e NormalizedEvent) String() string {
	switch e {
	case EventSourceHeld:
		return "SourceHeld"
	case EventDestinationAccepted:
		return "DestinationAccepted"
	case EventDestinationReserved:
		return "DestinationReserved"
	case EventDestinationActivated:
		return "DestinationActivated"
	case EventSourceReleased:
		return "SourceReleased"
	case EventCompleted:
		return "Completed"
	}
	return "NormalizedEvent(" + strconv.Itoa(int(e)) + ")"
}

// The conformance record of a hand-off and the lifecycle it is checked
// against live with the tests: only they use them.

// ErrNonconformant: a Conformance record does not match the normalized
// hand-off.
var ErrNonconformant = errors.New("handoff: nonconformant handoff")

var (
	sourceFirstLifecycle = []NormalizedEvent{
		EventSourceHeld,
		EventDestinationAccepted,
		EventDestinationReserved,
		EventDestinationActivated,
		EventSourceReleased,
		EventCompleted,
	}
	destinationFirstLifecycle = []NormalizedEvent{
		EventDestinationAccepted,
		EventDestinationReserved,
		EventSourceHeld,
		EventDestinationActivated,
		EventSourceReleased,
		EventCompleted,
	}
)

// ExpectedLifecycle returns the events of a successful hand-off in the given
// order, in the order they happen, or nil for an unknown order. The slice is
// the caller's.
func ExpectedLifecycle(order Order) []NormalizedEvent {
	switch order {
	case SourceFirst:
		return slices.Clone(sourceFirstLifecycle)
	case DestinationFirst:
		return slices.Clone(destinationFirstLifecycle)
	}
	return nil
}

// Conformance is what an engine conformance test observed of one hand-off of
// the shared fixture: one request whose prefill produces one output token on
// the source and whose decode produces two on the destination.
type Conformance struct {
	// Engine is the engine under test.
	Engine Engine
	// Order is the order the engine was driven in.
	Order Order
	// Lifecycle is the normalized events, in the order seen.
	Lifecycle []NormalizedEvent
	// SourceOutputTokens is how many tokens the source produced.
	SourceOutputTokens int
	// DestinationOutputTokens is how many tokens the destination produced.
	DestinationOutputTokens int
	// CompletedRequests is how many requests completed.
	CompletedRequests int
	// DestinationStored counts the KV blocks the destination stored, by when.
	DestinationStored StoredTiming
	// SourceDrained says the source held nothing for the request afterwards.
	SourceDrained bool
	// DestinationDrained says the destination held nothing afterwards.
	DestinationDrained bool
	// DriverDrained says the driver held nothing afterwards.
	DriverDrained bool
}

// StoredTiming counts the KV blocks a destination stored, by when they
// became visible to it.
type StoredTiming struct {
	// BeforeActivation counts blocks visible before ActivateDestination; the
	// destination must not see KV it does not own yet.
	BeforeActivation int
	// OnActivation counts blocks that became visible on activation.
	OnActivation int
	// RepeatedActivationHashesAfterActivation counts blocks activated again
	// after activation; KV must be activated once.
	RepeatedActivationHashesAfterActivation int
}

// Validate checks the record against the normalized hand-off: the engine's
// order, the lifecycle for that order, the fixture's counts (1 source token,
// 2 destination tokens, 1 completed request), KV visible only from
// activation and exactly once, and every party drained. The error wraps
// ErrUnsupportedEngine for an engine without hand-off and ErrNonconformant
// otherwise, naming what differs.
func (c Conformance) Validate() error {
	want, err := OrderFor(c.Engine)
	if err != nil {
		return err
	}
	if c.Order != want {
		return fmt.Errorf("%w: %s hands off %s, got %s", ErrNonconformant, c.Engine, want, c.Order)
	}
	if !slices.Equal(c.Lifecycle, ExpectedLifecycle(c.Order)) {
		return fmt.Errorf("%w: lifecycle %v, want %v", ErrNonconformant, c.Lifecycle, ExpectedLifecycle(c.Order))
	}
	if c.SourceOutputTokens != 1 || c.DestinationOutputTokens != 2 || c.CompletedRequests != 1 {
		return fmt.Errorf("%w: source output tokens %d, destination output tokens %d, completed requests %d; want 1, 2, 1",
			ErrNonconformant, c.SourceOutputTokens, c.DestinationOutputTokens, c.CompletedRequests)
	}
	s := c.DestinationStored
	if s.BeforeActivation != 0 || s.OnActivation == 0 || s.RepeatedActivationHashesAfterActivation != 0 {
		return fmt.Errorf("%w: destination stored %d blocks before activation, %d on activation, %d repeated after; want 0, > 0, 0",
			ErrNonconformant, s.BeforeActivation, s.OnActivation, s.RepeatedActivationHashesAfterActivation)
	}
	if !c.SourceDrained || !c.DestinationDrained || !c.DriverDrained {
		return fmt.Errorf("%w: not drained: source %t, destination %t, driver %t",
			ErrNonconformant, c.SourceDrained, c.DestinationDrained, c.DriverDrained)
	}
	return nil
}

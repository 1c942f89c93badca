package handoff

import "fmt"

// happyInput is one input of a successful hand-off: a fact, or the success
// outcome of the action of a kind. event is the normalized lifecycle event
// the input stands for, if any.
type happyInput struct {
	fact    FactKind
	action  ActionKind
	outcome OutcomeKind
	event   NormalizedEvent
}

// happyPaths are the inputs of a successful hand-off after Start, per order.
var happyPaths = map[Order][]happyInput{
	SourceFirst: {
		{action: ActionSubmitPrefill, outcome: OutcomeSubmitted},
		{fact: FactSourceHeld, event: EventSourceHeld},
		{action: ActionReserveDestination, outcome: OutcomeAccepted, event: EventDestinationAccepted},
		{fact: FactDestinationReserved, event: EventDestinationReserved},
		{action: ActionStartTransfer, outcome: OutcomeScheduled},
		{fact: FactTransferCompleted},
		{action: ActionActivateDestination, outcome: OutcomeApplied, event: EventDestinationActivated},
		{action: ActionReleaseSource, outcome: OutcomeApplied, event: EventSourceReleased},
	},
	DestinationFirst: {
		{action: ActionReserveDestination, outcome: OutcomeAccepted, event: EventDestinationAccepted},
		{fact: FactDestinationReserved, event: EventDestinationReserved},
		{action: ActionSubmitPrefill, outcome: OutcomeSubmitted},
		{fact: FactSourceHeld, event: EventSourceHeld},
		{action: ActionStartTransfer, outcome: OutcomeScheduled},
		{fact: FactTransferCompleted},
		{action: ActionActivateDestination, outcome: OutcomeApplied, event: EventDestinationActivated},
		{action: ActionReleaseSource, outcome: OutcomeApplied, event: EventSourceReleased},
	},
}

// benchTiming is a 1000-token prompt of 128 KiB a token over 25 GB/s.
var benchTiming = TransferTiming{
	Mode: TimingFullPrompt, FullPromptTokens: 1000,
	KVBytesPerToken: 131072, HasKVBytesPerToken: true,
	BandwidthGBs: 25, HasBandwidthGBs: true,
}

// runHappyPath drives c through a successful hand-off, reusing buf for every
// call so that it allocates nothing, and returns the number of calls made.
// events, when not nil, receives the normalized lifecycle.
func runHappyPath(c *Coordinator, order Order, buf []Action, events *[]NormalizedEvent) (int, error) {
	var ids [maxActions + 1]ActionID
	note := func(out []Action) {
		for _, a := range out {
			ids[a.Kind] = a.ID
			if a.Kind == ActionComplete && events != nil {
				*events = append(*events, EventCompleted)
			}
		}
	}
	note(c.Start(buf[:0]))
	steps := 1
	for _, in := range happyPaths[order] {
		var out []Action
		var err error
		if in.fact != 0 {
			out, err = c.Step(Fact{Kind: in.fact, Handoff: c.id, Timing: benchTiming, TransferableTokens: 600}, buf[:0])
		} else {
			out, err = c.Outcome(ids[in.action], Outcome{Kind: in.outcome}, buf[:0])
		}
		if err != nil {
			return steps, err
		}
		steps++
		if in.event != 0 && events != nil {
			*events = append(*events, in.event)
		}
		note(out)
	}
	if c.Completion() != CompletionSuccess {
		return steps, fmt.Errorf("happy path ended with completion %s", c.Completion())
	}
	return steps, nil
}

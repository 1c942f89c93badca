package handoff

import (
	"math"
	"strconv"

	"github.com/kvbm/kvbm/kvbmerr"
)

// mode is the coordinator's phase. Each mode has its own step and advance
// functions, as each raft state has its own step function.
type mode uint8

const (
	modeActive     mode = iota // moving ownership forward
	modeCleaningUp             // canceling the sides that started
	modeComplete               // over; everything is ignored
)

func (m mode) String() string {
	switch m {
	case modeActive:
		return "active"
	case modeCleaningUp:
		return "cleaning-up"
	case modeComplete:
		return "complete"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// stepFunc applies a fact in one mode. The fact's handoff and kind are
// already checked.
type stepFunc func(c *Coordinator, f Fact, out []Action) ([]Action, error)

// advanceFunc appends the actions that the coordinator's progress now allows
// in one mode.
type advanceFunc func(c *Coordinator, out []Action) []Action

// Coordinator sequences one hand-off. Make it with NewCoordinator, then drive
// it as the package documentation describes: Start, then Step and Outcome
// until an ActionComplete comes back.
type Coordinator struct {
	id              HandoffID
	order           Order
	fallbackDelayMs float64

	mode    mode
	step    stepFunc
	advance advanceFunc

	started     bool
	journal     journal
	source      sourceProgress
	destination destinationProgress
	transfer    transferProgress
	completion  Completion
}

// sourceProgress is what the coordinator knows of the prefill side.
type sourceProgress struct {
	submitIssued  bool
	submitted     bool // SubmitPrefill reported Submitted
	held          bool // FactSourceHeld arrived
	timing        TransferTiming
	releaseIssued bool
	cancelIssued  bool
	cleanedUp     bool // ReleaseSource or CancelSource reported Applied or Noop
}

// destinationProgress is what the coordinator knows of the decode side.
type destinationProgress struct {
	reserveIssued      bool
	accepted           bool // ReserveDestination reported Accepted
	reserved           bool // FactDestinationReserved arrived
	transferableTokens uint64
	activationIssued   bool
	activated          bool // ActivateDestination reported Applied
	cancelIssued       bool
	cleanedUp          bool // CancelDestination reported Applied or Noop
}

// transferProgress is what the coordinator knows of the KV transfer.
type transferProgress struct {
	issued    bool
	scheduled bool // StartTransfer reported Scheduled
	completed bool // FactTransferCompleted arrived
}

// NewCoordinator returns a coordinator for hand-off id in the given order.
// fallbackDelayMs is the StartTransfer delay used when the source's
// TransferTiming gives none; it must be finite and ≥ 0. The error wraps
// ErrInvalidConfig and names the bad value.
func NewCoordinator(id HandoffID, order Order, fallbackDelayMs float64) (*Coordinator, error) {
	if err := checkConfig(order, fallbackDelayMs); err != nil {
		return nil, err
	}
	c := &Coordinator{id: id, order: order, fallbackDelayMs: fallbackDelayMs}
	c.becomeActive()
	return c, nil
}

func checkConfig(order Order, fallbackDelayMs float64) error {
	if !order.valid() {
		return kvbmerr.Detail(ErrInvalidConfig, "order "+order.String())
	}
	if math.IsNaN(fallbackDelayMs) || math.IsInf(fallbackDelayMs, 0) || fallbackDelayMs < 0 {
		return kvbmerr.Detail(ErrInvalidConfig, "fallback transfer delay "+formatFloat(fallbackDelayMs)+" ms, want finite and >= 0")
	}
	return nil
}

func (c *Coordinator) becomeActive() {
	c.mode = modeActive
	c.step = stepActive
	c.advance = advanceActive
}

func (c *Coordinator) becomeCleaningUp() {
	c.mode = modeCleaningUp
	c.step = stepIgnore
	c.advance = advanceCleanup
}

func (c *Coordinator) becomeComplete() {
	c.mode = modeComplete
	c.step = stepIgnore
	c.advance = advanceNothing
}

// Start appends the hand-off's first action to out and returns the extended
// slice: ActionSubmitPrefill for SourceFirst, ActionReserveDestination for
// DestinationFirst. A second Start, or a Start after cleanup began (a
// terminal fact arrived first), appends nothing.
func (c *Coordinator) Start(out []Action) []Action {
	if c.started || c.mode != modeActive {
		c.started = true
		return out
	}
	c.started = true
	if c.order == SourceFirst {
		return c.issueSubmitPrefill(out)
	}
	return c.issueReserveDestination(out)
}

// Step applies fact f and appends the actions it allows to out, returning
// the extended slice. A repeated fact (the first one wins) and any valid fact
// once cleanup has begun append nothing; FactFailed, FactTimedOut and FactCanceled
// begin cleanup.
//
// The error wraps ErrForeignHandoff when f is for another hand-off,
// ErrInvalidFact for an unknown kind, ErrFactOutOfOrder when f reports what
// cannot have happened yet (the source held before SubmitPrefill was
// acknowledged, the destination reserved before ReserveDestination was
// accepted, the transfer completed before StartTransfer was scheduled) and
// ErrInvalidTiming when FactSourceHeld carries a timing that fails
// TransferTiming.Validate. On error, out is returned as given and the
// coordinator is unchanged.
func (c *Coordinator) Step(f Fact, out []Action) ([]Action, error) {
	if f.Handoff != c.id {
		return out, kvbmerr.Detail(ErrForeignHandoff, f.Kind.String()+" for "+f.Handoff.String()+", coordinator is for "+c.id.String())
	}
	if !f.Kind.valid() {
		return out, kvbmerr.Detail(ErrInvalidFact, "kind "+f.Kind.String())
	}
	return c.step(c, f, out)
}

// Outcome records how action id went and appends the actions that allows to
// out, returning the extended slice. Reporting the outcome already recorded
// appends nothing; OutcomeFailed for any action but a cancel begins cleanup.
// Once the hand-off is complete every outcome appends nothing.
//
// The error wraps ErrUnknownAction when id was not issued,
// ErrConflictingOutcome when the action already has a different outcome,
// ErrInvalidOutcome when o's kind is unknown or not one the action's kind
// accepts (see ActionKind), and ErrCleanupFailed for OutcomeFailed of a
// cancel. On error, out is returned as given and nothing is recorded, so the
// right outcome can still be reported.
func (c *Coordinator) Outcome(id ActionID, o Outcome, out []Action) ([]Action, error) {
	if c.mode == modeComplete {
		// This is also where any outcome of the ActionComplete lands.
		return out, nil
	}
	e, ok := c.journal.lookup(id)
	if !ok {
		return out, kvbmerr.Detail(ErrUnknownAction, "id "+strconv.FormatUint(uint64(id), 10))
	}
	o = o.normalized()
	if e.reported {
		if e.outcome == o {
			return out, nil
		}
		return out, kvbmerr.Detail(ErrConflictingOutcome, "action "+strconv.FormatUint(uint64(id), 10)+" ("+e.kind.String()+") reported "+e.outcome.String()+", now "+o.String())
	}
	if err := checkOutcome(id, e.kind, o); err != nil {
		return out, err
	}
	e.reported, e.outcome = true, o
	if o.Kind == OutcomeFailed {
		return c.beginCleanup(out), nil
	}
	c.record(e.kind)
	return c.advance(c, out), nil
}

// checkOutcome decides, before anything is recorded, whether an action of
// kind k may report o.
func checkOutcome(id ActionID, k ActionKind, o Outcome) error {
	switch {
	case !o.Kind.valid():
		return kvbmerr.Detail(ErrInvalidOutcome, "kind "+o.Kind.String()+" for action "+strconv.FormatUint(uint64(id), 10)+" ("+k.String()+")")
	case o.Kind == OutcomeFailed && k.isCancel():
		return kvbmerr.Detail(ErrCleanupFailed, "action "+strconv.FormatUint(uint64(id), 10)+" ("+k.String()+"): "+strconv.Quote(o.Message))
	case o.Kind == OutcomeFailed || k.accepts(o.Kind):
		return nil
	}
	return kvbmerr.Detail(ErrInvalidOutcome, o.String()+" for action "+strconv.FormatUint(uint64(id), 10)+" ("+k.String()+"), want "+k.wantOutcomes())
}

// record notes the progress a successful outcome of an action of kind k
// makes.
func (c *Coordinator) record(k ActionKind) {
	switch k {
	case ActionSubmitPrefill:
		c.source.submitted = true
	case ActionReserveDestination:
		c.destination.accepted = true
	case ActionStartTransfer:
		c.transfer.scheduled = true
	case ActionActivateDestination:
		c.destination.activated = true
	case ActionReleaseSource, ActionCancelSource:
		c.source.cleanedUp = true
	case ActionCancelDestination:
		c.destination.cleanedUp = true
	}
}

// IsComplete reports whether the hand-off is over: an ActionComplete was
// issued.
func (c *Coordinator) IsComplete() bool { return c.mode == modeComplete }

// Completion returns how the hand-off ended, or CompletionNone while it has
// not.
func (c *Coordinator) Completion() Completion { return c.completion }

// issue appends a new action of kind k to out.
func (c *Coordinator) issue(out []Action, k ActionKind) []Action {
	return append(out, Action{ID: c.journal.issue(k), Kind: k, Handoff: c.id})
}

func (c *Coordinator) issueSubmitPrefill(out []Action) []Action {
	c.source.submitIssued = true
	return c.issue(out, ActionSubmitPrefill)
}

func (c *Coordinator) issueReserveDestination(out []Action) []Action {
	c.destination.reserveIssued = true
	return c.issue(out, ActionReserveDestination)
}

// complete ends the hand-off: Success when it got there from the active
// mode, Canceled from cleanup. It appends the ActionComplete and forgets the
// journal.
func (c *Coordinator) complete(out []Action) []Action {
	c.completion = CompletionSuccess
	if c.mode == modeCleaningUp {
		c.completion = CompletionCanceled
	}
	out = c.issue(out, ActionComplete)
	out[len(out)-1].Completion = c.completion
	c.becomeComplete()
	c.journal.clear()
	return out
}

// stepIgnore is the step function of every mode but the active one: once
// cleanup has begun, no fact changes what must be done.
func stepIgnore(_ *Coordinator, _ Fact, out []Action) ([]Action, error) { return out, nil }

// advanceNothing is the advance function of the complete mode.
func advanceNothing(_ *Coordinator, out []Action) []Action { return out }

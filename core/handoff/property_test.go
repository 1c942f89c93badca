package handoff

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRandomDrives drives coordinators with random sequences of starts,
// facts and outcomes — mostly plausible ones, some wrong — and checks the
// invariants after every call. Each run then plays a well-behaved driver
// that cancels and answers every outstanding action, which must always end
// the hand-off. A failure names the run's seed and its inputs.
func TestRandomDrives(t *testing.T) {
	const runs = 3000
	seeds := rand.New(rand.NewPCG(0x6b76626d, 3))
	var success, canceled, unfinished int
	for range runs {
		seed := seeds.Uint64()
		o := newObserver(t, seed)
		o.drive(60)
		switch o.completion {
		case CompletionSuccess:
			success++
		case CompletionCanceled:
			canceled++
		default:
			unfinished++
		}
		o.finish()
	}
	// The generator must reach every ending, or the invariants prove little.
	require.Positive(t, success, "no random run completed successfully")
	require.Positive(t, canceled, "no random run was canceled")
	require.Positive(t, unfinished, "every random run finished on its own")
	t.Logf("%d runs: %d succeeded, %d canceled, %d left for the cleanup phase", runs, success, canceled, unfinished)
}

// observer drives one coordinator and checks every answer against what it
// has seen so far.
type observer struct {
	t     *testing.T
	seed  uint64
	rng   *rand.Rand
	id    HandoffID
	order Order
	c     *Coordinator
	log   []logEntry // the inputs so far, for failure messages

	terminalPct, failedPct int // how chaotic this run is

	lastID     ActionID
	issued     map[ActionKind]ActionID
	kinds      []ActionKind         // issued kinds in order
	ids        []ActionID           // issued ids in order
	recorded   map[ActionID]Outcome // outcomes the coordinator took
	happy      map[ActionKind]bool  // actions that reported their success outcome
	facts      map[FactKind]bool    // progress facts the coordinator took
	cleanup    bool                 // a terminal fact or a failure was taken
	completes  int
	completion Completion
}

func newObserver(t *testing.T, seed uint64) *observer {
	rng := rand.New(rand.NewPCG(seed, seed>>7))
	o := &observer{
		t: t, seed: seed, rng: rng,
		id:       testHandoffID(rng.Uint64()),
		order:    []Order{SourceFirst, DestinationFirst}[rng.IntN(2)],
		issued:   map[ActionKind]ActionID{},
		recorded: map[ActionID]Outcome{},
		happy:    map[ActionKind]bool{},
		facts:    map[FactKind]bool{},
	}
	o.terminalPct = []int{0, 2, 10}[rng.IntN(3)]
	o.failedPct = []int{0, 3, 10}[rng.IntN(3)]
	c, err := NewCoordinator(o.id, o.order, float64(rng.IntN(10)))
	require.NoError(t, err)
	o.c = c
	return o
}

func (o *observer) fail(format string, args ...any) {
	o.t.Helper()
	var b strings.Builder
	for _, e := range o.log {
		b.WriteString("\n  " + e.String())
	}
	o.t.Fatalf("seed %#x, %s, inputs:%s\n%s", o.seed, o.order, b.String(), fmt.Sprintf(format, args...))
}

// logEntry is one input and what came back, formatted only on failure.
type logEntry struct {
	what    string // "start", "fact" or "outcome"
	fact    Fact
	id      ActionID
	outcome Outcome
	actions []Action
	err     error
}

func (e logEntry) String() string {
	s := e.what
	switch e.what {
	case "fact":
		s += fmt.Sprintf(" %s %s %+v transferable=%d", e.fact.Kind, e.fact.Handoff, e.fact.Timing, e.fact.TransferableTokens)
	case "outcome":
		s += fmt.Sprintf(" %d %s", e.id, e.outcome)
	}
	for _, a := range e.actions {
		s += "\n    -> " + a.String()
	}
	if e.err != nil {
		s += "\n    -> error: " + e.err.Error()
	}
	return s
}

// drive feeds up to n random inputs.
func (o *observer) drive(n int) {
	for range n {
		switch r := o.rng.IntN(100); {
		case r < 8:
			o.start()
		case r < 50:
			o.fact(o.randomFact())
		default:
			id, out := o.randomOutcome()
			o.outcome(id, out)
		}
	}
}

// finish plays a well-behaved driver: cancel the hand-off, then answer each
// outstanding action with an outcome its kind accepts, until it completes.
func (o *observer) finish() {
	o.fact(Fact{Kind: FactCanceled, Handoff: o.id})
	for range 2 * maxActions {
		if o.c.IsComplete() {
			break
		}
		for i, id := range o.ids {
			if _, ok := o.recorded[id]; !ok && o.kinds[i] != ActionComplete {
				o.outcome(id, Outcome{Kind: goodOutcome(o.kinds[i])})
			}
		}
	}
	if !o.c.IsComplete() || o.completes != 1 {
		o.fail("a well-behaved cleanup did not complete: complete=%t, %d Complete actions", o.c.IsComplete(), o.completes)
	}
}

func goodOutcome(k ActionKind) OutcomeKind {
	switch k {
	case ActionSubmitPrefill:
		return OutcomeSubmitted
	case ActionReserveDestination:
		return OutcomeAccepted
	case ActionStartTransfer:
		return OutcomeScheduled
	}
	return OutcomeApplied
}

func (o *observer) randomFact() Fact {
	f := Fact{Handoff: o.id, TransferableTokens: o.rng.Uint64N(4096)}
	switch r := o.rng.IntN(100); {
	case r < 28:
		f.Kind = FactSourceHeld
	case r < 56:
		f.Kind = FactDestinationReserved
	case r < 84:
		f.Kind = FactTransferCompleted
	case r < 84+o.terminalPct:
		f.Kind = []FactKind{FactFailed, FactTimedOut, FactCanceled}[o.rng.IntN(3)]
	case r < 86+o.terminalPct:
		f.Kind = FactKind(o.rng.IntN(9)) // sometimes not a kind
	default:
		f.Kind = FactCanceled
		f.Handoff = testHandoffID(o.rng.Uint64())
	}
	f.Timing = TransferTiming{
		Mode:               TimingMode(1 + o.rng.IntN(2)),
		FullPromptTokens:   o.rng.Uint64N(4096),
		KVBytesPerToken:    o.rng.Uint64N(1 << 20),
		HasKVBytesPerToken: o.rng.IntN(4) > 0,
		BandwidthGBs:       []float64{0, 1, 25, 400, -1, math.NaN(), math.Inf(1)}[o.rng.IntN(7)],
		HasBandwidthGBs:    o.rng.IntN(4) > 0,
	}
	if o.rng.IntN(20) == 0 {
		f.Timing.Mode = 0
	}
	return f
}

func (o *observer) randomOutcome() (ActionID, Outcome) {
	if len(o.ids) == 0 || o.rng.IntN(20) == 0 {
		return ActionID(o.rng.Uint64N(12)), Outcome{Kind: OutcomeKind(o.rng.IntN(8))}
	}
	i := o.rng.IntN(len(o.ids))
	switch r := o.rng.IntN(100); {
	case r < 100-o.failedPct-5:
		k := goodOutcome(o.kinds[i])
		if k == OutcomeApplied && o.kinds[i] != ActionActivateDestination && o.rng.IntN(2) == 0 {
			k = OutcomeNoop
		}
		return o.ids[i], Outcome{Kind: k}
	case r < 100-5:
		return o.ids[i], Outcome{Kind: OutcomeFailed, Message: []string{"a", "b"}[o.rng.IntN(2)]}
	default:
		return o.ids[i], Outcome{Kind: OutcomeKind(o.rng.IntN(8))}
	}
}

// prefix is what every call is given to append to: the coordinator must
// leave it alone.
var prefix = Action{ID: math.MaxUint64, Kind: ActionKind(200)}

func (o *observer) start() {
	o.log = append(o.log, logEntry{what: "start"})
	o.check(o.c.Start([]Action{prefix}), nil)
}

func (o *observer) fact(f Fact) {
	o.log = append(o.log, logEntry{what: "fact", fact: f})
	wasComplete := o.c.IsComplete()
	before := snapshot(o.c)
	out, err := o.c.Step(f, []Action{prefix})
	o.unchangedOnError(before, err)
	if err == nil && !wasComplete && f.Handoff == o.id {
		switch f.Kind {
		case FactSourceHeld, FactDestinationReserved, FactTransferCompleted:
			if !o.cleanup {
				o.facts[f.Kind] = true
			}
		default:
			o.cleanup = true
		}
	}
	if f.Handoff != o.id && err == nil {
		o.fail("a fact for another hand-off was taken")
	}
	o.check(out, err)
}

func (o *observer) outcome(id ActionID, oc Outcome) {
	o.log = append(o.log, logEntry{what: "outcome", id: id, outcome: oc})
	wasComplete := o.c.IsComplete()
	before := snapshot(o.c)
	out, err := o.c.Outcome(id, oc, []Action{prefix})
	o.unchangedOnError(before, err)
	if err == nil && !wasComplete {
		i := slices.Index(o.ids, id)
		if i < 0 {
			o.fail("an outcome for unknown action %d was taken", id)
		}
		k := o.kinds[i]
		if prev, ok := o.recorded[id]; ok && prev != oc.normalized() {
			o.fail("action %d took %s after %s", id, oc, prev)
		}
		o.recorded[id] = oc.normalized()
		if oc.Kind == OutcomeFailed {
			if k.isCancel() {
				o.fail("a failed %s was taken", k)
			}
			o.cleanup = true
		} else if !o.cleanup {
			o.happy[k] = true
		}
	}
	o.check(out, err)
}

// snapshot copies the coordinator's state, leaving out the per-mode
// functions, which the mode determines.
func snapshot(c *Coordinator) Coordinator {
	s := *c
	s.step, s.advance = nil, nil
	if math.IsNaN(s.source.timing.BandwidthGBs) {
		// An unknown bandwidth may be NaN, which DeepEqual never finds equal.
		s.source.timing.BandwidthGBs = -42
	}
	return s
}

// unchangedOnError verifies that a refused input changed nothing.
func (o *observer) unchangedOnError(before Coordinator, err error) {
	if err != nil && !reflect.DeepEqual(before, snapshot(o.c)) {
		o.fail("%v changed the coordinator:\n%+v\n%+v", err, before, snapshot(o.c))
	}
}

// check verifies the invariants on what one call returned.
func (o *observer) check(out []Action, err error) {
	if len(out) == 0 || out[0] != prefix {
		o.fail("the caller's slice was not kept: %v", out)
	}
	got := out[1:]
	last := &o.log[len(o.log)-1]
	last.actions, last.err = slices.Clone(got), err
	if err != nil && len(got) > 0 {
		o.fail("an error (%v) came with actions %v", err, got)
	}
	if len(got) > MaxActionsPerCall || (len(got) == 2 && (got[0].Kind != ActionCancelSource || got[1].Kind != ActionCancelDestination)) {
		o.fail("too many actions in one call: %v", got)
	}
	for _, a := range got {
		if o.completes > 0 {
			o.fail("action %s after Complete", a)
		}
		if a.ID != o.lastID+1 {
			o.fail("action %s: want id %d", a, o.lastID+1)
		}
		o.lastID = a.ID
		if a.Handoff != o.id {
			o.fail("action %s for hand-off %s", a, a.Handoff)
		}
		if _, ok := o.issued[a.Kind]; ok {
			o.fail("%s issued twice", a.Kind)
		}
		o.issued[a.Kind] = a.ID
		o.kinds = append(o.kinds, a.Kind)
		o.ids = append(o.ids, a.ID)
		switch a.Kind {
		case ActionCancelSource:
			if _, ok := o.issued[ActionSubmitPrefill]; !ok {
				o.fail("CancelSource for a source that never started")
			}
		case ActionCancelDestination:
			if _, ok := o.issued[ActionReserveDestination]; !ok {
				o.fail("CancelDestination for a destination that never started")
			}
		case ActionStartTransfer:
			if math.IsNaN(a.DelayMs) || math.IsInf(a.DelayMs, 0) || a.DelayMs < 0 {
				o.fail("StartTransfer delay %v", a.DelayMs)
			}
		case ActionComplete:
			o.completes++
			o.completion = a.Completion
			o.checkCompletion(a)
		}
	}
	if o.c.IsComplete() != (o.completes == 1) || o.c.Completion() != o.completion {
		o.fail("IsComplete %t and Completion %s, after %d Complete actions (%s)",
			o.c.IsComplete(), o.c.Completion(), o.completes, o.completion)
	}
}

// checkCompletion verifies that Success is reached only along the full happy
// path, and that a hand-off that began cleanup ends Canceled.
func (o *observer) checkCompletion(a Action) {
	switch a.Completion {
	case CompletionSuccess:
		want := []ActionKind{ActionSubmitPrefill, ActionReserveDestination}
		if o.order == DestinationFirst {
			want[0], want[1] = want[1], want[0]
		}
		want = append(want, ActionStartTransfer, ActionActivateDestination, ActionReleaseSource, ActionComplete)
		if !slices.Equal(o.kinds, want) {
			o.fail("Success after actions %v, want %v", o.kinds, want)
		}
		if o.cleanup {
			o.fail("Success after cleanup began")
		}
		for _, k := range want[:len(want)-1] {
			if !o.happy[k] {
				o.fail("Success without %s succeeding", k)
			}
		}
		for _, f := range []FactKind{FactSourceHeld, FactDestinationReserved, FactTransferCompleted} {
			if !o.facts[f] {
				o.fail("Success without %s", f)
			}
		}
	case CompletionCanceled:
		if !o.cleanup {
			o.fail("Canceled without a terminal fact or a failure")
		}
	default:
		o.fail("Complete with completion %s", a.Completion)
	}
}

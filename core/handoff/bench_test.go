package handoff

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkHandoff runs full successful hand-offs: one op is one hand-off of
// 9 calls (Start, 3 facts, 5 outcomes), writing actions into one reused
// buffer. Coordinators are made with the timer stopped, so allocs/op counts
// the calls only and must be 0; ns/step is the cost of one call.
// BenchmarkNewCoordinator measures making one.
func BenchmarkHandoff(b *testing.B) {
	for _, order := range []Order{SourceFirst, DestinationFirst} {
		b.Run(order.String(), func(b *testing.B) {
			buf := make([]Action, 0, MaxActionsPerCall)
			const batch = 1024
			pool := make([]*Coordinator, 0, batch)
			steps := 0
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if i%batch == 0 {
					b.StopTimer()
					pool = pool[:0]
					for range batch {
						c, err := NewCoordinator(testHandoffID(1), order, 0)
						if err != nil {
							b.Fatal(err)
						}
						pool = append(pool, c)
					}
					b.StartTimer()
				}
				n, err := runHappyPath(pool[i%batch], order, buf, nil)
				if err != nil {
					b.Fatal(err)
				}
				steps += n
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(steps), "ns/step")
			b.ReportMetric(float64(steps)/b.Elapsed().Seconds(), "steps/s")
		})
	}
}

func BenchmarkNewCoordinator(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewCoordinator(testHandoffID(1), SourceFirst, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// runCleanup drives c through a hand-off whose reservation fails, and
// returns an error if it does not end Canceled.
func runCleanup(c *Coordinator, buf []Action) error {
	out := c.Start(buf[:0])
	out, err := c.Outcome(out[0].ID, Outcome{Kind: OutcomeSubmitted}, out[:0])
	if err == nil {
		out, err = c.Step(Fact{Kind: FactSourceHeld, Handoff: c.id, Timing: benchTiming}, out[:0])
	}
	if err == nil {
		out, err = c.Outcome(out[0].ID, Outcome{Kind: OutcomeFailed, Message: "no room"}, out[:0])
	}
	if err == nil {
		second := out[1].ID
		if out, err = c.Outcome(out[0].ID, Outcome{Kind: OutcomeApplied}, out[:0]); err == nil {
			_, err = c.Outcome(second, Outcome{Kind: OutcomeNoop}, out[:0])
		}
	}
	if err != nil {
		return err
	}
	if c.Completion() != CompletionCanceled {
		return fmt.Errorf("cleanup ended with completion %s", c.Completion())
	}
	return nil
}

// Facts and outcomes allocate nothing when the caller's slice has room, on
// the happy path and in cleanup: the C ABI calls them once per event of
// every hand-off.
func TestStepsDoNotAllocate(t *testing.T) {
	for _, order := range []Order{SourceFirst, DestinationFirst} {
		const runs = 100
		pool := make([]*Coordinator, runs+1) // AllocsPerRun runs once more to warm up
		for i := range pool {
			c, err := NewCoordinator(testHandoffID(1), order, 0)
			require.NoError(t, err)
			pool[i] = c
		}
		buf := make([]Action, 0, MaxActionsPerCall)
		i := 0
		allocs := testing.AllocsPerRun(runs, func() {
			if _, err := runHappyPath(pool[i], order, buf, nil); err != nil {
				panic(err)
			}
			i++
		})
		require.Zero(t, allocs, order.String())
	}

	const runs = 100
	pool := make([]*Coordinator, runs+1)
	for i := range pool {
		c, err := NewCoordinator(testHandoffID(1), SourceFirst, 0)
		require.NoError(t, err)
		pool[i] = c
	}
	buf := make([]Action, 0, MaxActionsPerCall)
	i := 0
	allocs := testing.AllocsPerRun(runs, func() {
		if err := runCleanup(pool[i], buf); err != nil {
			panic(err)
		}
		i++
	})
	require.Zero(t, allocs, "cleanup")
}

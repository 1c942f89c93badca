package handoff

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The coordinator's happy path, read as normalized events, is the expected
// lifecycle of its order.
func TestHappyPathFollowsExpectedLifecycle(t *testing.T) {
	for _, order := range []Order{SourceFirst, DestinationFirst} {
		t.Run(order.String(), func(t *testing.T) {
			c, err := NewCoordinator(testHandoffID(1), order, 0)
			require.NoError(t, err)
			var events []NormalizedEvent
			_, err = runHappyPath(c, order, make([]Action, 0, 2), &events)
			require.NoError(t, err)
			require.Equal(t, ExpectedLifecycle(order), events)
		})
	}
}

func TestExpectedLifecycle(t *testing.T) {
	require.Equal(t, []NormalizedEvent{
		EventSourceHeld, EventDestinationAccepted, EventDestinationReserved,
		EventDestinationActivated, EventSourceReleased, EventCompleted,
	}, ExpectedLifecycle(SourceFirst))
	require.Equal(t, []NormalizedEvent{
		EventDestinationAccepted, EventDestinationReserved, EventSourceHeld,
		EventDestinationActivated, EventSourceReleased, EventCompleted,
	}, ExpectedLifecycle(DestinationFirst))
	require.Nil(t, ExpectedLifecycle(0))

	// The slice is the caller's: changing it changes nothing here.
	l := ExpectedLifecycle(SourceFirst)
	l[0] = EventCompleted
	require.Equal(t, EventSourceHeld, ExpectedLifecycle(SourceFirst)[0])
}

func TestOrderFor(t *testing.T) {
	o, err := OrderFor(EngineVLLM)
	require.NoError(t, err)
	require.Equal(t, SourceFirst, o)
	o, err = OrderFor(EngineSGLang)
	require.NoError(t, err)
	require.Equal(t, DestinationFirst, o)
	_, err = OrderFor(EngineTRTLLM)
	require.ErrorIs(t, err, ErrUnsupportedEngine)
	require.EqualError(t, err, "handoff: engine does not support destination handoff: TRT-LLM")
	_, err = OrderFor(0)
	require.ErrorIs(t, err, ErrUnsupportedEngine)
}

func conformant(engine Engine) Conformance {
	order, _ := OrderFor(engine)
	return Conformance{
		Engine:                  engine,
		Order:                   order,
		Lifecycle:               ExpectedLifecycle(order),
		SourceOutputTokens:      1,
		DestinationOutputTokens: 2,
		CompletedRequests:       1,
		DestinationStored:       StoredTiming{OnActivation: 4},
		SourceDrained:           true,
		DestinationDrained:      true,
		DriverDrained:           true,
	}
}

func TestConformanceValidate(t *testing.T) {
	require.NoError(t, conformant(EngineVLLM).Validate())
	require.NoError(t, conformant(EngineSGLang).Validate())

	for _, tc := range []struct {
		name   string
		engine Engine
		change func(*Conformance)
		want   string
	}{
		{"TRT-LLM", EngineTRTLLM, func(*Conformance) {}, "handoff: engine does not support destination handoff: TRT-LLM"},
		{"order", EngineVLLM, func(c *Conformance) { c.Order = DestinationFirst },
			"handoff: nonconformant handoff: vLLM hands off SourceFirst, got DestinationFirst"},
		{"lifecycle", EngineSGLang, func(c *Conformance) { c.Lifecycle = ExpectedLifecycle(SourceFirst) },
			"handoff: nonconformant handoff: lifecycle [SourceHeld DestinationAccepted DestinationReserved DestinationActivated SourceReleased Completed], " +
				"want [DestinationAccepted DestinationReserved SourceHeld DestinationActivated SourceReleased Completed]"},
		{"short lifecycle", EngineVLLM, func(c *Conformance) { c.Lifecycle = c.Lifecycle[:5] },
			"handoff: nonconformant handoff: lifecycle [SourceHeld DestinationAccepted DestinationReserved DestinationActivated SourceReleased], " +
				"want [SourceHeld DestinationAccepted DestinationReserved DestinationActivated SourceReleased Completed]"},
		{"source tokens", EngineVLLM, func(c *Conformance) { c.SourceOutputTokens = 2 },
			"handoff: nonconformant handoff: source output tokens 2, destination output tokens 2, completed requests 1; want 1, 2, 1"},
		{"destination tokens", EngineVLLM, func(c *Conformance) { c.DestinationOutputTokens = 1 },
			"handoff: nonconformant handoff: source output tokens 1, destination output tokens 1, completed requests 1; want 1, 2, 1"},
		{"completed", EngineVLLM, func(c *Conformance) { c.CompletedRequests = 0 },
			"handoff: nonconformant handoff: source output tokens 1, destination output tokens 2, completed requests 0; want 1, 2, 1"},
		{"stored before activation", EngineVLLM, func(c *Conformance) { c.DestinationStored.BeforeActivation = 1 },
			"handoff: nonconformant handoff: destination stored 1 blocks before activation, 4 on activation, 0 repeated after; want 0, > 0, 0"},
		{"nothing stored on activation", EngineVLLM, func(c *Conformance) { c.DestinationStored.OnActivation = 0 },
			"handoff: nonconformant handoff: destination stored 0 blocks before activation, 0 on activation, 0 repeated after; want 0, > 0, 0"},
		{"activated twice", EngineSGLang, func(c *Conformance) { c.DestinationStored.RepeatedActivationHashesAfterActivation = 2 },
			"handoff: nonconformant handoff: destination stored 0 blocks before activation, 4 on activation, 2 repeated after; want 0, > 0, 0"},
		{"source not drained", EngineVLLM, func(c *Conformance) { c.SourceDrained = false },
			"handoff: nonconformant handoff: not drained: source false, destination true, driver true"},
		{"destination not drained", EngineVLLM, func(c *Conformance) { c.DestinationDrained = false },
			"handoff: nonconformant handoff: not drained: source true, destination false, driver true"},
		{"driver not drained", EngineSGLang, func(c *Conformance) { c.DriverDrained = false },
			"handoff: nonconformant handoff: not drained: source true, destination true, driver false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := conformant(tc.engine)
			if tc.engine == EngineTRTLLM {
				c.Order, c.Lifecycle = SourceFirst, ExpectedLifecycle(SourceFirst)
			}
			tc.change(&c)
			err := c.Validate()
			require.EqualError(t, err, tc.want)
			if tc.engine == EngineTRTLLM {
				require.ErrorIs(t, err, ErrUnsupportedEngine)
			} else {
				require.ErrorIs(t, err, ErrNonconformant)
			}
		})
	}
}

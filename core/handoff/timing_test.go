package handoff

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// startTransferDelay drives a source-first hand-off up to StartTransfer, with
// a destination that can take 3 tokens, and returns the delay it carries.
func startTransferDelay(t *testing.T, timing TransferTiming, fallbackMs float64) float64 {
	t.Helper()
	id := testHandoffID(1)
	c, err := NewCoordinator(id, SourceFirst, fallbackMs)
	require.NoError(t, err)

	out := c.Start(nil)
	require.Len(t, out, 1)
	require.Equal(t, ActionSubmitPrefill, out[0].Kind)
	out, err = c.Outcome(out[0].ID, Outcome{Kind: OutcomeSubmitted}, out[:0])
	require.NoError(t, err)
	require.Empty(t, out)

	out, err = c.Step(Fact{Kind: FactSourceHeld, Handoff: id, Timing: timing}, out)
	require.NoError(t, err)
	require.Len(t, out, 1)
	require.Equal(t, ActionReserveDestination, out[0].Kind)
	out, err = c.Outcome(out[0].ID, Outcome{Kind: OutcomeAccepted}, out[:0])
	require.NoError(t, err)
	require.Empty(t, out)

	out, err = c.Step(Fact{Kind: FactDestinationReserved, Handoff: id, TransferableTokens: 3}, out)
	require.NoError(t, err)
	require.Len(t, out, 1)
	require.Equal(t, ActionStartTransfer, out[0].Kind)
	return out[0].DelayMs
}

// From the seed: a timing without bytes per token and bandwidth, and one
// whose bandwidth is 0, both get the configured fallback.
func TestMissingOrZeroBandwidthUsesFallback(t *testing.T) {
	missing := TransferTiming{Mode: TimingDestinationMissing, FullPromptTokens: 10}
	require.Equal(t, 7.5, startTransferDelay(t, missing, 7.5))

	zero := missing
	zero.KVBytesPerToken, zero.HasKVBytesPerToken = 1024, true
	zero.BandwidthGBs, zero.HasBandwidthGBs = 0, true
	require.NoError(t, zero.Validate())
	require.Equal(t, 7.5, startTransferDelay(t, zero, 7.5))
}

// From the seed: a negative bandwidth is refused.
func TestNegativeBandwidthIsRejected(t *testing.T) {
	timing := TransferTiming{
		Mode: TimingFullPrompt, FullPromptTokens: 10,
		KVBytesPerToken: 1024, HasKVBytesPerToken: true,
		BandwidthGBs: -1, HasBandwidthGBs: true,
	}
	require.ErrorIs(t, timing.Validate(), ErrInvalidTiming)
	require.ErrorContains(t, timing.Validate(), "bandwidth -1 GB/s")
}

func TestDelayMs(t *testing.T) {
	known := func(mode TimingMode, tokens, kv uint64, bw float64) TransferTiming {
		return TransferTiming{Mode: mode, FullPromptTokens: tokens,
			KVBytesPerToken: kv, HasKVBytesPerToken: true, BandwidthGBs: bw, HasBandwidthGBs: true}
	}
	for _, tc := range []struct {
		name         string
		timing       TransferTiming
		transferable uint64
		want         float64
		wantOK       bool
		wantValidErr bool
	}{
		{"full prompt", known(TimingFullPrompt, 1000, 131072, 25), 7, 5.24288, true, false},
		{"destination missing", known(TimingDestinationMissing, 1000, 131072, 25), 600, 3.145728, true, false},
		{"zero bytes per token", known(TimingFullPrompt, 1000, 0, 25), 0, 0, true, false},
		{"zero tokens", known(TimingDestinationMissing, 1000, 131072, 25), 0, 0, true, false},
		{"zero bandwidth", known(TimingFullPrompt, 1000, 131072, 0), 0, 0, false, false},
		{"no bandwidth", TransferTiming{Mode: TimingFullPrompt, FullPromptTokens: 1, KVBytesPerToken: 1, HasKVBytesPerToken: true}, 0, 0, false, false},
		{"no bytes per token", TransferTiming{Mode: TimingFullPrompt, FullPromptTokens: 1, BandwidthGBs: 1, HasBandwidthGBs: true}, 0, 0, false, false},
		{"unknown mode", known(0, 1000, 131072, 25), 0, 0, false, true},
		{"negative bandwidth", known(TimingFullPrompt, 1000, 131072, -25), 0, 0, false, true},
		{"NaN bandwidth", known(TimingFullPrompt, 1000, 131072, math.NaN()), 0, 0, false, true},
		{"infinite bandwidth", known(TimingFullPrompt, 1000, 131072, math.Inf(1)), 0, 0, false, true},
		{"overflowing delay", known(TimingFullPrompt, math.MaxUint64, math.MaxUint64, 1e-300), 0, 0, false, true},
		// Valid for the full prompt, but the destination claims far more.
		{"overflowing missing delay", known(TimingDestinationMissing, 1, math.MaxUint64, 1e-290), math.MaxUint64, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.timing.DelayMs(tc.transferable)
			require.Equal(t, tc.wantOK, ok)
			require.InDelta(t, tc.want, got, 1e-12)
			if tc.wantValidErr {
				require.ErrorIs(t, tc.timing.Validate(), ErrInvalidTiming)
			} else {
				require.NoError(t, tc.timing.Validate())
			}
		})
	}
}

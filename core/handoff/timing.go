package handoff

import (
	"math"
	"strconv"

	"github.com/kvbm/kvbm/kvbmerr"
)

// TimingMode says which token count a transfer's delay is modelled on.
//
// The values are stable (see the package documentation).
type TimingMode uint8

const (
	// TimingFullPrompt models the transfer as moving the whole prompt's KV
	// (TransferTiming.FullPromptTokens).
	TimingFullPrompt TimingMode = 1
	// TimingDestinationMissing models the transfer as moving only what the
	// destination is missing: the transferable tokens it reported in
	// FactDestinationReserved.
	TimingDestinationMissing TimingMode = 2
)

// String returns the mode's name, or TimingMode(n) for an unknown value.
func (m TimingMode) String() string {
	switch m {
	case TimingFullPrompt:
		return "FullPrompt"
	case TimingDestinationMissing:
		return "DestinationMissing"
	}
	return "TimingMode(" + strconv.Itoa(int(m)) + ")"
}

// TransferTiming is what the source knows, when it holds the KV, about how
// long moving it will take. It arrives with FactSourceHeld. The optional
// inputs carry a Has flag rather than a pointer, so the struct stays a plain
// value that C can fill in.
type TransferTiming struct {
	// Mode picks the token count the delay is modelled on.
	Mode TimingMode
	// FullPromptTokens is the prompt's length in tokens.
	FullPromptTokens uint64
	// KVBytesPerToken is the size of one token's KV; read only when
	// HasKVBytesPerToken is set.
	KVBytesPerToken uint64
	// HasKVBytesPerToken says KVBytesPerToken is known.
	HasKVBytesPerToken bool
	// BandwidthGBs is the link's bandwidth in GB/s (1e9 bytes per second);
	// read only when HasBandwidthGBs is set. It must be finite and not
	// negative; 0 means unknown.
	BandwidthGBs float64
	// HasBandwidthGBs says BandwidthGBs is known.
	HasBandwidthGBs bool
}

// DelayMs returns how long, in milliseconds, moving the KV should take:
// tokens × KVBytesPerToken / (BandwidthGBs × 1e9) × 1000, where tokens is
// FullPromptTokens in TimingFullPrompt mode and transferableTokens (the
// destination's count) in TimingDestinationMissing mode. It reports false —
// no value — when KVBytesPerToken or BandwidthGBs is unknown or the bandwidth
// is 0, and also for inputs Validate refuses (an unknown mode, a negative or
// non-finite bandwidth) and when the result overflows, which can happen in
// TimingDestinationMissing mode when the destination claims more tokens than
// Validate could check.
func (t TransferTiming) DelayMs(transferableTokens uint64) (float64, bool) {
	var tokens uint64
	switch t.Mode {
	case TimingFullPrompt:
		tokens = t.FullPromptTokens
	case TimingDestinationMissing:
		tokens = transferableTokens
	default:
		return 0, false
	}
	d, ok := t.delayFor(tokens)
	if !ok || math.IsInf(d, 1) {
		return 0, false
	}
	return d, true
}

// delayFor is the delay of moving tokens tokens, or false when the timing
// gives none. With a finite bandwidth > 0 the result is ≥ 0 and not NaN, but
// it may overflow to +Inf.
func (t TransferTiming) delayFor(tokens uint64) (float64, bool) {
	bw := t.BandwidthGBs
	if !t.HasKVBytesPerToken || !t.HasBandwidthGBs || !(bw > 0) || math.IsInf(bw, 1) {
		return 0, false
	}
	// Float arithmetic throughout: tokens × bytes can overflow a uint64.
	return float64(tokens) * float64(t.KVBytesPerToken) / (bw * 1e9) * 1000, true
}

// Validate checks the timing a source reports. It returns an error wrapping
// ErrInvalidTiming, naming the value, when the mode is unknown, when the
// bandwidth is negative, NaN or infinite, or when the delay for the full
// prompt is not a finite number (a bandwidth so small that the delay
// overflows). A missing input or a bandwidth of 0 is valid: there is simply
// no modelled delay.
func (t TransferTiming) Validate() error {
	if t.Mode != TimingFullPrompt && t.Mode != TimingDestinationMissing {
		return kvbmerr.Detail(ErrInvalidTiming, "mode "+t.Mode.String())
	}
	if t.HasBandwidthGBs {
		bw := t.BandwidthGBs
		if math.IsNaN(bw) || math.IsInf(bw, 0) || bw < 0 {
			return kvbmerr.Detail(ErrInvalidTiming, "bandwidth "+formatFloat(bw)+" GB/s, want finite and >= 0")
		}
	}
	if d, ok := t.delayFor(t.FullPromptTokens); ok && math.IsInf(d, 1) {
		return kvbmerr.Detail(ErrInvalidTiming, "full-prompt delay "+formatFloat(d)+" ms ("+
			strconv.FormatUint(t.FullPromptTokens, 10)+" tokens × "+strconv.FormatUint(t.KVBytesPerToken, 10)+
			" bytes at "+formatFloat(t.BandwidthGBs)+" GB/s)")
	}
	return nil
}

// formatFloat writes f as fmt's %v does.
func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

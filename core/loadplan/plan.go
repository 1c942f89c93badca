// Package loadplan decides how much of a cached prefix is worth loading:
// the blocks whose load is expected to end before recomputing them would,
// by a margin, given what the tiers' loads were measured at and how fast
// the engine prefills. One policy for every engine adapter (vLLM's
// scheduler, SGLang's storage); pure, so that it can be asked anywhere.
package loadplan

import (
	"strconv"

	"github.com/kvbm/kvbm/kvbmerr"
)

// Tier is what is known of one tier's loads.
type Tier struct {
	// Rate is the bytes per second its loads were measured at; 0: not
	// measured yet (taken as fast: a tier is loaded from until measured).
	Rate float64
	// Queued is the bytes of loads ahead in it.
	Queued float64
}

// The tiers a block is loaded from (kvbm's numbering).
const (
	G2 = 2
	G3 = 3
	G4 = 4
)

// Input is one decision's facts.
type Input struct {
	// Tiers is the tier holding each block of the matched prefix, in
	// order (G2, G3 or G4).
	Tiers []int
	// BlockBytes is the bytes of one block (on one rank).
	BlockBytes float64
	// TokensPerBlock is the tokens one block holds.
	TokensPerBlock int
	// PrefillRate is the tokens per second the engine prefills at; 0: not
	// measured yet (every block is loaded).
	PrefillRate float64
	// Load holds each tier's measurements, by tier number: G3 and G4 are
	// their staging into G2, G2 the copy into G1 that every block takes.
	Load [5]Tier
	// Margin is the fraction of the recompute time a load must save (0 to
	// 1): it absorbs the measurements' noise.
	Margin float64
}

// Decision is what Plan decided.
type Decision struct {
	// Blocks is how many leading blocks to load; the rest are recomputed.
	Blocks int
	// LoadSeconds and ComputeSeconds are the expected times of loading and
	// of computing those blocks.
	LoadSeconds, ComputeSeconds float64
}

// Plan returns the number of leading blocks whose load saves the most time
// over computing them, by at least the margin; 0 when no prefix does. The
// expected load time of n blocks is every tier's queued bytes plus its
// share of the n blocks over its rate (G3 and G4 blocks are staged into G2
// and then copied into G1 as G2's are); their compute time is their tokens
// over the prefill rate.
func Plan(in Input) (Decision, error) {
	if err := in.check(); err != nil {
		return Decision{}, err
	}
	if in.PrefillRate == 0 {
		return Decision{Blocks: len(in.Tiers)}, nil
	}
	var bytes [5]float64
	best, bestGain := Decision{}, 0.0
	for n, t := range in.Tiers {
		bytes[t] += in.BlockBytes
		bytes[G2] += boolf(t != G2) * in.BlockBytes // staged, then copied
		load := 0.0
		for tier := G2; tier <= G4; tier++ {
			if bytes[tier] > 0 && in.Load[tier].Rate > 0 {
				load += (in.Load[tier].Queued + bytes[tier]) / in.Load[tier].Rate
			}
		}
		compute := float64((n+1)*in.TokensPerBlock) / in.PrefillRate
		if gain := compute*(1-in.Margin) - load; gain > 0 && gain >= bestGain {
			best, bestGain = Decision{Blocks: n + 1, LoadSeconds: load, ComputeSeconds: compute}, gain
		}
	}
	return best, nil
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (in *Input) check() error {
	bad := func(what string) error { return kvbmerr.Detail(kvbmerr.ErrInvalidArgument, "load plan: "+what) }
	for i, t := range in.Tiers {
		if t < G2 || t > G4 {
			return bad("block " + strconv.Itoa(i) + "'s tier is " + strconv.Itoa(t) + ", want 2, 3 or 4")
		}
	}
	if !(in.BlockBytes > 0) || in.TokensPerBlock <= 0 {
		return bad("block bytes " + num(in.BlockBytes) + " and tokens per block " + strconv.Itoa(in.TokensPerBlock) + " must be > 0")
	}
	if !(in.PrefillRate >= 0) || !(in.Margin >= 0 && in.Margin < 1) {
		return bad("prefill rate " + num(in.PrefillRate) + " must be >= 0 and margin " + num(in.Margin) + " in [0, 1)")
	}
	for t, l := range in.Load {
		if !(l.Rate >= 0) || !(l.Queued >= 0) {
			return bad("tier " + strconv.Itoa(t) + "'s rate " + num(l.Rate) + " and queued bytes " + num(l.Queued) + " must be >= 0")
		}
	}
	return nil
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

package loadplan

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// 2 MiB blocks of 16 tokens; an engine prefilling 8,000 tokens/s computes a
// block in 2 ms, so a tier is worth loading from above 1 GB/s.
const mib = 1 << 20

func in(tiers []int, load [5]Tier, prefill float64) Input {
	return Input{Tiers: tiers, BlockBytes: 2 * mib, TokensPerBlock: 16, PrefillRate: prefill, Load: load, Margin: 0.1}
}

func rep(t, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = t
	}
	return out
}

func TestPlan(t *testing.T) {
	fast := Tier{Rate: 20e9}
	for _, c := range []struct {
		name string
		in   Input
		want int
	}{
		{"nothing measured: load all", in(rep(G2, 8), [5]Tier{}, 0), 8},
		{"prefill rate unknown: load all", in(rep(G4, 8), [5]Tier{G4: {Rate: 1e6}}, 0), 8},
		{"fast G2: load all", in(rep(G2, 64), [5]Tier{G2: fast}, 8000), 64},
		{"a tier not measured yet is loaded from", in(rep(G3, 8), [5]Tier{G2: fast}, 8000), 8},
		{"a G4 far slower than recomputing: nothing", in(rep(G4, 8), [5]Tier{G2: fast, G4: {Rate: 100e6}}, 8000), 0},
		{"G2 then slow G4: the G2 part", in(append(rep(G2, 10), rep(G4, 10)...), [5]Tier{G2: fast, G4: {Rate: 100e6}}, 8000), 10},
		{"G4 just fast enough: loaded", in(rep(G4, 8), [5]Tier{G2: fast, G4: {Rate: 3e9}}, 8000), 8},
		{"within the margin: recomputed", in(rep(G4, 8), [5]Tier{G2: fast, G4: {Rate: 1.12e9}}, 8000), 0},
		// A queue ahead delays every block of its tier: a short prefix is
		// not worth it, a long one is.
		{"busy G3, short prefix: recomputed", in(rep(G3, 4), [5]Tier{G2: fast, G3: {Rate: 5e9, Queued: 200 * mib}}, 8000), 0},
		{"busy G3, long prefix: loaded", in(rep(G3, 200), [5]Tier{G2: fast, G3: {Rate: 5e9, Queued: 200 * mib}}, 8000), 200},
		// A slow engine makes even a slow tier worth it.
		{"slow prefill: G4 loaded", in(rep(G4, 8), [5]Tier{G2: fast, G4: {Rate: 100e6}}, 200), 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := Plan(c.in)
			require.NoError(t, err)
			require.Equal(t, c.want, d.Blocks, "%+v", d)
			if d.Blocks > 0 && c.in.PrefillRate > 0 {
				require.Less(t, d.LoadSeconds, d.ComputeSeconds*(1-c.in.Margin))
			}
		})
	}
}

func TestBadInputIsRefused(t *testing.T) {
	for _, bad := range []Input{
		{Tiers: []int{1}, BlockBytes: 1, TokensPerBlock: 1},
		{Tiers: []int{2}, BlockBytes: 0, TokensPerBlock: 1},
		{Tiers: []int{2}, BlockBytes: 1, TokensPerBlock: 0},
		{Tiers: []int{2}, BlockBytes: 1, TokensPerBlock: 1, Margin: 1},
		{Tiers: []int{2}, BlockBytes: 1, TokensPerBlock: 1, PrefillRate: -1},
		{Tiers: []int{2}, BlockBytes: 1, TokensPerBlock: 1, Load: [5]Tier{G3: {Rate: -1}}},
	} {
		_, err := Plan(bad)
		require.Error(t, err, "%+v", bad)
	}
}

package cache

import (
	"time"

	"github.com/kvbm/kvbm/core/worker"
)

// loadRates is what the cache measured of its loads, per tier: the bytes
// per second they ran at (a moving average; 0 until measured) and the
// bytes in flight. G3 and G4 are their staging into G2 (or straight into
// G1), G2 the copy into G1 that every onboarded block takes. The load
// policy (core/loadplan) weighs a prefix's load against recomputing it
// with them. Callers hold c.mu.
type loadRates struct {
	rate   [5]float64
	queued [5]float64
}

// rateWeight is the weight of the newest measurement in the average.
const rateWeight = 0.3

// minSampleBytes: a load smaller than this is not measured: its time is
// mostly the call's fixed cost, which as a rate would make the tier look
// slow for the large prefixes the policy weighs.
var minSampleBytes = float64(1 << 20) // a variable: tests of small blocks lower it

// start counts bytes of tier t as in flight.
func (r *loadRates) start(t worker.Tier, bytes float64) { r.queued[t] += bytes }

// done ends bytes of tier t that took d (0 bytes: nothing to measure).
func (r *loadRates) done(t worker.Tier, bytes float64, d time.Duration) {
	r.queued[t] = max(0, r.queued[t]-bytes)
	if bytes < minSampleBytes || d <= 0 {
		return
	}
	sample := bytes / d.Seconds()
	if r.rate[t] == 0 {
		r.rate[t] = sample
		return
	}
	r.rate[t] = (1-rateWeight)*r.rate[t] + rateWeight*sample
}

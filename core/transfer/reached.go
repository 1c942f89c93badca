package transfer

import (
	"time"

	"github.com/kvbm/kvbm/cuda"
)

// StreamReached marks the work queued on s so far and returns when the
// host saw it over: the time copies queued next on s began, which is later
// than when they were queued if s was busy with the caller's own work (an
// engine's forward). Load rates measured from it are the copies' own. The
// channel yields the zero time when the mark could not be made or waited.
func (m *Manager) StreamReached(s cuda.Stream) <-chan time.Time {
	at := make(chan time.Time, 1)
	ev, err := m.events.get()
	if err == nil {
		if err = m.drv.EventRecord(ev, s); err != nil {
			m.events.put(ev)
		}
	}
	if err != nil {
		at <- time.Time{}
		return at
	}
	go func() {
		err := m.drv.EventSynchronize(ev)
		t := time.Now()
		m.events.put(ev)
		if err != nil {
			t = time.Time{}
		}
		at <- t
	}()
	return at
}

package capability

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A revocation ends the scopes made before it for the blocks it names,
// and only those: other blocks, other layouts and scopes made after it
// (for the blocks' next owner) read on.
func TestARevocationEndsTheScopesMadeBeforeIt(t *testing.T) {
	var r Revocations
	before := r.Epoch()
	require.True(t, r.Allows(before, 1, 0, 7), "nothing revoked yet")
	r.Revoke(LayoutBlocksRevoked{1, 8, []int{3, 5}})
	after := r.Epoch()
	require.Greater(t, after, before)
	for _, c := range []struct {
		epoch       uint64
		layout      uint16
		first, last int
		ok          bool
	}{
		{before, 1, 0, 2, true}, {before, 1, 3, 3, false}, {before, 1, 2, 4, false}, {before, 1, 4, 4, true},
		{before, 1, 5, 7, false}, {before, 1, 6, 7, true}, {before, 2, 3, 5, true},
		{after, 1, 0, 7, true},
	} {
		require.Equal(t, c.ok, r.Allows(c.epoch, c.layout, c.first, c.last), "epoch %d layout %d blocks %d to %d", c.epoch, c.layout, c.first, c.last)
	}
	// A second revocation of one block ends the scope made between.
	r.Revoke(LayoutBlocksRevoked{1, 8, []int{5}})
	require.False(t, r.Allows(after, 1, 5, 5))
	require.True(t, r.Allows(after, 1, 3, 3), "block 3 was not revoked again")
	// A layout registered anew with more blocks under the same number.
	r.Revoke(LayoutBlocksRevoked{1, 16, []int{12}})
	require.False(t, r.Allows(before, 1, 3, 3), "kept when the table grew")
	require.False(t, r.Allows(after, 1, 12, 12))
	require.True(t, r.Allows(after, 1, 13, 15))
}

// Revoke returns only once the requests begun before it have ended, and
// never waits for one begun after it.
func TestARevocationWaitsForTheRequestsBegunBeforeIt(t *testing.T) {
	var r Revocations
	old := r.Enter()
	done := make(chan struct{})
	go func() {
		r.Revoke(LayoutBlocksRevoked{1, 4, []int{0}})
		close(done)
	}()
	// The revocation has closed the old phase once a new request counts
	// in the other one; it still waits for the old request.
	var late Ticket
	for late = r.Enter(); late == old; late = r.Enter() {
		r.Exit(late)
	}
	select {
	case <-done:
		t.Fatal("Revoke returned while a request begun before it was still reading")
	default:
	}
	r.Exit(old)
	<-done // the late request, still in flight, does not hold it
	r.Exit(late)
}

// A request that looked at the phase before a revocation closed it, and
// counted itself only after that revocation returned, is counted where
// the next revocation waits: that one does not return while the request,
// allowed before it, still reads.
func TestARequestCountedLateIsWaitedForByTheNextRevocation(t *testing.T) {
	var r Revocations
	epoch := r.Epoch()
	paused, resume := make(chan struct{}), make(chan struct{})
	enterPause = func() { close(paused); <-resume }
	t.Cleanup(func() { enterPause = nil })
	var allowed bool
	checked, finish, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		tk := r.Enter()
		allowed = r.Allows(epoch, 1, 2, 2)
		close(checked)
		<-finish // reading
		r.Exit(tk)
		close(done)
	}()
	<-paused
	enterPause = nil
	r.Revoke(LayoutBlocksRevoked{1, 4, []int{3}}) // closes the phase the request looked at
	close(resume)
	<-checked
	require.True(t, allowed, "block 2 is not revoked yet")
	revoked := make(chan struct{})
	go func() {
		r.Revoke(LayoutBlocksRevoked{1, 4, []int{2}})
		close(revoked)
	}()
	select {
	case <-revoked:
		t.Fatal("the revocation returned while a request it did not see begin still reads block 2")
	case <-time.After(50 * time.Millisecond):
	}
	close(finish)
	<-revoked
	<-done
}

// A request racing a revocation either began before it (and the
// revocation waited for it) or sees it: never both "allowed" and
// "still reading after Revoke returned".
func TestARequestRacingARevocationNeverOutlivesIt(t *testing.T) {
	for range 1000 {
		var r Revocations
		epoch := r.Epoch()
		var reading sync.Mutex // held by the request while it reads
		var after bool         // set by the revoker once Revoke returned
		var late bool          // a request allowed read after that
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			tk := r.Enter()
			defer r.Exit(tk)
			if r.Allows(epoch, 1, 2, 2) {
				for range 20 { // a read takes a while: the revoker runs meanwhile
					runtime.Gosched()
				}
				reading.Lock()
				late = late || after
				reading.Unlock()
			}
		}()
		go func() {
			defer wg.Done()
			<-start
			r.Revoke(LayoutBlocksRevoked{1, 4, []int{2}})
			reading.Lock()
			after = true
			reading.Unlock()
		}()
		close(start)
		wg.Wait()
		require.False(t, late, "a request allowed read after the revocation returned")
	}
}

// What revocation adds to a request of a block-scoped connection: Enter,
// the check of 64 blocks (each revoked once), Exit.
func BenchmarkRevocationCheck(b *testing.B) {
	var r Revocations
	blocks := make([]int, 1024)
	for i := range blocks {
		blocks[i] = i
	}
	r.Revoke(LayoutBlocksRevoked{1, len(blocks), blocks})
	epoch := r.Epoch()
	b.ResetTimer()
	for i := range b.N {
		tk := r.Enter()
		first := (i * 64) % len(blocks)
		if !r.Allows(epoch, 1, first, first+63) {
			b.Fatal("refused")
		}
		r.Exit(tk)
	}
}

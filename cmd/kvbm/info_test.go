package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A UCX worker that does not open (UCX blocked opening its devices) does
// not hold info up: it says so once ucxWorkerWait passed.
func TestInfoDoesNotWaitForABlockedUCXWorker(t *testing.T) {
	was, wait := openUCXWorker, ucxWorkerWait
	t.Cleanup(func() { openUCXWorker, ucxWorkerWait = was, wait })
	release, returned := make(chan struct{}), make(chan struct{})
	openUCXWorker = func() string {
		defer close(returned)
		<-release
		return "kvbm sets nothing; the worker opens"
	}
	ucxWorkerWait = 50 * time.Millisecond
	start := time.Now()
	require.Contains(t, ucxWorker(), "worker: did not open within 50ms: UCX blocks opening its devices")
	require.Less(t, time.Since(start), 5*time.Second)
	close(release)
	<-returned

	openUCXWorker = func() string { return "kvbm sets nothing; the worker opens" }
	ucxWorkerWait = time.Minute
	require.Equal(t, "kvbm sets nothing; the worker opens", ucxWorker())
}

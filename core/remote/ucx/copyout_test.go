//go:build cgo

package ucx

import (
	"bytes"
	"errors"
	"runtime"
	"testing"
	"unsafe"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/stretchr/testify/require"
)

// The copy out of staging, on the progress thread's side alone (no UCX):
// a staged data message is copied copyStep bytes a turn, oldest first; a
// pull is answered only once all of its data is copied; a pull answered
// meanwhile (its deadline) drops what it had left, gives its slot back,
// and no byte of it lands afterwards, while another pull's copy goes on.
func TestCopyOutTakesTurnsAndStopsWhenThePullEnds(t *testing.T) {
	tr := &Transport{pulls: map[uint64]*pull{}}
	defer tr.staging.close()
	const n = 3 * copyStep
	stage := func(id uint64, dst []byte, fill byte) *pull {
		r := &pull{id: id, total: n, ch: make(chan error, 1),
			local: []piece{{uint64(uintptr(unsafe.Pointer(&dst[0]))), uint64(len(dst))}}}
		tr.pulls[id] = r
		s := tr.staging.tryGet(n)
		require.NotNil(t, s)
		for i := range s.bytes()[:n] {
			s.bytes()[i] = fill + byte(i%251)
		}
		r.copying++
		tr.copies = append(tr.copies, staged{r: r, s: s, off: 0, n: n})
		// Every byte arrived and the exporter said it served them all.
		r.recvd, r.sent, r.done, r.status = n, n, true, remote.StatusOK
		return r
	}
	want := func(fill byte, k int) []byte {
		b := make([]byte, n)
		for i := range k {
			b[i] = fill + byte(i%251)
		}
		return b
	}
	answered := func(r *pull) (error, bool) {
		select {
		case err := <-r.ch:
			return err, true
		default:
			return nil, false
		}
	}

	a, b := make([]byte, n), make([]byte, n)
	ra, rb := stage(1, a, 0x10), stage(2, b, 0x80)
	tr.checkPull(ra)
	_, done := answered(ra)
	require.False(t, done, "answered before its data was copied")

	require.True(t, tr.copyOut())
	require.True(t, bytes.Equal(want(0x10, copyStep), a), "one turn copies copyStep bytes of the oldest")
	require.True(t, bytes.Equal(make([]byte, n), b))

	// a's deadline: what it had left is dropped, its slot given back.
	cause := errors.New("the deadline")
	tr.endPull(ra, cause)
	err, done := answered(ra)
	require.True(t, done)
	require.Same(t, cause, err)
	require.Equal(t, 1, tr.staging.outstanding(), "a's slot given back, b's still out")

	for i := 0; i < 3; i++ {
		require.True(t, tr.copyOut())
		_, done := answered(rb)
		require.Equal(t, i == 2, done, "b answered once its last byte is copied")
	}
	require.False(t, tr.copyOut())
	require.Zero(t, tr.staging.outstanding())
	require.True(t, bytes.Equal(want(0x80, n), b), "b whole")
	require.True(t, bytes.Equal(want(0x10, copyStep), a), "no byte of a after it was answered")
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}

package main

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/worker"
)

// metadataWorkerID calls the export on Go bytes.
func metadataWorkerID(b []byte, out *cUint64) status {
	var p *cUint8
	if len(b) > 0 {
		p = (*cUint8)(unsafe.Pointer(&b[0]))
	}
	return kvbmgo_metadata_worker_id(p, cSize(len(b)), out)
}

func TestMetadataWorkerID(t *testing.T) {
	md, err := worker.Metadata{WorkerID: 0xA1B2C3D4E5F60718}.Encode()
	require.NoError(t, err)
	var id cUint64
	require.Equal(t, statusOK, metadataWorkerID(md, &id))
	require.Equal(t, uint64(0xA1B2C3D4E5F60718), uint64(id))
}

func TestMetadataWorkerIDRefusesBadArguments(t *testing.T) {
	runtime.LockOSThread() // the last error is per thread
	defer runtime.UnlockOSThread()
	md, err := worker.Metadata{WorkerID: 7}.Encode()
	require.NoError(t, err)
	var id cUint64
	flipped := append([]byte(nil), md...)
	flipped[9] ^= 1 // the worker id, under the checksum
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": md[:len(md)-1],
		"checksum":  flipped,
		"garbage":   []byte("not metadata at all, but long enough"),
	} {
		require.Equal(t, errInvalidArgument, metadataWorkerID(b, &id), name)
		require.Contains(t, lastError(), "metadata_worker_id", name)
	}
	require.Equal(t, errInvalidArgument, metadataWorkerID(md, nil))
	require.Contains(t, lastError(), "worker_id is NULL")
}

package worker

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/kvbmerr"
)

// StandaloneConfig configures a worker that owns its transfer manager and
// object store: what an engine process creates through the C ABI.
type StandaloneConfig struct {
	WorkerID uint64
	Device   int
	Rank     int
	Driver   cuda.Driver
	// DiskDir is where G3 files go ("": no G3).
	DiskDir string
	// G3PersistID, when set, makes G3 persistent (a warm restart): its file
	// is named in DiskDir and outlives the process, and the worker's cache
	// keeps a journal of its blocks beside it, for the next process whose
	// id is the same. The id says what the keys are (the engine's model,
	// layout, dtype, rank): another id finds nothing. "": G3 has no name
	// and goes with the process.
	G3PersistID string
	// ObjectDir is the G4 object store's location ("": no G4): a
	// directory or file:///path for the filesystem store, or
	// s3://bucket/prefix for S3 (object.Location). Objects are namespaced
	// by Rank inside it.
	ObjectDir string
	// S3 holds the S3 settings an s3:// ObjectDir does not give
	// (endpoint, region, credentials, limits); empty fields take the AWS
	// environment variables.
	S3 object.S3Config
	// Loopback, when set, is joined so that other workers of the process
	// can import this one's layouts, and used to reach theirs.
	Loopback *remote.Loopback
	// Network, when set, is the transport to other processes; the worker
	// takes it over and closes it.
	Network remote.Transport
	// RemoteDeadline bounds each remote operation (0: the default,
	// transfer.DefaultRemoteDeadline).
	RemoteDeadline time.Duration
}

// NewStandalone makes a worker with its own transfer manager; Close
// releases both.
func NewStandalone(cfg StandaloneConfig) (*PhysicalWorker, error) {
	if err := checkDevice(cfg.Driver, cfg.Device); err != nil {
		return nil, err
	}
	tc := transfer.Config{WorkerID: cfg.WorkerID, Device: cfg.Device, Driver: cfg.Driver, DiskDir: cfg.DiskDir,
		RemoteDeadline: cfg.RemoteDeadline}
	if cfg.G3PersistID != "" {
		tc.DiskName = G3FileName
	}
	m, err := transfer.NewManager(tc)
	if err != nil {
		return nil, err
	}
	pc := PhysicalConfig{Manager: m, Rank: cfg.Rank, Loopback: cfg.Loopback, Network: cfg.Network}
	if cfg.ObjectDir != "" {
		store, err := object.Open(object.Location{URL: cfg.ObjectDir, HasRank: true, Rank: cfg.Rank, S3: cfg.S3})
		if err != nil {
			return nil, errors.Join(fmt.Errorf("object store: %w", err), m.Close())
		}
		pc.Objects = store
	}
	w, err := NewPhysical(pc)
	if err != nil {
		return nil, errors.Join(err, closeStore(pc.Objects), m.Close())
	}
	w.owned = true
	w.g3PersistID = cfg.G3PersistID
	return w, nil
}

// G3FileName is a persistent G3's file in the worker's disk directory.
const G3FileName = "kvbm-g3.blocks"

// G3PersistID is the id of a persistent G3 (StandaloneConfig.G3PersistID);
// "" when G3 goes with the process.
func (w *PhysicalWorker) G3PersistID() string { return w.g3PersistID }

// Close stops serving peers, closes the connections to them, and for a
// worker made by NewStandalone waits for transfers in flight and releases
// the manager (a worker over a caller's manager leaves it open).
func (w *PhysicalWorker) Close() error {
	err := w.leave()
	if !w.owned {
		return err
	}
	return errors.Join(err, w.m.Close(), closeStore(w.objects))
}

// closeStore closes an object store that holds resources (an S3 store's
// connections); nil and stores without Close are left alone.
func closeStore(s object.Store) error {
	if c, ok := s.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// checkDevice refuses a device ordinal the driver does not have, so that a
// worker on it fails at create rather than at its first registration. A
// nil driver is left to the transfer manager to refuse.
func checkDevice(drv cuda.Driver, device int) error {
	if drv == nil {
		return nil
	}
	n, err := drv.DeviceCount()
	if err != nil {
		return fmt.Errorf("worker: count devices: %w", err)
	}
	if device < 0 || device >= n {
		return fmt.Errorf("%w: worker: device %d does not exist: the %s backend has %d device(s)",
			kvbmerr.ErrInvalidArgument, device, drv.Name(), n)
	}
	return nil
}

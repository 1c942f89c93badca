package worker

import (
	"context"

	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/transfer"
)

// Worker is a worker as its leader sees it: the handles of its tiers,
// its metadata, its transfers and its object store access.
type Worker interface {
	WorkerTransfers
	ObjectBlockOps
	// Handles returns the handles of the registered tiers.
	Handles() Handles
	// ExportMetadata encodes the worker's layouts, each with its tier.
	ExportMetadata() ([]byte, error)
	// ImportMetadata makes another worker's layouts reachable and returns
	// their handles.
	ImportMetadata(md []byte) ([]transfer.LayoutHandle, error)
}

// WorkerTransfers executes transfers named by tier.
type WorkerTransfers interface {
	// ExecuteLocalTransfer copies blocks between two of this worker's tiers.
	ExecuteLocalTransfer(src, dst Tier, srcIDs, dstIDs []int, opts transfer.Options) (*transfer.Notification, error)
	// ExecuteRemoteOnboard pulls blocks described by src (a remote layout or
	// object keys) into a local tier.
	ExecuteRemoteOnboard(src RemoteDescriptor, dst Tier, dstIDs []int, opts transfer.Options) (*transfer.Notification, error)
	// ExecuteRemoteOffload pushes blocks of a local tier to dst.
	ExecuteRemoteOffload(src Tier, srcIDs []int, dst RemoteDescriptor, opts transfer.Options) (*transfer.Notification, error)
	// ConnectRemote imports an instance's metadata (exactly one item) and
	// remembers its handles by tier.
	ConnectRemote(instance InstanceID, metadata [][]byte) error
	// HasRemoteMetadata reports whether ConnectRemote succeeded for instance.
	HasRemoteMetadata(instance InstanceID) bool
	// ExecuteRemoteOnboardForInstance pulls blocks of a connected instance's
	// tier into a local tier.
	ExecuteRemoteOnboardForInstance(instance InstanceID, remote Tier, srcIDs []int, dst Tier, dstIDs []int,
		opts transfer.Options) (*transfer.Notification, error)
}

// ObjectBlockOps moves blocks between a worker's tiers and the object
// store (G4). Results come back in input order; each block succeeds or
// fails on its own.
type ObjectBlockOps interface {
	HasBlocks(ctx context.Context, keys []object.Key) []object.Presence
	PutBlocks(ctx context.Context, keys []object.Key, src Tier, blockIDs []int) []object.Result
	GetBlocks(ctx context.Context, keys []object.Key, dst Tier, blockIDs []int) []object.Result
}

// RemoteDescriptor names blocks outside this worker: blocks of a remote
// layout (Handle and BlockIDs) or objects (Keys).
type RemoteDescriptor struct {
	Handle   *transfer.LayoutHandle
	BlockIDs []int
	Keys     []object.Key
}

// RemoteLayout describes blocks of another worker's layout.
func RemoteLayout(h transfer.LayoutHandle, blockIDs []int) RemoteDescriptor {
	return RemoteDescriptor{Handle: &h, BlockIDs: blockIDs}
}

// RemoteObjects describes objects in the store.
func RemoteObjects(keys []object.Key) RemoteDescriptor { return RemoteDescriptor{Keys: keys} }

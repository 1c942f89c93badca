package ucx

import (
	"os"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/cuda"
)

// Linking this package in makes the transport selectable as
// KVBM_TRANSPORT=ucx (remote.Open), and auto's choice where it finds an
// RDMA network (auto.go), in the message mode; the one-sided
// mode (EnvOneSided) is refused with ErrLateWrites unless
// EnvAcceptLateWrites is 1. Device memory is registered as host
// memory under the emulated device, as CUDA memory otherwise.
func init() {
	remote.Prefer("ucx", preferred)
	remote.Register("ucx", func(o remote.OpenOptions) (remote.Transport, error) {
		if err := Available(); err != nil {
			return nil, err
		}
		oneSided := os.Getenv(EnvOneSided) == "1"
		if oneSided && os.Getenv(EnvAcceptLateWrites) != "1" {
			return nil, ErrLateWrites
		}
		drv, err := cuda.Default()
		return New(Config{DeviceIsHost: err == nil && drv.Name() == cuda.EmulatedName, OneSided: oneSided, Advertise: o.Advertise})
	})
}

package ucx

import (
	"fmt"
	"strings"
	"sync"
)

// KVBM_TRANSPORT=auto chooses UCX where the UCX that loads finds an RDMA
// network (InfiniBand or RoCE through verbs or mlx5, AWS EFA): there it
// moves blocks at the network's speed, and over TCP or shared memory it
// moves nothing faster than the TCP transport does. Decided once per
// process, from the resources a UCX context finds (UCX_TLS and
// UCX_NET_DEVICES apply).
var (
	autoOnce sync.Once
	autoOK   bool
	autoWhy  string
)

func preferred() (bool, string) {
	autoOnce.Do(func() {
		if err := Available(); err != nil {
			autoWhy = err.Error()
			return
		}
		rs, err := cachedResources()
		if err != nil {
			autoWhy = err.Error()
			return
		}
		autoOK, autoWhy = rdma(rs)
	})
	return autoOK, autoWhy
}

// cachedResources is Resources, found once per process.
var cachedResources = sync.OnceValues(Resources)

// rdmaTransports are UCX's transports over an RDMA network.
var rdmaTransports = []string{"rc_verbs", "rc_mlx5", "dc_mlx5", "ud_verbs", "ud_mlx5", "srd"}

// rdma says whether resources ("transport/device") include an RDMA
// network, and why.
func rdma(resources []string) (bool, string) {
	var found []string
	for _, r := range resources {
		tl, _, _ := strings.Cut(r, "/")
		for _, t := range rdmaTransports {
			if tl == t {
				found = append(found, r)
			}
		}
	}
	if len(found) > 0 {
		return true, fmt.Sprintf("UCX %s finds an RDMA network (%s)", Version(), strings.Join(found, " "))
	}
	return false, fmt.Sprintf("UCX %s finds no RDMA network (%s)", Version(), strings.Join(resources, " "))
}

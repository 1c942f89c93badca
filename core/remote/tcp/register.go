package tcp

import "github.com/kvbm/kvbm/core/remote"

// Linking this package in makes the transport selectable as
// KVBM_TRANSPORT=tcp and as "auto" (remote.Open), with the defaults of an
// empty Config (KVBM_TCP_LISTEN, KVBM_TCP_ADVERTISE, KVBM_SAME_HOST, KVBM_TLS_*).
func init() {
	remote.Register("tcp", func(o remote.OpenOptions) (remote.Transport, error) {
		t := New(Config{Advertise: o.Advertise})
		if t.tlsErr != nil {
			return nil, t.tlsErr // at create, not at the first export
		}
		return t, nil
	})
}

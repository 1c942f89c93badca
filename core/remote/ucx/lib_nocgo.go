//go:build !cgo

package ucx

import "errors"

// Available reports why the UCX transport cannot be used: without cgo
// there is no dlopen.
func Available() error {
	return errors.New("ucx: built without cgo, so libucp cannot be loaded")
}

// Version is "" without cgo.
func Version() string { return "" }

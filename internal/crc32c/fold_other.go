//go:build !amd64 || !cgo

package crc32c

const folds = false

func fold(uint32, []byte) uint32 { panic("crc32c: no folded path in this build") }

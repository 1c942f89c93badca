//go:build !race

package memcopy

const raceEnabled = false

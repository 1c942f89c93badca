//go:build race

package memcopy

const raceEnabled = true

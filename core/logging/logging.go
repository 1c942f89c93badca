// Package logging sets up kvbm's logs: log/slog to stderr (never stdout),
// at the level KVBM_LOG names, "error" by default.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// EnvLevel is the environment variable that sets the log level.
const EnvLevel = "KVBM_LOG"

// ParseLevel reads a KVBM_LOG value: debug, info, warn or error ("" is
// error).
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "error":
		return slog.LevelError, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	}
	return slog.LevelError, fmt.Errorf("%s=%q: want debug, info, warn or error", EnvLevel, s)
}

// New returns a logger writing text to w at the level of value; a bad
// value logs a warning once and keeps the default.
func New(w io.Writer, value string) *slog.Logger {
	level, err := ParseLevel(value)
	l := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
	if err != nil {
		l.Error("kvbm: ignoring a bad log level", "err", err)
	}
	return l
}

// Configure makes the process's default slog logger kvbm's: stderr, level
// from KVBM_LOG. The library calls it once when it loads.
func Configure() { slog.SetDefault(New(os.Stderr, os.Getenv(EnvLevel))) }

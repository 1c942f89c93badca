package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// printTable prints the demo's rows, each beside its own limit (a plain
// copy, O_DIRECT, a file per block) measured right after it.
func printTable(w io.Writer, rows []row) {
	cells := [][]string{{"path", "blocks", "bytes", "seconds", "GB/s", "limit", "limit GB/s", "vs limit", "verified"}}
	for _, r := range rows {
		gbs := float64(r.bytes) / r.elapsed.Seconds() / 1e9
		verified := "yes"
		if r.err != nil {
			verified = "NO"
		}
		cells = append(cells, []string{
			r.path, fmt.Sprint(r.blocks), fmt.Sprintf("%d MiB", r.bytes>>20),
			fmt.Sprintf("%.3f", r.elapsed.Seconds()), fmt.Sprintf("%.2f", gbs),
			r.limit.name, fmt.Sprintf("%.2f", r.limit.gbs), fmt.Sprintf("%.2f", gbs/r.limit.gbs), verified,
		})
	}
	printCells(w, cells, 1)
}

// printCells prints a Markdown table: cells[0] is the header; the first
// `left` columns and the last are aligned left, the others right.
func printCells(w io.Writer, cells [][]string, left int) {
	width := make([]int, len(cells[0]))
	for _, c := range cells {
		for i, s := range c {
			width[i] = max(width[i], len([]rune(s)))
		}
	}
	line := func(c []string) {
		parts := make([]string, len(c))
		for i, s := range c {
			pad := strings.Repeat(" ", width[i]-len([]rune(s)))
			if i < left || i == len(c)-1 {
				parts[i] = s + pad
			} else {
				parts[i] = pad + s
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(parts, " | "))
	}
	line(cells[0])
	sep := make([]string, len(width))
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	fmt.Fprintf(w, "|-%s-|\n", strings.Join(sep, "-|-"))
	for _, c := range cells[1:] {
		line(c)
	}
}

func gbPerS(bytes int64, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e9 }

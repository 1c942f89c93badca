package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// measureCopy is the limit every path is compared with: a plain Go copy of
// total bytes, through buffers larger than the caches, in this run.
func measureCopy(total int64) float64 {
	chunk := min(total, 64<<20)
	src, dst := make([]byte, chunk), make([]byte, chunk)
	fill(src, 1)
	copy(dst, src) // fault the pages in before timing
	t0 := time.Now()
	for done := int64(0); done < total; done += chunk {
		copy(dst[:min(chunk, total-done)], src)
	}
	return float64(total) / time.Since(t0).Seconds() / 1e9
}

func printTable(w io.Writer, rows []row, copyGBs float64) {
	header := []string{"path", "blocks", "bytes", "seconds", "GB/s", "copy GB/s", "vs copy", "verified"}
	cells := [][]string{header}
	for _, r := range rows {
		gbs := float64(r.bytes) / r.elapsed.Seconds() / 1e9
		verified := "yes"
		if r.err != nil {
			verified = "NO"
		}
		cells = append(cells, []string{
			r.path, fmt.Sprint(r.blocks), fmt.Sprintf("%d MiB", r.bytes>>20),
			fmt.Sprintf("%.3f", r.elapsed.Seconds()), fmt.Sprintf("%.2f", gbs),
			fmt.Sprintf("%.2f", copyGBs), fmt.Sprintf("%.2f", gbs/copyGBs), verified,
		})
	}
	width := make([]int, len(header))
	for _, c := range cells {
		for i, s := range c {
			width[i] = max(width[i], len([]rune(s)))
		}
	}
	line := func(c []string) {
		parts := make([]string, len(c))
		for i, s := range c {
			pad := strings.Repeat(" ", width[i]-len([]rune(s)))
			if i == 0 || i == len(c)-1 {
				parts[i] = s + pad
			} else {
				parts[i] = pad + s
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(parts, " | "))
	}
	line(cells[0])
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	fmt.Fprintf(w, "|-%s-|\n", strings.Join(sep, "-|-"))
	for _, c := range cells[1:] {
		line(c)
	}
}

package ucx

import "strings"

// parseResources takes the "transport/device" of each resource line of
// ucp_context_print_info ("#      resource 0  :  md 0  dev 0  flags -- tcp/lo"),
// in order, each once. The line is the same from UCX 1.13 to 1.22.
func parseResources(info string) []string {
	var out []string
	seen := map[string]bool{}
	for _, line := range strings.Split(info, "\n") {
		f := strings.Fields(strings.TrimPrefix(line, "#"))
		if len(f) < 2 || f[0] != "resource" || !strings.Contains(line, " flags ") {
			continue
		}
		r := f[len(f)-1]
		if strings.Contains(r, "/") && !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	return out
}

// parseSettings takes the "UCX_NAME=value" lines of ucp_config_print.
func parseSettings(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), "=")
		if name, found := strings.CutPrefix(name, "UCX_"); ok && found {
			out[name] = value
		}
	}
	return out
}

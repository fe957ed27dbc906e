package mdconfig

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// FormatDiagnostics renders diagnostics one per paragraph as
// "file:line:col: error: summary: detail", followed by the source line and
// a marker under the offending text when src (the file's content) is given.
// Errors come before warnings; otherwise the order is that of diags.
func FormatDiagnostics(diags hcl.Diagnostics, src []byte) string {
	var b strings.Builder
	lines := bytes.Split(src, []byte("\n"))
	for _, sev := range []hcl.DiagnosticSeverity{hcl.DiagError, hcl.DiagWarning} {
		for _, d := range diags {
			if d.Severity != sev {
				continue
			}
			kind := "error"
			if sev == hcl.DiagWarning {
				kind = "warning"
			}
			if d.Subject != nil && d.Subject.Filename != "" {
				fmt.Fprintf(&b, "%s: ", posString(*d.Subject))
			}
			fmt.Fprintf(&b, "%s: %s", kind, d.Summary)
			if d.Detail != "" {
				fmt.Fprintf(&b, ": %s", d.Detail)
			}
			b.WriteByte('\n')
			if d.Subject != nil {
				writeSnippet(&b, lines, *d.Subject)
			}
		}
	}
	return b.String()
}

func writeSnippet(b *strings.Builder, lines [][]byte, r hcl.Range) {
	ln := r.Start.Line
	if ln < 1 || ln > len(lines) || r.Start.Column < 1 {
		return
	}
	line := strings.ReplaceAll(string(lines[ln-1]), "\t", " ")
	if r.Start.Column > len(line)+1 {
		return
	}
	width := 1
	if r.End.Line == ln && r.End.Column > r.Start.Column {
		width = min(r.End.Column, len(line)+1) - r.Start.Column
	}
	gutter := fmt.Sprintf("%5d | ", ln)
	fmt.Fprintf(b, "%s%s\n%s%s%s\n", gutter, line, strings.Repeat(" ", len(gutter)), strings.Repeat(" ", r.Start.Column-1), strings.Repeat("^", max(width, 1)))
}
